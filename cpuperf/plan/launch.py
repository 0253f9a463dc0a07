"""plan_launch(): the exact argv, environment and per-rank pinning of a training job; execute() runs it.

Pure planning over HostFacts + Recommendation (+ hosts, the launcher environment, the MPI launcher the edge
found): one process run directly (pinned in a preexec), several ranks on one node through torchrun or mpirun (Open MPI vs
Intel MPI/MPICH hydra argv), several nodes through a hostfile (torchrun c10d per node, or mpirun from
the first node) or a Slurm allocation (srun). Each rank is pinned by `python -m cpuperf.run.rankexec`,
which reads its local rank from the launcher and a slot table from CPUPERF_RANK_SLOTS. The runtime
variables (OMP_NUM_THREADS, CCL_*, KMP_*, I_MPI_PIN_DOMAIN, MASTER_*, GLOO_SOCKET_IFNAME, LD_PRELOAD)
are decided by cpuperf.decide.runtime_env, never here.

The edge (subprocess, signals, /proc) lives in cpuperf/run/launcher.py, each rank in cpuperf/run/rankexec.py.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from cpuperf.boundary import DEFAULT_MASTER_PORT, RANK_LOGDIR, RANK_PIDDIR, RANK_SLOTS, RDZV_TIMEOUT
from cpuperf.decide.allocator import ALLOCATORS
from cpuperf.decide.placement import MemoryPolicy, Placement
from cpuperf.decide.threads import threads_on
from cpuperf.errors import ExitCode, FieldError
from cpuperf.jsonable import NOT_IN_JSON, as_json
from cpuperf.knowledge.variables import variables
from cpuperf.probe.facts import HostFacts
from cpuperf.probe.slurm import NO_SLURM, SlurmFacts

if TYPE_CHECKING:
    from cpuperf.decide.runtime_env import EnvVar
    from cpuperf.plan.user_launcher import LauncherRanks
    from cpuperf.probe.hosts import Host

SCHEMA = "cpuperf.launch/1"
LAUNCHERS = ("direct", "torchrun", "mpirun", "srun")
# A user's launcher's ranks given their thread counts, with pinning decided against.
UNPINNED_RANKS = ("each rank's thread count set by a per-rank step keyed on its local rank; its CPUs left as your "
                  "launcher sets them (the OS scheduler's under torchrun)")
SLOTS_VAR = RANK_SLOTS  # JSON slot table read by cpuperf.run.rankexec
LOGDIR_VAR = RANK_LOGDIR  # where rankexec writes rank<R>.log and rank<R>.pid
PIDDIR_VAR = RANK_PIDDIR  # a user's launcher: rankexec writes only rank<L>.pid here (output stays theirs)
RDZV_TIMEOUT_VAR = RDZV_TIMEOUT  # the worker's init_process_group bound (cpuperf.train.loop)
DEFAULT_RDZV_TIMEOUT_S = 300  # --rdzv-timeout: how long node 0 waits for the others to join


@dataclass(frozen=True)
class RankSpec:
    """One local rank: the CPUs it is pinned to and its thread count (None = leave as is)."""

    local_rank: int
    cpus: Tuple[int, ...]
    threads: Optional[int]


@dataclass(frozen=True)
class LaunchPlan:
    launcher: str  # direct | torchrun | mpirun | srun
    flavour: Optional[str]  # openmpi | intelmpi | mpich | slurm | torchrun | None
    argv: Tuple[str, ...]  # the command cpuperf runs on this node
    env: Dict[str, str]  # variables set on top of the current environment
    env_reasons: Dict[str, str]  # name -> why
    per_rank: Tuple[RankSpec, ...]  # local ranks of this node
    nproc_per_node: int
    nnodes: int
    node_rank: int
    hosts: Tuple[str, ...]
    master_addr: Optional[str]
    master_port: Optional[int]
    affinity: Optional[Tuple[int, ...]]  # direct launch: pinned in the child before exec
    log_dir: Optional[str]
    rank_command: Tuple[str, ...]  # what each rank finally runs (after rankexec)
    notes: Tuple[str, ...] = ()
    node_commands: Tuple[str, ...] = ()  # torchrun multi-node: the command to start on every node
    yours: Optional[LauncherRanks] = None  # the user's own launcher (its JSON: LauncherRanks' fields)
    pid_dir: Optional[str] = None  # where each rank's pid file appears (rank<R>.pid), read by the watcher
    # argv makes its own session (the user's command behind `setsid`): started in none of cpuperf's, since setsid(1)
    # leading a process group forks and its parent exits at once (cpuperf.plan.command.CommandLine.own_session)
    own_session: bool = field(default=False, metadata=NOT_IN_JSON)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def to_json(self) -> Dict[str, object]:
        return as_json(self)

    def json_computed(self) -> Dict[str, object]:
        return {"world_size": self.world_size, "command": shell_line(self.argv, {})}


def shell_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """A copy-pasteable line: VAR=value ... argv."""
    prefix = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in argv)


# -- the launcher ----------------------------------------------------------------------------------

def choose_launcher(asked: Optional[str], world: int, nnodes: int, slurm_nodes: Optional[int],
                    mpi: Optional[Tuple[str, str]]) -> Tuple[str, str]:
    """(launcher, why)."""
    if asked is not None:
        if asked not in LAUNCHERS[1:]:
            raise FieldError("launcher", asked, "{flag} {value!r}: use torchrun, mpirun or srun")
        if asked == "mpirun" and mpi is None:
            raise FieldError("launcher", asked, "{typed}, but no Open MPI, Intel MPI or MPICH mpirun was found",
                             "apt-get install openmpi-bin, or use {flag} torchrun", code=ExitCode.LAUNCH_FAILED)
        return asked, "as asked"
    if world <= 1:
        return "direct", "one process: run directly, pinned, no launcher"
    if slurm_nodes is not None:
        return "srun", f"inside a Slurm allocation of {slurm_nodes} node(s): srun starts the ranks"
    return "torchrun", ("torchrun (ships with torch): one per node with c10d rendezvous" if nnodes > 1
                        else "torchrun --standalone (ships with torch)")


# -- the plan --------------------------------------------------------------------------------------

def rank_specs(placement: Placement, pin: bool, threads: Optional[int]) -> Tuple[RankSpec, ...]:
    """Local ranks: their compute CPUs (pin=False: none) and the one thread count (decide.threads.rank_threads;
    None: torch's own, even where pinned)."""
    specs = []
    for slot in placement.slots:
        cpus = tuple(slot.compute_cpus or slot.cpus) if pin else ()
        specs.append(RankSpec(slot.local_rank, cpus, threads))
    return tuple(specs)


def slot_table(specs: Sequence[RankSpec]) -> str:
    return json.dumps([{"cpus": list(s.cpus), "threads": s.threads} for s in specs], separators=(",", ":"))


@dataclass(frozen=True)
class LaunchSpec:
    """What a launch is asked for besides the host and the placement (plan_launch).

    nnodes: the job's node count, decided by cpuperf.decide.nodes; slurm: the Slurm job cpuperf runs in.
    env_vars: cpuperf.decide.runtime_env EnvVar records (already merged by the caller into name -> value order);
    pin: pin ranks to their slot CPUs; threads: each rank's count (decide.threads.rank_threads; None: torch's own).
    rdzv_timeout: seconds the rendezvous may take (torchrun's join_timeout; the ranks' process group).
    numa_binding: GPU ranks bound by torchrun to their GPU's NUMA node (--numa-binding=node; see numa_binding_ok).
    yours: the user's own launcher (cpuperf.plan.user_launcher.LauncherRanks): cpuperf runs that command
    directly; `placement` then holds its ranks, placed through the per-rank step already in rank_command.
    """

    rank_command: Sequence[str]
    env_vars: Sequence[EnvVar] = ()
    launcher: Optional[str] = None
    hosts: Optional[Sequence[Host]] = None
    nnodes: int = 1
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    pin: bool = True
    threads: Optional[int] = None
    log_dir: Optional[str] = None
    environ: Optional[Mapping[str, str]] = None
    euid: int = 1000
    python: Optional[str] = None
    local_addr: Optional[str] = None
    job_id: str = "cpuperf"
    rdzv_timeout: Optional[float] = None
    yours: Optional[LauncherRanks] = None
    slurm: SlurmFacts = NO_SLURM
    numa_binding: bool = False
    opens_session: bool = False  # rank_command makes its own session (the user's command behind `setsid`)
    memory_policy: Optional[MemoryPolicy] = None  # one process over several NUMA nodes (decide.placement.memory_policy)


def plan_launch(facts: HostFacts, placement: Placement, spec: LaunchSpec, *,
                mpi: Optional[Tuple[str, str]]) -> LaunchPlan:
    """The launch of `spec.rank_command` on `placement.nproc_per_node` ranks per node over `spec.nnodes` nodes.
    `mpi`: the MPI launcher the edge found on this host, (path, flavour) or None (cpuperf.probe.software.mpi_flavour,
    asked once by cpuperf.run.edge.gather)."""
    rank_command, env_vars, launcher, hosts = spec.rank_command, spec.env_vars, spec.launcher, spec.hosts
    nnodes, node_rank, master_addr, master_port = spec.nnodes, spec.node_rank, spec.master_addr, spec.master_port
    pin, threads, log_dir, environ, euid = spec.pin, spec.threads, spec.log_dir, spec.environ, spec.euid
    python, local_addr, job_id, rdzv_timeout = spec.python, spec.local_addr, spec.job_id, spec.rdzv_timeout
    yours, slurm, numa_binding = spec.yours, spec.slurm, spec.numa_binding
    if yours is not None:  # cpuperf runs your launcher's command as it is
        return replace(_plan_yours(placement, yours, rank_command, env_vars, pin, threads, log_dir, environ or {}),
                       own_session=spec.opens_session)
    environ = environ or {}
    nproc = placement.nproc_per_node
    _check_rdzv_timeout(rdzv_timeout)
    _check_rank0_known(nnodes, hosts, slurm.allocation, master_addr)
    world = nproc * nnodes
    chosen, why = choose_launcher(launcher, world, nnodes, slurm.allocation, mpi)
    specs = rank_specs(placement, pin, threads)
    env, reasons = _base_env(env_vars, world)
    notes: List[str] = [f"launcher: {why}"]
    _rankexec_env(chosen, env, reasons, specs, log_dir)
    job = _Job(python or sys.executable, placement, tuple(rank_command), nnodes, _node_rank(node_rank, nnodes),
               env.get("MASTER_ADDR", master_addr), int(env["MASTER_PORT"]) if "MASTER_PORT" in env else master_port,
               master_port, job_id, local_addr, rdzv_timeout, tuple(h.name for h in hosts) if hosts else (),
               hosts, euid, environ, slurm, mpi, numa_binding)
    start = _start(chosen, job, specs, env, reasons, notes)
    if chosen == "direct" and spec.memory_policy is not None:
        start = start._replace(argv=_with_memory_policy(start.argv, spec.memory_policy, facts, notes))
    if world > 1:
        _rendezvous_env(env, reasons, chosen, start.addr, start.port, rdzv_timeout)
    return LaunchPlan(launcher=chosen, flavour=start.flavour, argv=start.argv, env=env, env_reasons=reasons,
                      per_rank=specs, nproc_per_node=nproc, nnodes=nnodes, node_rank=job.node_rank,
                      hosts=job.host_names, master_addr=start.addr if world > 1 else None,
                      master_port=start.port if world > 1 else None, affinity=start.affinity, log_dir=log_dir,
                      rank_command=job.cmd, notes=tuple(notes), node_commands=start.node_commands,
                      pid_dir=log_dir if chosen != "direct" else None,
                      own_session=spec.opens_session and chosen == "direct")  # else a launcher starts it, in its own


def _with_memory_policy(argv: Tuple[str, ...], policy: MemoryPolicy, facts: HostFacts,
                        notes: List[str]) -> Tuple[str, ...]:
    """The one process started under numactl with its memory policy, where numactl is installed; else said."""
    numactl = facts.software.numactl if facts.software is not None else None
    if not numactl:
        notes.append(f"memory: {policy.describe()} not applied: numactl is not installed "
                     "(apt-get install numactl, or dnf install numactl)")
        return argv
    notes.append(f"memory: {policy.describe()} (numactl {' '.join(policy.numactl)}): {policy.reason}")
    return (numactl, *policy.numactl, *argv)


class _Job(NamedTuple):
    """What every launcher's start reads: this node's part of the job, and how its ranks meet."""

    python: str
    placement: Placement
    cmd: Tuple[str, ...]
    nnodes: int
    node_rank: int
    addr: Optional[str]  # the rendezvous address and port the environment already names, else the options'
    port: Optional[int]
    master_port: Optional[int]  # --master-port as given
    job_id: str
    local_addr: Optional[str]
    rdzv_timeout: Optional[float]
    host_names: Tuple[str, ...]
    hosts: Optional[Sequence[Host]]
    euid: int
    environ: Mapping[str, str]
    slurm: SlurmFacts
    mpi: Optional[Tuple[str, str]]
    numa_binding: bool  # torchrun binds GPU ranks to their GPU's NUMA node


def _start(chosen: str, job: _Job, specs: Sequence[RankSpec], env: Dict[str, str], reasons: Dict[str, str],
           notes: List[str]) -> _Start:
    """How the chosen launcher starts this node's ranks (each through cpuperf's per-rank step but a direct one)."""
    rankexec = (job.python, "-m", "cpuperf.run.rankexec", "--")
    nproc = job.placement.nproc_per_node
    if chosen == "direct":
        return _Start(job.cmd, None, job.addr, job.port, _direct_rank(specs, env, reasons))
    if chosen == "torchrun":
        base, port, addr = _torchrun_base(job)
        if job.numa_binding:
            base.append("--numa-binding=node")
            notes.append("torchrun binds each rank to the CPUs of its GPU's NUMA node (--numa-binding=node)")
        return _Start((*base, *rankexec[1:], *job.cmd), "torchrun", addr, port,
                      node_commands=_torchrun_notes(job.nnodes, job.host_names, port, env, reasons, notes))
    if chosen == "mpirun":
        assert job.mpi is not None  # choose_launcher checked
        base = _mpirun_base(job, *job.mpi, env, notes)
        return _Start((*base, *rankexec, *job.cmd), job.mpi[1], job.addr, job.port)
    return _Start(_srun_argv(job.nnodes, nproc, (*rankexec, *job.cmd)), "slurm",
                  _slurm_master(job.addr, job.nnodes, job.slurm, env, reasons), job.port)


class _Start(NamedTuple):
    """How this node starts its ranks: the launcher's argv and flavour, the rendezvous address and port,
    the CPUs of a direct launch, what each node runs (torchrun over several nodes)."""

    argv: Tuple[str, ...]
    flavour: Optional[str]
    addr: Optional[str]
    port: Optional[int]
    affinity: Optional[Tuple[int, ...]] = None
    node_commands: Tuple[str, ...] = ()


def _srun_argv(nnodes: int, nproc: int, rank_command: Sequence[str]) -> Tuple[str, ...]:
    """srun starts every rank of the allocation; cpuperf's per-rank step pins them (srun's binding off)."""
    return ("srun", f"--nodes={nnodes}", f"--ntasks-per-node={nproc}", f"--ntasks={nnodes * nproc}",
            "--cpu-bind=none", "--kill-on-bad-exit=1", "--export=ALL", *rank_command)


def _node_rank(node_rank: Optional[int], nnodes: int) -> int:
    """This node's rank among the job's nodes (0 unless given); a rank outside them is a usage error."""
    rank = 0 if node_rank is None else node_rank
    if not 0 <= rank < max(1, nnodes):
        raise FieldError("node_rank", rank, f"{{typed}} is outside 0..{nnodes - 1}")
    return rank


def _check_rdzv_timeout(rdzv_timeout: Optional[float]) -> None:
    if rdzv_timeout is not None and not (math.isfinite(rdzv_timeout) and 0 < rdzv_timeout <= 7 * 86400):
        raise FieldError("rdzv_timeout", rdzv_timeout, "{typed}: give seconds, more than 0 and at most a week")


def _rankexec_env(chosen: str, env: Dict[str, str], reasons: Dict[str, str], specs: Sequence[RankSpec],
                  log_dir: Optional[str]) -> None:
    """What cpuperf.run.rankexec reads in each rank a launcher starts: its slot, and where its log goes (a direct
    launch has no per-rank step: nothing)."""
    if chosen == "direct":
        return
    env[SLOTS_VAR] = slot_table(specs)
    reasons[SLOTS_VAR] = "per-rank CPUs and threads for cpuperf.run.rankexec (by local rank)"
    if log_dir:
        env[LOGDIR_VAR] = log_dir
        reasons[LOGDIR_VAR] = "each rank's output goes to rank<R>.log here"


def _direct_rank(specs: Sequence[RankSpec], env: Dict[str, str], reasons: Dict[str, str]) -> Optional[Tuple[int, ...]]:
    """One rank run directly: the CPUs cpuperf pins it to (None: unpinned), its OpenMP threads in env."""
    affinity = specs[0].cpus if specs and specs[0].cpus else None
    if specs and specs[0].threads is not None:
        env["OMP_NUM_THREADS"] = str(specs[0].threads)
        reasons.setdefault("OMP_NUM_THREADS", "the rank's physical cores")
    return affinity


def _rendezvous_env(env: Dict[str, str], reasons: Dict[str, str], chosen: str, addr: Optional[str],
                    port: Optional[int], rdzv_timeout: Optional[float]) -> None:
    """Several ranks: where they meet (torchrun sets its own) and how long forming the group may take."""
    if chosen != "torchrun":
        env.setdefault("MASTER_ADDR", addr or "127.0.0.1")
        env.setdefault("MASTER_PORT", str(port or DEFAULT_MASTER_PORT))
    env[RDZV_TIMEOUT_VAR] = _seconds(rdzv_timeout)
    reasons[RDZV_TIMEOUT_VAR] = "how long the ranks' process group may take to form (--rdzv-timeout)"


def _crowded(theirs: str, ranks: int, placement: Placement, threads: Optional[int]) -> List[str]:
    """A note where the user's OMP_NUM_THREADS, which cpuperf keeps, gives the node more compute threads than it
    has cores: the threads then take turns on the cores. The value stays theirs; the note says what would fit."""
    first = theirs.split(",", 1)[0].strip()  # OpenMP also takes a list, one count per nesting level
    if not first.isdigit() or placement.cpu_budget < 1:
        return []
    total = int(first) * ranks
    if total <= placement.cpu_budget:
        return []
    fits = threads or threads_on(placement.threads_per_rank, placement.cpu_budget // ranks)
    return [f"your OMP_NUM_THREADS={first} x {ranks} rank(s) = {total} compute threads on {placement.cpu_budget} "
            f"physical core(s): they take turns on the cores; OMP_NUM_THREADS={fits} (cpuperf's plan) gives each "
            "thread a core of its own"]


def _plan_yours(placement: Placement, yours: LauncherRanks, rank_command: Sequence[str], env_vars: Sequence[EnvVar], pin: bool,
                threads: Optional[int], log_dir: Optional[str], environ: Mapping[str, str]) -> LaunchPlan:
    """The user's launcher, run directly. Placed: the launcher itself on all the ranks' CPUs, each rank
    narrowed to its slot by the per-rank step (several ranks) and OMP_NUM_THREADS = its share. Not placed:
    no pinning and no thread variables at all, so the launcher's own defaults stand."""
    env, reasons = _base_env(env_vars, max(1, yours.count or 1))
    for name in variables().names(launch=True):  # your launcher's rendezvous stays yours
        env.pop(name, None)
        reasons.pop(name, None)
    # Placed: pinned and given thread counts, or (pinning decided against) thread counts alone.
    placed = bool(yours.place) and (pin or threads is not None)
    specs = rank_specs(placement, pin, threads) if placed else tuple(
        RankSpec(r, (), None) for r in range(max(1, yours.count or 1)))
    notes = [f"launcher: yours ({yours.launcher}); {yours.count if yours.count is not None else 'an unknown number of'} "
             f"rank(s) from {yours.source}; cpuperf adds no launcher of its own", *yours.notes]
    affinity: Optional[Tuple[int, ...]] = None
    # The user's own thread count, where the plan keeps it (merged env) or set in front of the launcher: every
    # rank gets it, so no per-rank value of ours replaces it.
    theirs = yours.user_threads or (environ.get("OMP_NUM_THREADS") if env.get("OMP_NUM_THREADS")
                                                      == environ.get("OMP_NUM_THREADS") else None)
    if placed:
        affinity = tuple(sorted({c for s in specs for c in s.cpus})) or None
        share = threads
        if theirs:
            specs = tuple(RankSpec(s.local_rank, s.cpus, None) for s in specs)
            cpus = len(specs[0].cpus) if specs and specs[0].cpus else 0
            notes.append(f"your OMP_NUM_THREADS={theirs} is kept: each rank runs {theirs} thread(s) "
                         + (f"on its {cpus} CPU(s)" if cpus else "on the CPUs the OS scheduler gives it"))
            notes.extend(_crowded(theirs, len(specs), placement, threads))
            env["OMP_NUM_THREADS"] = theirs
        elif share:
            env["OMP_NUM_THREADS"] = str(share)
            reasons["OMP_NUM_THREADS"] = f"each of your launcher's {len(specs)} rank(s) computes on {share} core(s) of its own"
        if len(specs) > 1:
            env[SLOTS_VAR] = slot_table(specs)
            reasons[SLOTS_VAR] = "per-rank CPUs and threads, applied by the per-rank step (cpuperf.run.rankexec) by local rank"
            if log_dir:
                env[PIDDIR_VAR] = log_dir
                reasons[PIDDIR_VAR] = "each rank records its pid here, so cpuperf can check what it runs with"
        notes.append(f"placement: {yours.why if pin else UNPINNED_RANKS}")
    else:
        # the variables that place threads: set only where cpuperf places the ranks
        for name in variables().names(lever=("threads_per_rank", "affinity")):
            env.pop(name, None)
            reasons.pop(name, None)
        if theirs or environ.get("OMP_NUM_THREADS"):
            notes.append(f"your OMP_NUM_THREADS={theirs or environ['OMP_NUM_THREADS']} reaches every rank unchanged")
            notes.extend(_crowded(theirs or environ["OMP_NUM_THREADS"], max(1, yours.count or 1), placement, threads))
        notes.append(f"placement: {yours.why}" if pin or not yours.place
                     else "placement: plain run (no --auto): your launcher's own")
    n = len(specs)
    return LaunchPlan(launcher="direct", flavour=yours.launcher, argv=tuple(rank_command), env=env, env_reasons=reasons,
                      per_rank=specs, nproc_per_node=n, nnodes=max(1, yours.nodes), node_rank=0, hosts=(),
                      master_addr=None, master_port=None, affinity=affinity, log_dir=log_dir, rank_command=tuple(rank_command),
                      notes=tuple(notes), yours=yours, pid_dir=log_dir if placed and n > 1 else None)




def _torchrun_notes(nnodes: int, host_names: Sequence[str], port: Optional[int], env: Dict[str, str],
                    reasons: Dict[str, str], notes: List[str]) -> Tuple[str, ...]:
    """What to start on each node (several nodes); on one node without a port, torchrun picks its own."""
    if nnodes > 1:
        notes.append(f"start the same `cpuperf train` on each of the {nnodes} nodes with --node-rank 0..{nnodes - 1}")
        return tuple(f"node {host_names[r] if r < len(host_names) else r}: cpuperf train ... --node-rank {r}"
                     for r in range(nnodes))
    if port is None:
        for name in variables().names(launch=True, runtime="torch-distributed"):  # torchrun --standalone sets its own
            env.pop(name, None)
            reasons.pop(name, None)
        notes.append("rendezvous: torchrun --standalone picks a free port (pass --master-port to fix one)")
    return ()


def _base_env(env_vars: Sequence[EnvVar], world: int) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(name -> value, name -> why) of the plan's runtime variables; one rank drops the rendezvous ones."""
    env = {var.name: var.value for var in env_vars}
    reasons = {var.name: var.reason for var in env_vars}
    if world <= 1:
        # No process group: the rendezvous variables would only confuse a user's script.
        for name in variables().names(several_ranks=True):
            env.pop(name, None)
            reasons.pop(name, None)
    return env, reasons

def _check_rank0_known(count: int, hosts: Optional[Sequence[Host]], slurm_nodes: Optional[int],
                       master_addr: Optional[str]) -> None:
    """Several nodes are refused where nothing says where rank 0 is."""
    if count > 1 and not hosts and slurm_nodes is None and master_addr is None:
        raise FieldError("nnodes", count, f"{count} nodes need a hostfile, a Slurm allocation or {{opt.master_addr}}",
                         "pass {opt.hostfile} FILE (first host = rank 0)")


def _mpirun_base(job: _Job, path: str, flavour: str, env: Mapping[str, str], notes: List[str]) -> List[str]:
    """mpirun's own argv (Open MPI, or Intel MPI / MPICH hydra), exporting the plan's env to every rank;
    over several nodes it starts them all from here (said in `notes`)."""
    nproc, nnodes, hosts, environ = job.placement.nproc_per_node, job.nnodes, job.hosts, job.environ
    world = nproc * nnodes
    if nnodes > 1:
        notes.append("mpirun starts every node's ranks from here (passwordless ssh to each host)")
    if flavour == "openmpi":
        base = [path, "-np", str(world), "--bind-to", "none", "--map-by", "slot"]
        if job.euid == 0:
            base.append("--allow-run-as-root")  # Open MPI refuses root without it
        if nproc > job.placement.cpu_budget:
            base.append("--oversubscribe")  # Open MPI counts one slot per core
        if hosts and nnodes > 1:
            base += ["--host", ",".join(f"{h.name}:{nproc}" for h in hosts[:nnodes])]
        for k in env:
            base += ["-x", f"{k}={env[k]}"]
        for k in variables().names(forward=True):
            if k in environ and k not in env:
                base += ["-x", k]  # remote ranks need the same interpreter and packages
        return base
    base = [path, "-n", str(world), "-ppn", str(nproc)]
    if hosts and nnodes > 1:
        base += ["-hosts", ",".join(h.name for h in hosts[:nnodes])]
    for k in env:
        base += ["-genv", k, env[k]]
    for k in variables().names(forward=True, type="path_list"):  # the search paths
        if k in environ and k not in env:
            base += ["-genv", k, environ[k]]
    if flavour == "intelmpi" and "I_MPI_PIN_DOMAIN" not in env:
        base += ["-genv", "I_MPI_PIN", "0"]  # rankexec pins; Intel MPI's own pinning would fight it
    return base


def _slurm_master(addr: Optional[str], nnodes: int, slurm: SlurmFacts, env: Dict[str, str],
                  reasons: Dict[str, str]) -> Optional[str]:
    """Inside an allocation of several nodes, rank 0 runs on its first node: that is the rendezvous."""
    if addr not in (None, "127.0.0.1") or nnodes <= 1:
        return addr
    first = slurm.nodes[:1]
    if first:
        env["MASTER_ADDR"] = first[0]
        reasons["MASTER_ADDR"] = "the first node of the Slurm allocation (rank 0 runs there)"
        return first[0]
    return addr

def numa_binding_ok(torch_version: Optional[str]) -> bool:
    """Whether the installed torch's torchrun has --numa-binding (compat/launchers.toml [torchrun])."""
    from packaging.version import Version

    from cpuperf.data import load_builtin
    from cpuperf.versions import base_or_none

    v = base_or_none(torch_version)
    return v is not None and v >= Version(load_builtin("launchers.toml")["torchrun"]["numa_binding_min_torch"])


def _seconds(value: Optional[float]) -> str:
    t = DEFAULT_RDZV_TIMEOUT_S if value is None else value
    return str(int(t)) if float(t).is_integer() else f"{t:g}"


def _torchrun_base(job: _Job) -> Tuple[List[str], Optional[int], Optional[str]]:
    """(torchrun argv up to the target, the rendezvous port, its address).

    One node: --standalone picks its own free port, so a port the user asked for (--master-port)
    gets the static rendezvous on 127.0.0.1 at that port instead: only there does torchrun hand the
    ranks that port as MASTER_PORT (c10d gives them a fresh free port: RendezvousStoreInfo.build in
    torch/distributed/elastic/rendezvous/api.py). Several nodes: c10d at addr:port, join_timeout
    bounded by rdzv_timeout. torchrun runs its -m target with `python -u -m`: the caller's target is rankexec,
    which then execs the real command.
    """
    nnodes, node_rank, addr, port, asked_port = job.nnodes, job.node_rank, job.addr, job.port, job.master_port
    base = [job.python, "-m", "torch.distributed.run", f"--nproc-per-node={job.placement.nproc_per_node}"]
    timeout = _seconds(job.rdzv_timeout)
    if nnodes <= 1:
        if asked_port is None:
            return [*base, "--standalone"], None, addr
        return [*base, "--nnodes=1", "--node-rank=0", "--rdzv-backend=static", "--master-addr=127.0.0.1",
                f"--master-port={asked_port}"], asked_port, "127.0.0.1"
    if addr is None:
        raise FieldError("master_addr", None, "torchrun over several nodes needs a rendezvous address",
                         "pass {opt.hostfile} FILE or {flag} HOST")
    rdzv_port = port or DEFAULT_MASTER_PORT
    base += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
             f"--rdzv-endpoint={addr}:{rdzv_port}", f"--rdzv-id={job.job_id}",
             # The node holding the endpoint hosts the store; saying so avoids torchrun's
             # hostname match, which fails when names resolve elsewhere (containers, netns).
             f"--rdzv-conf=is_host={'true' if node_rank == 0 else 'false'},join_timeout={timeout}"]
    if job.local_addr:
        base.append(f"--local-addr={job.local_addr}")
    return base, rdzv_port, addr


def rendezvous_timed_out(text: str) -> bool:
    """torchrun's rendezvous did not complete in time (node 0 waited for nodes that never came)."""
    return "RendezvousTimeoutError" in text


# -- what really happened ---------------------------------------------------------------------------

@dataclass
class RankObservation:
    rank: int
    pid: int
    allowed_cpus: Optional[Tuple[int, ...]] = None
    threads: Optional[int] = None  # OS threads of the process
    omp_num_threads: Optional[str] = None
    openmp: List[str] = field(default_factory=list)
    allocator: Optional[str] = None
    world_size: Optional[int] = None  # WORLD_SIZE (or MPI's size) in the rank's own environment
    argv: Tuple[str, ...] = ()  # what the rank runs (/proc/PID/cmdline): the flags its script parsed

    def to_json(self) -> Dict[str, object]:
        return as_json(self)


def check_observations(plan: LaunchPlan, observed: Sequence[RankObservation],
                       worker_runtime: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Warnings where what ran differs from the plan (pinning, threads, allocator, OpenMP)."""
    warnings: List[str] = []
    by_local = {s.local_rank: s for s in plan.per_rank}
    want_alloc = None
    preload = plan.env.get("LD_PRELOAD", "")
    for name in ALLOCATORS:
        if name in preload:
            want_alloc = name
    want_iomp = "libiomp5" in preload
    for obs in observed:
        local = obs.rank % max(1, plan.nproc_per_node)
        spec = by_local.get(local)
        if spec is None:
            continue
        if spec.cpus and obs.allowed_cpus is not None and tuple(sorted(obs.allowed_cpus)) != tuple(sorted(spec.cpus)):
            warnings.append(f"rank {obs.rank} ran on CPUs {_fmt(obs.allowed_cpus)}, planned {_fmt(spec.cpus)}")
        # the rank's own count, else the environment's (a value of yours kept for every rank): what was said
        said = str(spec.threads) if spec.threads is not None else plan.env.get("OMP_NUM_THREADS")
        if said is not None and obs.omp_num_threads is not None and obs.omp_num_threads != said:
            warnings.append(f"rank {obs.rank} had OMP_NUM_THREADS={obs.omp_num_threads} (read back), "
                            + (f"planned {said}" if spec.threads is not None else f"not the {said} kept for it"))
        if want_alloc and obs.allocator and obs.allocator != want_alloc:
            warnings.append(f"rank {obs.rank} runs with the {obs.allocator} allocator, planned {want_alloc} (LD_PRELOAD)")
        if want_iomp and obs.openmp and "intel" not in obs.openmp:
            warnings.append(f"rank {obs.rank} did not load Intel OpenMP (libiomp5), though it was preloaded")
    if worker_runtime:
        torch_rt = worker_runtime.get("torch") or {}
        spec0 = by_local.get(0)
        n = torch_rt.get("num_threads")
        if spec0 is not None and spec0.threads is not None and n is not None and n != spec0.threads:
            warnings.append(f"rank 0's torch used {n} threads, planned {spec0.threads}")
        if worker_runtime.get("warning"):
            warnings.append(f"rank 0: {worker_runtime['warning']}")
    return warnings


def _fmt(cpus: Sequence[int]) -> str:
    from cpuperf.probe.parse import format_cpulist

    return format_cpulist(cpus) or "-"


def parse_failures(text: str) -> Dict[int, int]:
    """Every failed rank torchrun reports (rank -> exit code, signals as 128+N)."""
    out: Dict[int, int] = {}
    for m in re.finditer(r"(?<![\w])rank\s*:\s*(\d+)[^\n]*\n(?:[^\n]*\n)*?\s*exitcode\s*:\s*(-?\d+)", text):
        code = int(m.group(2))
        out.setdefault(int(m.group(1)), 128 - code if code < 0 else code)
    return out


def first_failure(text: str, died_first: Sequence[int]) -> Optional[Tuple[int, Optional[int]]]:
    """(rank, code) of the rank that failed first.

    died_first: the ranks whose processes were seen gone at the earliest moment (several when they
    went within one poll). A rank killed by a signal is the cause; ranks that then lost their peer
    exit with an error of their own a moment later, and torchrun's "root cause" may name either.
    """
    reported = parse_failures(text)
    root = parse_failure(text)
    if died_first:
        # SIGTERM is how torchrun stops the ranks left once one failed: a consequence where the root cause is a peer
        stopped = 128 + 15 if root is not None and root[0] in died_first and root[1] != 128 + 15 else None
        signalled = [r for r in died_first if reported.get(r, 0) > 128 and reported.get(r) != stopped]
        rank = signalled[0] if signalled else (root[0] if root and root[0] in died_first else died_first[0])
        return rank, reported.get(rank, root[1] if root and root[0] == rank else None)
    if reported:
        signalled = [r for r, c in reported.items() if c > 128]
        if signalled:
            return signalled[0], reported[signalled[0]]
    return root


def parse_failure(text: str) -> Optional[Tuple[int, Optional[int]]]:
    """(rank, exit code) of the first failed rank, from torchrun's or mpirun's report."""
    # torchrun: "Root Cause (first observed failure):\n[0]:\n  time ...\n  rank : 1 (local_rank: 1)\n  exitcode : -9 (pid: 123)"
    root = text.find("Root Cause")
    if root >= 0:
        m = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text[root:], re.S)
        if m:
            code = int(m.group(2))
            return int(m.group(1)), (128 - code if code < 0 else code)
    # Open MPI: "Process name: [[1234,1],1]\n  Exit code:    3"
    m = re.search(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)", text)
    if m:
        return int(m.group(1)), int(m.group(2))
    # Open MPI: "mpirun noticed that process rank 1 with PID 0 on node x exited on signal 9 (Killed)."
    m = re.search(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)", text)
    if m:
        return int(m.group(1)), 128 + int(m.group(2))
    # hydra: "=   RANK 1 PID 123 RUNNING AT host\n=   KILLED BY SIGNAL: 9 (Killed)" / "EXIT CODE: 3"
    m = re.search(r"RANK (\d+) PID \d+ RUNNING AT \S+\s*=\s*(?:KILLED BY SIGNAL: (\d+)|EXIT STATUS: (\d+)|EXIT CODE: (\d+))", text)
    if m:
        if m.group(2):
            return int(m.group(1)), 128 + int(m.group(2))
        return int(m.group(1)), int(m.group(3) or m.group(4))
    return None
