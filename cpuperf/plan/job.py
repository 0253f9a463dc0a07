"""The one plan of a job: decisions -> placement -> runtime env -> worker settings -> launch.

`recommend`, `ccl-env`, `train --dry-run` and `train` all render (or run) a JobPlan made here, so what cpuperf
says is what it launches. The command layer probes (facts, measurements, the route to the master, the
script's text) and hands the answers in; everything here is pure.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.decide import runtime_env as envplan
from cpuperf.decide.arm_levers import knob_vars
from cpuperf.decide.backend import process_group_backend
from cpuperf.decide.placement import MemoryPolicy, memory_policy
from cpuperf.decide.records import Recommendation, compile_mode_of
from cpuperf.decide.threads import rank_threads
from cpuperf.errors import FieldError, UsageError
from cpuperf.jsonable import JsonObject, JsonValue
from cpuperf.knowledge.knobs import BY_ID, SetValue
from cpuperf.knowledge.variables import variables
from cpuperf.plan.environment import lever_vars, with_launch_vars, with_lever_vars
from cpuperf.plan.launch import LaunchPlan, LaunchSpec, numa_binding_ok, plan_launch
from cpuperf.plan.request import PlanRequest
from cpuperf.probe.facts import HostFacts
from cpuperf.probe.slurm import NO_SLURM, SlurmFacts
from cpuperf.worker_settings import ConfigError, TrainSettings

if TYPE_CHECKING:
    from cpuperf.plan.applied import LeverState
    from cpuperf.plan.user_launcher import LauncherRanks
    from cpuperf.plan.user_script import ScriptPlan
    from cpuperf.probe.hosts import Host

# What the built-in loop can run (cpuperf.worker_settings); a value outside these cannot be honoured there.
WORKER_OPTIMIZERS = ("adamw", "adamw_fused")
WORKER_ATTENTION = ("sdpa",)
PLAIN_REASON = "no --auto: fp32, eager, torch's own thread count, no pinning (the baseline --auto is compared with)"


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for (`asked`: the request as typed at the edge, cpuperf.plan.request) and what the
    edge and the planner resolved of it: the mode in force, the constraints, the nodes, the run directory."""

    asked: PlanRequest = field(default_factory=PlanRequest)  # the user's options and command (read once)
    auto: bool = True  # --auto, or a saved plan (what recommend decided)
    constraints: Mapping[str, SetValue] = field(default_factory=dict)  # the built-in loop's --set values, with a config's shape
    hosts: Optional[Tuple[Host, ...]] = None
    nnodes: int = 1
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    local_addr: Optional[str] = None
    out_dir: str = "runs/train"
    preset: Optional[str] = None
    job_id: str = "cpuperf"
    slurm: SlurmFacts = NO_SLURM  # the Slurm job cpuperf runs in (srun inside an allocation; its first node is rank 0)


@dataclass(frozen=True)
class DecisionRow:
    """One decision as the train reports show it (its JSON: id, value, reason, overridden)."""

    id: str
    value: object  # the lever's value, as decided (printed and written to JSON as it is)
    reason: str
    overridden: bool

    def to_json(self) -> Dict[str, object]:
        return {"id": self.id, "value": self.value, "reason": self.reason, "overridden": self.overridden}


@dataclass(frozen=True)
class JobPlan:
    facts: HostFacts
    rec: Recommendation
    request: JobRequest
    env: Tuple[envplan.EnvVar, ...]
    launch: LaunchPlan
    # The built-in worker's settings, checked by its own schema (cpuperf.worker_settings): their to_dict() is the
    # JSON its --config reads; None for a user's command.
    settings: Optional[TrainSettings]
    decisions: Tuple[DecisionRow, ...]
    notes: Tuple[str, ...]
    script: Optional[ScriptPlan] = None  # the plan of the user's command (its Trainer flags); None: the built-in loop
    memory: Optional[MemoryPolicy] = None  # one process over several NUMA nodes: its memory policy

    @property
    def backend(self) -> Optional[str]:
        return self.rec.levers.ddp_backend.value

    def env_map(self) -> Dict[str, str]:
        return {e.name: e.value for e in self.env}

    def launch_options(self) -> Tuple[LeverState, ...]:
        """The launch options this job has (knob rows marked `option`), each as its application reports it: carried
        by the launch, and how, or why not (cpuperf.plan.applied lever_report lists them after the levers)."""
        return _memory_state(self.memory, self.launch)


