"""Shared libraries an installed wheel ships, by file (issue 54: the OS is read in probe/ only)."""

from __future__ import annotations

import os
from typing import Sequence, Tuple


def present_libraries(prefix: str, names: Sequence[str]) -> Tuple[str, ...]:
    """Those of `names` (libccl.so.1, ...) that exist in the environment's lib directory (`prefix`/lib)."""
    lib = os.path.join(prefix, "lib")
    return tuple(n for n in names if os.path.exists(os.path.join(lib, n)))
