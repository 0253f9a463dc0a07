"""The MFU denominator on CPUs: the sustained GEMM rate at the workload's own shapes, or a data peak.

A 0.3 s 512x512 torch.mm at start-up gave MFU 200.6% on one run and 17.8% on the next (issue 17):
too short to be stable and at shapes the model never runs. Here the peak is the rate of the model's
own linear layers (QKV, attention output, MLP up and down, LM head at batch x sequence rows) in the
dtype the run computes in, timed over several repeats; the median is the peak and the spread is
reported. The data peak (cores x FLOPs per cycle x clock, compat/cpu_peaks.toml) is the fallback
where measuring fails or is implausible. torch is imported inside functions only.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cpuperf.knowledge.gpu import Peak

Shape = Tuple[int, int, int]  # (m, k, n): an (m x k) @ (k x n) product


def workload_shapes(d_model: int, vocab: int, rows: int) -> List[Shape]:
    """The GEMMs of one transformer block plus the LM head, at `rows` = batch x sequence tokens."""
    d = d_model
    return [(rows, d, 3 * d), (rows, d, d), (rows, d, 4 * d), (rows, 4 * d, d), (rows, d, vocab)]


def measure_cpu_peak(shapes: Sequence[Shape], dtype: str, repeats: int = 5, seconds: float = 0.25,
                     max_rows: int = 4096) -> Peak:
    """Median GEMM rate over `repeats` timed runs of at least `seconds` each, at the given shapes."""
    import torch

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    g = torch.Generator().manual_seed(0)  # leave the training RNG streams alone
    # Rows are capped: the rate at 4096 rows is the rate at more (the product is already GEMM-bound).
    pairs = [(torch.randn(min(m, max_rows), k, dtype=tdt, generator=g), torch.randn(k, n, dtype=tdt, generator=g))
             for m, k, n in shapes]
    flops = sum(2.0 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs)
    for a, b in pairs:  # warm-up: oneDNN primitive creation
        torch.mm(a, b)
    rates: List[float] = []
    for _ in range(max(3, repeats)):
        n, t0 = 0, time.perf_counter()
        while True:
            for a, b in pairs:
                torch.mm(a, b)
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
        rates.append(flops * n / elapsed / 1e12)
    med = statistics.median(rates)
    spread = (max(rates) - min(rates)) / med if med > 0 else 0.0
    dims = ", ".join(f"{m}x{k}x{n}" for m, k, n in shapes)
    return Peak(float(f"{med:.4g}"), dtype,
                f"measured: sustained {dtype} GEMM at the workload's shapes ({dims}), median of {len(rates)} x "
                f"{seconds:g} s on {torch.get_num_threads()} thread(s): {min(rates):.4g}-{max(rates):.4g} TFLOP/s, "
                f"spread {spread * 100:.0f}%")


def _clock_hz(cpuinfo: Optional[str], max_freq_khz: Optional[str]) -> Optional[float]:
    if max_freq_khz and max_freq_khz.strip().isdigit():
        return int(max_freq_khz.strip()) * 1e3
    for line in (cpuinfo or "").splitlines():
        if line.lower().startswith("cpu mhz"):
            try:
                return float(line.split(":", 1)[1]) * 1e6
            except (IndexError, ValueError):
                return None
    return None


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def data_peak(microarchitecture: str, dtype: str, threads: int, clock_hz: Optional[float] = None) -> Optional[Peak]:
    """cores x FLOPs/cycle/core x clock from compat/cpu_peaks.toml; None for CPUs it does not list."""
    from cpuperf.data import load_builtin

    if clock_hz is None:
        clock_hz = _clock_hz(_read("/proc/cpuinfo"), _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"))
    if not clock_hz:
        return None
    for row in load_builtin("cpu_peaks.toml").get("cpu", []):
        if microarchitecture in row["match"]:
            per_cycle = row.get("bf16") if dtype == "bf16" else row.get("fp32")
            if per_cycle is None:
                return None
            tflops = threads * per_cycle * clock_hz / 1e12
            return Peak(float(f"{tflops:.4g}"), dtype, f"data: {threads} core(s) x {per_cycle} {dtype} FLOPs/cycle x "
                        f"{clock_hz / 1e9:.2f} GHz ({microarchitecture}; {row['source']})", card=microarchitecture)
    return None


def cpu_microarchitecture() -> str:
    """This CPU's microarchitecture, as cpuperf's probe names it ('unknown' when it cannot tell)."""
    try:
        from cpuperf.probe import probe_host

        return probe_host(software=False).cpu.microarchitecture
    except Exception:  # the report must never stop training
        return "unknown"


def cpu_peak(d_model: int, vocab: int, rows: int, dtype: str, threads: int) -> Peak:
    """The CPU MFU denominator: measured at the workload's shapes, or the data peak if that fails."""
    try:
        return measure_cpu_peak(workload_shapes(d_model, vocab, rows), dtype)
    except Exception as exc:  # a failed measurement falls back to data, and says so
        fallback = data_peak(cpu_microarchitecture(), dtype, threads)
        if fallback is None:
            raise
        return Peak(fallback.tflops, dtype, f"{fallback.source} (measuring failed: {type(exc).__name__})", fallback.card)


def bounded_mfu(achieved_tflops: Optional[float], peak: Optional[Peak], world: int,
                remeasure: Any = None, threads: int = 1) -> Tuple[Optional[float], Optional[Peak], Dict[str, Any]]:
    """MFU never above 100%: a peak below the achieved rate is wrong, so measure again or fall back.

    Returns (mfu, the peak used, notes for the report). `remeasure()` gives a longer measurement.
    """
    notes: Dict[str, Any] = {}
    if achieved_tflops is None or peak is None or peak.tflops <= 0:
        return None, peak, notes
    mfu = achieved_tflops / (peak.tflops * world)
    if mfu <= 1.0:
        return mfu, peak, notes
    notes["rejected_peak"] = peak.to_json()
    if remeasure is not None:
        again = remeasure()
        if again is not None and achieved_tflops / (again.tflops * world) <= 1.0:
            notes["peak_note"] = f"the first peak ({peak.tflops:g} TFLOP/s) was below the achieved rate: measured again"
            return achieved_tflops / (again.tflops * world), again, notes
    data = data_peak(cpu_microarchitecture(), peak.dtype, threads) if peak.dtype in ("fp32", "bf16") else None
    if data is not None and achieved_tflops / (data.tflops * world) <= 1.0:
        notes["peak_note"] = (f"the measured peak ({peak.tflops:g} TFLOP/s) was below the achieved rate "
                              f"({achieved_tflops / world:.4g} per rank): using the data peak")
        return achieved_tflops / (data.tflops * world), data, notes
    notes["peak_note"] = (f"no trustworthy peak: the measured {peak.tflops:g} TFLOP/s is below the achieved "
                          f"{achieved_tflops / world:.4g} per rank (host busy while measuring?): MFU not reported")
    return None, None, notes
