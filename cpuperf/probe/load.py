"""Other work on this host right now: load average, per-CPU busy time over a short window, CPU pressure.

Load changes from second to second, so it is not part of the cached HostFacts snapshot: the commands
that decide from it (doctor, recommend, train, bench) probe it once and attach it with `with_load`.
A live host is sampled over a short window (default 0.2 s, compat/tuning.toml; CPUPERF_LOAD_WINDOW overrides, 0 skips the
window); a --sysroot tree gives its recorded /proc/loadavg and pressure files and no per-CPU figure
(a single recorded /proc/stat says nothing about the last second).
"""

from __future__ import annotations

import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from cpuperf.probe.facts import LoadFacts
from cpuperf.probe.sources import Sources

DEFAULT_WINDOW_S = 0.2  # where no caller hands in compat/tuning.toml [load].window_s
_SAMPLES = 4  # procs_running readings spread over the window (one reading is a coin toss)


def parse_loadavg(text: Optional[str]) -> Tuple[Optional[float], Optional[int]]:
    """'3.95 1.67 0.82 8/124 17943' -> (3.95, 8 running)."""
    if not text:
        return None, None
    parts = text.split()
    try:
        one = float(parts[0])
    except (IndexError, ValueError):
        return None, None
    running: Optional[int] = None
    if len(parts) > 3 and "/" in parts[3]:
        try:
            running = int(parts[3].split("/")[0])
        except ValueError:
            running = None
    return one, running


class CpuTimes(NamedTuple):
    """One CPU's line of /proc/stat, in jiffies (USER_HZ); guest time is already in user time."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int  # a hypervisor gave the CPU to others


def parse_stat_times(text: Optional[str]) -> Dict[int, CpuTimes]:
    """/proc/stat -> {cpu: its times}."""
    out: Dict[int, CpuTimes] = {}
    for line in (text or "").splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            cpu = int(name[3:])
            vals = [int(v) for v in fields[:8]]
        except ValueError:
            continue
        out[cpu] = CpuTimes(*(vals + [0] * (8 - len(vals))))
    return out


def parse_stat_cpus(text: Optional[str]) -> Dict[int, Tuple[int, int]]:
    """/proc/stat -> {cpu: (busy jiffies, total jiffies)}."""
    out: Dict[int, Tuple[int, int]] = {}
    for cpu, t in parse_stat_times(text).items():
        busy = t.user + t.nice + t.system + t.irq + t.softirq + t.steal
        out[cpu] = (busy, busy + t.idle + t.iowait)
    return out


def parse_psi_some_avg10(text: Optional[str]) -> Optional[float]:
    """'some avg10=94.41 avg60=...' -> 94.41."""
    for line in (text or "").splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def parse_psi_some_total(text: Optional[str]) -> Optional[int]:
    """'some avg10=... total=13862513' -> 13862513 (microseconds some task waited for a CPU, since boot)."""
    for line in (text or "").splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key == "total":
                    try:
                        return int(value)
                    except ValueError:
                        return None
    return None


def _pressure_paths(src: Sources) -> List[str]:
    """This cgroup's cpu.pressure files, nearest first, then the host's /proc/pressure/cpu."""
    from cpuperf.probe.topology import cgroup_dirs

    version, dirs = cgroup_dirs(src, "cpu")
    return [*([f"{d}/cpu.pressure" for d in dirs] if version == 2 else []), "/proc/pressure/cpu"]


def _pressure(src: Sources) -> Tuple[Optional[float], Optional[str]]:
    """This cgroup's cpu.pressure (the nearest one that has it), else the host's /proc/pressure/cpu."""
    for path in _pressure_paths(src):
        value = parse_psi_some_avg10(src.read(path))
        if value is not None:
            return value, path
    return None, None


def pressure_total(src: Sources) -> Tuple[Optional[int], Optional[str]]:
    """(microseconds some task waited for a CPU since boot, the file), from the file _pressure reads; (None,
    None) where the kernel keeps no pressure figures."""
    for path in _pressure_paths(src):
        value = parse_psi_some_total(src.read(path))
        if value is not None:
            return value, path
    return None, None


# A CPU at least this busy in the first window is sampled once more before it counts (half busy:
# compat/tuning.toml [load] busy_cpu_fraction, the figure the decision uses).
_CONFIRM_AT = 0.5


def _sample(src: Sources, window_s: float, cpus: Optional[Sequence[int]]) -> Tuple[List[Tuple[int, float]], List[int], float]:
    """(per-CPU busy fraction by others, runnable counts seen, seconds) over one window while we sleep."""
    before = parse_stat_cpus(src.read("/proc/stat"))
    counts: List[int] = []
    start = time.monotonic()
    for _ in range(_SAMPLES):
        time.sleep(window_s / _SAMPLES)
        _, r = parse_loadavg(src.read("/proc/loadavg"))
        if r is not None:
            counts.append(r)
    elapsed = time.monotonic() - start
    after = parse_stat_cpus(src.read("/proc/stat"))
    wanted = set(cpus) if cpus else set(after)
    busy: List[Tuple[int, float]] = []
    for cpu in sorted(wanted & set(before) & set(after)):
        d_busy, d_total = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
        if d_total > 0:
            busy.append((cpu, round(min(1.0, max(0.0, d_busy / d_total)), 3)))
    return busy, counts, elapsed


def probe_load(src: Sources, cpus: Optional[Sequence[int]] = None, window_s: Optional[float] = None,
               default_s: float = DEFAULT_WINDOW_S) -> LoadFacts:
    """Sample load over `window_s` (live) or read what a snapshot recorded. Never raises. Without `window_s`:
    CPUPERF_LOAD_WINDOW, else `default_s` (the caller asks compat/tuning.toml [load] of knowledge/tuning.py: the
    probe, below it in the layers, reads no rule)."""
    if window_s is None:
        window_s = src.env_seconds("CPUPERF_LOAD_WINDOW", default_s)
    psi, psi_path = _pressure(src)
    one, running = parse_loadavg(src.read("/proc/loadavg"))
    if not src.live or window_s <= 0:
        others = None if running is None else max(0.0, running - 1.0)  # the reader itself is running
        return LoadFacts(0.0, one, others, None, psi, psi_path, "live" if src.live else "snapshot")
    busy, counts, elapsed = _sample(src, window_s, cpus)
    if any(frac >= _CONFIRM_AT for _, frac in busy):
        # Busy now: a process that is just exiting, or load that stays? A second window tells; each
        # CPU keeps its lower figure, so only load seen in both decides threads for a whole run.
        time.sleep(window_s)
        again, counts2, elapsed2 = _sample(src, window_s, cpus)
        second = dict(again)
        busy = [(cpu, min(frac, second.get(cpu, frac))) for cpu, frac in busy]
        counts, elapsed = counts + counts2, elapsed + elapsed2
    others = round(sum(max(0, c - 1) for c in counts) / len(counts), 2) if counts else None
    return LoadFacts(round(elapsed, 3), one, others, tuple(busy) if busy else None, psi, psi_path, "live")


def load_for(sysroot: Optional[str], cpus: Optional[Sequence[int]] = None,
             window_s: Optional[float] = None, default_s: float = DEFAULT_WINDOW_S) -> LoadFacts:
    """probe_load for a live host (sysroot None) or a recorded tree."""
    return probe_load(Sources(sysroot=sysroot), cpus, window_s, default_s)
