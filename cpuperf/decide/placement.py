"""Where ranks and threads go: one owner for processes per node, threads per rank and pinning.

Pure over HostFacts. Rules: one rank per socket (or per NUMA node when asked); physical cores only
(SMT siblings add nothing to GEMM-bound training: torch's run_cpu uses physical cores by default);
only the CPUs this process may use (affinity ∩ cgroup cpuset); no more threads than the cgroup quota
or the Slurm allotment; on hybrid parts performance cores only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from cpuperf.decide.threads import threads_on
from cpuperf.errors import FieldError, UsageError
from cpuperf.jsonable import JsonObject, as_json
from cpuperf.probe.facts import HostFacts

# Oversubscribing past this many threads per CPU only thrashes (and can exhaust the process table).
OVERSUBSCRIBE_LIMIT = 4


@dataclass(frozen=True)
class Core:
    socket: int
    node: Optional[int]
    cpus: Tuple[int, ...]  # logical CPUs of this physical core that we may use, first = primary


@dataclass(frozen=True)
class RankSlot:
    local_rank: int
    socket: Optional[int]
    node: Optional[int]
    cpus: Tuple[int, ...]  # one logical CPU per physical core, compute + CCL workers
    compute_cpus: Tuple[int, ...]
    ccl_worker_cpus: Tuple[int, ...]
    threads: int


@dataclass(frozen=True)
class Placement:
    nproc_per_node: int
    unit: str  # 'socket' | 'numa' | 'cores'
    slots: Tuple[RankSlot, ...]
    ccl_workers: int
    cpu_budget: int  # physical cores we may keep busy, after quota and Slurm
    reasons: Tuple[str, ...]

    @property
    def threads_per_rank(self) -> int:
        return min(s.threads for s in self.slots) if self.slots else 1

    def to_json(self) -> JsonObject:
        return as_json(self)

    def json_computed(self) -> JsonObject:
        return {"threads_per_rank": self.threads_per_rank}


def usable_cores(facts: HostFacts) -> List[Core]:
    """Physical cores with at least one CPU we may use; efficient cores dropped on hybrid parts."""
    allowed = set(facts.usable_cpus())
    cores: Dict[Tuple[int, int], List[int]] = {}
    nodes: Dict[Tuple[int, int], Optional[int]] = {}
    types: Dict[Tuple[int, int], Optional[str]] = {}
    for cpu in facts.topology.cpus:
        if cpu.id not in allowed:
            continue
        key = (cpu.socket, cpu.core)
        cores.setdefault(key, []).append(cpu.id)
        nodes.setdefault(key, cpu.node)
        types.setdefault(key, cpu.core_type)
    keys = sorted(cores, key=lambda k: min(cores[k]))
    if any(types[k] == "performance" for k in keys):
        keys = [k for k in keys if types[k] != "efficient"]
    return [Core(socket=k[0], node=nodes[k], cpus=tuple(sorted(cores[k]))) for k in keys]


def cpu_budget(facts: HostFacts, cores: List[Core]) -> Tuple[int, List[str]]:
    """How many cores we may keep busy: usable physical cores, capped by quota and Slurm."""
    budget = len(cores)
    reasons = [f"{len(cores)} physical cores usable (affinity and cgroup cpuset applied, SMT siblings not counted)"]
    quota = facts.topology.cpu_quota
    if quota is not None and math.floor(quota) < budget:
        budget = max(1, math.floor(quota))
        reasons.append(f"cgroup CPU quota {quota:g} CPUs caps it at {budget}")
    slurm = facts.limits.slurm_cpus_per_task
    if slurm is not None and slurm < budget:
        budget = max(1, slurm)
        reasons.append(f"Slurm allots {slurm} CPUs per task")
    return max(1, budget), reasons


def default_nproc(facts: HostFacts, unit: str = "socket") -> int:
    """One rank per socket (or NUMA node with CPUs we may use)."""
    cores = usable_cores(facts)
    if unit == "numa":
        return max(1, len({c.node for c in cores if c.node is not None}) or 1)
    return max(1, len({c.socket for c in cores}))


def ccl_worker_count(cores_per_rank: int) -> int:
    from cpuperf.knowledge.tuning import tuning  # not on ccl-env's path of a remembered decision

    rule = tuning().ccl_workers
    if cores_per_rank >= rule.min_cores_for_default:
        return rule.default
    if cores_per_rank >= rule.min_cores_for_medium:
        return rule.medium
    return rule.small if cores_per_rank >= 2 else 0


def _groups(cores: List[Core], nproc: int, unit: str) -> List[List[Core]]:
    """Split cores into nproc groups along socket or NUMA boundaries where they line up."""
    def key(c: Core) -> Optional[int]:
        if unit == "socket":
            return c.socket
        return c.node if c.node is not None else c.socket

    by_unit: Dict[Optional[int], List[Core]] = {}
    for core in cores:
        by_unit.setdefault(key(core), []).append(core)
    units = [by_unit[k] for k in sorted(by_unit, key=lambda k: (k is None, k))]
    if len(units) == nproc:
        return units
    if len(units) > nproc and len(units) % nproc == 0:  # e.g. 4 NUMA nodes, 2 ranks
        per = len(units) // nproc
        return [sum(units[i * per:(i + 1) * per], []) for i in range(nproc)]
    # Otherwise split the ordered core list evenly (a rank never gets zero cores).
    per = len(cores) // nproc
    return [cores[i * per:(i + 1) * per] for i in range(nproc)]


def plan_placement(facts: HostFacts, nproc_per_node: Optional[int] = None, unit: str = "socket",
                   ccl: bool = False, nnodes: int = 1, threads_per_rank: Optional[int] = None,
                   oversubscribe: bool = False) -> Placement:
    """Ranks, their cores and thread counts for this host.

    `nproc_per_node` and `threads_per_rank` are the user's constraints when given: the cores are laid
    out around them, and a count the usable cores cannot hold is refused unless `oversubscribe`.
    """
    if unit not in ("socket", "numa"):
        raise UsageError(f"unknown placement unit {unit!r}", hint="use 'socket' or 'numa'")
    cores = usable_cores(facts)
    if not cores:
        # A snapshot without topology or a host that lies: still give one rank one thread.
        return Placement(1, "cores", (RankSlot(0, None, None, (), (), (), 1),), 0, 1,
                         ("no usable cores could be identified; one rank, one thread",))
    budget, reasons = cpu_budget(facts, cores)
    chosen_default = nproc_per_node is None
    nproc = default_nproc(facts, unit) if chosen_default else int(nproc_per_node or 1)
    _check_counts(facts, len(cores), nproc, threads_per_rank, oversubscribe)
    if nproc > len(cores):  # oversubscribed: ranks share cores, round robin
        cores = [cores[i % len(cores)] for i in range(nproc)]
    if budget < len(cores):
        # Quota/Slurm: keep the first `budget` cores, still split by unit.
        cores = cores[:max(budget, nproc)]
    groups = _groups(cores, nproc, unit)
    slots: List[RankSlot] = []
    per_rank_budget = max(1, budget // nproc)
    # oneCCL workers drive every collective, so they matter as soon as there is more than one rank
    # in the job, one rank per node across several nodes included.
    workers = ccl_worker_count(min(len(g) for g in groups)) if (ccl and nproc * max(1, nnodes) > 1) else 0
    for rank, group in enumerate(groups):
        slots.append(_slot(rank, group, workers, per_rank_budget, threads_per_rank))
    if threads_per_rank is not None:
        reasons.append(f"{threads_per_rank} thread(s) per rank, as asked")
    if chosen_default:
        reasons.append(f"one rank per {unit} with usable cores: {nproc}")
    else:
        reasons.append(f"{nproc} ranks per node, as asked")
    if workers:
        reasons.append(f"{workers} oneCCL worker core(s) per rank, taken from its compute threads")
    return Placement(nproc, unit if nproc > 1 else "cores", tuple(slots), workers, budget, tuple(reasons))


def _check_counts(facts: HostFacts, ncores: int, nproc: int, threads_per_rank: Optional[int], oversubscribe: bool) -> None:
    """The user's rank and thread counts against the usable cores and CPUs (a usage error where they cannot fit)."""
    if nproc < 1:
        raise FieldError("nproc_per_node", nproc, "{flag} must be at least 1")
    if nproc > ncores and not oversubscribe:
        raise FieldError("nproc_per_node", nproc, f"nproc_per_node {nproc} exceeds the {ncores} usable physical cores "
                         f"({len(facts.usable_cpus())} usable CPUs)",
                         f"use at most {ncores}, or {{set.oversubscribe}}=true to share cores", setting=True)
    if threads_per_rank is not None and not oversubscribe:
        logical = len(facts.usable_cpus())
        if threads_per_rank * nproc > logical:
            raise FieldError("threads_per_rank", threads_per_rank,
                             f"threads_per_rank {threads_per_rank} x {nproc} rank(s) exceeds the {logical} usable CPUs",
                             f"use at most {max(1, logical // nproc)} threads per rank, or {{set.oversubscribe}}=true",
                             setting=True)
    logical = max(1, len(facts.usable_cpus()))
    if oversubscribe and max(nproc, nproc * (threads_per_rank or 1)) > OVERSUBSCRIBE_LIMIT * logical:
        raise UsageError(f"{nproc} rank(s) x {threads_per_rank or 1} thread(s) is more than {OVERSUBSCRIBE_LIMIT}x "
                         f"the {logical} usable CPUs, even oversubscribed", hint=f"use at most {OVERSUBSCRIBE_LIMIT * logical} threads in all")


