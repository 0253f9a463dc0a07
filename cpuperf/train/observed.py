"""What a benchmark run saw from inside its own process: what was in force, and who else used its CPUs.

A figure is only evidence with its conditions beside it. `what_ran` reads the levers back from the live
process (the allocator the dynamic loader actually mapped, torch's threads, the CPU affinity, autocast,
the optimizer's kernel, whether the model is compiled), not from the settings that asked for them.
`CpuWindow` brackets the timed steps: the jiffies the kernel counted busy on this process's CPUs
(/proc/stat, per CPU) less the CPU time this process took is the time other processes took there, and
/proc/pressure/cpu's `some total` says how long any task waited for a CPU meanwhile.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, List, Optional, Sequence, TypedDict, Union

from cpuperf.probe.load import CpuTimes, parse_stat_times, pressure_total
from cpuperf.probe.parse import parse_maps
from cpuperf.probe.sources import Sources
from cpuperf.train.runtime_check import read_self_maps


def _busy(t: CpuTimes) -> int:
    # irq and softirq left out: the kernel charges them to whichever CPU took the interrupt, and a run of
    # several ranks raises its own (gloo over loopback) that no process is charged for.
    return t.user + t.nice + t.system + t.steal


@dataclass
class _Mark:
    at: float
    own_cpu_s: float
    busy: Dict[int, int]
    pressure_us: Optional[int]


class WindowFigures(TypedDict, total=False):
    """One rank's window (empty where it was not closed)."""

    cpus: List[int]
    elapsed_s: float
    busy_s: Dict[str, float]  # CPU (as text) -> everyone's busy seconds there
    own_cpu_s: float
    pressure_some_s: Optional[float]
    pressure_file: Optional[str]


class CpuWindow:
    """CPU time between begin() and end(): every CPU's busy time, this process's own, and the pressure."""

    def __init__(self, src: Optional[Sources] = None):
        self.src = src or Sources()
        self.pressure_path: Optional[str] = None
        self._begin: Optional[_Mark] = None
        self._end: Optional[_Mark] = None

    def _mark(self) -> _Mark:
        times = parse_stat_times(self.src.read("/proc/stat"))
        pressure, self.pressure_path = pressure_total(self.src)
        return _Mark(time.monotonic(), time.process_time(), {c: _busy(t) for c, t in times.items()}, pressure)

    def begin(self) -> None:
        self._begin = self._mark()

    def end(self) -> None:
        self._end = self._mark()

    def figures(self) -> WindowFigures:
        """elapsed_s, busy_s per CPU (everyone's), own_cpu_s, pressure_some_s over the window; {} if not closed."""
        a, b = self._begin, self._end
        if a is None or b is None:
            return {}
        hz = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        return {"cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else sorted(a.busy),
                "elapsed_s": round(b.at - a.at, 4),
                "busy_s": {str(c): round((b.busy[c] - a.busy[c]) / hz, 3) for c in a.busy if c in b.busy},
                "own_cpu_s": round(b.own_cpu_s - a.own_cpu_s, 3),
                "pressure_some_s": (round((b.pressure_us - a.pressure_us) / 1e6, 4)
                                    if a.pressure_us is not None and b.pressure_us is not None else None),
                "pressure_file": self.pressure_path}


def combine_windows(per_rank: Sequence[WindowFigures]) -> Dict[str, Union[None, float, str, List[int]]]:
    """One job's window from its ranks' own: the CPUs any rank may run on, everyone's busy time there (rank
    0's reading: the ranks' windows open and close within a step of each other), every rank's own CPU time;
    the rest is what other processes took on those CPUs."""
    if not per_rank or not per_rank[0]:
        return {}
    first = per_rank[0]
    cpus = sorted({int(c) for w in per_rank for c in w.get("cpus") or []})
    busy = sum(float(first.get("busy_s", {}).get(str(c), 0.0)) for c in cpus)
    own = sum(float(w.get("own_cpu_s") or 0.0) for w in per_rank)
    return {"cpus": cpus, "elapsed_s": first.get("elapsed_s"), "busy_cpu_s": round(busy, 3), "own_cpu_s": round(own, 3),
            "others_cpu_s": round(max(0.0, busy - own), 3), "pressure_some_s": first.get("pressure_some_s"),
            "pressure_file": first.get("pressure_file")}


def compiled(model: object) -> bool:
    """torch.compile in force: the model wrapped (an OptimizedModule), or modules of it compiled in place (regional
    compile: nn.Module.compile on each block)."""
    if hasattr(model, "_orig_mod"):
        return True
    modules = getattr(model, "modules", None)
    return callable(modules) and any(getattr(m, "_compiled_call_impl", None) is not None for m in modules())


def what_ran(model: object, opt: object, threads: int, autocast_dtype: Optional[str],
             maps_text: Optional[str] = None) -> Dict[str, Union[None, bool, int, str, List[int], List[str]]]:
    """This process's levers as in force (`threads`: torch's count): allocator and OpenMP mapped, threads, CPUs, dtype, optimizer, compile
    (`maps_text`: a recorded /proc/self/maps; None reads this process's)."""
    libs = parse_maps(read_self_maps() if maps_text is None else maps_text)
    alloc = None if libs.allocator == "glibc" else libs.allocator
    defaults = getattr(opt, "defaults", {}) or {}
    optimizer = type(opt).__name__.lower()
    if optimizer == "adamw":
        optimizer = "adamw_fused" if defaults.get("fused") else "adamw"
    graphs = None
    try:
        from torch._dynamo.utils import counters

        graphs = int(counters["stats"]["unique_graphs"])
    except Exception:  # a torch without dynamo's counters: the module type still says compiled
        pass
    parameters = getattr(model, "parameters", None)
    params = next(iter(parameters()), None) if callable(parameters) else None
    return {
        "allocator": alloc,
        "allocator_path": next((p for p in libs.paths if alloc and os.path.basename(p).startswith(f"lib{alloc}")), None),
        "openmp": libs.openmp,
        "threads": threads,
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "dtype": autocast_dtype or {"torch.float32": "fp32", "torch.bfloat16": "bf16"}.get(
            str(getattr(params, "dtype", "")), str(getattr(params, "dtype", None))),
        "optimizer": optimizer,
        "compile": compiled(model), "compiled_graphs": graphs,
        "ipex": "intel_extension_for_pytorch" in sys.modules,
    }


def autocast_dtype(torch: ModuleType) -> Optional[str]:
    """'bf16' / 'fp16' where CPU autocast is on in the calling code, else None."""
    try:
        on = torch.is_autocast_enabled("cpu")
        dtype = torch.get_autocast_dtype("cpu") if on else None
    except (TypeError, AttributeError):  # torch < 2.4: the CPU-specific calls
        on = torch.is_autocast_cpu_enabled()
        dtype = torch.get_autocast_cpu_dtype() if on else None
    if not on:
        return None
    return {str(torch.bfloat16): "bf16", str(torch.float16): "fp16"}.get(str(dtype), str(dtype))
