"""What the worker really runs with: allowed CPUs, threads, OpenMP runtime, allocator.

`parse_maps()` is pure (tests feed recorded /proc/self/maps text); `runtime_report()` reads this
process ("inject or probe": pass the facts, or None to read them here). torch is imported only
inside runtime_report(), and only if the caller has already imported it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, Mapping, Optional, TypeVar

from cpuperf.knowledge.variables import variables
from cpuperf.probe.parse import LoadedLibs, parse_maps  # noqa: F401  (the worker reports them)


def compact_cpus(cpus: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (the cpuset list format)."""
    from cpuperf.probe.parse import format_cpulist

    return format_cpulist(cpus)


def native_bf16(cpuinfo_text: str) -> Optional[bool]:
    """True when the CPU flags include AVX512-BF16 or AMX-BF16 (bf16 matmuls in hardware).

    Without them oneDNN emulates bf16 and it runs many times slower than fp32 (measured ~15-25x
    on EPYC Zen 3). None when there is no flags line (not x86, or no /proc/cpuinfo).
    """
    for line in cpuinfo_text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return bool({"avx512_bf16", "amx_bf16"} & flags)
    return None


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def read_self_maps() -> str:
    """This process's /proc/self/maps ('' where the kernel will not give it): the libraries really mapped."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _affinity() -> Optional[list[int]]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def runtime_report(maps_text: Optional[str] = None, affinity: Optional[list[int]] = None,
                   environ: Optional[Mapping[str, str]] = None,
                   cpuinfo_text: Optional[str] = None) -> Dict[str, Any]:
    """A JSON-ready record of CPUs, threads, OpenMP runtime, allocator and tuning variables."""
    maps_text = read_self_maps() if maps_text is None else maps_text
    cpuinfo_text = _read_cpuinfo() if cpuinfo_text is None else cpuinfo_text
    affinity = _affinity() if affinity is None else affinity
    environ = os.environ if environ is None else environ
    libs = parse_maps(maps_text)
    report: Dict[str, Any] = {
        "pid": os.getpid(),
        "allowed_cpus": compact_cpus(affinity) if affinity else None,
        "n_allowed_cpus": len(affinity) if affinity else None,
        "os_cpu_count": os.cpu_count(),
        "openmp": libs.openmp,
        "allocator": libs.allocator,
        "native_bf16": native_bf16(cpuinfo_text),
        "libs": libs.paths,
        "env": {k: environ[k] for k in variables().names(report=True) if k in environ},
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        report["torch"] = {
            "version": torch.__version__,
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
            "cpu_capability": _safe(lambda: torch.backends.cpu.get_cpu_capability()),
            "mkldnn": _safe(lambda: bool(torch.backends.mkldnn.is_available())),
            "cuda": _safe(lambda: torch.version.cuda),
            "cuda_available": _safe(lambda: bool(torch.cuda.is_available())),
        }
        n = report["n_allowed_cpus"]
        if n and torch.get_num_threads() > n:
            report["warning"] = (f"torch uses {torch.get_num_threads()} threads on {n} allowed "
                                 "CPUs (oversubscribed)")
    return report


_T = TypeVar("_T")


def _safe(fn: Callable[[], _T]) -> Optional[_T]:
    try:
        return fn()
    except Exception:  # a probe must never fail the run
        return None