def _slot(rank: int, group: List[Core], workers: int, per_rank_budget: int, threads_per_rank: Optional[int]) -> RankSlot:
    """One rank's slot: its cores' first CPUs, the oneCCL workers' first, then compute threads."""
    primaries = tuple(c.cpus[0] for c in group)
    worker_cpus = primaries[:workers] if workers else ()
    compute = primaries[workers:] if workers else primaries
    threads = threads_on(len(compute), per_rank_budget - workers if workers else per_rank_budget)
    if threads_per_rank is not None:
        compute, threads = _fit_threads(group, compute, worker_cpus, threads_per_rank)
    sockets = {c.socket for c in group}
    nodes = {c.node for c in group}
    return RankSlot(rank, sockets.pop() if len(sockets) == 1 else None,
                    nodes.pop() if len(nodes) == 1 else None, primaries, compute, worker_cpus, threads)


def _fit_threads(group: List[Core], compute: Tuple[int, ...], worker_cpus: Tuple[int, ...],
                 threads: int) -> Tuple[Tuple[int, ...], int]:
    """A rank's CPUs for an asked thread count: its first cores, then their SMT siblings, then shared."""
    if threads <= len(compute):
        return compute[:threads], threads
    siblings = tuple(cpu for core in group for cpu in core.cpus if cpu not in worker_cpus)
    if threads <= len(siblings):
        return siblings[:threads], threads
    return siblings or compute, threads  # oversubscribed: more threads than CPUs, as asked


