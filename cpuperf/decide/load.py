"""Other runnable work on the CPUs a job would use: a doctor finding, and fewer threads per rank when the user
asks plans to adapt to it (--adapt-to-load; load changes from second to second, so it is never a silent input).

Pure over LoadFacts (cpuperf.probe.load). An OpenMP team waits at every barrier for its slowest
thread, so a rank with one thread on a CPU another process keeps busy runs at the speed of that
shared CPU: measured on a shared 2-core host, 2 threads gave 12.8-15.0 samples/s and 1 thread 53-55.
The rule: compute threads go only to the CPUs others leave free (at least one per rank).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.decide.findings import Finding
from cpuperf.decide.placement import Placement
from cpuperf.decide.threads import threads_on
from cpuperf.jsonable import JsonObject
from cpuperf.knowledge.tuning import tuning
from cpuperf.probe.facts import HostFacts, LoadFacts


def busy_threshold() -> float:
    return float(tuning().load.busy_cpu_fraction)


def job_cpus(placement: Placement) -> Tuple[int, ...]:
    """The CPUs the ranks would compute on."""
    return tuple(c for s in placement.slots for c in (s.compute_cpus or s.cpus))


def taken_cpus(load: Optional[LoadFacts], cpus: Sequence[int]) -> Dict[int, float]:
    """{cpu: busy fraction} of the CPUs in `cpus` that others kept busy over the window."""
    if load is None or load.cpu_busy is None:
        return {}
    threshold = busy_threshold()
    busy = load.busy()
    return {c: busy[c] for c in cpus if busy.get(c, 0.0) >= threshold}


def describe(load: LoadFacts, taken: Mapping[int, float]) -> str:
    """'CPU 1 100% busy with other work over 0.34 s; load average 5.7, 8 runnable besides cpuperf; ...'."""
    parts: List[str] = []
    if taken:
        cpus = ", ".join(f"CPU {c} {v * 100:.0f}%" for c, v in sorted(taken.items()))
        parts.append(f"{cpus} busy with other work over {load.window_s:.2f} s")
    if load.loadavg_1m is not None:
        runnable = f", {load.runnable_others:g} runnable besides cpuperf" if load.runnable_others is not None else ""
        parts.append(f"load average {load.loadavg_1m:g}{runnable}")
    if load.psi_some_avg10 is not None:
        parts.append(f"CPU pressure {load.psi_some_avg10:g}% (some avg10, {load.psi_source})")
    return "; ".join(parts)


def evidence(load: Optional[LoadFacts], taken: Mapping[int, float]) -> JsonObject:
    if load is None:
        return {}
    return {"load": {"busy_cpus": {str(c): v for c, v in sorted(taken.items())}, "window_s": load.window_s,
                     "loadavg_1m": load.loadavg_1m, "runnable_others": load.runnable_others,
                     "psi_some_avg10": load.psi_some_avg10, "source": load.source}}


def adjust_placement(placement: Placement, load: Optional[LoadFacts],
                     yours: bool = False) -> Tuple[Placement, JsonObject, Optional[str]]:
    """Drop CPUs others keep busy from each rank's compute CPUs (at least one stays); fewer threads.

    Returns the placement (unchanged when nothing is busy or the user set threads or affinity: `yours`), the
    evidence for the threads decision (the measured figures, also when nothing changed) and a note
    when load was seen but the user's setting stands.
    """
    cpus = job_cpus(placement)
    taken = taken_cpus(load, cpus)
    ev = evidence(load, taken)
    if load is None or not taken:
        return placement, ev, None
    if yours:
        return placement, ev, f"other runnable load on the job's CPUs ({describe(load, taken)}); your --set stands"
    busy = load.busy()
    slots = []
    for slot in placement.slots:
        compute = tuple(slot.compute_cpus or slot.cpus)
        free = tuple(c for c in compute if c not in taken) or (min(compute, key=lambda c: busy.get(c, 0.0)),)
        slots.append(dataclasses.replace(slot, compute_cpus=free, threads=threads_on(len(free), slot.threads)))
    before = placement.threads_per_rank
    new = dataclasses.replace(placement, slots=tuple(slots))
    where = "the free CPUs" if any(c not in taken for c in cpus) else "the least busy CPU (none is free)"
    why = (f"other runnable load: {describe(load, taken)}; {new.threads_per_rank} thread(s) per rank on "
           f"{where} instead of {before}")
    # The last reason names the rank count (recommend reads it for nproc_per_node): keep it last.
    new = dataclasses.replace(new, reasons=placement.reasons[:-1] + (why,) + placement.reasons[-1:])
    load_ev = ev.get("load")
    if isinstance(load_ev, dict):
        load_ev["threads_without_load"] = before
    return new, ev, None


def check_load(facts: HostFacts) -> List[Finding]:
    """Doctor: other runnable load on the CPUs the job would use, with the figure and the fix."""
    from cpuperf.decide.placement import plan_placement

    load = facts.load
    if load is None:
        return []
    placement = plan_placement(facts)
    cpus = job_cpus(placement)
    taken = taken_cpus(load, cpus)
    crowded = (load.cpu_busy is None and load.runnable_others is not None
               and load.runnable_others >= max(1, len(facts.usable_cpus())) * busy_threshold())
    if not taken and not crowded:
        return []
    adjusted, _, _ = adjust_placement(placement, load)
    fix = (f"stop the other work on those CPUs, or train on the rest: plans ignore load unless asked, and with "
           f"--adapt-to-load (train, recommend, ccl-env) they use {adjusted.threads_per_rank} thread(s) per rank while it "
           "lasts (or --set threads_per_rank=N); a cached measurement taken now is flagged: cpuperf bench --refresh on "
           "the quiet host")
    return [Finding("cpu-load", "warning",
                    f"other runnable load on the CPUs the job would use ({len(cpus)} CPU(s)): {describe(load, taken)}",
                    fix)]
