"""What cpuperf reads back is data from elsewhere (its caches, tunings, remembered decisions, plans, facts): one
bounded, non-blocking JSON reader, and a small vocabulary of checks with types and ranges, so that a bad entry
is dropped alone and named, and nothing else in the file is lost.

A check is a function from a JSON value to None (it fits) or one line saying why not; `pruned` applies a
record's checks field by field and drops what does not fit, `entries` does the same for the entries of a map.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

from cpuperf.fsutil import MAX_INPUT_BYTES, read_capped
from cpuperf.jsonable import JsonMapping, JsonObject, JsonValue

Check = Callable[[object], Optional[str]]

MAX_TEXT = 4096  # a name, a reason, a load figure: far above any cpuperf writes
MAX_COUNT = 1 << 20  # CPUs, threads, ranks, repeats: far above any host, far below what breaks arithmetic
MAX_FIGURE = 1e15  # GFLOP/s, samples/s, seconds: finite and far above any real one


class Unreadable(ValueError):
    """A file that is not what it should be: not a regular file, too big, not UTF-8, not JSON, a key twice.
    One line; the caller names the file."""


def _no_duplicates(pairs: List[Tuple[str, JsonValue]]) -> JsonObject:
    out: JsonObject = {}
    for key, value in pairs:
        if key in out:
            raise Unreadable(f"names {key[:40]!r} twice")
        out[key] = value
    return out


def loads(text: Union[str, bytes]) -> Any:
    """JSON as cpuperf reads it back: a key given twice refused (which one counts is a parser's guess),
    NaN and Infinity read as NaN (so a check refuses that value alone), nesting past the parser's depth refused."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Unreadable(f"is not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=lambda _: math.nan)
    except Unreadable:
        raise
    except RecursionError:
        raise Unreadable("is nested too deeply to be a cpuperf file") from None
    except ValueError as exc:
        raise Unreadable(f"is not JSON ({str(exc).splitlines()[0][:80]})") from None


def read_json(path: Union[str, Path], limit: int = MAX_INPUT_BYTES) -> Any:
    """The JSON in a regular file of at most `limit` bytes, read without blocking (fsutil.read_capped).
    Unreadable (a ValueError) for a FIFO, device, directory, a bigger file, bad text or JSON; OSError passes."""
    return loads(read_capped(path, limit))


# -- checks ------------------------------------------------------------------------------------------

def number(low: float = 0.0, high: float = MAX_FIGURE, *, whole: bool = False, above: bool = False) -> Check:
    """A finite number in low..high (`above`: strictly above low); `whole`: an integer. true/false is no number."""
    def check(v: object) -> Optional[str]:
        kind = "a whole number" if whole else "a number"
        if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)):
            return f"must be {kind}, not {_show(v)}"
        if not math.isfinite(v) or v < low or v > high or (above and v == low):
            span = f"above {low:g}" if above else f"in {low:g}..{high:g}" if high < MAX_FIGURE else f"of at least {low:g}"
            return f"must be {kind} {span}" + (f" and at most {high:g}" if above and high < MAX_FIGURE else "") + \
                f", not {_show(v)}"
        return None
    return check


def positive(high: float = MAX_FIGURE) -> Check:
    """A finite number above 0."""
    return number(0.0, high, above=True)


def count(low: int = 1, high: int = MAX_COUNT) -> Check:
    return number(low, high, whole=True)


def text(limit: int = MAX_TEXT, printable: bool = True) -> Check:
    """A string of at most `limit` characters; `printable`: none of them a terminal control (or a line break)."""
    def check(v: object) -> Optional[str]:
        if not isinstance(v, str):
            return f"must be a string, not {_show(v)}"
        if len(v) > limit:
            return f"is over {limit} characters"
        return None if not printable or v.isprintable() else "holds a control character"
    return check


def boolean(v: object) -> Optional[str]:
    return None if isinstance(v, bool) else f"must be true or false, not {_show(v)}"


def one_of(*allowed: JsonValue) -> Check:
    def check(v: object) -> Optional[str]:
        ok = any(v == a and type(v) is type(a) for a in allowed)
        return None if ok else f"must be one of {', '.join(json.dumps(a) for a in allowed)}, not {_show(v)}"
    return check


def nullable(inner: Check) -> Check:
    return lambda v: None if v is None else inner(v)


def list_of(item: Check, limit: int = MAX_COUNT) -> Check:
    def check(v: object) -> Optional[str]:
        if not isinstance(v, list):
            return f"must be a list, not {_show(v)}"
        if len(v) > limit:
            return f"lists over {limit} items"
        for i, x in enumerate(v):
            why = item(x)
            if why:
                return _join(f"[{i}]", why)
        return None
    return check


def map_of(value: Check, key: Check = text(256)) -> Check:
    """An object whose every key and value fit (all or nothing; `entries` drops bad ones instead)."""
    def check(v: object) -> Optional[str]:
        if not isinstance(v, dict):
            return f"must be an object, not {_show(v)}"
        for k, x in v.items():
            why = key(k)
            if why:
                return f"key {why}"
            why = value(x)
            if why:
                return _join(f".{_key(k)}", why)
        return None
    return check


def record(fields: Mapping[str, Check], required: Sequence[str] = ()) -> Check:
    """An object whose listed fields fit where present (others are not read), and the required ones present."""
    def check(v: object) -> Optional[str]:
        if not isinstance(v, dict):
            return f"must be an object, not {_show(v)}"
        for name in required:
            if name not in v:
                return f".{name} is missing"
        for name, rule in fields.items():
            if name in v:
                why = rule(v[name])
                if why:
                    return _join(f".{name}", why)
        return None
    return check


# -- pruning: a bad part dropped alone -----------------------------------------------------------------

def pruned(data: JsonMapping, fields: Mapping[str, Check], where: str) -> Tuple[JsonObject, List[str]]:
    """(data without the fields whose check fails, a note per field dropped). Fields not listed are kept as
    they are: the reader of each decides whether it uses them."""
    kept: JsonObject = {}
    notes: List[str] = []
    for name, value in data.items():
        rule = fields.get(name)
        why = rule(value) if rule is not None else None
        if why:
            notes.append(_join(f"{where}.{_key(name)}", why))
        else:
            kept[name] = value
    return kept, notes


def entries(value: object, check: Check, where: str) -> Tuple[JsonObject, List[str]]:
    """(the entries of a map that fit `check`, a note per entry dropped); a value that is no map: ({}, one note)."""
    if not isinstance(value, dict):
        return {}, [f"{where} must be an object, not {_show(value)}"]
    kept: JsonObject = {}
    notes: List[str] = []
    for name, item in value.items():
        why = text(256)(name)
        why = f"key {why}" if why else check(item)
        if why:
            notes.append(_join(f"{where}.{_key(name)}", why))
        else:
            kept[name] = item
    return kept, notes


def _join(where: str, why: str) -> str:
    """'a.b' + '.c must be ...' -> 'a.b.c must be ...'; 'a.b' + 'must be ...' -> 'a.b must be ...'."""
    return where + why if why.startswith((".", "[")) else f"{where} {why}"


def _key(name: object) -> str:
    shown = str(name)[:40]
    return shown if shown.isprintable() else repr(shown)


def _show(v: object) -> str:
    """A value in a message: short, and never a raw control character (repr escapes them)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "a non-finite number"
    if isinstance(v, (dict, list)):
        return "an object" if isinstance(v, dict) else "a list"
    shown = repr(v) if isinstance(v, str) else json.dumps(v)
    return shown[:40] + ("..." if len(shown) > 40 else "")
