"""MFU on CPUs: against the hardware peak, with the measured GEMM ceiling beside it as "% of achievable".

MFU divides by the hardware's peak, as nanoGPT and the GPU world do: cores x FLOPs per cycle for the
dtype (the CPU's variant in compat/cpu_peaks.toml, knowledge/cpu_peaks.py) x clock (probe/clocks.py),
naming the clock used (nominal and measured). No figure called MFU has a measured denominator. Beside it, the sustained GEMM rate at the
model's own linear layers (QKV, attention output, MLP up and down, LM head at batch x sequence rows)
in the dtype the run computes in, median over repeats with its spread: the achievable ceiling
(a 0.3 s 512x512 torch.mm once gave 200.6% and 17.8% on consecutive runs).
torch is imported inside functions only.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from cpuperf.knowledge.cpu_peaks import hardware_peak
from cpuperf.knowledge.gpu import Peak
from cpuperf.probe.clocks import cpu_is_guest, cpu_microarchitecture, read_clocks

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


def this_hardware_peak(dtype: str, cores: int, cpus: Optional[Sequence[int]] = None,
                       achievable_tflops: Optional[float] = None) -> Tuple[Optional[Peak], Dict[str, Any]]:
    """hardware_peak for this host: its microarchitecture, model name and clocks (read now)."""
    clocks = read_clocks(cpus)
    return hardware_peak(cpu_microarchitecture(), dtype, cores, clocks.model_name, clocks.nominal_hz,
                         clocks.measured_hz, clocks.nominal_from, achievable_tflops, guest=cpu_is_guest())


def data_peak(microarchitecture: str, dtype: str, threads: int, clock_hz: Optional[float] = None,
              model_name: Optional[str] = None) -> Optional[Peak]:
    """cores x FLOPs/cycle/core x clock from compat/cpu_peaks.toml; None for CPUs it does not list."""
    if clock_hz is None:
        clock_hz = read_clocks().best_hz
    peak, _ = hardware_peak(microarchitecture, dtype, threads, model_name, clock_hz)
    return peak


def cpu_peak(d_model: int, vocab: int, rows: int, dtype: str, threads: int) -> Peak:
    """The achievable ceiling: the GEMM rate measured at the workload's shapes (never an MFU denominator)."""
    return measure_cpu_peak(workload_shapes(d_model, vocab, rows), dtype)


def cpu_mfu(achieved_tflops: Optional[float], hardware: Optional[Peak], achievable: Optional[Peak], world: int,
            remeasure: Optional[Callable[[], Peak]] = None
            ) -> Tuple[Optional[float], Optional[float], Optional[Peak], Dict[str, object]]:
    """(MFU against the hardware peak, fraction of the achievable GEMM ceiling, the ceiling used, notes).

    MFU above 100% means the table row or the clock is wrong: not reported, and the note says so. A
    measured ceiling below the achieved rate was taken while the host was busy: measured again once.
    """
    notes: Dict[str, object] = {}
    mfu = None
    if achieved_tflops is not None and hardware is not None and hardware.tflops > 0:
        mfu = achieved_tflops / (hardware.tflops * world)
        if mfu > 1.0:
            notes["mfu_note"] = (f"{mfu * 100:.0f}% of the hardware peak is impossible: the table row or clock "
                                 f"is wrong for this CPU ({hardware.source[:80]}): MFU not reported")
            mfu = None
    frac, ceiling, more = bounded_mfu(achieved_tflops, achievable, world, remeasure, data_fallback=False)
    notes.update({k.replace("peak", "achievable"): v for k, v in more.items()})
    return mfu, frac, ceiling, notes


def bounded_mfu(achieved_tflops: Optional[float], peak: Optional[Peak], world: int,
                remeasure: Optional[Callable[[], Peak]] = None, threads: int = 1,
                data_fallback: bool = True) -> Tuple[Optional[float], Optional[Peak], Dict[str, object]]:
    """achieved / peak never above 100%: a peak below the achieved rate is wrong, so measure again or fall back.

    Returns (fraction, the peak used, notes for the report). `remeasure()` gives a longer measurement.
    """
    notes: Dict[str, object] = {}
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
    data = data_peak(cpu_microarchitecture(), peak.dtype, threads) \
        if data_fallback and peak.dtype in ("fp32", "bf16") else None
    if data is not None and achieved_tflops / (data.tflops * world) <= 1.0:
        notes["peak_note"] = (f"the measured peak ({peak.tflops:g} TFLOP/s) was below the achieved rate "
                              f"({achieved_tflops / world:.4g} per rank): using the data peak")
        return achieved_tflops / (data.tflops * world), data, notes
    notes["peak_note"] = (f"no trustworthy peak: the measured {peak.tflops:g} TFLOP/s is below the achieved "
                          f"{achieved_tflops / world:.4g} per rank (host busy while measuring?): not reported")
    return None, None, notes