def _memory_state(policy: Optional[MemoryPolicy], plan: LaunchPlan) -> Tuple[LeverState, ...]:
    """numa_memory as the launch carries it: the one process under numactl with its policy, or why not (no row
    where the plan has no policy)."""
    from cpuperf.plan.applied import LeverState

    if policy is None:
        return ()
    if plan.launcher == "direct" and plan.yours is None and tuple(plan.argv[1:1 + len(policy.numactl)]) == policy.numactl:
        return (LeverState("numa_memory", policy.mode, True, f"{policy.describe()}: numactl {' '.join(policy.numactl)}"),)
    why = ("numactl is not installed (apt-get install numactl)" if plan.launcher == "direct" and plan.yours is None
           else "your launcher starts the process: cpuperf does not wrap it in numactl")
    return (LeverState("numa_memory", policy.mode, False, f"{policy.describe()}: {why}"),)


def runtime_vars(facts: HostFacts, rec: Recommendation, request: JobRequest, *, mpi: Optional[str] = None,
                 socket_ifname: Optional[str] = None, environ: Mapping[str, str],
                 libraries: Optional[envplan.Libraries] = None,
                 own_rendezvous: bool = False) -> Tuple[List[envplan.EnvVar], List[str]]:
    """The runtime variables of this plan (cpuperf.decide.runtime_env owns each one) and notes.

    --auto: all of them. Plain: only what the user's own keys imply (threads, allocator) and what
    several ranks need to meet (rendezvous, gloo interface, oneCCL).
    """
    lv = rec.levers
    world = lv.world
    backend = process_group_backend(lv.ddp_backend.value)
    preload = bool(lv.allocator.value) and (request.auto or lv.allocator.overridden)
    rt = envplan.runtime_env(facts, rec.placement, envplan.RuntimeEnvRequest(
        backend=backend, hosts=request.hosts,
        master_addr=request.master_addr, master_port=request.asked.master_port, preload=preload,
        threads=rank_threads(lv, request.auto),
        # a user's launcher that spans nodes meets on its own rendezvous: none is planned here
        allocator=lv.allocator.value, nnodes=1 if own_rendezvous else lv.nnodes.value, mpi=mpi,
        socket_ifname=socket_ifname,
        libraries=libraries, environ=environ, slurm_first=_slurm_first(request.slurm),
        pin=lv.affinity.value == "auto", knobs={"fp32_math_mode": lv.fp32_math_mode.value}))
    table = variables()
    keep = {e.name for e in rt.vars} if request.auto else (set(table.names(lever="allocator")) if preload else set())
    if lv.fp32_math_mode.overridden:  # your value, plain or not: its Arm variable goes with it
        keep |= set(knob_vars("fp32_math_mode"))
    if world > 1:
        keep |= set(table.names(meet=True))  # what several ranks need to meet, plain or not
    keep |= set(table.names(lever="threads_per_rank", type="threads"))  # set where decided (rank_threads)
    if world <= 1:
        keep -= set(table.names(several_ranks=True))
    return with_lever_vars([e for e in rt.vars if e.name in keep], lever_vars(rec.decisions, request.auto)), list(rt.notes)


