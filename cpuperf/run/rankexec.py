"""`python -m cpuperf.run.rankexec -- CMD...`: pin this rank to its slot, then exec CMD.

Started by torchrun / mpirun / srun once per rank. Reads the local rank from the launcher
(LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID) and its slot from
CPUPERF_RANK_SLOTS (a JSON list indexed by local rank: {"cpus": [...], "threads": N}); sets the CPU
affinity and OMP_NUM_THREADS, sends its output to CPUPERF_RANK_LOGDIR/rank<R>.log, records its pid
in rank<R>.pid (under a user's own launcher: only the pid, in CPUPERF_RANK_PIDDIR/rank<local>.pid) (the pid survives exec: cpuperf train reads /proc/<pid> of each rank), asks the
kernel for SIGTERM when its parent (the launcher) dies, so no rank trains on as an orphan, then
execs. Kept import-light: it runs once per rank before the real command.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

from cpuperf.boundary import LOCAL_RANK_VARS, RANK_LOGDIR, RANK_PIDDIR, RANK_SLOTS, RANK_VARS
from cpuperf.fsutil import LinkRefused, append_nofollow, ensure_dir, open_nofollow


def _first_int(environ: Mapping[str, str], names: Tuple[str, ...]) -> Optional[int]:
    for name in names:
        raw = environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


class SlotError(ValueError):
    """CPUPERF_RANK_SLOTS is not the list cpuperf writes."""


def slot_for(environ: Mapping[str, str]) -> Tuple[int, int, Optional[Dict[str, Any]]]:
    """(global rank, local rank, slot or None) from the launcher's variables; SlotError when the slot list is
    not a JSON list of {"cpus": [CPU ids], "threads": N} objects."""
    local = _first_int(environ, LOCAL_RANK_VARS) or 0
    rank = _first_int(environ, RANK_VARS)
    try:
        slots = json.loads(environ.get(RANK_SLOTS) or "[]")
    except (ValueError, RecursionError):
        raise SlotError("not JSON") from None
    if not isinstance(slots, list):
        raise SlotError("not a JSON list")
    slot = slots[local] if 0 <= local < len(slots) else None
    if slot is not None:
        _check_slot(slot, local)
    return (rank if rank is not None else local), local, slot


def _check_slot(slot: object, local: int) -> None:
    if not isinstance(slot, dict):
        raise SlotError(f"slot {local} is not an object")
    cpus, threads = slot.get("cpus") or [], slot.get("threads")
    if not isinstance(cpus, list) or not all(type(c) is int and 0 <= c < 1 << 16 for c in cpus):
        raise SlotError(f"slot {local}: cpus must list CPU numbers")
    if threads is not None and not (type(threads) is int and 1 <= threads <= 1 << 16):
        raise SlotError(f"slot {local}: threads must be a positive whole number")


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """Linux: deliver `signum` to this process when its parent dies (survives exec; see prctl(2)).

    If `parent` is already gone (we were re-parented before the call), act as if it had just died.
    Elsewhere, or without libc, a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


def _write_pid(path: str) -> None:
    """This process's pid in `path` (truncated first), never through a link."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{os.getpid()}\n")


def _refused(rank: int, exc: LinkRefused) -> int:
    sys.stderr.write(f"cpuperf.run.rankexec: rank {rank}: {exc.message} (hint: {exc.hint})\n")
    return int(exc.code)


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write("cpuperf.run.rankexec: no command given (usage: python -m cpuperf.run.rankexec -- CMD ...)\n")
        return 2
    try:
        rank, local, slot = slot_for(os.environ)
    except SlotError as exc:
        sys.stderr.write(f"cpuperf.run.rankexec: CPUPERF_RANK_SLOTS is malformed ({exc})\n")
        return 2
    if slot:
        cpus = list(slot.get("cpus") or [])
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except (OSError, ValueError) as exc:
                why = getattr(exc, "strerror", None) or exc
                sys.stderr.write(f"cpuperf.run.rankexec: rank {rank}: cannot pin to CPUs {cpus}: {why}\n")
        if slot.get("threads"):
            os.environ["OMP_NUM_THREADS"] = str(int(slot["threads"]))
    # The launcher is our parent (torchrun's agent, orted, slurmstepd): when it dies, so do we.
    die_with_parent(os.getppid())
    # Every file here is opened without following a link (cpuperf.fsutil's rule for a run directory): a link where a
    # pid file or a rank's log goes ends the rank with exit 10, the link named, and nothing written through it.
    piddir = os.environ.get(RANK_PIDDIR)
    if piddir:  # a user's launcher: its ranks' output stays where the launcher sends it
        try:
            _write_pid(os.path.join(piddir, f"rank{local}.pid"))
        except LinkRefused as exc:
            return _refused(rank, exc)
        except OSError as exc:
            sys.stderr.write(f"cpuperf.run.rankexec: rank {rank}: cannot record its pid under {piddir}: {exc.strerror}\n")
    logdir = os.environ.get(RANK_LOGDIR)
    if logdir:
        try:
            ensure_dir(logdir)
            _write_pid(os.path.join(logdir, f"rank{rank}.pid"))
            # Appended, never truncated: a resumed run's log follows the earlier one's.
            fd = append_nofollow(os.path.join(logdir, f"rank{rank}.log"))
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        except LinkRefused as exc:
            return _refused(rank, exc)
        except OSError as exc:
            sys.stderr.write(f"cpuperf.run.rankexec: rank {rank}: cannot write logs under {logdir}: {exc.strerror}\n")
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        sys.stderr.write(f"cpuperf.run.rankexec: rank {rank}: cannot run {args[0]}: {exc.strerror}\n")
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    raise SystemExit(main())
