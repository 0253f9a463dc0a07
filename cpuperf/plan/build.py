"""The one planner of a training job: a request (cpuperf.plan.request) and what the edge found -> `JobPlan`.

Pure: the command probes the host, reads the hostfile and a saved plan, takes the measurements, checks the
hosts and picks the run directory (the edge), and hands the values here; nothing here reads the OS or changes
what it is handed. Every path goes through `build_job_plan`: the built-in loop, a user's script, a user's
launcher, a saved plan, several nodes, and decisions made already (`decided_inputs`: recommend's job for your
script, each node's part of a plan over a hostfile, a tuning point)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.errors import FieldError, verbatim
from cpuperf.jsonable import JsonMapping
from cpuperf.probe.slurm import NO_SLURM, SlurmFacts

if TYPE_CHECKING:
    from cpuperf.decide.cluster import ClusterConstraints
    from cpuperf.decide.memory import MemoryLevers
    from cpuperf.decide.records import Constraints, Dtype, Levers, Measurements, Recommendation
    from cpuperf.decide.workload import Workload
    from cpuperf.knowledge.knobs import Overrides
    from cpuperf.plan.job import JobPlan, JobRequest
    from cpuperf.plan.request import PlanRequest
    from cpuperf.plan.saved import SavedPlan
    from cpuperf.plan.script_read import ScriptRead
    from cpuperf.plan.user_launcher import LauncherRanks
    from cpuperf.plan.user_script import ScriptPlan
    from cpuperf.probe.facts import HostFacts
    from cpuperf.probe.hosts import Host
    from cpuperf.worker_settings import TrainSettings


@dataclass(frozen=True)
class EdgeFacts:
    """What the command found at the edge for this request, handed to the planner as values."""

    environ: Mapping[str, str]
    out_dir: str  # --out, else the run directory picked for this run
    python: str  # the interpreter the built-in worker and a rank step run with
    euid: int
    workload: Workload  # what is trained (--model resolved, a HF config read from its cache)
    hosts: Optional[Tuple[Host, ...]] = None  # the hostfile's nodes, cut to the node count
    nnodes: int = 1
    saved: Optional[SavedPlan] = None  # the saved plan for this node, fitted to this host
    saved_diffs: Tuple[str, ...] = ()  # how this host differs from it (--replan)
    measurements: Optional[Measurements] = None
    node_rank: Optional[int] = None
    local_addr: Optional[str] = None
    master_addr: Optional[str] = None
    socket_ifname: Optional[str] = None
    script_text: Optional[str] = None  # the user's script, to see how it parses its arguments
    # the script read once (source, framework, arguments by its parser: cpuperf.plan.script_read); None: read from
    # script_text by build_job_plan
    script: Optional[ScriptRead] = None
    launcher_python: Optional[str] = None  # the Python the user's launcher runs scripts with
    accelerate_default_config: bool = False
    slurm: SlurmFacts = NO_SLURM  # the Slurm job cpuperf runs in (cpuperf.probe.slurm)
    mpi: Optional[Tuple[str, str]] = None  # the MPI launcher found and its flavour (cpuperf.probe.software.mpi_flavour)
    # recommend's decisions made already (`cpuperf recommend`, a cluster's node, a tuning point): planned as they
    # stand, for the job `cpuperf train --auto -- python your_script.py` would run (the script a placeholder)
    decided: Optional[Recommendation] = None


def build_job_plan(request: PlanRequest, facts: HostFacts, edge: EdgeFacts, use_tuned: bool = True) -> JobPlan:
    """The job's one plan (cpuperf.plan.job.JobPlan) from the request and what the edge found. `use_tuned`
    False: the rules' plan, without a cached tuning (the start of `--tune`)."""
    from cpuperf.plan.job import EnvInputs, RankRun, plan_job
    from cpuperf.plan.request import with_command

    request = with_command(request)  # the user's command, read once (a request from train_request carries it)
    if edge.script is None and request.command is not None:
        from cpuperf.plan.script_read import read_user_script

        user_cmd = request.command.script
        if user_cmd.script or user_cmd.module:
            edge = replace(edge, script=read_user_script(user_cmd, edge.script_text))
    auto = request.auto or edge.saved is not None  # a saved plan is what recommend decided
    decided = dict(request.decided)
    yours = _your_launcher(request, facts, edge, oversubscribe=bool(decided.get("oversubscribe")))
    nproc = (yours.count or 1) if yours is not None else request.nproc
    if yours is not None and yours.oversubscribed:
        decided.setdefault("oversubscribe", True)
    if edge.decided is not None:
        rec = edge.decided
    elif edge.saved is not None:
        rec = _from_saved(request, edge.saved, edge, facts, yours)
    else:
        rec = _decide(request, facts, edge, decided, nproc, yours, use_tuned)
    job = _job_request(request, edge, rec, auto)
    cmd, settings, script = _rank_command(request, edge, rec, job, auto)
    if yours is not None and yours.step and request.command is not None and script is not None:
        from cpuperf.plan.user_launcher import with_rank_step

        # every rank dies with cpuperf; placed ones are also pinned. The command with its Trainer flags, as the
        # launcher will see it:
        flagged = request.command.launcher_with(script.words)
        if flagged is not None:
            cmd = list(with_rank_step(flagged, edge.python, edge.launcher_python))
    saved_env = edge.saved.env if edge.saved is not None and not edge.saved_diffs else None
    run = RankRun(tuple(cmd), settings, script, yours, python=edge.python, log_dir=os.path.join(edge.out_dir, "logs"),
                  euid=edge.euid, opens_session=request.command is not None and request.command.own_session)
    given = EnvInputs(edge.environ, edge.mpi, edge.socket_ifname,
                      planned_env=tuple(saved_env) if saved_env is not None else None,
                      planned_memory=edge.saved.memory if edge.saved is not None and saved_env is not None else None)
    jp = plan_job(facts, rec, job, run, given)
    from cpuperf.plan.peak_report import reporting_peak

    return reporting_peak(jp, edge.environ)