def merged_env(wanted: Sequence[envplan.EnvVar], request: JobRequest, world: int,
               environ: Mapping[str, str]) -> Tuple[Tuple[envplan.EnvVar, ...], List[str]]:
    """Our variables merged over the user's environment: theirs kept unless an option or the job needs ours."""
    force = [n for n, given in (("MASTER_ADDR", request.master_addr), ("MASTER_PORT", request.asked.master_port)) if given]
    if world > 1:  # ours, not a stale value from the shell
        force += variables().names(launch=True, runtime="torch-distributed")
    merged = envplan.merge_env(environ, list(wanted), force=force)
    notes = [f"kept your {k.name}={k.value!r} (cpuperf would set {k.wanted})" for k in merged.kept]
    notes += [envplan.describe_invalid(item) for item in merged.invalid]
    reasons = {e.name: e.reason for e in wanted}
    return tuple(envplan.EnvVar(n, merged.final[n], "cpuperf" if n in reasons else "environment", reasons.get(n, ""))
                 for n in merged.final), notes


def check_worker_can_honour(rec: Recommendation) -> None:
    """The built-in loop's limits: a value it cannot run is refused (exit 2), never dropped."""
    lv = rec.levers
    if lv.optimizer.value not in WORKER_OPTIMIZERS:
        why = "set by you" if lv.optimizer.overridden else "the memory plan's choice"
        raise FieldError("optimizer", lv.optimizer.value, f"optimizer {{value}} ({why}): the built-in loop has "
                         + ", ".join(WORKER_OPTIMIZERS), "{set.optimizer}=adamw, or bring your own script after --",
                         setting=True)
    if lv.attention.overridden and lv.attention.value not in WORKER_ATTENTION:
        raise UsageError(f"attention {lv.attention.value}: the built-in loop uses torch's SDPA dispatcher",
                         hint="leave attention unset; the worker reports the kernel SDPA ran")
    for knob in (lv.zero, lv.pin_memory, lv.sharding, lv.offload):
        if knob.overridden and knob.value:
            raise UsageError(f"{knob.id}={knob.value}: the built-in loop has no such setting",
                             hint="it applies to your own script: cpuperf recommend renders it")


def worker_settings(rec: Recommendation, request: JobRequest, out_dir: str) -> TrainSettings:
    """The built-in worker's settings (cpuperf.worker_settings.TrainSettings, same ids as the knobs), checked as the
    worker will read them: a value its schema refuses is one line (exit 2)."""
    raw = _worker_values(rec, request, out_dir)
    try:
        return TrainSettings.from_dict(raw)
    except ConfigError as exc:
        raise UsageError(f"training settings: {exc.message}", hint=exc.hint) from exc


def _worker_values(rec: Recommendation, request: JobRequest, out_dir: str) -> JsonObject:
    """The worker's settings that the plan sets, by id (the schema's defaults stand for the rest)."""
    check_worker_can_honour(rec)
    lv = rec.levers
    world = lv.world
    # --model's preset, else the one the plan's workload is (the host's default: decide.workload.builtin_default)
    built_in = rec.workload.name if rec.workload.source == "preset" else "tiny"
    s: JsonObject = {"preset": request.preset or built_in}
    if request.auto:  # every lever the worker takes (its knob row says `worker`), as decided; the process group's
        # backend only where ranks meet (below), the thread count as the ranks apply it (rank_threads)
        s.update({d.id: _json_scalar(d.value) for d in rec.decisions if BY_ID[d.id].worker and d.id != "ddp_backend"})
        s["threads_per_rank"] = rank_threads(lv, True)
    else:
        per_rank = max(1, math.ceil(rec.workload.batch_size / max(1, world)))
        s.update(dtype="fp32", compile=False, ipex=False, threads_per_rank=None, batch_size=per_rank,
                 device=lv.device.value)
        for d in rec.decisions:  # plain = the baseline plus exactly the user's keys
            if d.overridden and BY_ID[d.id].worker:
                s[d.id] = _json_scalar(d.value)
    if lv.ddp_backend.value and world > 1:
        s["ddp_backend"] = lv.ddp_backend.value
    compiled = lv.compile.value and (request.auto or lv.compile.overridden)  # plain: only where you set it
    if compiled and compile_mode_of(lv.compile) != "default":  # the mode measured to pay back
        s["compile_mode"] = compile_mode_of(lv.compile)
    asked = request.asked
    if asked.max_steps is not None:
        s["max_steps"] = asked.max_steps
    if asked.time_budget is not None:
        s["time_budget_s"] = asked.time_budget
        if asked.max_steps is None:
            s["max_steps"] = None
    if asked.seed is not None:
        s["seed"] = asked.seed
    s.update(out_dir=out_dir, resume=asked.resume, progress="plain")
    for key, value in request.constraints.items():
        knob = BY_ID.get(key)
        if knob is not None and knob.worker and not knob.decided:
            if key == "model":
                model = s.get("model")
                shape: JsonObject = dict(value) if isinstance(value, dict) else {}
                s["model"] = {**(model if isinstance(model, dict) else {}), **shape}
            elif not isinstance(value, dict):  # only `model` holds a shape (knowledge/knobs.py)
                s[key] = value
    return s


