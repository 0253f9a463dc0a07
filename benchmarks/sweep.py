"""The exhaustive sweep: dtype x compile x optimizer x allocator x ranks-times-threads x pinning, on this host.

Every lever is detected on the host first; a lever that does not exist here (no native bf16, no C
compiler for torch.compile, no allocator installed, one core) is pruned, and the results say why.
--full runs the whole product in every round. --quick does not screen it: the tuner's own path is its
screen (benchmarks/tuned.py), and config_for turns the tuner's points into suite configurations.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple


@dataclass
class Lever:
    name: str
    values: List[Any]
    pruned: Optional[str] = None  # why only the default value is swept here
    notes: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return {"values": [_label(self.name, v) for v in self.values], "pruned": self.pruned, "notes": self.notes}


def _label(lever: str, value: Any) -> str:
    if lever == "layout":
        return f"{value[0]}x{value[1]}"
    if lever == "compile":
        return "compile" if value else "eager"
    if lever == "pinning":
        return "pinned" if value else "unpinned"
    if lever == "optimizer":
        return value or "adamw"
    return str(value or "default")


def levers(facts: Any, full: bool) -> Dict[str, Lever]:
    """The levers this host has, each with the values to sweep (the first is the default's)."""
    from packaging.version import Version

    from cpuperf.decide.placement import plan_placement
    from cpuperf.knowledge.tuning import tuning
    from cpuperf.run.measure import allocator_libraries

    out: Dict[str, Lever] = {}
    dtype = Lever("dtype", ["fp32"])
    if facts.cpu.bf16_native:
        dtype.values.append("bf16")
    elif full:
        dtype.values.append("bf16")
        dtype.notes.append(f"bf16 is emulated on {facts.cpu.microarchitecture} (no avx512_bf16/AMX): swept, expect it slow")
    else:
        dtype.pruned = (f"{facts.cpu.microarchitecture} has no native bf16 (no avx512_bf16, AMX or Arm BF16): emulated "
                        "bf16 is several times slower than fp32 (--full sweeps it anyway)")
    out["dtype"] = dtype

    torch_info = facts.software.packages.get("torch") if facts.software else None
    compile_ = Lever("compile", [False])
    if torch_info is None:
        compile_.pruned = "torch is not installed"
    elif not (shutil.which("cc") or shutil.which("gcc") or shutil.which("g++")):
        compile_.pruned = "no C/C++ compiler on PATH: torch.compile's CPU backend (inductor) needs one"
    else:
        compile_.values.append(True)
    out["compile"] = compile_

    # AdamW's fused CPU kernel (torch >= the tuning table's version) against torch's default (foreach).
    optimizer = Lever("optimizer", [None])
    fused_min = tuning().optimizer.fused_cpu_min_torch
    if torch_info is None:
        optimizer.pruned = "torch is not installed"
    elif Version(torch_info.version).release < Version(fused_min).release:
        optimizer.pruned = f"torch {torch_info.version} has no fused AdamW on CPU (since {fused_min})"
    else:
        optimizer.values.append("adamw_fused")
    out["optimizer"] = optimizer

    libs = allocator_libraries(facts)
    alloc = Lever("allocator", [None, *sorted(libs)])
    if not libs:
        alloc.pruned = "no tcmalloc, jemalloc or mimalloc on this host (`cpuperf install` adds the mimalloc wheel)"
    out["allocator"] = alloc

    placement = plan_placement(facts)  # the host's cores, not today's load (probe_host without load)
    cores = max(1, placement.threads_per_rank * placement.nproc_per_node)
    layouts: List[Tuple[int, int]] = [(1, cores)]
    for ranks in range(2, cores + 1):
        if cores % ranks == 0:
            layouts.append((ranks, cores // ranks))
    logical = len(facts.usable_cpus())
    if logical > cores:
        layouts.append((1, logical))
    layout = Lever("layout", layouts)
    if len(layouts) == 1:
        layout.pruned = f"{cores} usable core(s): one rank with all of them is the only layout"
    out["layout"] = layout

    pinning = Lever("pinning", [False, True])
    if logical <= 1:
        pinning.values = [False]
        pinning.pruned = "one usable CPU: nothing to pin to"
    out["pinning"] = pinning
    return out


def cpu_slots(facts: Any, ranks: int, threads: int) -> List[List[int]]:
    """Each rank's CPUs: consecutive physical cores (one logical CPU per core unless SMT is swept)."""
    usable = list(facts.usable_cpus())
    per_core: Dict[Any, List[int]] = {}
    for cpu in facts.topology.cpus:
        if cpu.id in usable:
            per_core.setdefault((cpu.socket, cpu.core), []).append(cpu.id)
    firsts = [sorted(v)[0] for _, v in sorted(per_core.items())] or usable
    pool = firsts if ranks * threads <= len(firsts) else usable
    return [pool[r * threads:(r + 1) * threads] or pool[:threads] for r in range(ranks)]


def config_for(facts: Any, dtype: str, compile_: bool, allocator: Optional[str], layout: Tuple[int, int],
               pinned: bool, optimizer: Optional[str] = None) -> Dict[str, Any]:
    """One sweep point as a suite configuration (settings for cpuperf.train.bench, env, ranks, CPUs)."""
    from cpuperf.run.measure import allocator_env, allocator_libraries

    ranks, threads = layout
    env = {"OMP_NUM_THREADS": str(threads)}
    if allocator:
        env.update(allocator_env(allocator, allocator_libraries(facts)[allocator]))
    settings: Dict[str, Any] = {"dtype": dtype, "compile": compile_, "threads_per_rank": threads}
    if optimizer:
        settings["optimizer"] = optimizer
    slots = cpu_slots(facts, ranks, threads)
    if pinned:
        settings["cpus_per_rank"] = slots
    labels = [("dtype", dtype), ("compile", compile_)] + ([("optimizer", optimizer)] if optimizer else []) + \
        [("allocator", allocator), ("layout", layout), ("pinning", pinned)]
    name = " ".join(_label(k, v) for k, v in labels)
    return {"name": name, "env": env, "settings": settings, "ranks": ranks, "sweep": True,
            "point": {"dtype": dtype, "compile": compile_, "optimizer": optimizer, "allocator": allocator,
                      "ranks": ranks, "threads_per_rank": threads, "pinned": pinned}}


def product(facts: Any, found: Dict[str, Lever], with_compile: bool = True) -> List[Dict[str, Any]]:
    """Every combination of the levers' values (compile left out where with_compile is False)."""
    compiles = found["compile"].values if with_compile else [False]
    optimizers = found["optimizer"].values if "optimizer" in found else [None]
    return [config_for(facts, d, c, a, lay, p, o) for d, c, o, a, lay, p in itertools.product(
        found["dtype"].values, compiles, optimizers, found["allocator"].values, found["layout"].values,
        found["pinning"].values)]


def winnable(facts: Any, points: List[Dict[str, Any]], auto_point: Optional[Dict[str, Any]],
             gemm: Optional[Dict[str, float]] = None,
             not_with_ranks: Tuple[str, ...] = ()) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """--full's points less what this host cannot win or the engine never runs, each rule with its count and why:
    (kept, left out). `auto_point`: auto's point (sweep keys); `gemm`: the GEMM check's GFLOP/s per dtype."""
    usable = sorted(facts.usable_cpus())
    bf16_slow = bool(gemm and not facts.cpu.bf16_native and gemm.get("bf16") and gemm.get("fp32")
                     and gemm["bf16"] < gemm["fp32"])
    rules: List[Tuple[str, Callable[[Dict[str, Any]], bool], str]] = []
    if bf16_slow and gemm:
        rules.append(("bf16 emulated", lambda p: p["point"]["dtype"] == "bf16",
                      f"{facts.cpu.microarchitecture} has no native bf16 and the GEMM check measured bf16 "
                      f"{gemm['bf16']:.0f} against fp32 {gemm['fp32']:.0f} GFLOP/s ({gemm['fp32'] / gemm['bf16']:.0f}x "
                      "slower): a bf16 point cannot win"))
    rules.append(("pinned to every CPU", lambda p: bool(p["point"]["pinned"]) and all(
        sorted(s) == usable for s in p["settings"].get("cpus_per_rank") or [[]]),
        f"pinning a rank to all {len(usable)} usable CPUs is the unpinned run (the same affinity): its twin runs"))
    if not_with_ranks:
        rules.append(("allocator x ranks", lambda p: p["point"]["ranks"] > 1 and p["point"]["allocator"] in not_with_ranks,
                      f"cpuperf never preloads {'/'.join(not_with_ranks)} into a job of several ranks "
                      "(compat/tuning.toml not_with_ranks: aborts at exit measured): not a point auto could take"))
    if auto_point is not None:
        pinned_alone = auto_point["pinned"] and any(sorted(s) != usable for s in cpu_slots(
            facts, auto_point["ranks"], auto_point["threads_per_rank"]))
        twin = {**auto_point, "compile": True, "pinned": pinned_alone}
        rules.append(("compile", lambda p: bool(p["point"]["compile"]) and p["point"] != twin,
                      "compile runs at auto's own point only (its compiled twin, every round, its compile time carried "
                      "over the steps of the run auto plans, as the tuner counts it): a run that compiles spends tens of "
                      "seconds before its timed steps on 2 cores, and every compiled point would take one workload's "
                      "sweep past 20 minutes; the twin says whether compile gains where auto runs"))
    kept: List[Dict[str, Any]] = []
    left: Dict[str, Dict[str, Any]] = {}
    for p in points:
        hit = next(((name, why) for name, test, why in rules if test(p)), None)
        if hit is None:
            kept.append(p)
        else:
            entry = left.setdefault(hit[0], {"rule": hit[0], "why": hit[1], "points": 0})
            entry["points"] += 1
    return kept, list(left.values())
