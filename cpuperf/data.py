"""Find and read the knowledge shipped under compat/ (inside the wheel: cpuperf/compat)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Dict, List

from cpuperf.errors import BadDataError

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python < 3.11
    import tomli as _toml  # type: ignore[no-redef]


def builtin_compat_dir() -> Path:
    """The packaged data (wheel) or the repository's compat/ (source checkout, editable install)."""
    packaged = Path(__file__).resolve().parent / "compat"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "compat"


def extra_compat_dirs() -> List[Path]:
    """CPUPERF_COMPAT_DIR (os.pathsep-separated) extends the matrix without a release."""
    raw = os.environ.get("CPUPERF_COMPAT_DIR", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


@functools.cache
def load_toml(path: str) -> Dict[str, Any]:
    """Parse one TOML data file; a syntax error is a BadDataError naming the file."""
    try:
        with open(path, "rb") as fh:
            return _toml.load(fh)
    except OSError as exc:
        raise BadDataError(f"cannot read data file {path}: {exc.strerror}",
                           hint="reinstall cpuperf, or fix CPUPERF_COMPAT_DIR") from exc
    except _toml.TOMLDecodeError as exc:
        raise BadDataError(f"malformed data file {path}: {exc}",
                           hint="fix the file, or unset CPUPERF_COMPAT_DIR") from exc


def load_builtin(name: str) -> Dict[str, Any]:
    """Load compat/<name> from the built-in data."""
    return load_toml(str(builtin_compat_dir() / name))