def _json_scalar(value: object) -> JsonValue:
    """A user's value of a worker setting as the worker's JSON carries it (a string, number, true/false or null)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{value!r} is not a JSON value")


def decision_records(rec: Recommendation, auto: bool) -> Tuple[DecisionRow, ...]:
    """The decisions as the train reports show them (plain mode: the baseline and the user's keys)."""
    rows = [DecisionRow(d.id, d.value, d.reason, d.overridden) for d in rec.decisions if auto or d.overridden]
    if not auto:
        rows.insert(0, DecisionRow("plain", True, PLAIN_REASON, False))
    return tuple(rows)


@dataclass(frozen=True)
class RankRun:
    """What each rank runs and how the job starts it."""

    command: Tuple[str, ...]  # what each rank runs (the built-in worker, or the user's command with its flags)
    settings: Optional[TrainSettings] = None  # the built-in worker's checked settings; None for a user's command
    script: Optional[ScriptPlan] = None  # the plan of the user's command
    yours: Optional[LauncherRanks] = None  # the user's own launcher and its ranks
    python: Optional[str] = None
    log_dir: Optional[str] = None
    euid: int = 1000
    opens_session: bool = False  # the command makes its own session (`setsid ...`: CommandLine.own_session)


@dataclass(frozen=True)
class EnvInputs:
    """What the job's environment is made from besides the decisions."""

    environ: Mapping[str, str]  # the environment cpuperf runs in (or {} for a recorded host)
    # the MPI launcher the edge found on this host, (path, flavour) (cpuperf.probe.software.mpi_flavour): mpirun's
    # argv, and its flavour's variables where --launcher mpirun starts the ranks
    mpi: Optional[Tuple[str, str]] = None
    socket_ifname: Optional[str] = None  # the interface to the rendezvous
    libraries: Optional[envplan.Libraries] = None
    # a saved plan's runtime variables, used as they are (only this launch's rendezvous variables are added to them)
    planned_env: Optional[Tuple[envplan.EnvVar, ...]] = None
    planned_memory: Optional[MemoryPolicy] = None  # with planned_env: the saved plan's memory policy, as saved


def plan_job(facts: HostFacts, rec: Recommendation, request: JobRequest, run: RankRun, given: EnvInputs) -> JobPlan:
    """The whole plan, built once: env from the decisions, then the launch that carries both."""
    lv = rec.levers
    world = lv.world
    notes: List[str] = list(rec.notes)
    environ = given.environ
    flavour = given.mpi[1] if given.mpi is not None and request.asked.launcher == "mpirun" else None
    wanted, env_notes = runtime_vars(facts, rec, request, mpi=flavour, socket_ifname=given.socket_ifname,
                                     environ=environ, libraries=given.libraries, own_rendezvous=run.yours is not None)
    if given.planned_env is not None:
        wanted = with_launch_vars(given.planned_env, wanted)
    env, merge_notes = merged_env([*wanted, *_framework_vars(run.script)], request, world, environ)
    notes += merge_notes + env_notes
    pin = lv.affinity.value == "auto" and (request.auto or lv.affinity.overridden) and \
        (lv.device.value == "cpu" or rec.placement.unit == "gpu-numa")
    threads = rank_threads(lv, request.auto)
    # GPU ranks whose GPUs' NUMA nodes cpuperf could not read: torchrun finds them itself where it can.
    numa = lv.on_gpu and request.auto and rec.placement.unit != "gpu-numa" and \
        numa_binding_ok(rec.stack.get("torch"))
    if given.planned_env is not None:  # a saved plan, run as saved: its memory policy as it stands (plan.saved)
        memory, memory_note = given.planned_memory, None
    else:
        memory, memory_note = memory_policy(facts, rec.placement, lv.on_gpu, request.auto,
                                            *memory_pins(rec, request.asked.decided.get("numa_memory", "auto")))
    notes += [memory_note] if memory_note else []
    launch = plan_launch(facts, rec.placement, LaunchSpec(
        rank_command=run.command, env_vars=env, launcher=request.asked.launcher, hosts=request.hosts,
        nnodes=lv.nnodes.value, node_rank=request.node_rank if request.node_rank is not None else 0,
        master_addr=request.master_addr, master_port=request.asked.master_port, pin=pin, threads=threads,
        log_dir=run.log_dir, environ=environ, euid=run.euid, python=run.python, local_addr=request.local_addr,
        job_id=request.job_id, rdzv_timeout=request.asked.rdzv_timeout, yours=run.yours, slurm=request.slurm,
        numa_binding=numa, opens_session=run.opens_session, memory_policy=memory), mpi=given.mpi)
    return JobPlan(facts, rec, request, env, launch, run.settings, decision_records(rec, request.auto),
                   tuple(_kept_as_run(notes, launch)), run.script, memory)


def memory_pins(rec: Recommendation, asked: object) -> Tuple[object, Optional[Tuple[Optional[str], str]]]:
    """(--set numa_memory as asked, else as the recommendation carries it: 'auto' where not set; a cached tuning's
    verdict with its reason, or None)."""
    pin = rec.options.get("numa_memory")
    if pin is None:
        return asked, None
    mode = pin.value if isinstance(pin.value, str) else None  # 'interleave', or none: first touch
    if pin.reason is None:
        return (mode if asked == "auto" else asked), None
    return asked, (mode, pin.reason)


def _kept_as_run(notes: List[str], launch: LaunchPlan) -> List[str]:
    """A kept OMP_NUM_THREADS said as the ranks run it: where the launch starts every rank with a count of its own
    (the per-rank step, a direct launch), that count is what they run, not the value kept in the environment."""
    counts = [s.threads for s in launch.per_rank]
    if not counts or any(c is None for c in counts):
        return notes
    runs = "/".join(dict.fromkeys(str(c) for c in counts))
    kept = "kept your OMP_NUM_THREADS="
    return [f"your OMP_NUM_THREADS={n[len(kept):].split(' ', 1)[0]} is not what the ranks run: the launch starts "
            f"each rank with OMP_NUM_THREADS={runs} (--set threads_per_rank=N sets the count)"
            if n.startswith(kept) else n for n in notes]


def _framework_vars(script: Optional[ScriptPlan]) -> List[envplan.EnvVar]:
    """The variables the script's framework reads for a lever (PL_TRAINER_PRECISION), each with its reason; merged
    like every other (a value in your environment stays yours, and is said)."""
    if script is None:
        return []
    why = {" ".join(f.args): f.why for f in script.added}
    return [envplan.EnvVar(name, value, "cpuperf", why.get(name, f"{script.framework}: read by the framework"))
            for name, value in script.env]


def worker_command(python: str, settings: TrainSettings) -> List[str]:
    """How each rank starts the built-in loop (its --config: the settings' JSON)."""
    return [python, "-m", "cpuperf.train.worker", "--config", json.dumps(settings.to_dict(), separators=(",", ":"))]


def _slurm_first(slurm: SlurmFacts) -> Optional[str]:
    """The first node of the Slurm allocation cpuperf runs in (rank 0 runs there), if any."""
    return slurm.nodes[0] if slurm.allocation and slurm.nodes else None

