"""compat/cpu_peaks.toml: which CPU generations have a FLOPs-per-cycle row, the row and boost clock of one
CPU, what the data leaves out for want of a source, and the hardware peak (cores x FLOPs/cycle x clock, the MFU
denominator) from clocks given. Pure."""

from __future__ import annotations

import re
from typing import Any, FrozenSet, List, Mapping, Optional, Tuple, TypedDict, Union

from cpuperf.data import load_builtin
from cpuperf.jsonable import JsonObject
from cpuperf.knowledge.gpu import Peak

Number = Union[int, float]  # as the table writes it (32, or 2.5): shown as written


class _PeakRequired(TypedDict):
    match: List[str]
    variant: str
    source: str


class PeakRow(_PeakRequired, total=False):
    """A [[cpu]] row: the FLOPs per cycle per core of one generation's variant (no fp32/bf16: unsourced or emulated)."""

    model_name: List[str]
    fp32: Number
    bf16: Number


class BoostRow(TypedDict):
    """A [[boost]] row: a generation's highest rated boost clock, and its part."""

    ghz: Number
    part: str
    source: str


class UnsourcedRow(TypedDict):
    """An [[unsourced]] row: what the data leaves out about a CPU, and why."""

    kind: str  # flops_per_cycle | boost_clock
    what: str
    why: str


def _peak_row(row: Mapping[str, Any]) -> PeakRow:
    out: PeakRow = {"match": list(row["match"]), "variant": str(row["variant"]), "source": str(row["source"])}
    if "model_name" in row:
        out["model_name"] = list(row["model_name"])
    if "fp32" in row:
        out["fp32"] = row["fp32"]
    if "bf16" in row:
        out["bf16"] = row["bf16"]
    return out


def peak_generations() -> FrozenSet[str]:
    """Microarchitectures with a FLOPs-per-cycle row (any variant) in compat/cpu_peaks.toml."""
    return frozenset(name for row in load_builtin("cpu_peaks.toml").get("cpu", []) for name in row["match"])


def peak_row(microarchitecture: str, model_name: Optional[str]) -> Optional[PeakRow]:
    """The compat/cpu_peaks.toml row for this CPU: the first variant whose model_name pattern matches."""
    for row in load_builtin("cpu_peaks.toml").get("cpu", []):
        if microarchitecture not in row["match"]:
            continue
        patterns = row.get("model_name")
        if not patterns or any(re.search(p, model_name or "") for p in patterns):
            return _peak_row(row)
    return None


def _fits(row: Mapping[str, Any], microarchitecture: str, model_name: Optional[str]) -> bool:
    patterns = row.get("model_name")
    return microarchitecture in row["match"] and (not patterns or any(re.search(p, model_name or "") for p in patterns))


def boost_row(microarchitecture: str, model_name: Optional[str]) -> Optional[BoostRow]:
    """The compat/cpu_peaks.toml [[boost]] row for this CPU: its generation's highest rated boost clock."""
    return next((BoostRow(ghz=row["ghz"], part=str(row["part"]), source=str(row["source"]))
                 for row in load_builtin("cpu_peaks.toml").get("boost", []) if _fits(row, microarchitecture, model_name)),
                None)


def unsourced(microarchitecture: str, model_name: Optional[str]) -> List[UnsourcedRow]:
    """The [[unsourced]] rows for this CPU: what the data leaves out about it for want of a primary source."""
    return [UnsourcedRow(kind=str(row["kind"]), what=str(row["what"]), why=str(row["why"]))
            for row in load_builtin("cpu_peaks.toml").get("unsourced", []) if _fits(row, microarchitecture, model_name)]


def peak_data(microarchitecture: str, model_name: Optional[str]) -> JsonObject:
    """What compat/cpu_peaks.toml says about this CPU, for doctor: its FLOPs-per-cycle row, its highest rated
    clock row, and what it leaves out unsourced (each None / empty where the data has nothing)."""
    row, boost = peak_row(microarchitecture, model_name), boost_row(microarchitecture, model_name)
    return {"flops_per_cycle": None if row is None else {"variant": row["variant"], "fp32": row.get("fp32"),
                                                          "bf16": row.get("bf16"), "source": row["source"]},
            "boost_clock": None if boost is None else {"ghz": boost["ghz"], "part": boost["part"], "source": boost["source"]},
            "unsourced": [{"kind": r["kind"], "what": r["what"], "why": r["why"]}
                          for r in unsourced(microarchitecture, model_name)]}


