"""Which allocator library a job preloads: THE rule, in one place (issue 54). Its data is compat/tuning.toml
[allocator], read once into `AllocatorRule`; every caller asks this module: recommend's decision
(`decide_allocator`), the runtime variables' preload (`preload_choice`, `preload_env`), the tuner's candidates
(`allocator_rule().not_with_ranks`) and the measurement (`allocator_rule().min_speedup`, `preload_env`); the
install plan reads the wheel to install from the same row. A newcomer changing an allocator rule edits this file
and that table, nothing else. Light: no engine, no TOML parsed at import."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.jsonable import JsonObject
from cpuperf.probe.facts import ALLOCATOR_LIBS, HostFacts

if TYPE_CHECKING:  # the records are the engine's: ccl-env's preload (every new shell) does without them
    from cpuperf.decide.records import AllocatorName, Decision, Measurements
    from cpuperf.knowledge.tuning import AllocatorRule

# Debug and profiler builds are never preloaded: they trade speed for checks.
_NOT_FOR_SPEED = ("debug", "profiler")


# The allocators cpuperf measures and preloads, in the order a preload without a decision falls back to (the probe's
# ALLOCATOR_LIBS, which names the files it looks for): every other module asks here for names and order.
ALLOCATORS: Tuple[str, ...] = tuple(ALLOCATOR_LIBS)


def allocator_names() -> str:
    """'tcmalloc, jemalloc or mimalloc': the allocators as a message names them."""
    return ", ".join(ALLOCATORS[:-1]) + " or " + ALLOCATORS[-1]


def library_stem(name: str) -> str:
    """The file name an allocator's library starts with in LD_PRELOAD ('libtcmalloc' for tcmalloc and its minimal
    build)."""
    return "lib" + name


def allocator_rule() -> AllocatorRule:
    """compat/tuning.toml [allocator], typed (cpuperf.knowledge.tuning reads the file)."""
    from cpuperf.knowledge.tuning import tuning  # not imported on ccl-env's path in every new shell

    return tuning().allocator


def install_hint() -> str:
    """How to get an allocator: the wheel without root, the system packages with it."""
    rule = allocator_rule()
    return f"`cpuperf install` adds the {rule.wheel} wheel (no root); system ones: {rule.system_install}"


def is_library_of(name: str, path: str) -> bool:
    """Whether `path` is a file of allocator `name`'s library (its name matches the probe's patterns)."""
    import fnmatch

    return any(fnmatch.fnmatch(os.path.basename(path), p) for p in ALLOCATOR_LIBS.get(name, ()))


def first_library(paths: Sequence[str]) -> Optional[str]:
    """The plainest of a library's files (libX.so before libX.so.2.1)."""
    ordered = sorted(paths, key=lambda p: (os.path.basename(p).count("."), p))
    return ordered[0] if ordered else None


def preloadable(paths: Sequence[str]) -> Optional[str]:
    """The library to LD_PRELOAD among an allocator's files: the full build, else the minimal one."""
    usable = [p for p in paths if not any(t in os.path.basename(p) for t in _NOT_FOR_SPEED)]
    full = [p for p in usable if "minimal" not in os.path.basename(p)]
    return first_library(full) or first_library(usable)


def not_with_ranks(names: Sequence[str], world: int) -> List[str]:
    """The allocators among `names` never preloaded into a job of `world` ranks (compat/tuning.toml
    [allocator] not_with_ranks: they aborted jobs of several ranks at exit)."""
    if world <= 1:
        return []
    refused = allocator_rule().not_with_ranks
    return sorted(n for n in names if n in refused)


def keeps_the_default(decision: Decision[Optional[AllocatorName]]) -> bool:
    """An allocator decision that keeps the default allocator on purpose: measured on this host (none beat the
    default by min_speedup, or the one that did may not run with several ranks), or your value. A preload asked for
    without a choice (`preload_choice`) then adds none; only a decision that measured nothing falls back."""
    return decision.value is None and (decision.overridden or "measured" in decision.evidence)


def preload_choice(decided: Optional[str], allocators: Mapping[str, Sequence[str]], world: int,
                   kept: bool = False) -> Optional[str]:
    """The allocator to preload: the decided one where its library is here, else none (`missing_here` says why:
    never another allocator nobody decided); without a decision (ccl-env --preload with nothing measured), the first
    installed in ALLOCATOR_LIBS's order that `world` ranks may preload; none where the decision kept the default
    (`kept`: `keeps_the_default`)."""
    if decided:
        return decided if preloadable(allocators.get(decided, ())) else None
    if kept:
        return None
    installed = [n for n in ALLOCATORS if preloadable(allocators.get(n, ()))]
    refused = not_with_ranks(installed, world)
    return next((n for n in installed if n not in refused), None)


def install_hint_for(name: str) -> str:
    """How to get one allocator: `cpuperf install` where the wheel ships it, else the system's packages."""
    rule = allocator_rule()
    if name == rule.wheel_allocator:
        return f"`cpuperf install` adds it (the {rule.wheel} wheel, no root)"
    return f"install it with the system's packages ({rule.system_install})"


