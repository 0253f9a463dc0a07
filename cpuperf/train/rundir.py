"""A run directory belongs to one run: a lock for the run's life, and no silent overwrite of a finished run.

Rank 0 claims out_dir before anything else. `cpuperf train` takes the same lock before it starts any
rank (so a refused run never touches another run's logs) and hands it on through CPUPERF_RUN_LOCK:
the worker then finds the lock held under that token and goes on without taking it again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Optional

from cpuperf.boundary import RUN_LOCK
from cpuperf.errors import FilesystemError
from cpuperf.fsutil import DirLock, LockBusy, acquire_dir_lock, refuse_link
from cpuperf.train.checkpoint import CKPT_NAME
from cpuperf.train.errors import RunDirBusyError
from cpuperf.worker_settings import ConfigError

METRICS_NAME = "metrics.jsonl"
TOKEN_VAR = RUN_LOCK  # the token of a lock a launcher holds for this run


def busy_message(out_dir: str, holder_text: Optional[str]) -> str:
    """The one line for a run directory held by another run."""
    who = f" ({holder_text})" if holder_text else ""
    return f"run directory {out_dir} is in use by another run{who}"


BUSY_HINT = "wait for that run to end, or pass another --out"


def existing_run(out_dir: Path) -> Optional[str]:
    """What makes out_dir an existing run (a checkpoint, a non-empty metrics file), or None."""
    ckpt = out_dir / CKPT_NAME
    if ckpt.exists():
        return f"a checkpoint ({ckpt})"
    metrics = out_dir / METRICS_NAME
    if metrics.exists() and metrics.stat().st_size > 0:
        return f"metrics ({metrics})"
    return None


def refuse_links(out_dir: str, resume: bool) -> None:
    """The run's files written in place (metrics.jsonl appended) and, on resume, read back (the checkpoint): a
    link standing there is refused before anything is read or written (fsutil.LinkRefused, exit 10). The
    checkpoint itself is replaced as a whole, so a fresh run replaces a link there without touching its target."""
    names = (METRICS_NAME, CKPT_NAME) if resume else (METRICS_NAME,)
    for name in names:
        refuse_link(os.path.join(out_dir, name))


def claim(out_dir: str, resume: bool, environ: Optional[Mapping[str, str]] = None) -> Optional[DirLock]:
    """Lock out_dir for this run (None: a launcher holds it for us) and refuse to overwrite a run.

    RunDirBusyError when another live run holds it; ConfigError (exit 2) when it already holds a
    run and resume is off.
    """
    environ = os.environ if environ is None else environ
    lock: Optional[DirLock] = None
    try:
        lock = acquire_dir_lock(out_dir)
    except LockBusy as exc:
        token = environ.get(TOKEN_VAR, "")
        if not (token and exc.holder is not None and exc.holder.token == token):
            raise RunDirBusyError(busy_message(out_dir, exc.holder.describe() if exc.holder else None),
                                  hint=BUSY_HINT) from None
    except FilesystemError:  # a link or a non-file named .lock (fsutil): exit 10, said as such
        raise
    except OSError as exc:
        raise ConfigError(f"cannot lock run directory {out_dir}: {exc.strerror}",
                          hint="pass a writable --out") from None
    try:
        refuse_links(out_dir, resume)
    except FilesystemError:
        if lock is not None:
            lock.release()
        raise
    if lock is not None and lock.stale is not None:
        sys.stderr.write(f"cpuperf train: note: took over the stale lock of a run that is gone "
                         f"({lock.stale.describe()})\n")
    what = existing_run(Path(out_dir))
    if what is not None and not resume:
        if lock is not None:
            lock.release()
        raise ConfigError(f"{out_dir} already holds a run: {what}; not overwriting it",
                          hint="pass --resume to continue it, or another --out")
    return lock


DEFAULT_BASE = os.path.join("runs", "train")
VERSION_PREFIX = "version_"


def _versions(base: str) -> list[int]:
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return sorted(int(n[len(VERSION_PREFIX):]) for n in names
                  if n.startswith(VERSION_PREFIX) and n[len(VERSION_PREFIX):].isdigit()
                  and len(n) - len(VERSION_PREFIX) <= 9)


def default_run_dir(base: str = DEFAULT_BASE, *, resume: bool = False, create: bool = False) -> str:
    """The run directory when --out is not given, as Lightning's version_N: a new BASE/version_N per run
    (one more than the highest there), or with `resume` the newest one that holds a checkpoint. `create` makes the new one
    at once (mkdir fails if another run took the name first: the next number is tried)."""
    versions = _versions(base)
    if resume:
        if not versions and existing_run(Path(base)) is not None:
            return os.path.abspath(base)  # a run from before version_N directories: continue it in place
        if not versions:
            raise ConfigError(f"--resume: {base} holds no run (no {VERSION_PREFIX}N directory)",
                              hint="pass --out DIR naming the run to continue")
        # The newest run that can be continued: a later directory without a checkpoint (a user-script run, a run
        # stopped before its first checkpoint) would train from scratch and call it resumed.
        for number in reversed(versions):
            path = os.path.join(base, f"{VERSION_PREFIX}{number}")
            if os.path.isfile(os.path.join(path, CKPT_NAME)):
                return os.path.abspath(path)
        raise ConfigError(f"--resume: no run under {base} has a checkpoint ({VERSION_PREFIX}{versions[0]}"
                          + (f"..{versions[-1]}" if len(versions) > 1 else "") + " hold none)",
                          hint="pass --out DIR naming the run to continue, or start a new run without --resume")
    number = versions[-1] + 1 if versions else 0
    while True:
        path = os.path.abspath(os.path.join(base, f"{VERSION_PREFIX}{number}"))
        if not create:
            return path
        try:
            os.makedirs(base, exist_ok=True)
            os.mkdir(path)
            return path
        except FileExistsError:
            if not os.path.isdir(base):
                raise
            number += 1


def run_dir(out_dir: Optional[str], *, resume: bool, create: bool) -> str:
    """--out as given; else a new BASE/version_N per run (the newest one with `resume`), made now with `create`."""
    if out_dir is not None:
        if os.path.lexists(out_dir) and not os.path.isdir(out_dir):  # was "cannot lock ...: File exists", exit 10
            from cpuperf.errors import UsageError

            raise UsageError(f"--out {out_dir}: not a directory (a file of that name is there)",
                             hint="give --out a directory: a new one, or a run's own")
        return os.path.abspath(out_dir)
    try:
        return default_run_dir(resume=resume, create=create)
    except OSError as exc:
        from cpuperf.errors import from_os_error

        raise from_os_error(exc) from None


def remove_if_empty(path: str) -> None:
    """Undo run_dir's making of a directory for a run that never started."""
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty, or gone: never more than the empty directory made for this run
