"""Where a run's seconds go outside the job: named moments of this process, from its own start to its exit.

`train --verbose` says them: from cpuperf's start (the kernel's start time of this process, so the interpreter's own
start and cpuperf's imports count) to the job's first instruction (its exec: the direct child's, or the first rank's
pid file, written by cpuperf.run.rankexec just before it execs), the job's run, and from the job's end (its launcher
reaped) to cpuperf's exit. A moment costs one clock read; nothing is sampled.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, List, Optional, Tuple

# (name of the part that ends here, when: seconds since boot, the clock the kernel's process start time is on,
# whose time it is: None for cpuperf's own, else whose: "the job", "the launcher")
_MARKS: List[Tuple[str, float, Optional[str]]] = []


def now() -> float:
    """Seconds since boot (CLOCK_BOOTTIME where there is one: what /proc/PID/stat's start time counts from)."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def _started() -> Optional[float]:
    """This process's start, seconds since boot (/proc/self/stat field 22, in clock ticks); None where unknown."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def mark(part: str, at: Optional[float] = None, whose: Optional[str] = None) -> None:
    """The part named `part` ends now (or at `at`, seconds since boot: a file's time, converted by `since_boot`);
    `whose`: None where the part is cpuperf's own time, else whose it is ("the job", "the launcher")."""
    _MARKS.append((part, now() if at is None else at, whose))


def since_boot(wall: float) -> float:
    """A wall-clock time (a file's mtime) on the boot clock of the marks."""
    return now() - (time.time() - wall)


def parts() -> List[Tuple[str, float, Optional[str]]]:
    """(part, seconds, whose) in order, the first from this process's start; a part whose moment came before the
    last one's (a clock read across processes) counts 0."""
    start = _started()
    out: List[Tuple[str, float, Optional[str]]] = []
    last = start if start is not None else (_MARKS[0][1] if _MARKS else 0.0)
    for part, at, whose in _MARKS:
        out.append((part, max(0.0, at - last), whose))
        last = max(last, at)
    return out


def render() -> List[str]:
    """The breakdown as lines: each part and its seconds (whose, where not cpuperf's), then cpuperf's own total."""
    rows = parts()
    if not rows:
        return []
    own = sum(s for _, s, whose in rows if whose is None)
    lines = [f"timing: {p} {s:.3f} s" + (f" ({whose})" if whose else "") for p, s, whose in rows]
    return lines + [f"timing: cpuperf's own {own:.3f} s, outside the job and its launcher (up to this line)"]


def reset() -> None:
    """Forget the marks (tests; a second run in one process)."""
    _MARKS.clear()


# -- Python's cyclic collector while cpuperf plans ---------------------------------------------------------------

_COLLECTING: List[bool] = []  # whether the collector ran before each pause, the outermost first


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A plan is made with Python's cyclic collector paused: its passes over what the imports and the plan make (all
    of it alive to the end) were 25-50 ms of the CPU of a `train` start on a 2-CPU host. Bounded: resumed where the
    job or a run starts (resume_collector) and, at the latest, as the command returns, each time as it was."""
    import gc

    _COLLECTING.append(gc.isenabled())
    gc.disable()
    try:
        yield
    finally:
        if _COLLECTING.pop():
            gc.enable()


def resume_collector() -> None:
    """The plan is made and the job (or a run) starts, for as long as it takes: the collector runs again if it ran
    before the first pause (entry.main's, then cli.train's inside it)."""
    import gc

    if _COLLECTING and _COLLECTING[0]:
        gc.enable()
