"""Watching a running job at no measurable cost: rank deaths, what each rank really runs with, rank 0's log.

cpuperf's own process shares the host with the training it supervises (on a small host, the same
cores), so everything here waits on events instead of polling:

- a rank's death wakes the watcher through a pidfd (Linux >= 5.3, Python >= 3.9; pidfd_open(2)), so
  the first rank to die is known exactly; where pidfds are missing, /proc/PID/stat is polled slowly;
- each rank's /proc (CPUs, OMP_NUM_THREADS, OpenMP runtime, allocator) is sampled on a backing-off
  schedule until the rank is verified (its OpenMP runtime is mapped: torch is loaded, the exec is
  done), then only its status is re-read, rarely;
- rank pid files are looked for on a backing-off schedule until every local rank has one;
- rank 0's log is echoed a few times a second at most, after a stat says it grew.

The watcher is one thread blocked in poll(2) on the pidfds and a wake-up pipe.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, TextIO, Tuple

from cpuperf.boundary import WORLD_SIZE_VARS
from cpuperf.output import StreamError, write_stream
from cpuperf.plan.launch import LaunchPlan, RankObservation

# Offsets between /proc samples of a rank not yet verified: torch takes a second or more to load,
# then one sample verifies it. Capped: a rank that never loads an OpenMP runtime costs a sample a while.
SAMPLE_STEPS_S = (0.2, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
RECHECK_S = 60.0  # a verified rank: /proc/PID/status only (threads, CPUs), this rarely
PIDFILE_STEPS_S = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)  # looking for rank<R>.pid until every rank has one
FALLBACK_POLL_S = 0.2  # without pidfds: /proc/PID/stat of each live rank this often
TAIL_STEPS_S = (0.25, 0.5, 1.0)  # rank 0's log: soon after it grew, backing off while it is quiet


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state != ["Z"]


def _status(obs: RankObservation, text: str) -> None:
    from cpuperf.probe.parse import parse_cpulist

    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            obs.allowed_cpus = tuple(parse_cpulist(value.strip()) or ())
        elif key == "Threads":
            obs.threads = int(value.strip())


def observe(rank: int, pid: int) -> Optional[RankObservation]:
    """What a running rank really has: allowed CPUs, OS threads, OMP_NUM_THREADS, OpenMP, allocator."""
    from cpuperf.probe.parse import parse_maps

    status = _read(f"/proc/{pid}/status")
    maps = _read(f"/proc/{pid}/maps")
    if status is None or maps is None:
        return None
    obs = RankObservation(rank=rank, pid=pid)
    _status(obs, status)
    environ = _read(f"/proc/{pid}/environ") or ""
    sizes: Dict[str, int] = {}
    for item in environ.split("\0"):
        if item.startswith("OMP_NUM_THREADS="):
            obs.omp_num_threads = item.split("=", 1)[1]
        key, _, value = item.partition("=")
        if key in WORLD_SIZE_VARS and value.strip().isdigit():
            sizes[key] = min(int(value.strip()), 1 << 20)
    obs.world_size = next((sizes[k] for k in WORLD_SIZE_VARS if k in sizes), None)
    cmdline = _read(f"/proc/{pid}/cmdline") or ""
    obs.argv = tuple(cmdline.split("\0")[:-1][:4096])
    libs = parse_maps(maps)
    obs.openmp = list(libs.openmp)
    obs.allocator = libs.allocator
    return obs


def open_pidfd(pid: int) -> Tuple[Optional[int], bool]:
    """(pidfd or None, pidfds work here). A pid already gone gives (None, True)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None, False
    try:
        return opener(pid), True
    except ProcessLookupError:
        return None, True
    except OSError:  # ENOSYS before Linux 5.3, or a seccomp filter that refuses it
        return None, False


class _Rank:
    """One rank followed by the watcher."""

    def __init__(self, rank: int, pid: int, now: float):
        self.rank, self.pid = rank, pid
        self.fd: Optional[int] = None
        self.dead = False
        self.verified = False
        self.step = 0
        self.next_sample = now + SAMPLE_STEPS_S[0]

    def schedule(self, now: float) -> None:
        if self.verified:
            self.next_sample = now + RECHECK_S
        else:
            self.step = min(self.step + 1, len(SAMPLE_STEPS_S) - 1)
            self.next_sample = now + SAMPLE_STEPS_S[self.step]