def gpu_placement(facts: HostFacts, gpu_nodes: Sequence[Optional[int]], workers_per_rank: int,
                  threads_per_rank: Optional[int] = None) -> Optional[Placement]:
    """One rank per GPU on the physical cores of its GPU's NUMA node (ranks whose GPUs share a node split its
    cores), each with its compute threads and `workers_per_rank` further cores for its data loader workers.
    None where a GPU's node is unknown or has no core this process may use: the caller keeps its own plan."""
    if not gpu_nodes or any(n is None for n in gpu_nodes):
        return None
    by_node: Dict[Optional[int], List[Core]] = {}
    for core in usable_cores(facts):
        by_node.setdefault(core.node, []).append(core)
    sharing: Dict[Optional[int], int] = {}
    for node in gpu_nodes:
        sharing[node] = sharing.get(node, 0) + 1
    taken: Dict[Optional[int], int] = {}
    slots: List[RankSlot] = []
    for rank, node in enumerate(gpu_nodes):
        share = len(by_node.get(node, [])) // sharing[node]
        if share < 1:
            return None
        first = taken.get(node, 0) * share
        taken[node] = taken.get(node, 0) + 1
        mine = by_node[node][first:first + share]
        workers = min(workers_per_rank, share // 2)  # at most half: the compute threads keep the other half
        threads = threads_per_rank or threads_on(share - workers)
        cpus = tuple(c.cpus[0] for c in mine)
        # The process may use all of its share: the compute threads' count leaves `workers` cores to the loaders.
        slots.append(RankSlot(rank, mine[0].socket, node, cpus, cpus, (), threads))
    nodes = sorted({n for n in gpu_nodes if n is not None})
    reason = (f"each rank on the cores of its GPU's NUMA node ({', '.join(f'node {n}' for n in nodes)}), "
              f"{min(s.threads for s in slots)} compute thread(s) each, the rest of its cores for its data loader workers")
    return Placement(len(gpu_nodes), "gpu-numa", tuple(slots), 0, sum(len(s.cpus) for s in slots), (reason,))


# -- the memory of one process over several NUMA nodes --------------------------------------------------------

@dataclass(frozen=True)
class MemoryPolicy:
    """The NUMA memory policy of a one-process job whose CPUs span several nodes (compat/tuning.toml [numa_memory])."""

    mode: str  # 'interleave'
    nodes: Tuple[int, ...]
    reason: str

    @property
    def numactl(self) -> Tuple[str, ...]:
        """numactl's options for it."""
        return (f"--{self.mode}=" + ",".join(str(n) for n in self.nodes),)

    def describe(self) -> str:
        return f"{self.mode} over NUMA nodes {','.join(str(n) for n in self.nodes)}"


def memory_policy(facts: HostFacts, placement: Placement, on_gpu: bool, auto: bool,
                  asked: object = "auto", tuned: Optional[Tuple[Optional[str], str]] = None
                  ) -> Tuple[Optional[MemoryPolicy], Optional[str]]:
    """(the policy, a note) for a job of one process per node: where its CPUs span several NUMA nodes, the rule's
    policy over them (--auto, or `asked` 'interleave' from --set numa_memory); `asked` None (--set numa_memory=none)
    opts out. Several ranks per node (each on its own socket or node), a GPU job, one node: no policy. `tuned`: a
    cached tuning's verdict (`train --tune` compared the policy with first touch: 'interleave' or None, and its
    reason), over the rule's, never over yours."""
    if asked is None or on_gpu or placement.nproc_per_node != 1 or not placement.slots or not (auto or asked != "auto"):
        return None, ("--set numa_memory=none: the process's pages land where first touched" if asked is None else None)
    node_of = {c.id: c.node for c in facts.topology.cpus}
    cpus = placement.slots[0].cpus or facts.usable_cpus()
    nodes = tuple(sorted({n for n in (node_of.get(c) for c in cpus) if n is not None}))
    if len(nodes) < 2:
        return None, ("--set numa_memory=interleave: this process's CPUs are on one NUMA node, nothing to interleave"
                      if asked == "interleave" else None)
    from cpuperf.knowledge.tuning import tuning

    rule = tuning().numa_memory
    if tuned is not None and asked == "auto":
        if tuned[0] is None:
            return None, f"numa_memory: first touch, {tuned[1]}"
        return MemoryPolicy(rule.policy, nodes, tuned[1]), None
    return MemoryPolicy(rule.policy, nodes, rule.reason), None
