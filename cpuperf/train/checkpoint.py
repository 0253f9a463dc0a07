"""Atomic checkpoint files: write a temp file in the same directory, fsync, os.replace, fsync dir.

A reader therefore sees either the previous complete checkpoint or the new complete one, never a
torn file, even if the process is killed mid-write (POSIX rename(2) is atomic within a
filesystem; the directory fsync makes the rename itself durable).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import torch

CKPT_SCHEMA = "cpuperf.train.ckpt/1"
CKPT_NAME = "checkpoint.pt"


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """torch.save `obj` to `path` atomically."""
    import torch

    from cpuperf.fsutil import atomic_writer

    with atomic_writer(path) as fh:
        torch.save(obj, fh)


def load(path: Path, map_location: Union[str, torch.device] = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by save_atomic (weights_only: no code runs on load)."""
    import os

    import torch

    from cpuperf.fsutil import open_nofollow

    # Read through no link (fsutil.LinkRefused, exit 10): the run directory's one rule, --resume included.
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
        obj = torch.load(fh, map_location=map_location, weights_only=True)
    if not isinstance(obj, dict) or obj.get("schema") != CKPT_SCHEMA:
        raise ValueError(f"{path} is not a {CKPT_SCHEMA} checkpoint")
    return obj