def _decide(request: PlanRequest, facts: HostFacts, edge: EdgeFacts, decided: Overrides, nproc: Optional[int],
            yours: Optional[LauncherRanks], use_tuned: bool) -> Recommendation:
    """recommend's decisions for this request, from the measurements the edge took."""
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.knowledge.hf_flags import TRAINER_COMPILE_MODES
    from cpuperf.worker_settings import COMPILE_MODES

    meas = edge.measurements
    tuned, said = _command_tuning(request, meas, edge) if use_tuned else (None, None)
    # Your launcher's nodes (torchrun --nnodes 2) are the job's, where cpuperf starts no nodes of its own.
    nnodes = max(edge.nnodes, yours.nodes) if yours is not None else edge.nnodes
    rec = recommend(facts, _with_parallel(request, edge), RecommendRequest(
        nproc_per_node=nproc, nnodes=nnodes, unit=request.unit,
        device=request.device, measurements=meas, overrides=decided, tuned=tuned,
        shape_tuning=use_tuned and request.auto and not request.user_argv,
        environ=_command_environ(request, edge.environ if facts.live else {}),
        baseline=None if request.auto else ({} if yours is not None else {"nproc_per_node": 1}),
        ranks_from=f"your launcher: {yours.source}" if yours is not None else None,
        ranks_unknown=yours is not None and yours.count is None,
        memory_levers=memory_levers(request, facts, edge),
        compile_modes=COMPILE_MODES if request.command is None else TRAINER_COMPILE_MODES))
    dp = rec.workload.parallel
    if yours is not None and dp.kind == "trainer" and dp.global_batch is not None and rec.levers.world > 1:
        world = rec.levers.world  # your launcher's ranks are yours, and so is the batch they train
        rec = replace(rec, notes=(*rec.notes, f"your {yours.launcher} starts {world} rank(s): global batch {world} x "
                                  f"{dp.per_device} per device x {dp.grad_accum} accumulation = {world * dp.global_batch}"
                                  f" ({dp.where}; cpuperf changes no batch of a launch you start)"))
    # A tuning is of CPU levers: a plan on a GPU says nothing of one.
    if rec.levers.device.value != "cpu":
        return rec
    from cpuperf.plan.layout_note import slower_layout

    slower = slower_layout(request.command, edge.script, edge.script_text, meas.tuned_by_command if meas else {},
                           (edge.python, *((edge.launcher_python,) if edge.launcher_python else ()), "python", "python3")
                           ) if request.auto and use_tuned else None
    return replace(rec, notes=(*rec.notes, *(n for n in (said, slower) if n is not None)))


