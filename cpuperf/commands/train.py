"""`cpuperf train`: run the built-in training loop (or a user's script) with the recommended settings.

probe -> recommendation (--auto) -> TrainSettings + runtime env (cpuperf.decide.runtime_env) -> LaunchPlan
(cpuperf.plan.launch) -> execute (cpuperf.run.launcher) -> verify what ran -> one summary.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from cpuperf.boundary import RDZV_TIMEOUT
from cpuperf.errors import CpuperfError, ExitCode, LaunchFailedError, UsageError, exit_code_for_signal
from cpuperf.output import Output

if TYPE_CHECKING:
    from cpuperf.decide.records import Measurements, Recommendation
    from cpuperf.decide.workload import Workload
    from cpuperf.plan.job import JobPlan, JobRequest
    from cpuperf.plan.launch import LaunchPlan
    from cpuperf.plan.saved import SavedPlan
    from cpuperf.plan.user_launcher import LauncherCommand, LauncherRanks
    from cpuperf.probe.facts import HostFacts
    from cpuperf.probe.hosts import Host
    from cpuperf.run.launcher import ExecResult

SCHEMA = "cpuperf.train/1"
DRY_RUN_SCHEMA = "cpuperf.train-plan/1"


@dataclass
class TrainArgs:
    auto: bool = False
    dry_run: bool = False
    sets: List[str] = field(default_factory=list)
    model: Optional[str] = None
    max_steps: Optional[int] = None
    time_budget: Optional[float] = None
    batch_size: Optional[int] = None
    seed: Optional[int] = None
    resume: bool = False
    out_dir: Optional[str] = None
    nproc_per_node: Optional[int] = None
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    hostfile: Optional[str] = None
    ppn: Optional[int] = None
    launcher: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    rdzv_timeout: Optional[float] = None
    device: str = "auto"
    unit: str = "socket"
    hf_flags: str = "auto"
    sysroot: Optional[str] = None
    user_argv: List[str] = field(default_factory=list)
    plan: Optional[str] = None  # a saved plan to run as it stands (cpuperf recommend --save)
    replan: bool = False
    adapt_to_load: bool = False
    tune: bool = False  # --tune: tune the levers on the user's command itself (a few short runs per candidate)
    budget: Optional[float] = None


def split_constraints(a: TrainArgs) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """--set values, typed by the one vocabulary: (decisions for recommend, the built-in loop's own settings)."""
    from cpuperf.knowledge.knobs import BY_ID, parse_assignments

    constraints = parse_assignments(a.sets)
    decided = {k: v for k, v in constraints.items() if BY_ID[k].decided or k == "oversubscribe"}
    worker = {k: v for k, v in constraints.items() if k not in decided}
    if worker and a.user_argv:
        key = sorted(worker)[0]
        raise UsageError(f"--set {key}: a setting of the built-in training loop; your script sets its own",
                         hint="pass it to your script as its own argument")
    if a.batch_size is not None:
        decided.setdefault("batch_size", a.batch_size)
    return decided, worker


def _nodes(a: TrainArgs, environ: Dict[str, str]) -> Tuple[Optional[Tuple[Host, ...]], int]:
    from cpuperf.plan.launch import slurm_allocation
    from cpuperf.probe.hosts import read_hostfile

    hosts = read_hostfile(a.hostfile) if a.hostfile else None
    nnodes = a.nnodes or (len(hosts) if hosts else None) or slurm_allocation(environ) or 1
    if hosts and nnodes > len(hosts):
        raise UsageError(f"--nnodes {nnodes} but the hostfile names {len(hosts)} host(s)",
                         hint="list every node in the hostfile, or lower --nnodes")
    return (tuple(hosts[:nnodes]) if hosts else None), nnodes


def _measurements(a: TrainArgs, facts: HostFacts, environ: Dict[str, str],
                  workload: Optional[Workload] = None) -> Optional[Measurements]:
    """--auto: what recommend decides from (the cache, else the rules), measured first where a real run starts
    on a host with nothing cached (the built-in loop also tuned on its shape, when long enough); plain: the
    cache as it is."""
    from cpuperf.run import measure

    def log(msg: str) -> None:
        sys.stderr.write(f"cpuperf train: {msg}\n")

    measure_ok = environ.get("CPUPERF_MEASURE", "1").strip() or "1"
    if measure_ok not in ("0", "1"):
        raise UsageError(f"CPUPERF_MEASURE={measure_ok[:40]!r} is not 0 or 1", hint="unset it, or 0 to skip measuring")
    if a.auto and not a.dry_run and not a.plan:
        from cpuperf.decide.placement import plan_placement

        return measure.measure_before_run(facts, plan_placement(facts).threads_per_rank, log,
                                          workload if not a.user_argv and not a.sets else None)
    if a.auto:
        return measure.planning_measurements(facts, log)
    return measure.load_cached(facts, log)


# Options that decide something: a saved plan has decided them already.
_PLAN_FIXES = ("sets", "model", "batch_size", "nproc_per_node", "ppn", "nnodes")


def _saved_plan(a: TrainArgs, facts: HostFacts) -> Tuple[SavedPlan, List[str]]:
    """(the saved plan, how this host differs from it): refused (exit 13) where it differs, unless --replan."""
    from cpuperf.plan.saved import plan_fits, read_plan_file

    given = [name for name in _PLAN_FIXES if getattr(a, name)]
    if given or a.device != "auto" or a.unit != "socket":
        what = (given or ["device" if a.device != "auto" else "unit"])[0].replace("_", "-")
        raise UsageError(f"--plan {a.plan} fixes the decisions; --{'set' if what == 'sets' else what} would change them",
                         hint="drop it, or make a new plan: cpuperf recommend ... --save FILE")
    plan = read_plan_file(str(a.plan))
    hosts = None
    if a.hostfile:
        from cpuperf.probe.hosts import read_hostfile

        hosts = read_hostfile(a.hostfile)
    from cpuperf.probe.hosts import this_node_names

    return plan_fits(str(a.plan), plan, facts, a.replan, this_node_names(hosts, a.node_rank))


def _where(a: TrainArgs, hosts: Optional[Tuple[Host, ...]], nnodes: int, launcher: str) -> Tuple[Optional[int], Optional[str]]:
    """Multi-node, before anything is planned: every host checked, this node's rank and address."""
    from cpuperf.run.launcher import check_hosts, local_node_rank

    if hosts and not a.dry_run:  # every host of a hostfile resolves before anything starts (exit 7)
        from cpuperf.probe.hosts import require_resolvable

        require_resolvable(hosts)
    if not hosts or nnodes <= 1 or a.dry_run:
        return a.node_rank, None
    addresses = check_hosts(hosts, ssh=launcher == "mpirun")
    node_rank = a.node_rank
    if node_rank is None:
        node_rank = local_node_rank(hosts, addresses)
        if node_rank is None:
            if launcher == "torchrun":
                raise UsageError("this machine is not in the hostfile", hint="pass --node-rank R (0 = the first host)")
            node_rank = 0
    if node_rank >= len(hosts):
        raise UsageError(f"--node-rank {node_rank} is outside 0..{len(hosts) - 1}")
    if launcher == "mpirun" and node_rank != 0:
        raise UsageError("mpirun starts every node from the first host of the hostfile",
                         hint="run cpuperf train there, or use --launcher torchrun on each node")
    return node_rank, addresses.get(hosts[node_rank].name)


def _interface(a: TrainArgs, hosts: Optional[Tuple[Host, ...]], nnodes: int, environ: Dict[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """(master address, the local interface that reaches it) for a multi-node gloo job."""
    if nnodes <= 1:
        return a.master_addr, None
    from cpuperf.plan.launch import expand_nodelist, slurm_allocation
    from cpuperf.run.vendor_env import route_interface

    master = a.master_addr
    if master is None and not hosts and slurm_allocation(environ):
        first = expand_nodelist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")[:1]
        master = first[0] if first else None  # rank 0 runs on the allocation's first node
    addr = master or (hosts[0].name if hosts else None)
    ifname = None
    if addr:
        others = [h.name for h in (hosts or ()) if h.name != addr]
        ifname = route_interface(addr) or (route_interface(others[0]) if others else None)
    return master, ifname


def _rank_command(a: TrainArgs, rec: Recommendation, request: JobRequest, out_dir: str) -> Tuple[List[str], Optional[Dict[str, Any]], Dict[str, Any]]:
    """(what each rank runs, the built-in worker's settings or None, the HF flags report)."""
    from cpuperf.plan.job import worker_command, worker_settings

    user = list(a.user_argv)
    if not user:
        from cpuperf.train.errors import ConfigError
        from cpuperf.train.settings import TrainSettings

        raw = worker_settings(rec, request, out_dir)
        try:
            settings = TrainSettings.from_dict(raw).to_dict()
        except ConfigError as exc:
            raise UsageError(f"training settings: {exc.message}", hint=exc.hint) from exc
        return worker_command(sys.executable, settings), settings, {}
    from cpuperf.plan import user_script
    from cpuperf.render import recommendation as render

    parsed = user_script.parse_command(user)
    ours, skipped = render.speed_flags(rec) if a.auto else ([], [])
    script = user_script.plan_script(user, ours, a.hf_flags if a.auto else "never", _read_script(parsed.script),
                                     rec.stack.get("transformers"), skipped)
    return list(script.argv), None, {**script.to_json(), "_script": script}


def _read_script(path: Optional[str]) -> Optional[str]:
    """The user's script text, to see how it parses its arguments (None: unreadable)."""
    if not path:
        return None
    from cpuperf.fsutil import InputRefused, read_text_capped

    try:
        return read_text_capped(path, errors="replace")
    except (OSError, InputRefused):
        return None


def build_plan(a: TrainArgs, facts: Optional[HostFacts] = None, environ: Optional[Dict[str, str]] = None,
               use_tuned: bool = True) -> JobPlan:
    """The job's one plan (cpuperf.plan.job.JobPlan): probe, constraints, decisions, env, launch; no side effects
    but probing (and, multi-node outside --dry-run, checking the hosts). `use_tuned` False: the rules' plan,
    without a cached tuning (the start of `--tune`)."""
    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.plan.job import JobRequest, plan_job
    from cpuperf.plan.launch import choose_launcher, mpi_flavour, slurm_allocation
    from cpuperf.probe import probe_host

    environ = dict(os.environ if environ is None else environ)
    if a.sysroot and not a.dry_run:
        raise UsageError("--sysroot describes a recorded host: it can be planned for, not trained on",
                         hint="add --dry-run")
    facts = facts or probe_host(sysroot=a.sysroot)
    if a.adapt_to_load and facts.load is None and facts.live:
        from cpuperf.probe import with_load

        facts = with_load(facts)  # --adapt-to-load: threads per rank avoid CPUs other work keeps busy now
    saved_plan, diffs = _saved_plan(a, facts) if a.plan else (None, [])
    if saved_plan is not None:
        a.auto = True  # a saved plan is what recommend decided
        a.nnodes = a.nnodes or int(saved_plan.rec.get("nnodes") or 1)
    decided, worker = split_constraints(a)
    hosts, nnodes = _nodes(a, environ)
    nproc = a.nproc_per_node or a.ppn
    yours = _your_launcher(a, facts, environ, oversubscribe=bool(decided.get("oversubscribe")))
    if yours is not None:
        if (nproc or 1) > 1 or a.launcher:
            raise UsageError(f"your command starts its own launcher ({yours.launcher}): cpuperf adds none on top",
                             hint="drop --nproc-per-node/--ppn/--launcher, or run your script without its launcher")
        # Every decision is made for the count the launcher starts (cpuperf.plan.user_launcher).
        nproc = yours.count or 1
        if yours.oversubscribed:
            decided.setdefault("oversubscribe", True)
    steps = a.max_steps if a.max_steps is not None else (None if a.time_budget else 400)
    workload = resolve_workload(a.model, None, None, None, steps)
    if saved_plan is not None:
        rec = _from_saved(a, saved_plan, diffs, facts, yours)
        workload = rec.workload
    else:
        meas = _measurements(a, facts, environ, workload)
        rec = recommend(facts, workload, nproc_per_node=nproc, nnodes=nnodes, unit=a.unit, device=a.device,
                        measurements=meas, overrides=decided,
                        tuned=_command_tuning(a, meas) if use_tuned else None,
                        shape_tuning=use_tuned and a.auto and not a.user_argv,
                        environ=environ if facts.live else {},
                        baseline=None if a.auto else ({} if yours is not None else {"nproc_per_node": 1}),
                        ranks_from=f"your launcher: {yours.source}" if yours is not None else None)
    v = rec.values()
    world = v["nproc_per_node"] * nnodes
    mpi = mpi_flavour(facts)
    launcher, _ = choose_launcher(a.launcher, world, nnodes, slurm_allocation(environ), mpi)
    node_rank, local_addr = _where(a, hosts, nnodes, launcher)
    master, ifname = _interface(a, hosts, nnodes, environ)
    out_dir = _out_dir(a)
    worker = _hf_config_shape(rec.workload, worker)
    request = JobRequest(auto=a.auto, constraints=worker, user_argv=tuple(a.user_argv), hosts=hosts, nnodes=nnodes,
                         node_rank=node_rank, launcher=a.launcher, master_addr=master, master_port=a.master_port,
                         local_addr=local_addr, out_dir=out_dir, resume=a.resume, max_steps=a.max_steps,
                         time_budget=a.time_budget, seed=a.seed,
                         hf_flags=a.hf_flags, job_id=_job_id(hosts, a.master_port), rdzv_timeout=a.rdzv_timeout,
                         preset=_preset(a.model or (saved_plan.inputs.get("model") if saved_plan else None))
                         if not a.user_argv else None)
    cmd, settings, hf = _rank_command(a, rec, request, out_dir)
    if yours is not None and yours.step:  # every rank dies with cpuperf; placed ones are also pinned
        from cpuperf.plan.user_launcher import split_launcher, with_rank_step

        flagged = split_launcher(cmd)  # the command with its Trainer flags, as the launcher will see it
        if flagged is not None:
            cmd = list(with_rank_step(flagged, sys.executable, _launcher_python(flagged)))
    return plan_job(facts, rec, request, environ=environ, rank_command=cmd, settings=settings,
                    mpi=mpi[1] if (mpi and a.launcher == "mpirun") else None, socket_ifname=ifname,
                    log_dir=os.path.join(out_dir, "logs"), euid=os.geteuid(), hf=hf, yours=yours,
                    planned_env=saved_plan.env if saved_plan is not None and not diffs else None)


def _command_tuning(a: TrainArgs, meas: Optional[Measurements]) -> Optional[Tuple[Dict[str, Any], str]]:
    """(the cached `train --tune` result for this command, where) for an --auto run of a user's command, else None."""
    if not (a.auto and a.user_argv and meas is not None):
        return None
    from cpuperf.plan.user_script import command_key

    entry = meas.tuned_by_command.get(command_key(a.user_argv))
    return (entry, "on this command") if entry else None


def _from_saved(a: TrainArgs, plan: SavedPlan, diffs: List[str], facts: HostFacts,
                yours: Optional[LauncherRanks]) -> Recommendation:
    """The saved plan's recommendation as it stands, or decided again here (--replan, where this host differs)."""
    from dataclasses import replace

    rec = plan.rec
    if diffs:
        from cpuperf.plan.saved import replan_from
        from cpuperf.run.measure import planning_measurements

        meas = planning_measurements(facts, lambda m: sys.stderr.write(f"cpuperf train: {m}\n"))
        rec = replan_from(plan, facts, meas, os.environ if facts.live else {})
        rec = replace(rec, notes=(*rec.notes, f"--replan: planned again here ({'; '.join(diffs)})"))
    else:
        from cpuperf.plan.saved import fresh_differences
        from cpuperf.run.measure import planning_measurements

        # Run as saved, never more; every way it differs from what cpuperf decides here is a note, said before
        # the run starts (_execute) and carried in --json.
        differ = [f"the plan differs from what cpuperf decides here: {d}" for d in fresh_differences(plan, facts, planning_measurements(facts))]
        rec = replace(rec, notes=(*rec.notes, *differ, f"plan {a.plan} run as saved (made by cpuperf {plan.cpuperf}"
                                  + (f" on {plan.made_on})" if plan.made_on else ")")))
    if yours is not None and yours.count is not None and yours.count != rec.placement.nproc_per_node:
        raise UsageError(f"plan {a.plan} places {rec.placement.nproc_per_node} rank(s) per node; your {yours.launcher} "
                         f"starts {yours.count} ({yours.source})",
                         hint=f"make the plan for it: cpuperf recommend --nproc-per-node {yours.count} --save {a.plan}")
    return rec


def _your_launcher(a: TrainArgs, facts: HostFacts, environ: Dict[str, str],
                   oversubscribe: bool = False) -> Optional[LauncherRanks]:
    """The user's own launcher and its ranks (cpuperf.plan.user_launcher.LauncherRanks), or None."""
    if not a.user_argv:
        return None
    from cpuperf.decide.placement import usable_cores
    from cpuperf.knowledge.gpu import visible_gpus
    from cpuperf.plan.user_launcher import launcher_ranks, split_launcher

    cmd = split_launcher(a.user_argv)
    if cmd is None:
        return None
    return launcher_ranks(cmd, logical_cpus=len(facts.topology.cpus) or 1,
                          physical_cores=max(1, len(usable_cores(facts))), gpus=len(visible_gpus(facts, environ)),
                          has_default_config=cmd.launcher == "accelerate" and _accelerate_default_config(environ),
                          environ=environ, interpreter=_launcher_python(cmd), oversubscribe=oversubscribe)


def _launcher_python(cmd: LauncherCommand) -> Optional[str]:
    """The Python a launcher runs scripts with: the one named (`python -m torch.distributed.run`), else the
    interpreter on the `#!` line of the launcher's script (a console script of that environment)."""
    import shutil

    first = cmd.prefix[0]
    path = shutil.which(first)
    if path is None:
        return None
    if cmd.prefix[1:2] == ("-m",) or os.path.basename(first).startswith("python"):
        return path
    try:
        with open(path, "rb") as fh:
            head = fh.read(512).split(b"\n", 1)[0]
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
        return shutil.which(words[0]) if words else None
    return words[0] if words and os.path.isfile(words[0]) else None


def _accelerate_default_config(environ: Dict[str, str]) -> bool:
    """accelerate reads its default config file when one exists (accelerate/commands/config/config_args.py:
    $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface; then accelerate/default_config.yaml)."""
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.isfile(os.path.join(os.path.expanduser(home), "accelerate", "default_config.yaml"))


def _out_dir(a: TrainArgs) -> str:
    """--out as given; else a new runs/train/version_N per run (the newest one with --resume)."""
    if a.out_dir is not None:
        return os.path.abspath(a.out_dir)
    from cpuperf.train.rundir import default_run_dir

    try:
        return default_run_dir(resume=a.resume, create=not a.dry_run)
    except OSError as exc:
        from cpuperf.errors import from_os_error

        raise from_os_error(exc) from None


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
    import hashlib

    key = ",".join(h.name for h in hosts or ()) + f":{port or ''}"
    return "cpuperf-" + hashlib.sha1(key.encode()).hexdigest()[:10]


def _plan_json(jp: JobPlan) -> Dict[str, Any]:
    plan = jp.launch
    return {"launcher": plan.launcher, "flavour": plan.flavour, "argv": list(plan.argv), "env": plan.env,
            "env_reasons": plan.env_reasons, "per_rank": [{"local_rank": r.local_rank, "cpus": list(r.cpus),
                                                           "threads": r.threads} for r in plan.per_rank],
            "world_size": plan.world_size, "nproc_per_node": plan.nproc_per_node, "nnodes": plan.nnodes,
            "node_rank": plan.node_rank, "hosts": list(plan.hosts), "master_addr": plan.master_addr,
            "master_port": plan.master_port, "affinity": list(plan.affinity) if plan.affinity else None,
            "log_dir": plan.log_dir, "rank_command": list(plan.rank_command), "notes": list(plan.notes),
            "node_commands": list(plan.node_commands), "yours": plan.yours}


def run_train(out: Output, a: TrainArgs) -> int:
    """`cpuperf train`: plan, (dry-run | execute), verify, report. Returns the exit code."""
    if a.user_argv and a.user_argv[0] == "--":
        a.user_argv = a.user_argv[1:]
    if a.tune:
        return _run_tune(out, a)
    jp = build_plan(a)
    launch = _plan_json(jp)
    if a.dry_run:
        result = {"schema": DRY_RUN_SCHEMA, "auto": a.auto, "launch": launch, "settings": jp.settings,
                  "decisions": list(jp.decisions), "hf_flags": _hf_json(jp), "applied": _applied(jp),
                  "workload": jp.rec.workload.to_json(), "notes": list(jp.notes)}
        if out.json_mode:
            out.json(result)
        else:
            _print_plan(out, jp)
        return 0
    return _execute(out, a, jp, launch)


def _run_tune(out: Output, a: TrainArgs) -> int:
    """`cpuperf train --tune -- <Trainer command>`: coordinate descent on the command itself (cpuperf.decide.tune),
    each candidate a few steps of it under `cpuperf train --auto --set ...`, measured by the Trainer's own
    train_samples_per_second; the winner cached for this command line, used by later `--auto` runs of it."""
    import dataclasses
    import tempfile
    import time

    from cpuperf.data import load_builtin
    from cpuperf.decide import tune as dtune
    from cpuperf.plan.user_script import command_key, detect_parser, parse_command, tuning_argv
    from cpuperf.run import measure
    from cpuperf.run import tune as rtune

    _check_tunable(a)
    parsed = parse_command(a.user_argv)
    parser, why = detect_parser(_read_script(parsed.script), parsed.script_args)
    if parser != "hf":
        raise UsageError(f"--tune runs your command for a few steps with --max_steps: {why}",
                         hint="it needs a Trainer script that parses TrainingArguments from its command line "
                              "(HfArgumentParser)")
    jp = build_plan(dataclasses.replace(a, auto=True, dry_run=True, tune=False), use_tuned=False)
    if jp.rec.get("device") != "cpu":
        raise UsageError("--tune tunes CPU training: this plan trains on a GPU", hint="add --device cpu to tune the CPU plan")
    facts, rule = jp.facts, rtune.rules()
    start, cand = dtune.start_point(jp.rec), dtune.candidates(facts, jp.rec, load_builtin("tuning.toml"), script=True,
                                                        own_launcher=bool(jp.launch.yours))
    budget = float(a.budget or rule["script_budget_s"])
    out.info(f"cpuperf train: tuning {', '.join(cand.values) or 'nothing'} on your command ({rule['script_steps']} "
             f"steps per run, {rule['script_passes']} interleaved passes, budget {budget:.0f} s) ...")

    def log(msg: str) -> None:
        out.info(f"cpuperf train: {msg}")

    with tempfile.TemporaryDirectory(prefix="cpuperf-tune-") as work:
        argv = tuning_argv(a.user_argv, int(rule["script_steps"]), os.path.join(work, "out"))
        result = rtune.tune(start, cand, lambda p: rtune.script_point(p, list(cand.values), argv, work), budget,
                            int(rule["script_passes"]), log)
    entry = {**result.to_json(), "measured_at": int(time.time()), "budget_s": budget, "skipped": cand.skipped,
             "command": list(a.user_argv)}
    lines = rtune.summary(result, cand)
    if result.stopped == "failed":
        raise LaunchFailedError("your command failed at the rule's point: nothing tuned",
                                hint="run it once with cpuperf train --auto -- ... to see why")
    path = measure.save_tuned(facts, "tuned_by_command", command_key(a.user_argv), entry)
    if out.json_mode:
        out.json({"schema": "cpuperf.train-tune/1", "cache": str(path), **entry})
    else:
        out.product("\n".join(lines + [f"cached at {path}: `cpuperf train --auto -- <this command>` uses it"]))
    return 0


def _check_tunable(a: TrainArgs) -> None:
    if not a.user_argv:
        raise UsageError("--tune tunes your own Trainer command: cpuperf train --tune -- python train.py ...",
                         hint="for the built-in loop: cpuperf bench --tune [--model NAME]")
    if a.dry_run or a.plan or a.sysroot:
        what = "--dry-run" if a.dry_run else "--plan" if a.plan else "--sysroot"
        raise UsageError(f"--tune runs your command on this host: not with {what}",
                         hint="cpuperf train --auto --dry-run -- ... shows the plan a tuning made")


# docs/exit-codes.md: a stop by signal N exits 128 + N, as a shell reports it.


def _execute(out: Output, a: TrainArgs, jp: JobPlan, launch: Dict[str, Any]) -> int:
    from cpuperf.plan.launch import check_observations
    from cpuperf.run.launcher import execute, result_summary_from_metrics

    plan, user = jp.launch, bool(jp.request.user_argv)
    for note in jp.notes:
        out.info(f"note: {note}")
    who = f"your {plan.yours['launcher']}" if plan.yours else plan.launcher
    out.info(f"cpuperf train: {who} with {plan.world_size} rank(s)"
             + (f" on {plan.nnodes} node(s), this is node {plan.node_rank}" if plan.nnodes > 1 else "")
             + (", tuned (--auto)" if a.auto else ", plain defaults (no --auto)")
             + (f"; run directory {jp.request.out_dir}" if a.out_dir is None else ""))  # new per run: say which
    applied = _applied(jp)
    if applied is not None:
        from cpuperf.plan.user_script import applied_lines

        for line in applied_lines(applied):
            out.info(line)
    script = jp.hf.get("_script")
    res = execute(plan, echo=None if out.quiet else sys.stderr, stdout_is_product=user and not out.json_mode,
                  tee_stderr=script is not None and bool(script.added))
    observed = [res.observations[r] for r in sorted(res.observations)]
    summary, runtime = (None, None)
    if jp.settings is not None:
        summary, runtime = result_summary_from_metrics(os.path.join(jp.request.out_dir, "metrics.jsonl"))
    warnings = check_observations(plan, observed, runtime)
    for w in warnings:
        out.warn(w)
    verification = {"ranks": [o.to_json() for o in observed], "warnings": warnings, "worker_runtime": runtime}
    ckpt = os.path.join(jp.request.out_dir, "checkpoint.pt")
    has_ckpt = not user and os.path.isfile(ckpt)
    if res.interrupted:
        # Say "checkpoint" only where one exists: a run stopped before its first step has none.
        message = f"interrupted ({res.signal_name or 'SIGINT'}); the ranks were stopped" + (
            f", the last checkpoint is {ckpt}" if has_ckpt else ", no checkpoint was written")
        hint = "cpuperf train --resume continues from it" if has_ckpt else None
        out.error(message, hint)
        code = exit_code_for_signal(res.signal_name)  # 128 + the signal
        if out.json_mode:
            out.json({"error": {"code": int(code), "name": code.name.lower(), "message": message,
                                "hint": hint}, "launch": launch, "applied": _applied(jp),
                      "supervisor": _supervisor(res)})
        return int(code)
    if res.code != 0:
        return _report_failure(out, jp, res, launch, verification, has_ckpt)
    result = _result(jp, res, summary, launch, verification)
    if not user and summary is not None:
        result["run_dir"] = jp.request.out_dir  # said on stderr too: a new runs/train/version_N without --out
        result["plot"] = _plot(out, jp.request.out_dir)
    if out.json_mode:
        out.json(result)
    elif not user:
        out.product(_human(result))
    return 0


def _plot(out: Output, run_dir: str) -> List[str]:
    """The run's picture (plot.svg, plot.png with matplotlib); a failure to draw never fails the run."""
    from cpuperf.render.plot import plot_run

    try:
        files = plot_run(run_dir)["files"]
    except CpuperfError as exc:
        out.warn(f"no plot of the run: {exc.message}")
        return []
    out.info("plot: " + ", ".join(files))
    return list(files)


def _hf_json(jp: JobPlan) -> Optional[Dict[str, Any]]:
    return {k: v for k, v in jp.hf.items() if k != "_script"} or None


def _applied(jp: JobPlan) -> Optional[Dict[str, Any]]:
    """Every flag, env var and launcher choice applied to a user's script (None for the built-in loop)."""
    script = jp.hf.get("_script")
    if script is None:
        return None
    from cpuperf.plan.user_script import applied

    return applied(jp.launch, script)


def _report_failure(out: Output, jp: JobPlan, res: ExecResult, launch: Dict[str, Any], verification: Dict[str, Any],
                    has_ckpt: bool) -> int:
    code, message, hint = _failure(jp.launch, res)
    from cpuperf.plan.user_script import rejected_flags

    rejected = rejected_flags(res.code, res.wall_s, res.launcher_output, jp.hf.get("_script"))
    if rejected:
        message, hint = rejected
    if hint is None and has_ckpt:
        hint = "fix the cause, then cpuperf train --resume continues from the last checkpoint"
    if out.json_mode:
        out.json({"error": {"code": code, "name": "launch_failed" if code == ExitCode.LAUNCH_FAILED else "rank_failed",
                            "message": message, "hint": hint}, "launch": launch, "verification": verification,
                  "applied": _applied(jp), "supervisor": _supervisor(res)})
    out.error(message, hint)
    return code


def _result(jp: JobPlan, res: ExecResult, summary: Optional[Dict[str, Any]], launch: Dict[str, Any],
            verification: Dict[str, Any]) -> Dict[str, Any]:
    plan = jp.launch
    if jp.request.user_argv:
        return {"schema": SCHEMA, "user_command": list(plan.rank_command), "world_size": plan.world_size,
                "wall_s": round(res.wall_s, 3), "hf_flags": _hf_json(jp), "applied": _applied(jp),
                "decisions": list(jp.decisions),
                "launch": launch, "verification": verification, "supervisor": _supervisor(res)}
    if summary is None and plan.node_rank != 0:
        summary = {"schema": SCHEMA, "status": "completed", "node_rank": plan.node_rank,
                   "world_size": plan.world_size, "settings": jp.settings,
                   "note": f"rank 0 runs on {plan.master_addr}: the run's summary and metrics are written there"}
    if summary is None:
        raise LaunchFailedError("the training run ended without a summary in its metrics file",
                                hint=f"see the logs under {plan.log_dir}")
    summary = {k: val for k, val in summary.items() if k != "type"}
    return {**summary, "wall_s": round(res.wall_s, 3), "decisions": list(jp.decisions), "launch": launch,
            "verification": verification, "supervisor": _supervisor(res)}


def _supervisor(res: ExecResult) -> Optional[Dict[str, float]]:
    """cpuperf's own CPU time while the job ran: {cpu_s, wall_s, cpu_share (of one core)}."""
    return res.supervisor.to_json() if res.supervisor is not None else None


def _failure(plan: LaunchPlan, res: ExecResult) -> Tuple[int, str, Optional[str]]:
    """(exit code, one-line message, hint or None) naming what failed first: the rank's own error
    when it left one, a rendezvous that timed out with the nodes that never joined, else the rank
    and its log."""
    from cpuperf.plan.launch import first_failure, rendezvous_timed_out

    if plan.launcher == "torchrun" and plan.nnodes > 1 and rendezvous_timed_out(res.launcher_output):
        others = [h for i, h in enumerate(plan.hosts[:plan.nnodes]) if i != plan.node_rank] or ["the other nodes"]
        timeout = plan.env.get(RDZV_TIMEOUT, "?")
        return int(ExitCode.UNREACHABLE), (
            f"the rendezvous at {plan.master_addr}:{plan.master_port} did not complete within {timeout} s: "
            f"not joined: {', '.join(others)}"), "start cpuperf train on every node of the hostfile, or raise --rdzv-timeout"
    parsed = first_failure(res.launcher_output, res.died_first) if plan.launcher != "direct" else (0, res.code)
    rank = parsed[0] if parsed else None
    errors = res.rank_errors
    # The rank that failed first speaks; a rank killed by a signal leaves no error of its own, and
    # its peers' errors (a broken connection) are consequences, not the cause.
    own = errors.get(rank) if rank is not None else (errors[min(errors)] if errors else None)
    if own is not None:  # the worker's own one line, said once, with its code and hint
        who = f"rank {own.get('rank', rank)}: " if plan.world_size > 1 else ""
        return int(own.get("code") or res.code or 1), who + str(own["message"]), own.get("hint")
    if plan.launcher == "direct":
        return res.code, f"the training process exited with code {res.code}" + _signal_name(res.code), None
    code = parsed[1] if parsed and parsed[1] else None
    if rank is None:
        return res.code or int(ExitCode.LAUNCH_FAILED), (f"{plan.launcher} failed with exit code {res.code}; "
                                                          f"log: {os.path.join(plan.log_dir or '', 'launcher.log')}"), None
    log = os.path.join(plan.log_dir or "", f"rank{rank}.log")
    if code is None:
        code = res.code or int(ExitCode.LAUNCH_FAILED)
        how = f"{plan.launcher} exited with {res.code}"
    else:
        how = f"exit code {code}{_signal_name(code)}"
    return code, f"rank {rank} failed first ({how}); log: {log}", None


def _signal_name(code: int) -> str:
    import signal

    if code > 128:
        try:
            return f" = killed by {signal.Signals(code - 128).name}"
        except ValueError:
            return ""
    return ""


def _human(r: Dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    st = r.get("settings") or {}
    return (f"{r.get('status', 'done')}: {r.get('steps')} steps on {r.get('world_size')} rank(s), "
            f"{st.get('dtype')}{' compile' if st.get('compile') else ''}{' ipex' if st.get('ipex') else ''}, "
            f"{r.get('threads')} thread(s)\n"
            f"loss {f(r.get('loss_first'), '.4f')} -> {f(r.get('loss_last'), '.4f')}, "
            f"{f(r.get('samples_per_s'), '.1f')} samples/s, {f(r.get('tokens_per_s'), '.0f')} tokens/s, "
            f"wall {r['wall_s']:.1f} s\n"
            f"metrics {r.get('metrics_file')}\ncheckpoint {r.get('checkpoint')}")


def _print_plan(out: Output, jp: JobPlan) -> None:
    from cpuperf.plan.launch import shell_line

    plan = jp.launch
    if plan.yours:
        lines = [f"# launcher: yours ({plan.yours['launcher']}), {plan.world_size} rank(s) from {plan.yours['from']}"]
    else:
        lines = [f"# launcher: {plan.launcher}" + (f" ({plan.flavour})" if plan.flavour and plan.flavour != plan.launcher else "")
                 + f", {plan.world_size} rank(s)"]
    for spec in plan.per_rank:
        lines.append(f"#   local rank {spec.local_rank}: CPUs {','.join(map(str, spec.cpus)) or 'unpinned'}, "
                     f"threads {spec.threads if spec.threads is not None else 'the launcher or torch default'}")
    # A user's script gets the launch-level decisions; its own hyperparameters stay its own (the applied
    # list below says which Trainer flags, if any, carry a decision to it).
    shown = (("threads_per_rank", "nproc_per_node", "ddp_backend", "allocator", "plain") if jp.request.user_argv else
             ("dtype", "compile", "ipex", "threads_per_rank", "ddp_backend", "allocator", "batch_size", "optimizer", "plain"))
    # Ranks given thread counts but no CPUs: the plan decided against pinning, and says why.
    if len(plan.per_rank) > 1 and any(s.threads for s in plan.per_rank) and not any(s.cpus for s in plan.per_rank):
        shown = (*shown, "affinity")
    for d in jp.decisions:
        if d["overridden"] or d["id"] in shown or str(d["reason"]).startswith("tuned "):
            lines.append(f"# {d['id']} = {d['value']}: {d['reason']}")
    for note in plan.notes:
        lines.append(f"# {note}")
    applied = _applied(jp)
    if applied is not None:
        from cpuperf.plan.user_script import applied_lines

        lines.extend("# " + line for line in applied_lines(applied))
    lines.append(shell_line(plan.argv, dict(plan.env)))
    out.product("\n".join(lines))
    for note in jp.notes:
        out.info(f"note: {note}")


__all__ = ["TrainArgs", "run_train", "build_plan", "CpuperfError"]
