"""Atomic file writes (a crash or Ctrl-C leaves the old file or the new one, never half); directory locks;
bounded reads of files a user names (a device, a FIFO or a huge file is refused, never read until memory
runs out or blocked on forever)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Dict, Iterator, Mapping, Optional, Union

from cpuperf.errors import FilesystemError, UsageError

# Far above any config, lock, hostfile, RECORD or /proc file a real host has (cpuinfo of 1024 CPUs is ~1.5
# MB); far below what makes a read or a parse hurt.
MAX_INPUT_BYTES = 16 * 1024 * 1024


def cache_root(environ: Optional[Mapping[str, str]] = None) -> Path:
    """cpuperf's cache directory: CPUPERF_CACHE_DIR, else $XDG_CACHE_HOME/cpuperf, else ~/.cache/cpuperf."""
    env = os.environ if environ is None else environ
    base = env.get("CPUPERF_CACHE_DIR") or os.path.join(  # an empty XDG_CACHE_HOME means unset (XDG spec)
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cpuperf")
    return Path(base)


class InputRefused(ValueError):
    """A file that must not be read: not a regular file, or larger than the cap. One line, the path named."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_capped(path: Union[str, Path], limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. InputRefused for a device, FIFO, socket,
    directory or a bigger file (opened without blocking, so a FIFO with no writer cannot hang us);
    OSError (missing, permissions) passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputRefused(f"{os.fspath(path)} is {_kind(st.st_mode)}, not a file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputRefused(f"{os.fspath(path)} is larger than {limit // (1024 * 1024)} MiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text_capped(path: Union[str, Path], limit: int = MAX_INPUT_BYTES, errors: str = "strict") -> str:
    """read_capped as UTF-8 text (UnicodeDecodeError with errors='strict')."""
    return read_capped(path, limit).decode("utf-8", errors)


@contextlib.contextmanager
def atomic_writer(path: Union[str, Path], make_parents: bool = True) -> Iterator[IO[bytes]]:
    """Yield a binary file in path's directory; on success fsync it and os.replace() it into place. `make_parents`
    False: a file the user named, whose directory must exist (FileNotFoundError otherwise)."""
    import tempfile  # (and random): not for the commands that only read, such as ccl-env in every new shell

    path = Path(path)
    if make_parents:
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


def atomic_write_bytes(path: Union[str, Path], data: bytes, make_parents: bool = True) -> None:
    with atomic_writer(path, make_parents) as fh:
        fh.write(data)


# -- no link followed in a run directory ------------------------------------------------------------
# One rule for every file cpuperf writes or appends to in place in a directory of its own (a run's --out: the lock,
# metrics.jsonl, logs/ with its rank logs and pid files; a checkpoint read back on --resume): a symbolic link standing
# where the file goes is refused (exit 10, the link named), never followed: a link named .lock had its target emptied,
# a dangling metrics.jsonl created its target outside the run. Files replaced as a whole (atomic_writer: the
# checkpoint, plot.svg, the tokenizer cache) replace a link without touching its target and need no check.


class LinkRefused(FilesystemError):
    """A symbolic link where cpuperf writes (or reads back) a file of its own: refused, never followed (exit 10)."""

    def __init__(self, path: Union[str, Path]):
        where = os.fspath(path)
        try:
            target = f" (to {os.readlink(where)})"
        except OSError:
            target = ""
        super().__init__(f"{where} is a symbolic link{target}: cpuperf follows no link among "
                         "a run's own files", hint=f"remove the link (rm {where}), or give --out a directory of the run's own")
        self.filename = where


def is_link(path: Union[str, Path]) -> bool:
    """lstat: is `path` itself a symbolic link (dangling or not)?"""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def refuse_link(path: Union[str, Path]) -> None:
    """LinkRefused when `path` is a symbolic link; nothing when it is anything else or absent."""
    if is_link(path):
        raise LinkRefused(path)


def open_nofollow(path: Union[str, Path], flags: int, mode: int = 0o644) -> int:
    """os.open that never follows a link at `path` (O_NOFOLLOW): a link there is LinkRefused (exit 10, named);
    any other OSError passes through."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        # ELOOP is O_NOFOLLOW's answer for a link; opening a link to a directory for writing can say EISDIR first.
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENOTDIR) and is_link(path):
            raise LinkRefused(path) from None
        raise


def append_nofollow(path: Union[str, Path]) -> int:
    """A file descriptor appending to `path` (created 0644 when absent), never through a link."""
    return open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)


def ensure_dir(path: Union[str, Path]) -> None:
    """The directory `path` of cpuperf's own (logs/ in a run): made with its parents when absent; a link standing
    there is LinkRefused, so nothing is written into its target. A file there passes through as OSError."""
    refuse_link(path)
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        refuse_link(path)  # made a link by someone else just now
        raise
    refuse_link(path)


