"""Lines said once: a note that would otherwise repeat in every shell and every plan (ccl-env's "using gloo", "newer
than cpuperf's data", a warning about a past measurement) is said by the first command that meets it, and again only
when its text changes (another stack, another measurement). `cpuperf doctor` says them every time: it is where a user
asks what is wrong. An edge: it reads and writes one small file per kind under the cache root.
"""

from __future__ import annotations

import json
import zlib
from typing import List

_KEEP = 256  # the most recent lines remembered per kind: a bounded file, whatever runs on this host


def first_time(kind: str, text: str) -> bool:
    """True when `text` has not been said before under `kind` (and remember it now); False after. An unreadable
    or unwritable cache says it every time rather than never."""
    from cpuperf.fsutil import atomic_write_bytes, cache_root, read_capped

    path = cache_root() / "said" / f"{kind}.json"
    key = f"{zlib.crc32(text.encode()):08x}{zlib.adler32(text.encode()):08x}"  # no hashlib (OpenSSL) to load
    known: List[str] = []
    try:
        data = json.loads(read_capped(path, 64 << 10))
        known = [k for k in data if isinstance(k, str)] if isinstance(data, list) else []
    except (OSError, ValueError, RecursionError):  # InputRefused is a ValueError
        pass
    if key in known:
        return False
    try:
        atomic_write_bytes(path, json.dumps([*known, key][-_KEEP:]).encode())
    except OSError:
        pass
    return True
