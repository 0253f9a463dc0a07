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
    from cpuperf.knowledge.bf16 import bf16_native
    from cpuperf.knowledge.tuning import tuning
    from cpuperf.run.measure import allocator_libraries

    out: Dict[str, Lever] = {}
    dtype = Lever("dtype", ["fp32"])
    if bf16_native(facts):
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
    from cpuperf.knowledge.bf16 import bf16_native

    usable = sorted(facts.usable_cpus())
    bf16_slow = bool(gemm and not bf16_native(facts) and gemm.get("bf16") and gemm.get("fp32")
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


# -- Runtime levers: variables and thread counts that keep the math, each tried at auto's own point --------------
# Each point is auto's configuration with one change (variables added, another allocator, or fewer threads), judged
# against auto (or against its own baseline where the change needs another allocator: glibc's huge pages are judged
# against glibc), and where another point is the fairer rival, against that one too (`also`).

GOMP_POINTS: Tuple[Tuple[str, str], ...] = (
    # GNU libgomp (torch's CPU wheel ships it as torch/lib/libgomp.so.1): how an idle thread waits for the next
    # parallel region. Unset: it spins GOMP_SPINCOUNT (300000) rounds, then sleeps; PASSIVE never spins, ACTIVE
    # spins forever (gcc.gnu.org/onlinedocs/libgomp: OMP_WAIT_POLICY, GOMP_SPINCOUNT).
    ("OMP_WAIT_POLICY", "PASSIVE"), ("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "10000"))
THP_MIN_TORCH = "2.2"  # THP_MEM_ALLOC_ENABLE (c10/core/alloc_cpu.cpp), cherry-picked into release/2.2
GLIBC_HUGETLB_MIN = (2, 35)  # glibc.malloc.hugetlb (glibc 2.35 NEWS)
JEMALLOC_THP = "thp:always,metadata_thp:auto"  # jemalloc's opt.thp and opt.metadata_thp (jemalloc TUNING.md)
# Intel's libiomp5: how long (ms) a thread that finished its share spins before it sleeps. Unset: 200; 0 sleeps at
# once (as libgomp's PASSIVE); [kmp]'s value is what `--preload` sets (Intel OpenMP runtime reference: KMP_BLOCKTIME).
KMP_BLOCKTIME_DEFAULT = "200"
KMP_BLOCKTIMES = ("0",)  # tried beside the rule's value and the default


@dataclass(frozen=True)
class RuntimeHost:
    """What the runtime levers depend on, read once at the edge (runtime_host): the OpenMP runtimes found (name ->
    paths), the kernel's transparent-huge-page mode (always | madvise | never; None: unknown), glibc's version,
    the preloadable allocators (name -> library) and torch's version."""

    openmp: Dict[str, Tuple[str, ...]]
    thp: Optional[str]
    glibc: Optional[Tuple[int, int]]
    allocators: Dict[str, str]
    torch: Optional[str]


@dataclass(frozen=True)
class RuntimePoint:
    """One change to auto's point: `env` added to its variables (LD_PRELOAD's entry put first), `threads` per rank
    instead of auto's, or auto's allocator replaced (`allocator`, "" for glibc's malloc). `against`: the name of the
    configuration it is judged against; None for a baseline that is judged by nothing (glibc's malloc, the
    base of glibc's huge pages)."""

    lever: str  # openmp | thp | threads
    label: str
    env: Tuple[Tuple[str, str], ...] = ()
    threads: Optional[int] = None
    allocator: Optional[str] = None  # None: auto's; "": glibc's malloc; a name: that allocator
    against: Optional[str] = "auto"
    also: Tuple[str, ...] = ()  # further configurations it is judged against (the rival the plan would run instead)

    @property
    def name(self) -> str:
        return f"auto + {self.label}"


def _thp_mode(text: Optional[str]) -> Optional[str]:
    """The mode in brackets of /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never" -> madvise)."""
    if not text or "[" not in text:
        return None
    return text.split("[", 1)[1].split("]", 1)[0].strip() or None


def runtime_host(facts: Any) -> RuntimeHost:
    """The edge: this host's (or the facts' sysroot's) OpenMP runtimes, THP mode, glibc and allocators."""
    import os

    from cpuperf.run.measure import allocator_libraries

    root = getattr(facts, "sysroot", None) or ""
    try:
        with open(f"{root}/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = _thp_mode(f.read())
    except OSError:
        thp = None
    glibc: Optional[Tuple[int, int]] = None
    try:
        name, _, ver = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")  # "glibc 2.36"
        major, minor = ver.split(".")[:2]
        glibc = (int(major), int(minor)) if name == "glibc" else None
    except (ValueError, OSError, AttributeError):
        glibc = None
    sw = facts.software
    torch = sw.packages.get("torch") if sw else None
    return RuntimeHost({k: tuple(v) for k, v in (sw.openmp if sw else {}).items()}, thp, glibc,
                       dict(allocator_libraries(facts)), torch.version if torch else None)


def runtime_points(host: RuntimeHost, allocator: Optional[str], threads: int) -> Tuple[List[RuntimePoint], Dict[str, str]]:
    """The runtime levers' points at auto's point (its allocator, its threads per rank), and each lever (or part of
    one) this host cannot try, with why. Pure."""
    points: List[RuntimePoint] = []
    pruned: Dict[str, str] = {}
    _openmp_points(host, points, pruned)
    _allocator_points(host, allocator, points, pruned)
    _thp_points(host, allocator, points, pruned)
    fewer = sorted({t for t in (threads - 1, threads // 2) if 1 <= t < threads}, reverse=True)
    for t in fewer:
        points.append(RuntimePoint("threads", f"{t} thread(s)", (("OMP_NUM_THREADS", str(t)),), threads=t))
    if not fewer:
        pruned["threads"] = f"auto runs {threads} thread(s) per rank: no fewer to try"
    return points, pruned


def _openmp_points(host: RuntimeHost, points: List[RuntimePoint], pruned: Dict[str, str]) -> None:
    from cpuperf.knowledge.tuning import tuning

    passive: Tuple[str, ...] = ()
    if host.openmp.get("gomp"):
        points += [RuntimePoint("openmp", f"{k}={v}", ((k, v),)) for k, v in GOMP_POINTS]
        passive = ("auto + OMP_WAIT_POLICY=PASSIVE",)  # what a plan under load runs ([openmp_wait])
    else:
        pruned["openmp: GNU"] = ("no libgomp found: OMP_WAIT_POLICY and GOMP_SPINCOUNT as GNU's runtime reads them "
                                 "are not tried")
    iomp = next(iter(host.openmp.get("iomp") or ()), None)
    if iomp:
        # libiomp5 alone (its default KMP_BLOCKTIME, no KMP_AFFINITY); each blocktime; [kmp]'s pair as --preload
        # sets it. Each against auto (libgomp as torch ships it) and against libgomp sleeping at once (PASSIVE).
        kmp = tuning().kmp
        pre = ("LD_PRELOAD", iomp)
        alone = RuntimePoint("openmp", "libiomp5", (pre,), also=passive)
        points.append(alone)
        for t in sorted({*KMP_BLOCKTIMES, kmp.blocktime} - {KMP_BLOCKTIME_DEFAULT}, key=float):
            points.append(RuntimePoint("openmp", f"libiomp5 KMP_BLOCKTIME={t}", (pre, ("KMP_BLOCKTIME", t)),
                                       also=(alone.name, *passive)))
        points.append(RuntimePoint("openmp", f"libiomp5 KMP_BLOCKTIME={kmp.blocktime} KMP_AFFINITY={kmp.affinity}", (
            pre, ("KMP_BLOCKTIME", kmp.blocktime), ("KMP_AFFINITY", kmp.affinity)),
            also=(f"auto + libiomp5 KMP_BLOCKTIME={kmp.blocktime}", *passive)))
    else:
        pruned["openmp: Intel"] = ("no libiomp5 on this host (pip's intel-openmp ships it): KMP_BLOCKTIME and "
                                   "KMP_AFFINITY act on Intel's runtime only, and torch's CPU wheel runs GNU's libgomp")


def _allocator_points(host: RuntimeHost, allocator: Optional[str], points: List[RuntimePoint],
                      pruned: Dict[str, str]) -> None:
    """Each installed allocator other than auto's in its place (with the MALLOC_CONF the launchers export for
    jemalloc), against auto, and against mimalloc (the wheel `cpuperf install` adds) where that is installed; where
    auto preloads one, glibc's malloc against auto."""
    from cpuperf.decide.allocator import ALLOCATORS, allocator_rule

    wheel = allocator_rule().wheel_allocator
    rival = (f"auto + {wheel}",) if wheel in host.allocators and wheel != allocator else ()
    for name in ALLOCATORS:
        if name not in host.allocators:
            pruned[f"allocator: {name}"] = f"{name} is not installed here"
        elif name != allocator:
            points.append(RuntimePoint("allocator", name, allocator=name, also=() if name == wheel else rival))
    if allocator is not None:
        points.append(RuntimePoint("allocator", "glibc malloc", allocator=""))


def _thp_points(host: RuntimeHost, allocator: Optional[str], points: List[RuntimePoint], pruned: Dict[str, str]) -> None:
    from packaging.version import Version

    from cpuperf.knowledge.tuning import tuning

    if host.thp in (None, "never"):
        pruned["thp"] = ("the kernel gives no transparent huge pages (/sys/kernel/mm/transparent_hugepage/enabled: "
                         f"{host.thp or 'unreadable'}): no allocator can ask for them")
        return
    if host.torch and Version(host.torch).release >= Version(THP_MIN_TORCH).release:
        points.append(RuntimePoint("thp", "THP_MEM_ALLOC_ENABLE=1", (("THP_MEM_ALLOC_ENABLE", "1"),)))
    else:
        pruned["thp: torch"] = f"torch {host.torch or '(none)'} has no THP_MEM_ALLOC_ENABLE (from {THP_MIN_TORCH})"
    # Each allocator's own switch: at auto's allocator, judged against auto; elsewhere against that allocator.
    switches = {"jemalloc": (("MALLOC_CONF", tuning().allocator.jemalloc_malloc_conf.replace("metadata_thp:auto", "")
                              .strip(",") + "," + JEMALLOC_THP),),
                "mimalloc": (("MIMALLOC_ALLOW_LARGE_OS_PAGES", "1"),)}
    for name, env in switches.items():
        if name not in host.allocators:
            pruned[f"thp: {name}"] = f"{name} is not installed here: its huge-page switch ({env[0][0]}) is not tried"
        elif name == allocator:
            points.append(RuntimePoint("thp", f"{env[0][0]}={env[0][1]}", env))
        else:  # against that allocator without it (its point: _allocator_points)
            points.append(RuntimePoint("thp", f"{name} {env[0][0]}={env[0][1]}", env, allocator=name,
                                       against=f"auto + {name}"))
    if "tcmalloc" in host.allocators:
        pruned["thp: tcmalloc"] = ("gperftools' tcmalloc (Debian's libgoogle-perftools4) has no switch for "
                                   "transparent huge pages: only its allocator point is tried")
    if host.glibc is None or host.glibc < GLIBC_HUGETLB_MIN:
        pruned["thp: glibc"] = (f"glibc {'.'.join(map(str, host.glibc)) if host.glibc else '(not glibc)'} has no "
                                "glibc.malloc.hugetlb (from 2.35)")
        return
    env = (("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"),)
    if allocator is None:
        points.append(RuntimePoint("thp", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1", env))
    else:
        points.append(RuntimePoint("thp", "glibc malloc GLIBC_TUNABLES=glibc.malloc.hugetlb=1", env, allocator="",
                                   against="auto + glibc malloc"))


def select_points(points: List[RuntimePoint], wanted: List[str]) -> List[RuntimePoint]:
    """The points whose label holds any of `wanted` (all where it is empty), with every point they are judged
    against (so each kept point keeps its baselines), in their order. Pure."""
    if not wanted:
        return list(points)
    by_name = {p.name: p for p in points}
    keep = {p.name for p in points if any(w in p.label for w in wanted)}
    todo = list(keep)
    while todo:
        p = by_name[todo.pop()]
        for base in (p.against, *p.also):
            if base in by_name and base not in keep:
                keep.add(base)
                todo.append(base)
    return [p for p in points if p.name in keep]


def runtime_config(auto: Dict[str, Any], point: RuntimePoint, allocators: Dict[str, str]) -> Dict[str, Any]:
    """auto's configuration with the point's change, as a sweep configuration (checked as any: benchmarks.checks)."""
    from cpuperf.run.measure import allocator_env

    decisions = auto.get("decisions") or {}
    env = {k: v for k, v in (auto.get("env") or {}).items()}
    allocator = decisions.get("allocator")
    if point.allocator is not None:  # another allocator than auto's: its preload instead
        for k in ("LD_PRELOAD", "MALLOC_CONF"):
            env.pop(k, None)
        allocator = point.allocator or None
        if allocator:
            env.update(allocator_env(allocator, allocators[allocator]))
    for k, v in point.env:
        env[k] = v + ":" + env[k] if k == "LD_PRELOAD" and env.get(k) else v
    settings = dict(auto.get("settings") or {})
    if point.threads is not None:
        settings["threads_per_rank"] = point.threads
        if settings.get("cpus_per_rank"):
            settings["cpus_per_rank"] = [list(cpus)[:point.threads] for cpus in settings["cpus_per_rank"]]
    from benchmarks.suite import sweep_point_of

    base = sweep_point_of(decisions)
    return {"name": point.name, "env": env, "settings": settings, "ranks": auto.get("ranks") or 1, "sweep": True,
            "point": {**base, "allocator": allocator, "threads_per_rank": point.threads or base["threads_per_rank"],
                      "runtime": point.label},
            "lever": point.lever, "against": point.against, "also": list(point.also)}


def lever_verdicts(configs: List[Dict[str, Any]], rounds: List[Dict[str, Dict[str, Any]]],
                   confidence: float, resolution: float) -> List[Dict[str, Any]]:
    """Each runtime point against each configuration it is judged against (`against`, then `also`, where it ran),
    round by round (the two in the same round: one ratio a round), by cpuperf.decide.judge.paired against 1.0: won,
    lost, even, or undecided. Pure."""
    from benchmarks.checks import counted
    from cpuperf.decide.judge import paired

    names = {c["name"] for c in configs}
    out: List[Dict[str, Any]] = []
    for c in configs:
        if not c.get("lever") or not c.get("against"):
            continue
        for against in [c["against"], *(a for a in c.get("also") or () if a in names)]:
            pairs = [a / b for a, b in ((counted(r.get(c["name"])), counted(r.get(against))) for r in rounds) if a and b]
            v = paired(pairs, 1.0, confidence, resolution=resolution)
            out.append({"lever": c["lever"], "point": c["point"]["runtime"], "against": against,
                        "outcome": VERDICT_WORDS[v.outcome], "verdict": v.to_json(),
                        "pairs": [round(x, 4) for x in pairs]})
    return out


VERDICT_WORDS = {"above": "won", "below": "lost", "even": "even", "undecided": "undecided"}
