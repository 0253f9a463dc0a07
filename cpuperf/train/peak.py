"""MFU on CPUs: against the hardware peak, with the measured GEMM ceiling beside it as "% of achievable".

MFU divides by the hardware's peak, as nanoGPT and the GPU world do: cores x FLOPs per cycle for the
dtype (the CPU's variant in compat/cpu_peaks.toml) x clock, naming the clock used (nominal and
measured). No figure called MFU has a measured denominator. Beside it, the sustained GEMM rate at the
model's own linear layers (QKV, attention output, MLP up and down, LM head at batch x sequence rows)
in the dtype the run computes in, median over repeats with its spread: the achievable ceiling
(a 0.3 s 512x512 torch.mm once gave 200.6% and 17.8% on consecutive runs).
torch is imported inside functions only.
"""

from __future__ import annotations

import re
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


_GHZ_IN_NAME = re.compile(r"@\s*([0-9.]+)\s*GHz", re.I)


def nominal_clock_hz(cpuinfo: Optional[str], max_freq_khz: Optional[str]) -> Tuple[Optional[float], str]:
    """(Hz, where from): cpufreq's cpuinfo_max_freq (the highest clock the part runs), else the clock in
    the model name ('@ 2.60GHz', Intel's base clock); (None, ...) where neither says."""
    if max_freq_khz and max_freq_khz.strip().isdigit():
        return int(max_freq_khz.strip()) * 1e3, "cpufreq cpuinfo_max_freq"
    for line in (cpuinfo or "").splitlines():
        if line.lower().startswith("model name"):
            m = _GHZ_IN_NAME.search(line)
            if m:
                return float(m.group(1)) * 1e9, "the model name"
            break
    return None, "unknown"


def measured_clock_hz(cpuinfo: Optional[str], cpus: Optional[Sequence[int]] = None) -> Optional[float]:
    """The mean 'cpu MHz' /proc/cpuinfo reports for these CPUs now (all of them by default), in Hz."""
    rates: List[float] = []
    cpu: Optional[int] = None
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        try:
            if key == "processor":
                cpu = int(value)
            elif key == "cpu mhz" and (cpus is None or cpu in cpus):
                rates.append(float(value) * 1e6)
        except ValueError:
            continue
    return statistics.fmean(rates) if rates else None


def _clock_hz(cpuinfo: Optional[str], max_freq_khz: Optional[str]) -> Optional[float]:
    nominal, _ = nominal_clock_hz(cpuinfo, max_freq_khz)
    return nominal or measured_clock_hz(cpuinfo)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def peak_row(microarchitecture: str, model_name: Optional[str]) -> Optional[Dict[str, Any]]:
    """The compat/cpu_peaks.toml row for this CPU: the first variant whose model_name pattern matches."""
    from cpuperf.data import load_builtin

    for row in load_builtin("cpu_peaks.toml").get("cpu", []):
        if microarchitecture not in row["match"]:
            continue
        patterns = row.get("model_name")
        if not patterns or any(re.search(p, model_name or "") for p in patterns):
            return dict(row)
    return None


def boost_row(microarchitecture: str, model_name: Optional[str]) -> Optional[Dict[str, Any]]:
    """The compat/cpu_peaks.toml [[boost]] row for this CPU: its generation's highest rated boost clock."""
    from cpuperf.data import load_builtin

    for row in load_builtin("cpu_peaks.toml").get("boost", []):
        patterns = row.get("model_name")
        if microarchitecture in row["match"] and (not patterns or any(re.search(p, model_name or "") for p in patterns)):
            return dict(row)
    return None