def check_output_file(flag: str, path: str) -> None:
    """A file the user names for cpuperf to write (`recommend --save`, `install --write-lock`): its directory
    must exist (cpuperf never makes a path the user typed, /no/such/dir/ included), and it is not a directory."""
    if not path.strip():
        raise UsageError(f"{flag} is empty: name a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise FilesystemError(f"{flag} {path}: {parent} is not a directory", hint="check the path")
        raise FilesystemError(f"{flag} {path}: the directory {parent} does not exist",
                              hint=f"make it first (mkdir -p {parent}), or name a file in a directory that exists")
    if os.path.isdir(path):
        raise FilesystemError(f"{flag} {path} is a directory, not a file", hint="name a file, e.g. plan.json")


# -- a directory that belongs to one process at a time ----------------------------------------------

LOCK_NAME = ".lock"


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or last held) a directory lock, as recorded in its lock file."""

    pid: int
    host: str
    started: float  # time.time() when the lock was taken
    token: str  # lets a launcher hand the lock to the process it starts

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host}, since {when}"


class LockBusy(Exception):
    """Another live process holds the lock."""

    def __init__(self, path: str, holder: Optional[LockHolder]):
        super().__init__(path)
        self.path = path
        self.holder = holder


@dataclass
class DirLock:
    """An flock(2) on DIR/.lock, held while `fd` is open (the kernel drops it when the process dies)."""

    path: str
    fd: int
    holder: LockHolder
    stale: Optional[LockHolder]  # the record of a dead holder this lock took over, if any

    def release(self) -> None:
        """Clear the record (so the next run sees no stale lock) and drop the lock."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)
        self.fd = -1


def read_lock_holder(path: Union[str, Path]) -> Optional[LockHolder]:
    """The record in a lock file; None when absent, empty or malformed (binary, truncated)."""
    try:
        with os.fdopen(open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
            data = json.loads(fh.read(4096).decode("utf-8"))
        return LockHolder(int(data["pid"]), str(data["host"]), float(data["started"]), str(data["token"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def acquire_dir_lock(directory: Union[str, Path], token: str = "") -> DirLock:
    """Lock `directory` for this process (creating it); LockBusy if a live process holds it.

    flock, not a pid file alone: the kernel releases it when the holder dies however it dies, so a
    record left behind by a dead holder is stale by construction and is taken over (see DirLock.stale).
    """
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = os.path.join(str(directory), LOCK_NAME)
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)  # a link named .lock had its target emptied
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device named .lock: not ours to truncate
        os.close(fd)
        raise FilesystemError(f"{path} is not a regular file: cpuperf keeps its lock there",
                              hint=f"remove it (rm {path}), or give --out a directory of the run's own")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockBusy(path, read_lock_holder(path)) from None
    except OSError:
        os.close(fd)
        raise
    import socket

    stale = read_lock_holder(path)
    holder = LockHolder(os.getpid(), socket.gethostname(), time.time(), token)
    record = json.dumps(dataclasses.asdict(holder)).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record + b"\n", 0)
    return DirLock(path, fd, holder, stale)


def _own_hash(name: str) -> Any:
    """Python's own constructor of the hash `name` (sha256, sha1: no OpenSSL), or None where this build has none;
    looked up once (a module that is not there is searched for along the whole sys.path at every import)."""
    if name not in _OWN_HASH:
        import importlib

        _OWN_HASH[name] = None
        for module in {"sha256": ("_sha2", "_sha256"), "sha1": ("_sha1",)}[name]:  # _sha2: Python >= 3.12
            try:
                _OWN_HASH[name] = getattr(importlib.import_module(module), name)
                break
            except (ImportError, AttributeError):
                continue
    return _OWN_HASH[name]


_OWN_HASH: Dict[str, Any] = {}


def _hex(name: str, data: bytes) -> str:
    """hashlib.new(name, data).hexdigest(), from Python's own module where hashlib is not loaded yet: hashlib loads
    OpenSSL (~3 ms, ~10 ms on a busy host), on the path of ccl-env in every new shell and of every `train`. The same
    digest either way; OpenSSL's is ~8x faster on large inputs, so it is used where hashlib is loaded already or the
    input is large."""
    import sys

    own = None if "hashlib" in sys.modules or len(data) > 1 << 20 else _own_hash(name)
    if own is None:
        import hashlib

        return hashlib.new(name, data).hexdigest()
    return str(own(data).hexdigest())


def sha256_hex(data: bytes) -> str:
    """hashlib.sha256(data).hexdigest() (_hex: without loading OpenSSL where it can)."""
    return _hex("sha256", data)


def sha1_hex(data: bytes) -> str:
    """hashlib.sha1(data).hexdigest() (_hex: without loading OpenSSL where it can)."""
    return _hex("sha1", data)
