"""ccl-env's cache of what the decision engine answered: an edge (it reads and writes files under the cache root).

ccl-env runs in every new shell and the engine costs ~40-65 ms there; an answer is kept per its inputs, the
measurements, the knowledge files, the engine's own files, GPU visibility and cpuperf's version, so a change to
any of these decides again.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple, TypeVar

from cpuperf.jsonable import JsonValue

if TYPE_CHECKING:
    from cpuperf.probe.facts import HostFacts

T = TypeVar("T")


def _stamps(facts: HostFacts) -> List[object]:
    """What invalidates an answer besides its own inputs: variables, measurement and knowledge files, the engine."""
    from pathlib import Path

    from cpuperf.data import builtin_compat_dir, extra_compat_dirs
    from cpuperf.fsutil import cache_root

    engine = Path(__file__).resolve().parent.parent  # the rules themselves: an edited checkout decides again
    stamps: List[object] = []
    stamps += sorted((k, v) for k, v in os.environ.items() if k.startswith(("CUDA_", "NVIDIA_", "CPUPERF_")))
    # A recorded host's own measurement: .cpuperf/ in its tree (run.measure.RECORDED_FILE; measure imports the engine).
    recorded = [] if facts.live else [Path(str(facts.sysroot)) / ".cpuperf"]
    for folder in (cache_root() / "measurements", *recorded, builtin_compat_dir(), *extra_compat_dirs(),
                   *(engine / part for part in ("decide", "knowledge", "plan", "run", "commands"))):
        try:
            stamps += sorted((str(folder), e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(folder))
        except OSError:
            stamps.append((str(folder), "", 0, 0))
    return stamps


def remembered(kind: str, facts: HostFacts, parts: List[object], compute: Callable[[], Tuple[object, Optional[float]]],
               decode: Callable[[JsonValue], T]) -> T:
    """decode(what compute() returns: (JSON, when it expires)), remembered per `parts` and _stamps(facts).
    decode raises ValueError, TypeError or KeyError on what is not its JSON (then it is computed again)."""
    import json
    import time
    import zlib

    from cpuperf import __version__
    from cpuperf.fsutil import atomic_write_bytes, cache_root
    from cpuperf.readback import read_json

    key = json.dumps([__version__, *parts, _stamps(facts)], default=str)
    # The entry holds its whole key (compared, so the file name need not be unique): no hashlib (OpenSSL) to load.
    path = cache_root() / kind / f"{zlib.crc32(key.encode()):08x}{zlib.adler32(key.encode()):08x}.json"
    try:
        known = read_json(path, 4 << 20)  # bounded, never blocking; a key twice or NaN is no entry
        until = known["until"]
        if known["key"] == key and (until is None or (isinstance(until, (int, float)) and time.time() <= until)):
            return decode(known["value"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # Unreadable, InputRefused: decide again
        pass
    value, until = compute()
    text = json.dumps({"key": key, "until": until, "value": value})
    try:
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError:
        pass  # a read-only cache costs the engine's time, nothing else
    return decode(json.loads(text)["value"])  # as a later run reads it: the same output either way
