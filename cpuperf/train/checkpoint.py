"""Atomic checkpoint files: write a temp file in the same directory, fsync, os.replace, fsync dir.

A reader therefore sees either the previous complete checkpoint or the new complete one, never a
torn file, even if the process is killed mid-write (POSIX rename(2) is atomic within a
filesystem; the directory fsync makes the rename itself durable).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

CKPT_SCHEMA = "cpuperf.train.ckpt/1"
CKPT_NAME = "checkpoint.pt"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """torch.save `obj` to `path` atomically."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def load(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by save_atomic (weights_only: no code runs on load)."""
    import torch

    obj = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(obj, dict) or obj.get("schema") != CKPT_SCHEMA:
        raise ValueError(f"{path} is not a {CKPT_SCHEMA} checkpoint")
    return obj