def _with_parallel(request: PlanRequest, edge: EdgeFacts) -> Workload:
    """The workload with what the user's command allows of ranks (cpuperf.plan.user_script.data_parallel): whether
    it runs data-parallel under a launcher and whether cpuperf can keep its global batch; the built-in loop's with
    the shape its worker builds (`--set model.*`)."""
    w = edge.workload
    if request.command is None:  # the built-in loop: the model its worker builds, --set model.* included
        from cpuperf.decide.workload import with_model_shape

        shape = request.worker.get("model")
        return with_model_shape(w, shape) if isinstance(shape, dict) else w
    from cpuperf.plan.user_script import data_parallel

    cmd = request.command.script
    mode = request.hf_flags if request.auto else "never"
    return replace(w, parallel=data_parallel(cmd, edge.script, mode, edge.script_text))


def memory_levers(request: PlanRequest, facts: HostFacts, edge: EdgeFacts) -> MemoryLevers:
    """The memory levers this job's path can apply: the built-in loop recomputes activations (it has no sharding);
    a Trainer script takes what its transformers release accepts (compat/hf.toml); a plain run, or a script cpuperf
    adds no flags to, gets none, and a job that does not fit is only told (it may shard itself)."""
    from cpuperf.decide.memory import NOTHING, MemoryLevers, Reach

    recompute_only = Reach(True, False, False)
    if not request.auto:
        return MemoryLevers(NOTHING, "plain run (no --auto): the job as you gave it", advisory=True,
                            state_must_fit=request.command is None)
    if request.command is None:
        return MemoryLevers(recompute_only, "the built-in loop runs plain DDP (no sharding): bring a Trainer "
                            "script after -- for FSDP", state_must_fit=True)
    from cpuperf.knowledge.hf_flags import sharding_form
    from cpuperf.plan.user_script import script_kind

    cmd = request.command.script
    parser, why = script_kind(edge.script) if cmd.script else ("n/a", "no Python script")
    if request.hf_flags == "never" or (parser != "hf" and request.hf_flags != "always"):
        return MemoryLevers(NOTHING, f"{why}: cpuperf adds no memory lever to it", advisory=True)
    software = facts.software
    info = software.packages.get("transformers") if software is not None else None
    form = sharding_form(info.version if info else None)
    # On a CPU the Trainer runs plain DDP even with --fsdp (accelerate picks MULTI_CPU): measured with
    # transformers 5.24.0 and accelerate 1.15.0, two gloo ranks (tests/test_your_model.py keeps it so).
    on_cpu = "the Trainer does not shard on CPUs (it runs plain DDP even with --fsdp)"
    if form["fsdp"] is None:
        return MemoryLevers(recompute_only, f"no sharding: {form['why']}", cpu_can=recompute_only, cpu_why=on_cpu)
    return MemoryLevers(Reach(), cpu_can=recompute_only, cpu_why=on_cpu)


