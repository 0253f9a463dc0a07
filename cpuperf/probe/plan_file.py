"""A saved plan's text, read from the file the user names (`--plan FILE`): the OS read of it, bounded, without
blocking on a FIFO, one line for each way it is not a plan's file (exit 2). Parsing is plan/saved.py's."""

from __future__ import annotations

import errno
import os
import stat

from cpuperf.errors import UsageError, from_os_error

MAX_BYTES = 4 * 1024 * 1024  # a plan is a few kB; a bigger file is not one
_MAKE_ONE = "make one with: cpuperf recommend --save FILE"


def plan_text(path: str) -> str:
    """The UTF-8 text of the plan file at `path`: a regular file of at most MAX_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block us
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise UsageError(f"plan file {path} does not exist", hint=_MAKE_ONE) from None
        raise from_os_error(exc) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"plan file {path} is not a regular file", hint="give the JSON file cpuperf recommend --save wrote")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise UsageError(f"plan file {path} is over {MAX_BYTES // 2**20} MiB: not a cpuperf plan", hint=_MAKE_ONE)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"plan file {path} is not UTF-8 text", hint=_MAKE_ONE) from None