@dataclass
class _Schedule:
    """A backing-off timer: `due` is when the next look is; `back_off` and `reset` move it."""

    steps: Tuple[float, ...]
    due: float
    step: int = 0

    def back_off(self, now: float) -> None:
        self.step = min(self.step + 1, len(self.steps) - 1)
        self.due = now + self.steps[self.step]

    def reset(self, now: float) -> None:
        self.step = 0
        self.due = now + self.steps[0]


class Watch(threading.Thread):
    """Follows rank pid files: samples /proc, notes the first rank to die, tails rank 0's log.

    finish() wakes it for a last look and ends it.
    """

    def __init__(self, plan: LaunchPlan, direct_pid: Optional[int], echo: Optional[TextIO],
                 pidfds: bool = True):
        """pidfds=False: follow deaths by polling /proc (what happens where the kernel has no pidfds)."""
        super().__init__(daemon=True, name="cpuperf-watch")
        self.plan = plan
        self.direct_pid = direct_pid
        # Rank 0's log is echoed where cpuperf's launcher sent the ranks' output there (a user's own launcher
        # keeps its ranks' output on the console: nothing to echo).
        self.echo = echo if (plan.log_dir and direct_pid is None and plan.launcher != "direct") else None
        self.ranks: Dict[int, _Rank] = {}
        self.died_first: List[int] = []
        self.observations: Dict[int, RankObservation] = {}
        self.pidfds = pidfds  # until pidfd_open says otherwise
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        now = time.monotonic()
        self._pidfiles = _Schedule(PIDFILE_STEPS_S, now)
        self._tail_at = _Schedule(TAIL_STEPS_S, now)
        self._log_pos = 0  # rank logs are appended to: echo only what this run adds
        self._log_path: Optional[str] = None
        if self.echo is not None and plan.log_dir:
            rank0 = plan.node_rank * plan.nproc_per_node
            self._log_path = os.path.join(plan.log_dir, f"rank{rank0}.log")
            with contextlib.suppress(OSError):
                self._log_pos = os.path.getsize(self._log_path)

    # -- discovery and deaths -----------------------------------------------------------------------

    def _expected(self) -> List[int]:
        if self.direct_pid is not None:
            return [0]
        if not (self.plan.pid_dir or self.plan.log_dir):
            return []
        base = self.plan.node_rank * self.plan.nproc_per_node
        return [base + local for local in range(self.plan.nproc_per_node)]

    def _find(self, now: float) -> List[int]:
        """Start following ranks whose pid is now known; the ranks found already gone."""
        gone: List[int] = []
        for rank in self._expected():
            if rank in self.ranks:
                continue
            if self.direct_pid is not None:
                pid: Optional[int] = self.direct_pid
            else:
                pid_dir = self.plan.pid_dir or self.plan.log_dir
                assert pid_dir is not None
                text = _read(os.path.join(pid_dir, f"rank{rank}.pid"))
                pid = int(text.strip()) if text and text.strip().isdigit() else None
            if pid is None:
                continue
            r = self.ranks[rank] = _Rank(rank, pid, now)
            if self.pidfds:
                r.fd, self.pidfds = open_pidfd(pid)
            if (self.pidfds and r.fd is None) or not alive(pid):
                gone.append(rank)
        return gone

    def _polled_deaths(self) -> List[int]:
        """Ranks without a pidfd seen gone in /proc (the slow path)."""
        return [r.rank for r in self.ranks.values() if not r.dead and r.fd is None and not alive(r.pid)]

    def _died(self, ranks: List[int]) -> None:
        """ranks were seen gone at one moment: the first such moment names the ranks that died first."""
        fresh = sorted(r for r in set(ranks) if not self.ranks[r].dead)
        for rank in fresh:
            r = self.ranks[rank]
            r.dead = True
            if r.fd is not None:
                os.close(r.fd)
                r.fd = None
        if fresh and not self.died_first:
            self.died_first = fresh

    # -- /proc samples --------------------------------------------------------------------------------

    def _sample(self, r: _Rank, now: float) -> None:
        if r.verified:
            obs = self.observations.get(r.rank)
            text = _read(f"/proc/{r.pid}/status")
            if obs is not None and text is not None:
                _status(obs, text)
            r.schedule(now)
            return
        obs = observe(r.rank, r.pid)
        prev = self.observations.get(r.rank)
        if obs is not None and prev is not None and obs.omp_num_threads is None:
            # /proc/PID/environ of an exec'd process never changes, but reads empty while it exits:
            # a late sample must not erase what an earlier one saw.
            obs.omp_num_threads = prev.omp_num_threads
        # Keep the latest sample taken once torch (and its OpenMP runtime) is loaded.
        if obs is not None and (obs.openmp or prev is None):
            self.observations[r.rank] = obs
        # Verified: OpenMP is mapped, so the exec is done and environ and maps say what the rank runs with.
        r.verified = bool(obs is not None and obs.openmp)
        r.schedule(now)

    # -- rank 0's log --------------------------------------------------------------------------------

    def _tail(self, now: float) -> None:
        if self.echo is None or self._log_path is None:
            return
        try:
            grew = os.stat(self._log_path).st_size > self._log_pos
        except OSError:
            grew = False
        if not grew:
            self._tail_at.back_off(now)
            return
        try:
            with open(self._log_path, "rb") as fh:
                fh.seek(self._log_pos)
                chunk = fh.read()
        except OSError:
            chunk = b""
        if chunk:
            self._log_pos += len(chunk)
            try:  # a closed stderr or its reader gone: dropped (cpuperf.output); the run goes on either way
                write_stream(self.echo, chunk.decode("utf-8", "replace"))
            except StreamError:  # a full disk under 2> FILE: rank 0's log keeps it all
                self.echo = None
        self._tail_at.reset(now)

    # -- the loop ------------------------------------------------------------------------------------

    def _due(self, now: float) -> Optional[float]:
        """Do what is due; the next moment something is (None: only an event can)."""
        if len(self.ranks) < len(self._expected()) and now >= self._pidfiles.due:
            self._died(self._find(now))
            self._pidfiles.back_off(now)
        if not self.pidfds:
            self._died(self._polled_deaths())
        for r in list(self.ranks.values()):
            if not r.dead and now >= r.next_sample:
                self._sample(r, now)
        if self.echo is not None and now >= self._tail_at.due:
            self._tail(now)
        moments = [r.next_sample for r in self.ranks.values() if not r.dead]
        if len(self.ranks) < len(self._expected()):
            moments.append(self._pidfiles.due)
        if not self.pidfds:
            moments.append(now + FALLBACK_POLL_S)
        if self.echo is not None:
            moments.append(self._tail_at.due)
        return min(moments) if moments else None

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        registered: Dict[int, int] = {}  # fd -> rank
        try:
            while not self._stopping:
                now = time.monotonic()
                nxt = self._due(now)
                for r in self.ranks.values():
                    if r.fd is not None and r.fd not in registered:
                        poller.register(r.fd, select.POLLIN)
                        registered[r.fd] = r.rank
                timeout = None if nxt is None else max(0, int((nxt - time.monotonic()) * 1000) + 1)
                events = poller.poll(timeout)
                dead = [registered[fd] for fd, _ in events if fd in registered]
                for fd, rank in list(registered.items()):
                    if rank in dead:
                        poller.unregister(fd)
                        del registered[fd]
                self._died(dead)
            self._last_look()
        finally:
            os.close(self._wake_r)
            for r in self.ranks.values():
                if r.fd is not None:
                    os.close(r.fd)
                    r.fd = None

    def _last_look(self) -> None:
        """After the child exited: ranks not yet seen gone are gone now; the rest of rank 0's log."""
        now = time.monotonic()
        self._died(self._find(now))
        ready = []
        for r in self.ranks.values():
            if r.dead:
                continue
            if r.fd is not None:
                p = select.poll()
                p.register(r.fd, select.POLLIN)
                if p.poll(0):
                    ready.append(r.rank)
            elif not alive(r.pid):
                ready.append(r.rank)
        self._died(ready)
        if self.echo is not None:
            self._tail(now)

    def finish(self, timeout: float = 5.0) -> None:
        """Wake the watcher for its last look, and wait for it."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self.join(timeout=timeout)
        with contextlib.suppress(OSError):
            os.close(self._wake_w)