def _job_request(request: PlanRequest, edge: EdgeFacts, rec: Recommendation, auto: bool) -> JobRequest:
    from cpuperf.plan.job import JobRequest

    model = request.model or (edge.saved.inputs.get("model") if edge.saved is not None else None)
    return JobRequest(request, auto=auto, constraints=_hf_config_shape(rec.workload, dict(request.worker)),
                      hosts=edge.hosts, nnodes=edge.nnodes, node_rank=edge.node_rank, master_addr=edge.master_addr,
                      local_addr=edge.local_addr, out_dir=edge.out_dir, job_id=_job_id(edge.hosts, request.master_port),
                      slurm=edge.slurm, preset=_preset(model) if not request.user_argv else None)


def _rank_command(request: PlanRequest, edge: EdgeFacts, rec: Recommendation, job: JobRequest,
                  auto: bool) -> Tuple[List[str], Optional[TrainSettings], Optional[ScriptPlan]]:
    """(what each rank runs, the built-in worker's settings or None, the plan of the user's command or None)."""
    from cpuperf.plan.job import worker_command, worker_settings

    if edge.decided is not None and request.command is None:  # recommend's job: a placeholder for your script
        from cpuperf.plan.launch_view import SCRIPT_PLACEHOLDER

        return [edge.python, SCRIPT_PLACEHOLDER], None, None
    if request.command is None:
        settings = worker_settings(rec, job, edge.out_dir)
        return worker_command(edge.python, settings), settings, None
    from cpuperf.plan import user_script

    ours, skipped = user_script.recommended_speed_flags(rec, config_dir=edge.out_dir) if auto else ([], [])
    script = user_script.plan_command(request.command, ours, request.hf_flags if auto else "never",
                                      edge.script, rec.stack.get("transformers"), skipped,
                                      dtype=(str(rec.levers.dtype.value), user_script.dtype_why(rec)))
    return list(script.argv), None, script


def _command_tuning(request: PlanRequest, meas: Optional[Measurements], edge: EdgeFacts
                    ) -> Tuple[Optional[Tuple[JsonMapping, str]], Optional[str]]:
    """(the cached `train --tune` result for this command and where, a note saying which tuning the plan uses or
    that none is cached) for an --auto run of a user's command; (None, None) otherwise."""
    if not request.auto or request.command is None:
        return None, None
    import time

    from cpuperf.plan.user_script import key_of_command, script_kind

    entry = (meas.tuned_by_command if meas is not None else {}).get(key_of_command(request.command.script, edge.script,
                                                                             edge.script_text))
    if not entry:
        # --tune runs a Trainer script with --max_steps: it is suggested only for a command it takes
        tunable = script_kind(edge.script)[0] == "hf"
        return None, ("no tuning of this command is cached (the same arguments and script): the rules decide"
                      + ("; `cpuperf train --tune -- <command>` tunes it" if tunable else ""))
    from cpuperf.decide.tune import not_judged

    if not_judged(entry):
        return (entry, "on this command"), None  # recommend says why it is not used
    at, levers = entry.get("measured_at"), entry.get("levers")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(at) if isinstance(at, (int, float)) else 0.0))
    return (entry, "on this command"), (f"the tuning of this command from {when} ({entry.get('runs')} runs, "
                                        f"{len(levers) if isinstance(levers, dict) else 0} lever(s) compared) "
                                        "decides the tuned levers")