def missing_here(decided: Optional[str], allocators: Mapping[str, Sequence[str]]) -> Optional[str]:
    """Why the decided allocator is not preloaded (its library is not found in this environment), with the fix; None
    where it is found or none was decided."""
    if not decided or preloadable(allocators.get(decided, ())):
        return None
    return (f"the plan decided {decided}, and its library ({library_stem(decided)}.so) is not found here: no allocator "
            f"is preloaded; {install_hint_for(decided)}")


def preload_env(name: str, library: str) -> Dict[str, str]:
    """What preloading `name` sets: LD_PRELOAD, and for jemalloc the MALLOC_CONF the launchers export."""
    env = {"LD_PRELOAD": library}
    if name == "jemalloc":
        env["MALLOC_CONF"] = allocator_rule().jemalloc_malloc_conf
    return env


def _by_workload(meas: Measurements, name: str) -> Dict[str, float]:
    """An allocator's measured ratios over the default, by reference workload ({} where none)."""
    got = meas.allocator_speedup.get(f"{name}_by_workload")
    return got if isinstance(got, dict) else {}


def _measured(meas: Measurements, available: Sequence[str], key: str) -> Dict[str, float]:
    """Each available allocator's measured ratio over the default on the workload `key` (an older cache without
    ratios by workload: the geometric mean)."""
    measured: Dict[str, float] = {}
    for name in available:
        by_workload = _by_workload(meas, name)
        ratio = by_workload.get(key) if by_workload else meas.allocator_speedup.get(name)
        if isinstance(ratio, (int, float)):
            measured[name] = float(ratio)
    return measured


def decide_allocator(facts: HostFacts, meas: Measurements, on_gpu: bool, family: str = "lm",
                     world: int = 1, dtype: str = "fp32", ranks_unknown: bool = False) -> Decision[Optional[AllocatorName]]:
    """The allocator to preload for a workload of this family: the measured best, only where it beats the
    default, and never one known to abort jobs of several ranks (`world` > 1) at exit.

    A bf16 plan reads the ratio measured under bf16 autocast (`lm-bf16`) where the host has one: the allocation
    pattern is another (on a Zen 4 VM mimalloc was 1.00x on the fp32 LM and 1.10x in bf16); else the fp32 one, and
    the reason says so."""
    from cpuperf.decide.records import Decision, as_allocator

    available: Dict[str, Tuple[str, ...]] = {}
    if facts.software is not None:
        available = {k: v for k, v in facts.software.allocators.items() if v}
    if on_gpu:
        return Decision("allocator", None, "host allocator does not matter for GPU training", {})
    if not available:
        return Decision("allocator", None, f"no {allocator_names()} found: " + install_hint(), {})
    rule = allocator_rule()
    in_dtype = f"{family}-{dtype}" if dtype != "fp32" else None
    if in_dtype and not any(in_dtype in _by_workload(meas, name) for name in available):
        in_dtype = None  # not measured in this dtype here: the fp32 figure, said
    key = in_dtype or family
    measured = _measured(meas, list(available), key)
    on = f"{family} reference workload" + (f" in {dtype} autocast" if in_dtype else
                                           f" in fp32 (not measured in {dtype} here)" if dtype != "fp32" else "")
    if measured:
        evidence: JsonObject = {"measured": {k: round(v, 3) for k, v in measured.items()}, "workload": key,
                                "by_workload": {k: dict(_by_workload(meas, k)) for k in measured},
                                "source": meas.source}
        figures = ", ".join(f"{k} {v:.2f}x" for k, v in sorted(measured.items(), key=lambda kv: -kv[1]))
        good = {k: v for k, v in measured.items() if v >= rule.min_speedup}
        unknown = ranks_unknown and world <= 1  # a launcher whose count cpuperf cannot tell may start several
        unsafe = not_with_ranks(list(good), 2 if unknown else world)
        if unsafe:
            evidence["not_with_ranks"] = {"allocators": list(unsafe), "world": None if unknown else world,
                                          "source": rule.not_with_ranks_source}
            good = {k: v for k, v in good.items() if k not in unsafe}
        ranks = "your launcher's rank count is unknown, and with several ranks" if unknown else f"with {world} ranks"
        not_here = (f"; not {', '.join(unsafe)}: {ranks} it aborted jobs at exit after training "
                    "(terminate called without an active exception; compat/tuning.toml)") if unsafe else ""
        if good:
            best = max(good, key=lambda k: good[k])
            return Decision("allocator", as_allocator(best), f"measured on the {on}: {figures} the default "
                            f"allocator: the fastest is preloaded{not_here}", evidence)
        if unsafe:
            return Decision("allocator", None, f"measured on the {on}: {figures} the default"
                            f"{not_here}: the default is kept", evidence)
        return Decision("allocator", None, f"measured on the {on}: {figures} the default; none "
                        f"beats it by {rule.min_speedup:.2f}x: the default is kept", evidence)
    noisy = [line for what, line in meas.undecided.items() if what.startswith("allocator") and what.endswith(family)]
    if noisy:
        return Decision("allocator", None, f"{', '.join(sorted(available))} installed; measured here, but {noisy[0]}",
                        {"available": list(sorted(available)), "undecided": list(noisy)})
    return Decision("allocator", None, f"{', '.join(sorted(available))} installed but unmeasured on this host: a fixed "
                    "preload lost 20% here before (run cpuperf bench to measure)", {"available": list(sorted(available))})