def hardware_peak(microarchitecture: str, dtype: str, cores: int, model_name: Optional[str] = None,
                  nominal_hz: Optional[float] = None, measured_hz: Optional[float] = None,
                  nominal_from: str = "given",
                  achievable_tflops: Optional[float] = None) -> Tuple[Optional[Peak], Dict[str, Any]]:
    """cores x FLOPs/cycle/core (this CPU's variant) x clock: the MFU denominator, and its parts.

    The clock is the higher of nominal and measured (a peak the run could beat is no peak); both are
    named. Where the GEMM measured on these cores (`achievable_tflops`) beats that peak, the cores run
    above those clocks (turbo, or a VM reporting its TSC): the generation's highest rated boost clock
    is used instead, named with its part; without one, no peak. (None, why) for a CPU or dtype the
    table has no peak for (emulated bf16 among them).
    """
    info: Dict[str, Any] = {"microarchitecture": microarchitecture, "model_name": model_name, "cores": cores,
                            "clock_nominal_ghz": round(nominal_hz / 1e9, 3) if nominal_hz else None,
                            "clock_nominal_from": nominal_from if nominal_hz else None,
                            "clock_measured_ghz": round(measured_hz / 1e9, 3) if measured_hz else None}
    row = peak_row(microarchitecture, model_name)
    if row is None:
        return None, {**info, "why_none": f"compat/cpu_peaks.toml has no row for {microarchitecture}"}
    per_cycle = row.get("bf16") if dtype == "bf16" else row.get("fp32") if dtype == "fp32" else None
    if per_cycle is None:
        return None, {**info, "variant": row["variant"],
                      "why_none": f"{microarchitecture} has no native {dtype} (emulated): no hardware peak"}
    clock = max(c for c in (nominal_hz, measured_hz, 0.0) if c is not None)
    if not clock:
        return None, {**info, "variant": row["variant"], "why_none": "the clock is unknown"}
    which = "nominal" if clock == nominal_hz else "measured"
    info.update(variant=row["variant"], flops_per_cycle=per_cycle)
    tflops = cores * per_cycle * clock / 1e12
    clocks = ", ".join(f"{k} {v / 1e9:.2f} GHz" for k, v in (("nominal", nominal_hz), ("measured", measured_hz)) if v)
    if achievable_tflops is not None and achievable_tflops > tflops:
        beaten = (f"the GEMM measured on these {cores} core(s), {achievable_tflops * 1e3:.4g} GFLOP/s, beats "
                  f"{tflops * 1e3:.4g} at the {which} clock {clock / 1e9:.2f} GHz: the cores run faster than "
                  "the clocks reported (turbo, or a VM reporting its TSC)")
        boost = boost_row(microarchitecture, model_name)
        if boost is None or cores * per_cycle * boost["ghz"] * 1e9 / 1e12 < achievable_tflops:
            return None, {**info, "why_none": f"{beaten}, and compat/cpu_peaks.toml has no boost clock for "
                                              f"{microarchitecture} above it"}
        clock, which = boost["ghz"] * 1e9, "boost"
        tflops = cores * per_cycle * clock / 1e12
        clocks += f", boost {boost['ghz']:.2f} GHz ({boost['part']}, the generation's highest)"
        info.update(clock_note=f"{beaten}; the generation's highest rated boost clock is used instead",
                    clock_boost_ghz=boost["ghz"], clock_boost_part=boost["part"], clock_boost_source=boost["source"])
    info.update(clock_used=which, clock_used_ghz=round(clock / 1e9, 3))
    return Peak(float(f"{tflops:.4g}"), dtype,
                f"hardware: {cores} core(s) x {per_cycle} {dtype} FLOPs/cycle x {clock / 1e9:.2f} GHz ({which} clock; "
                f"{clocks}) - {microarchitecture}, {row['variant']}; {row['source']}", card=microarchitecture), info


def this_hardware_peak(dtype: str, cores: int, cpus: Optional[Sequence[int]] = None,
                       achievable_tflops: Optional[float] = None) -> Tuple[Optional[Peak], Dict[str, Any]]:
    """hardware_peak for this host: its microarchitecture, model name and clocks (read now)."""
    cpuinfo = _read("/proc/cpuinfo")
    nominal, nominal_from = nominal_clock_hz(cpuinfo, _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"))
    name = next((l.partition(":")[2].strip() for l in (cpuinfo or "").splitlines() if l.lower().startswith("model name")),
                None)
    return hardware_peak(cpu_microarchitecture(), dtype, cores, name, nominal, measured_clock_hz(cpuinfo, cpus),
                         nominal_from, achievable_tflops)


def data_peak(microarchitecture: str, dtype: str, threads: int, clock_hz: Optional[float] = None,
              model_name: Optional[str] = None) -> Optional[Peak]:
    """cores x FLOPs/cycle/core x clock from compat/cpu_peaks.toml; None for CPUs it does not list."""
    if clock_hz is None:
        clock_hz = _clock_hz(_read("/proc/cpuinfo"), _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"))
    peak, _ = hardware_peak(microarchitecture, dtype, threads, model_name, clock_hz)
    return peak


def cpu_microarchitecture() -> str:
    """This CPU's microarchitecture, as cpuperf's probe names it ('unknown' when it cannot tell)."""
    try:
        from cpuperf.probe import probe_host

        return probe_host(software=False).cpu.microarchitecture
    except Exception:  # the report must never stop training
        return "unknown"


def cpu_peak(d_model: int, vocab: int, rows: int, dtype: str, threads: int) -> Peak:
    """The achievable ceiling: the GEMM rate measured at the workload's shapes (never an MFU denominator)."""
    return measure_cpu_peak(workload_shapes(d_model, vocab, rows), dtype)


def cpu_mfu(achieved_tflops: Optional[float], hardware: Optional[Peak], achievable: Optional[Peak], world: int,
            remeasure: Any = None) -> Tuple[Optional[float], Optional[float], Optional[Peak], Dict[str, Any]]:
    """(MFU against the hardware peak, fraction of the achievable GEMM ceiling, the ceiling used, notes).

    MFU above 100% means the table row or the clock is wrong: not reported, and the note says so. A
    measured ceiling below the achieved rate was taken while the host was busy: measured again once.
    """
    notes: Dict[str, Any] = {}
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
                remeasure: Any = None, threads: int = 1,
                data_fallback: bool = True) -> Tuple[Optional[float], Optional[Peak], Dict[str, Any]]:
    """achieved / peak never above 100%: a peak below the achieved rate is wrong, so measure again or fall back.

    Returns (fraction, the peak used, notes for the report). `remeasure()` gives a longer measurement.
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
    data = data_peak(cpu_microarchitecture(), peak.dtype, threads) \
        if data_fallback and peak.dtype in ("fp32", "bf16") else None
    if data is not None and achieved_tflops / (data.tflops * world) <= 1.0:
        notes["peak_note"] = (f"the measured peak ({peak.tflops:g} TFLOP/s) was below the achieved rate "
                              f"({achieved_tflops / world:.4g} per rank): using the data peak")
        return achieved_tflops / (data.tflops * world), data, notes
    notes["peak_note"] = (f"no trustworthy peak: the measured {peak.tflops:g} TFLOP/s is below the achieved "
                          f"{achieved_tflops / world:.4g} per rank (host busy while measuring?): not reported")
    return None, None, notes