def _from_saved(request: PlanRequest, plan: SavedPlan, edge: EdgeFacts, facts: HostFacts,
                yours: Optional[LauncherRanks]) -> Recommendation:
    """The saved plan's recommendation as it stands, or decided again here (--replan, where this host differs)."""
    from cpuperf.plan.saved import fresh_differences, replan_from

    rec = plan.rec
    if edge.saved_diffs:
        rec = replan_from(plan, facts, edge.measurements, edge.environ if facts.live else {})
        rec = replace(rec, notes=(*rec.notes, f"--replan: planned again here ({'; '.join(edge.saved_diffs)})"))
    else:
        # Run as saved, never more; every way it differs from what cpuperf decides here is a note, said before
        # the run starts and carried in --json.
        differ = [f"the plan differs from what cpuperf decides here: {d}"
                  for d in fresh_differences(plan, facts, edge.measurements)]
        rec = replace(rec, notes=(*rec.notes, *differ, f"plan {request.plan} run as saved (made by cpuperf {plan.cpuperf}"
                                  + (f" on {plan.made_on})" if plan.made_on else ")")))
    if yours is not None and yours.count is not None and yours.count != rec.placement.nproc_per_node:
        raise FieldError("plan", request.plan, f"plan {verbatim(request.plan)} places {rec.placement.nproc_per_node} "
                         f"rank(s) per node; your {verbatim(yours.launcher)} starts {yours.count} ({verbatim(yours.source)})",
                         f"make the plan for it: cpuperf recommend {{opt.nproc_per_node}} {yours.count} {{opt.save}} "
                         f"{verbatim(request.plan)}")
    return rec


def _your_launcher(request: PlanRequest, facts: HostFacts, edge: EdgeFacts,
                   oversubscribe: bool = False) -> Optional[LauncherRanks]:
    """The user's own launcher and its ranks (cpuperf.plan.user_launcher.LauncherRanks), or None."""
    cmd = request.command.launcher if request.command is not None else None
    if cmd is None:
        return None
    from cpuperf.decide.placement import usable_cores
    from cpuperf.knowledge.gpu import visible_gpus
    from cpuperf.plan.user_launcher import launcher_ranks

    return launcher_ranks(cmd, logical_cpus=len(facts.topology.cpus) or 1,
                          physical_cores=max(1, len(usable_cores(facts))),
                          gpus=len(visible_gpus(facts, _command_environ(request, edge.environ))),
                          has_default_config=cmd.launcher == "accelerate" and edge.accelerate_default_config,
                          environ=edge.environ, interpreter=edge.launcher_python, oversubscribe=oversubscribe)


def _command_environ(request: PlanRequest, environ: Mapping[str, str]) -> Dict[str, str]:
    """The environment the user's command runs in (its wrappers' `env NAME=VALUE`...), or `environ` itself."""
    return request.command.environ(environ) if request.command is not None else dict(environ)


def _preset(model: Optional[str]) -> Optional[str]:
    """A built-in preset name, or None for a Hugging Face config.json (its shape goes in model.*)."""
    return None if model and model.endswith(".json") else model


def _hf_config_shape(workload: Workload, worker: Dict[str, Any]) -> Dict[str, Any]:
    """--model CONFIG.json for the built-in loop: its GPT-2-style shape (the built-in tokenizer stays)."""
    if workload.source != "hf-config":
        return worker
    shape = {"n_layer": workload.n_layer, "n_head": workload.n_head, "d_model": workload.d_model,
             "seq_len": workload.seq_len, "vocab_size": workload.vocab}
    return {**worker, "model": {**shape, **worker.get("model", {})}}


def _job_id(hosts: Optional[Tuple[Host, ...]], port: Optional[int]) -> str:
    """The same rendezvous id on every node: derived from the hostfile and port, not from local paths."""
    from cpuperf.fsutil import sha1_hex  # hashlib's digest, without loading OpenSSL on every plan's way

    key = ",".join(h.name for h in hosts or ()) + f":{port or ''}"
    return "cpuperf-" + sha1_hex(key.encode())[:10]


# (node name, its facts, its recommendation, its job plan): one node of a plan over a hostfile
NodePlan = Tuple[str, "HostFacts", "Recommendation", "JobPlan"]


