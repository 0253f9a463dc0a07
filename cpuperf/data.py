"""Find and read the knowledge shipped under compat/ (inside the wheel: cpuperf/compat)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

from cpuperf.errors import BadDataError

if TYPE_CHECKING:
    from cpuperf.jsonable import JsonValue

# Real data files nest 3-4 levels; hundreds of levels is an attack on the parser (RecursionError).
MAX_DEPTH = 32


def too_deep(obj: object, limit: int = MAX_DEPTH) -> bool:
    """True when lists/tables nest deeper than `limit` (iterative: never recurses itself)."""
    stack: List[tuple[object, int]] = [(obj, 1)]
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


def extra_compat_dirs(environ: Optional[Mapping[str, str]] = None) -> List[Path]:
    """CPUPERF_COMPAT_DIR (os.pathsep-separated; empty = none) extends the matrix without a release."""
    raw = (os.environ if environ is None else environ).get("CPUPERF_COMPAT_DIR", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def overlays(name: str, environ: Optional[Mapping[str, str]] = None) -> Tuple[str, ...]:
    """The files called `name` in the CPUPERF_COMPAT_DIR directories, in their order: data laid over the shipped
    file of that name (knowledge/tuning.py reads tuning.toml so)."""
    return tuple(str(d / name) for d in extra_compat_dirs(environ) if (d / name).is_file())


@functools.cache
def load_toml(path: str) -> Dict[str, Any]:
    """Parse one TOML data file; a syntax error is a BadDataError naming the file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
            stamp = _stamp(path, os.fstat(fh.fileno()), raw)
    except OSError as exc:
        raise BadDataError(f"cannot read data file {path}: {exc.strerror}",
                           hint="reinstall cpuperf, or fix CPUPERF_COMPAT_DIR") from exc
    remembered = _remembered_parse(path, stamp)
    if remembered is not None:
        return remembered
    try:  # Python 3.11+
        import tomllib as _toml
    except ModuleNotFoundError:  # pragma: no cover - Python < 3.11
        import tomli as _toml  # type: ignore[no-redef,import-not-found,unused-ignore]
    try:  # load(file), not loads(text): the node probe bundle's stand-in parser reads the JSON beside fh.name
        with open(path, "rb") as fh:
            data = _toml.load(fh)
    except OSError as exc:
        raise BadDataError(f"cannot read data file {path}: {exc.strerror}",
                           hint="reinstall cpuperf, or fix CPUPERF_COMPAT_DIR") from exc
    except (_toml.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadDataError(f"malformed data file {path}: {str(exc).splitlines()[0] if str(exc) else 'too deep'}",
                           hint="fix the file, or unset CPUPERF_COMPAT_DIR") from exc
    if too_deep(data):
        raise BadDataError(f"malformed data file {path}: nested deeper than {MAX_DEPTH} levels",
                           hint="fix the file, or unset CPUPERF_COMPAT_DIR")
    _remember_parse(path, stamp, data)
    parsed: Dict[str, Any] = data
    return parsed


# What a remembered parse was made from: the file's path, size, mtime, inode, device, checksum, and the Python.
Stamp = List[Union[str, int]]


# tomllib is pure Python (~1 ms per kB) and ccl-env, which runs in every new shell, reads ~35 kB of TOML: the
# parsed form is remembered as JSON (parsed in C), checked against the file's size, mtime, inode and checksum
# (as Python checks a .pyc against its source) and the Python that parsed it.
def _stamp(path: str, st: os.stat_result, raw: bytes) -> Stamp:
    import sys
    import zlib

    return [os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, zlib.crc32(raw), sys.version]


def _parse_path(path: str) -> Path:
    """Where the parse of the file at `path` (absolute) is remembered."""
    import zlib

    from cpuperf.fsutil import cache_root

    return cache_root() / "compat-parsed" / f"{os.path.basename(path)}-{zlib.crc32(path.encode()):08x}.json"


_SAID: List[str] = []


def _remembered_parse(path: str, stamp: Stamp) -> Optional[Dict[str, JsonValue]]:
    """The remembered parse of this very file, None when there is none (or it is for another version of it).
    Read bounded and without blocking (cpuperf.readback); one that cannot be read is parsed again, said once,
    and replaced by the next remembered parse."""
    from cpuperf.readback import read_json

    where = _parse_path(os.path.abspath(path))
    try:
        known: JsonValue = read_json(where)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # a FIFO, a device, too big (InputRefused), not JSON, a key twice
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _say_once(f"note: the remembered parse {where} is not used ({why}): {os.path.basename(path)} is parsed again")
        return None
    if not isinstance(known, dict) or known.get("stamp") != stamp:
        return None  # another version of the file, or of Python: parsed again and replaced, as it should be
    data = known.get("data")
    if not isinstance(data, dict) or too_deep(data) or known.get("digest") != _digest(data):
        # The parse as written carries a digest of its data: one edited or corrupted since (`data: {}`, a number
        # where the TOML has text) would reach the code that trusts compat/ as shipped, an internal error.
        _say_once(f"note: the remembered parse {where} is not used (its data is not what was parsed): "
                  f"{os.path.basename(path)} is parsed again")
        return None
    return data


def _digest(data: Mapping[str, object]) -> str:
    """sha256 of the data as canonical JSON: what a remembered parse must still be to be used."""
    import json

    from cpuperf.fsutil import sha256_hex

    try:
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return ""  # NaN, or not JSON: never a digest that matches
    return sha256_hex(text.encode("utf-8"))


def _say_once(line: str) -> None:
    if line in _SAID:
        return
    _SAID.append(line)
    try:
        from cpuperf.output import message
    except ImportError:  # the node probe bundle carries no output sink: its stderr is the launcher's
        return
    message(line)


def _remember_parse(path: str, stamp: Stamp, data: Mapping[str, object]) -> None:
    import json

    from cpuperf.fsutil import atomic_write_bytes

    try:
        # TypeError: a date or time (not JSON), ValueError: NaN: such a file is parsed each time.
        text = json.dumps({"stamp": stamp, "data": data, "digest": _digest(data)}, allow_nan=False)
        if json.loads(text)["data"] == data:
            atomic_write_bytes(_parse_path(os.path.abspath(path)), text.encode("utf-8"))
    except (OSError, TypeError, ValueError):
        pass  # a read-only cache costs the parse, nothing else


def load_builtin(name: str) -> Dict[str, Any]:
    """Load compat/<name> from the built-in data."""
    return load_toml(str(builtin_compat_dir() / name))