def hardware_peak(microarchitecture: str, dtype: str, cores: int, model_name: Optional[str] = None,
                  nominal_hz: Optional[float] = None, measured_hz: Optional[float] = None,
                  nominal_from: str = "given",
                  achievable_tflops: Optional[float] = None,
                  guest: bool = False) -> Tuple[Optional[Peak], JsonObject]:
    """cores x FLOPs/cycle/core (this CPU's variant) x clock: the MFU denominator, and its parts.

    The clock is the higher of nominal and measured (a peak the run could beat is no peak); both are
    named. Where the GEMM measured on these cores (`achievable_tflops`) beats that peak, the cores run
    above those clocks (turbo, or a VM reporting its TSC): the generation's highest rated boost clock
    is used instead, named with its part; without one, no peak. On a virtual machine's guest (`guest`) the clocks
    read are the host's TSC rate, not the cores': the boost clock is used where the table has one, whatever one
    GEMM measured (a GEMM within noise of the TSC-clock peak flipped the denominator, and MFU 2x, between runs).
    (None, why) for a CPU or dtype the table has no peak for (emulated bf16 among them).
    """
    info: JsonObject = {"microarchitecture": microarchitecture, "model_name": model_name, "cores": cores,
                            "clock_nominal_ghz": round(nominal_hz / 1e9, 3) if nominal_hz else None,
                            "clock_nominal_from": nominal_from if nominal_hz else None,
                            "clock_measured_ghz": round(measured_hz / 1e9, 3) if measured_hz else None}
    row = peak_row(microarchitecture, model_name)
    if row is None:
        return None, {**info, "why_none": f"compat/cpu_peaks.toml has no row for {microarchitecture}"}
    per_cycle = row.get("bf16") if dtype == "bf16" else row.get("fp32") if dtype == "fp32" else None
    if per_cycle is None:
        gap = next((g for g in unsourced(microarchitecture, model_name) if g["kind"] == "flops_per_cycle"), None)
        why = (f"compat/cpu_peaks.toml has no {dtype} rate for {microarchitecture} (unsourced: {gap['what']})" if gap
               else f"{microarchitecture} has no native {dtype} (emulated): no hardware peak")
        return None, {**info, "variant": row["variant"], "why_none": why}
    clock = max(c for c in (nominal_hz, measured_hz, 0.0) if c is not None)
    if not clock:
        return None, {**info, "variant": row["variant"], "why_none": "the clock is unknown"}
    which = "nominal" if clock == nominal_hz else "measured"
    info.update(variant=row["variant"], flops_per_cycle=per_cycle)
    tflops = cores * per_cycle * clock / 1e12
    clocks = ", ".join(f"{k} {v / 1e9:.2f} GHz" for k, v in (("nominal", nominal_hz), ("measured", measured_hz)) if v)
    boost = boost_row(microarchitecture, model_name)
    if guest and boost is not None and boost["ghz"] * 1e9 > clock:
        clock, which = boost["ghz"] * 1e9, "boost"
        tflops = cores * per_cycle * clock / 1e12
        clocks += f", boost {boost['ghz']:.2f} GHz ({boost['part']}, the generation's highest)"
        info.update(clock_note="a virtual machine: the clocks it reports are its host's TSC rate, not what the cores run "
                               "at; the generation's highest rated boost clock is used instead",
                    clock_boost_ghz=boost["ghz"], clock_boost_part=boost["part"], clock_boost_source=boost["source"])
    if achievable_tflops is not None and achievable_tflops > tflops:
        beaten = (f"the GEMM measured on these {cores} core(s), {achievable_tflops * 1e3:.4g} GFLOP/s, beats "
                  f"{tflops * 1e3:.4g} at the {which} clock {clock / 1e9:.2f} GHz: the cores run faster than "
                  "the clocks reported (turbo, or a VM reporting its TSC)")
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
