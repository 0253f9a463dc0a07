"""Find and read the knowledge shipped under compat/ (inside the wheel: cpuperf/compat)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Dict, List

from cpuperf.errors import BadDataError

try:  # Python 3.11+; not a version check: the node probe bundle runs where tomllib may be absent
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python < 3.11, or the bundle's JSON stand-in
    import tomli as _toml  # type: ignore[no-redef,import-not-found,unused-ignore]


# Real data files nest 3-4 levels; hundreds of levels is an attack on the parser (RecursionError).
MAX_DEPTH = 32


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """True when lists/tables nest deeper than `limit` (iterative: never recurses itself)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


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
            data: Dict[str, Any] = _toml.load(fh)
    except OSError as exc:
        raise BadDataError(f"cannot read data file {path}: {exc.strerror}",
                           hint="reinstall cpuperf, or fix CPUPERF_COMPAT_DIR") from exc
    except (_toml.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadDataError(f"malformed data file {path}: {str(exc).splitlines()[0] if str(exc) else 'too deep'}",
                           hint="fix the file, or unset CPUPERF_COMPAT_DIR") from exc
    if too_deep(data):
        raise BadDataError(f"malformed data file {path}: nested deeper than {MAX_DEPTH} levels",
                           hint="fix the file, or unset CPUPERF_COMPAT_DIR")
    return data


def load_builtin(name: str) -> Dict[str, Any]:
    """Load compat/<name> from the built-in data."""
    return load_toml(str(builtin_compat_dir() / name))
