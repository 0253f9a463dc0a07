"""Atomic file writes: a crash or Ctrl-C leaves either the old file or the new one, never half."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Union


@contextlib.contextmanager
def atomic_writer(path: Union[str, Path]) -> Iterator[IO[bytes]]:
    """Yield a binary file in path's directory; on success fsync it and os.replace() it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename itself is durable only once the directory entry is on disk.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_bytes(path: Union[str, Path], data: bytes) -> None:
    with atomic_writer(path) as fh:
        fh.write(data)