def cluster_plans(names: Sequence[str], by_name: Mapping[str, HostFacts], rec: Recommendation,
                  hosts: Optional[Sequence[Host]], measured: Optional[Mapping[str, Any]] = None) -> List[NodePlan]:
    """One plan over the hostfile's nodes from each node's own facts: bf16 only if every node runs it natively,
    threads from each node's cores, refused (exit 14) where the stacks differ; the DDP backend and bucket size
    from an allreduce measured across exactly these nodes (`measured`), unless the user set the backend."""
    from cpuperf.decide import cluster
    from cpuperf.decide.recommend import RecommendRequest, recommend

    cons = cluster.constraints({n: by_name[n] for n in names})
    cons.require_one_stack()
    yours = {d.id: d.value for d in rec.decisions if d.overridden}
    pins = cluster_pins(cons, measured if len(names) > 1 else None, rec.levers)
    subs: List[NodePlan] = []
    for name in names:
        node = by_name[name]
        r = recommend(node, rec.workload, RecommendRequest(nnodes=len(names), overrides=yours, environ={}, pins=pins))
        request, edge = decided_inputs(r, hosts)
        subs.append((name, node, r, build_job_plan(request, node, edge)))
    return subs


def decided_inputs(rec: Recommendation, hosts: Optional[Sequence[Host]] = None, environ: Optional[Mapping[str, str]] = None,
                   slurm: SlurmFacts = NO_SLURM, master_addr: Optional[str] = None, mpi: Optional[Tuple[str, str]] = None,
                   euid: int = 1000) -> Tuple[PlanRequest, EdgeFacts]:
    """build_job_plan's request and edge for the job `cpuperf train --auto -- python your_script.py` would run with
    `rec`'s decisions (made by recommend, for a cluster's node, or at a tuning point), the script a placeholder.
    `environ`: the part of the shell the plan may see. Several nodes meet where every one can reach:
    --master-addr, else the hostfile's first host or the Slurm allocation's first node (runtime_env says which);
    with none of them runtime_env refuses (exit 2), as ccl-env does: loopback is never a rendezvous for other nodes."""
    from cpuperf.plan.request import PlanRequest

    several = tuple(hosts) if hosts else None
    request = PlanRequest(auto=True, launcher="torchrun" if several and len(several) > 1 else None,
                          master_addr=master_addr)
    edge = EdgeFacts(environ=environ or {}, out_dir="runs/train", python="python", euid=euid, workload=rec.workload,
                     hosts=several, nnodes=max(1, rec.levers.nnodes.value), master_addr=master_addr, slurm=slurm,
                     mpi=mpi, decided=rec)
    return request, edge


def cluster_pins(cons: ClusterConstraints, measured: Any, levers: Levers) -> Constraints:
    """What every node of a plan over several nodes must agree on, decided where each lever is decided (the
    engine), never patched after: fp32 unless every node runs bf16 natively; the DDP backend measured across
    exactly these nodes. The user's values stand over both."""
    from cpuperf.decide import cluster
    from cpuperf.decide.records import Constraints, Pin, as_backend

    fp32: Dtype = "fp32"
    dtype = Pin(fp32, cons.dtype_reason) if not cons.bf16 and not levers.dtype.overridden else None
    ddp = cluster.choose_ddp(measured) if measured and not levers.ddp_backend.overridden else None
    backend = None if ddp is None else Pin(as_backend(ddp.backend), ddp.reason,
                                            {**ddp.evidence, "bucket_cap_mb": ddp.bucket_cap_mb})
    return Constraints(dtype=dtype, ddp_backend=backend)


def saved_plan_of(facts: HostFacts, rec: Recommendation, jp: JobPlan, inputs: Mapping[str, Any], version: str,
                  made_on: Optional[str], subs: Sequence[NodePlan] = ()) -> SavedPlan:
    """The plan to save (cpuperf.plan.saved) with the facts it was made from, and each node's part."""
    from cpuperf.plan import saved

    plan = saved.make(facts, rec, jp.env, {k: inputs.get(k) for k in saved.INPUT_KEYS}, version, made_on, jp.memory)
    if subs:
        nodes = tuple((name, saved.make(f, r, j.env, plan.inputs, version, name, j.memory)) for name, f, r, j in subs)
        plan = replace(plan, nodes=nodes)
    return plan
