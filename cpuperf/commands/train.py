"""`cpuperf train`: run the built-in training loop (or a user's script) with the recommended settings.

probe -> recommendation (--auto) -> TrainSettings + runtime env (cpuperf.decide.runtime_env) -> LaunchPlan
(cpuperf.plan.launch) -> execute (cpuperf.run.launcher) -> verify what ran -> one summary.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from cpuperf.boundary import RDZV_TIMEOUT
from cpuperf.decide.placement import plan_placement
from cpuperf.decide.workload import for_script, from_script, resolve_workload
from cpuperf.errors import CpuperfError, ExitCode, LaunchFailedError, UsageError, exit_code_for_signal
from cpuperf.jsonable import JsonObject
from cpuperf.output import Output
from cpuperf.plan.build import EdgeFacts, build_job_plan
from cpuperf.probe.hf import script_model
from cpuperf.probe.launchers import launcher_python, read_script
from cpuperf.run import timeline
from cpuperf.run.edge import Found, Sources, gather
from cpuperf.run.measure import planning_measurements, train_measurements
from cpuperf.train.rundir import remove_if_empty, run_dir

if TYPE_CHECKING:
    from cpuperf.decide.workload import Workload
    from cpuperf.plan.applied import LeverState
    from cpuperf.plan.command import CommandLine
    from cpuperf.plan.job import JobPlan
    from cpuperf.plan.launch import LaunchPlan, RankObservation
    from cpuperf.plan.request import PlanRequest
    from cpuperf.plan.user_script import ScriptReport
    from cpuperf.probe.facts import HostFacts
    from cpuperf.run.launcher import ExecResult

SCHEMA = "cpuperf.train/1"
DRY_RUN_SCHEMA = "cpuperf.train-plan/1"


@dataclass(frozen=True)
class TrainOptions:
    """`train`'s options as cli.py passes them through: those the planner's request carries as given (auto ...
    replan, `argv`: the command after `--`; `given_request`), the raw ones it types (--set, --batch-size,
    --nproc-per-node/--ppn; `train_request`), where the facts come from, and --tune, which runs instead of one plan."""

    auto: bool = False
    dry_run: bool = False
    model: Optional[str] = None
    max_steps: Optional[int] = None
    time_budget: Optional[float] = None
    seed: Optional[int] = None
    resume: bool = False
    out_dir: Optional[str] = None
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    launcher: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    rdzv_timeout: Optional[float] = None
    device: str = "auto"
    unit: str = "socket"
    hf_flags: str = "auto"
    argv: Tuple[str, ...] = ()
    plan: Optional[str] = None
    replan: bool = False
    sets: Tuple[str, ...] = ()
    batch_size: Optional[int] = None
    nproc_per_node: Optional[int] = None
    ppn: Optional[int] = None
    sysroot: Optional[str] = None
    hostfile: Optional[str] = None
    adapt_to_load: bool = False
    tune: bool = False  # --tune: tune the levers on the user's command itself (a few short runs per candidate)
    budget: Optional[float] = None
    verbose: bool = False  # --verbose: where the run's seconds went outside the job (cpuperf.run.timeline)
    again: Tuple[str, ...] = ()  # the options as given, less --out/--resume: the resume hint repeats them


def resume_hint(jp: JobPlan, again: Tuple[str, ...]) -> str:
    """The command that continues this run from its checkpoint, as it works when pasted: the run's own options
    (the model shape, --auto, --set ...) with --resume and its run directory."""
    return "cpuperf train " + shlex.join([*again, "--resume", "--out", jp.request.out_dir])


def run(out: Output, options: TrainOptions) -> int:
    """`cpuperf train`: one run (run_train), or with --tune a search on the command instead (run_tune)."""
    return (run_tune if options.tune else run_train)(out, given_request(options), options)


def given_request(o: TrainOptions) -> PlanRequest:
    """The planner's request as the options gave it (train_request completes it)."""
    from cpuperf.plan.request import PlanRequest

    if o.replan and o.plan is None:
        raise UsageError("--replan without --plan: there is no saved plan to plan again",
                         hint="cpuperf train --plan FILE --replan, or leave out --replan (a plan is made here anyway)")
    return PlanRequest(auto=o.auto, dry_run=o.dry_run, model=o.model, max_steps=o.max_steps, time_budget=o.time_budget,
                       seed=o.seed, resume=o.resume, out_dir=o.out_dir, nnodes=o.nnodes, node_rank=o.node_rank,
                       launcher=o.launcher, master_addr=o.master_addr, master_port=o.master_port,
                       rdzv_timeout=o.rdzv_timeout, device=o.device, unit=o.unit, hf_flags=o.hf_flags,
                       user_argv=o.argv, plan=o.plan, replan=o.replan)


def train_request(given: PlanRequest, o: TrainOptions) -> PlanRequest:
    """The request as the options gave it, completed with the values `o` types (the constraints, the ranks per
    node); the combinations refused before anything is probed (exit 2)."""
    from cpuperf.plan.request import (
        check_builtin_only,
        check_option_values,
        check_own_launcher,
        check_saved_plan_options,
        check_sysroot,
        split_constraints,
        with_command,
    )

    check_sysroot(o.sysroot, given.dry_run)
    check_option_values(given)
    check_builtin_only(given)
    if given.plan:
        # Options that decide something: a saved plan has decided them already.
        fixes = {"sets": o.sets, "model": given.model, "batch_size": o.batch_size, "nproc_per_node": o.nproc_per_node,
                 "ppn": o.ppn, "nnodes": given.nnodes}
        check_saved_plan_options(given.plan, [name for name, v in fixes.items() if v], given.device, given.unit)
    nproc = o.nproc_per_node or o.ppn
    given = with_command(given)  # the user's command, read once: every later step reads given.command
    check_own_launcher(given.command, nproc, given.launcher)
    decided, worker = split_constraints(o.sets, o.batch_size, given.user_argv)
    return dataclasses.replace(given, decided=decided, worker=worker, has_sets=bool(o.sets), nproc=nproc,
                               global_batch=o.batch_size if not given.user_argv else None)


def _say(msg: str) -> None:
    from cpuperf.output import message

    message(f"cpuperf train: {msg}")


def build_plan(request: PlanRequest, options: TrainOptions = TrainOptions(), facts: Optional[HostFacts] = None,
               environ: Optional[Dict[str, str]] = None, use_tuned: bool = True,
               say: Callable[[str], None] = _say) -> JobPlan:
    """The job's one plan (cpuperf.plan.build) from the request and what the edge finds. Side effects: probing,
    measuring (a real --auto run), and, outside --dry-run, checking the hosts and making the run directory.
    `use_tuned` False: the rules' plan (the start of `--tune`). `say`: where its messages go (Output.teller)."""
    from cpuperf.decide.runtime_env import users_own
    from cpuperf.plan.request import with_command

    # what an earlier `eval "$(cpuperf ccl-env)"` exported, unchanged since, is cpuperf's: planned again, not kept
    environ = users_own(os.environ if environ is None else environ)
    request = with_command(request)
    # The host's facts and the user's records (hostfile, Slurm job, the command and its script, a saved plan held
    # against the host), then the job's nodes, each read once (cpuperf.run.edge); then what only a run does.
    found = gather(request, Sources(sysroot=options.sysroot, hostfile=options.hostfile,
                                    adapt_to_load=options.adapt_to_load, facts=facts), environ)
    workload = _workload(request, options, found)
    timeline.mark("read your command and the model it names")
    out_dir = run_dir(request.out_dir, resume=request.resume, create=not request.dry_run)
    try:
        jp = build_job_plan(request, found.facts, _edge_facts(request, found, workload, out_dir, say), use_tuned)
        timeline.mark("plan the job")
        return jp
    except BaseException:
        if request.out_dir is None and not request.dry_run and not request.resume:
            remove_if_empty(out_dir)  # made for this run, which never started
        raise


def _workload(request: PlanRequest, options: TrainOptions, found: Found) -> Workload:
    """What is trained: the model and batch your script names in its own arguments (never downloaded), with
    --model's shape for the memory plan; else the built-in loop's (--model, the batch you set)."""
    argv, steps = request.user_argv, request.steps
    if argv:
        script = request.command.script.script if request.command is not None else None
        named = script_model(found.script.named() if found.script is not None else {}, os.getcwd(), found.environ,
                             found.launcher_python or launcher_python(argv[:1]) if script else None,
                             may_run=not request.dry_run or options.tune)  # --tune runs it anyway
        return (for_script(resolve_workload(request.model, None, None, None, steps), named) if request.model
                else from_script(named))
    # the batch you set is the workload's: the shape a tuning is cached and looked up for (shape_key)
    batch = request.global_batch or request.decided.get("batch_size")
    return resolve_workload(request.model, None, None, batch if isinstance(batch, int) else None, steps,
                            host=found.facts)


def _edge_facts(request: PlanRequest, found: Found, workload: Workload, out_dir: str,
                say: Callable[[str], None]) -> EdgeFacts:
    """What only a run adds to the edge: the measurements (a real --auto run measures with the rules' threads per
    rank where nothing usable is cached), this node's place among the hosts, the route to the rendezvous."""
    facts = found.facts
    if found.saved is not None:  # the cache the saved plan's decisions read, said only where it plans again
        meas = planning_measurements(facts, say if found.saved_diffs else None)
    else:
        real_auto = request.auto and not request.dry_run
        meas = train_measurements(facts, found.environ, say, auto=request.auto,
                                  threads=plan_placement(facts).threads_per_rank if real_auto else None,
                                  shape=workload if not request.user_argv and not request.has_sets else None)
    timeline.mark("measurements")
    node_rank, local_addr = request.node_rank, None
    if not request.dry_run:  # the launcher's module: a real run's (a dry run starts nothing)
        from cpuperf.run.launcher import locate_node

        node_rank, local_addr = locate_node(found.hosts, found.nnodes, request.node_rank, request.launcher,
                                            found.slurm.allocation, found.mpi)
    ifname = None
    if found.nnodes > 1:  # the route to the rendezvous: several nodes only
        from cpuperf.run.vendor_env import master_interface

        ifname = master_interface(found.rendezvous, found.hosts)
    return found.edge_facts(workload, out_dir, sys.executable, measurements=meas, node_rank=node_rank,
                            local_addr=local_addr, master_addr=request.master_addr, socket_ifname=ifname)


def _plan_json(jp: JobPlan) -> Dict[str, Any]:
    plan = jp.launch
    return {"launcher": plan.launcher, "flavour": plan.flavour, "argv": list(plan.argv), "env": plan.env,
            "env_reasons": plan.env_reasons, "per_rank": [{"local_rank": r.local_rank, "cpus": list(r.cpus),
                                                           "threads": r.threads} for r in plan.per_rank],
            "world_size": plan.world_size, "nproc_per_node": plan.nproc_per_node, "nnodes": plan.nnodes,
            "node_rank": plan.node_rank, "hosts": list(plan.hosts), "master_addr": plan.master_addr,
            "master_port": plan.master_port, "affinity": list(plan.affinity) if plan.affinity else None,
            "log_dir": plan.log_dir, "rank_command": list(plan.rank_command), "notes": list(plan.notes),
            "node_commands": list(plan.node_commands), "yours": plan.yours.to_json() if plan.yours is not None else None}


def run_train(out: Output, given: PlanRequest, options: TrainOptions) -> int:
    """`cpuperf train`: plan, (dry-run | execute), verify, report. Returns the exit code. `given`: the request as
    the options gave it (train_request completes it). `train --tune` is another job: run_tune."""
    timeline.reset()  # one run per process; a test may run several in one
    timeline.mark("start Python, import cpuperf, read the options")
    request = train_request(given, options)
    if not request.dry_run:
        check_startable(request.command, dict(os.environ))
    jp = build_plan(request, options, say=out.teller("cpuperf train: "))
    _refuse_dropped(jp, options)
    if request.user_argv and request.model:  # said, since it changes nothing your command runs
        out.info(f"cpuperf train: --model {request.model} sizes the memory plan of your command; the model it trains "
                 "is its own code's")
    launch = _plan_json(jp)
    if request.dry_run:
        result = _dry_run_json(jp, launch)
        if out.json_mode:
            out.json(result)
        else:
            _print_plan(out, jp)
        return 0
    code = _execute(out, request, jp, launch, options.again)
    timeline.mark("verify and report")
    if options.verbose:
        _say_timing(out)
    return code


def _say_timing(out: Output) -> None:
    """--verbose: each part of the run's wall time, the job's and cpuperf's own (cpuperf.run.timeline)."""
    for line in timeline.render():
        out.info("cpuperf train: " + line)


def _refuse_dropped(jp: JobPlan, options: TrainOptions) -> None:
    """A value you gave (--batch-size, --set KEY=VALUE) that your command cannot carry is refused (exit 2) before
    anything runs, never dropped: `--batch-size 4 -- python plain.py` trained the script's own batch, said only as
    one lever line among thirty."""
    from cpuperf.plan.applied import YOURS_KEPT

    if not jp.request.asked.user_argv:
        return
    for state in _lever_report(jp):
        decision = getattr(jp.rec.levers, state.id, None)
        if state.applied or decision is None or not decision.overridden or state.how.startswith(YOURS_KEPT):
            continue  # carried, not yours, or your own variable for it stands (the plan says so)
        given = (f"--batch-size {options.batch_size}" if state.id == "batch_size" and options.batch_size
                 else f"--set {state.id}={state.value}")
        raise UsageError(f"{given}: your command cannot take it ({state.how})",
                         hint="drop it, and give your script its own option for it (after `--`)")


def check_startable(command: Optional[CommandLine], environ: Dict[str, str]) -> None:
    """A command of yours that cannot start is refused before anything is launched, with one line: its program on no
    PATH (exit 8, `-- pythn x.py`), or its script not there (exit 2, `-- python nosuch.py`, also behind your own
    torchrun or accelerate); such a command was launched, and ended as python's or torchrun's own exit 2 or 1."""
    from cpuperf.probe.launchers import program_missing, script_missing

    if command is None or command.hidden:  # a shell line cpuperf does not read through: the shell says
        return
    path = command.environ(environ).get("PATH")
    for word in dict.fromkeys(w for w in (command.given[:1] + command.words[:1]) if w):
        if program_missing(word, path):
            raise LaunchFailedError(f"{word}: command not found (no such program on PATH or at that path)",
                                    hint=f"check the first word of your command after `--`: {shlex.join(command.given)}")
    script = command.script.script
    changes_dir = any(w.shell or {"-C", "--chdir"} & set(w.argv) for w in command.wrappers)
    if script and not changes_dir and script_missing(script):
        raise UsageError(f"{script}: no such script (your command runs {shlex.join(command.words)} in {os.getcwd()})",
                         hint="check the script's path: it is found from the current directory")


def _settings_json(jp: JobPlan) -> Optional[JsonObject]:
    """The built-in worker's settings as the dry run and the result show them (None for a user's command)."""
    return jp.settings.to_dict() if jp.settings is not None else None


def _global_batch(jp: JobPlan) -> Optional[Dict[str, Any]]:
    """The job's global batch as planned (world x per-device x accumulation) where the plan knows it, with how the
    ranks share it; None where the batch is the command's own code's."""
    rec = jp.rec
    if rec.split is not None:
        return rec.split.to_json()
    dp = rec.workload.parallel
    if dp.kind == "builtin" and jp.settings is not None:
        per, acc = jp.settings.batch_size, jp.settings.grad_accum_steps
        return {"ranks": rec.levers.world, "global_batch": rec.levers.world * per * acc,
                "after": {"per_device": per, "grad_accum": acc, "processes": rec.levers.world}}
    if dp.global_batch is None:
        return None
    return {"ranks": rec.levers.world, "global_batch": rec.levers.world * dp.global_batch,
            "after": {"per_device": dp.per_device, "grad_accum": dp.grad_accum, "processes": rec.levers.world,
                      "from": dp.where}}


def run_tune(out: Output, given: PlanRequest, options: TrainOptions) -> int:
    """`cpuperf train --tune -- <Trainer command>`: coordinate descent on the command itself (cpuperf.decide.tune),
    each candidate a few steps of it under `cpuperf train --auto --set ...`, measured by the Trainer's own
    train_samples_per_second; the winner cached for this command line, used by later `--auto` runs of it."""
    timeline.resume_collector()  # a search of many runs, not one plan
    from cpuperf.plan.request import with_command
    from cpuperf.plan.script_read import read_user_script
    from cpuperf.plan.user_script import script_kind
    from cpuperf.run import tune as rtune

    _check_tunable(given, options)
    given = with_command(given)
    check_startable(given.command, dict(os.environ))
    command = given.command
    assert command is not None  # _check_tunable: a command is given
    script_text = read_script(command.script.script)
    parser, why = script_kind(read_user_script(command.script, script_text))
    if parser != "hf":
        raise UsageError(f"--tune runs your command for a few steps with --max_steps: {why}",
                         hint="it needs a Trainer script that parses TrainingArguments from its command line "
                              "(HfArgumentParser)")
    request = train_request(dataclasses.replace(given, auto=True, dry_run=True), options)
    jp = build_plan(request, options, use_tuned=False, say=out.teller("cpuperf train: "))
    if jp.rec.levers.device.value != "cpu":
        raise UsageError("--tune tunes CPU training: this plan trains on a GPU", hint="add --device cpu to tune the CPU plan")
    found, cand, budget = rtune.tune_on_command(jp, command, options.budget, out.teller("cpuperf train: "))
    if found.why_not is not None:
        raise CpuperfError(f"--tune: not saved as a tuning: {found.why_not}",
                           hint="your command was measured, not changed; the rules decide its --auto runs")
    result = found.result
    if result is None and found.code:  # the command's own failure: its exit code, as a run of it returns
        message = f"your command exited with code {found.code} at the rule's point: nothing tuned"
        hint = "run it once with cpuperf train --auto -- ... to see why"
        if out.json_mode:
            out.json({"error": {"code": found.code, "name": "command_failed", "message": message, "hint": hint}})
        out.error(message, hint)
        return found.code
    if result is None or result.stopped == "failed":
        raise LaunchFailedError("your command failed at the rule's point: nothing tuned",
                                hint="run it once with cpuperf train --auto -- ... to see why")
    entry, path = rtune.cache_command_tuning(jp.facts, command, script_text, found, cand, budget,
                                              jp.script.reading if jp.script is not None else None)
    if out.json_mode:
        out.json({"schema": "cpuperf.train-tune/1", "cache": str(path), **entry})
    else:
        lines = rtune.summary(result, cand)
        out.product("\n".join(lines + [f"cached at {path}: `cpuperf train --auto -- <this command>` uses it"]))
    return 0


def _check_tunable(request: PlanRequest, options: TrainOptions) -> None:
    if not request.user_argv:
        raise UsageError("--tune tunes your own Trainer command: cpuperf train --tune -- python train.py ...",
                         hint="for the built-in loop: cpuperf bench --tune [--model NAME]")
    if request.dry_run or request.plan or options.sysroot:
        what = "--dry-run" if request.dry_run else "--plan" if request.plan else "--sysroot"
        raise UsageError(f"--tune runs your command on this host: not with {what}",
                         hint="cpuperf train --auto --dry-run -- ... shows the plan a tuning made")


# docs/exit-codes.md: a stop by signal N exits 128 + N, as a shell reports it.


def _execute(out: Output, asked: PlanRequest, jp: JobPlan, launch: Dict[str, Any], again: Tuple[str, ...] = ()) -> int:
    from cpuperf.run.launcher import execute

    plan, user = jp.launch, bool(jp.request.asked.user_argv)
    for note in jp.notes:
        out.info(f"note: {note}")
    who = f"your {plan.yours.launcher}" if plan.yours is not None else plan.launcher
    out.info(f"cpuperf train: {who} with {plan.world_size} rank(s)"
             + (f" on {plan.nnodes} node(s), this is node {plan.node_rank}" if plan.nnodes > 1 else "")
             + (", the recommended settings (--auto)" if jp.request.auto else ", plain defaults (no --auto)")
             + (f"; run directory {_here(jp.request.out_dir)}" if asked.out_dir is None and not asked.resume else "")
             + (f"; resuming {_here(jp.request.out_dir)} (the newest run with a checkpoint)"
                if asked.out_dir is None and asked.resume else ""))  # new per run, or the one continued: say which
    _say_levers(out, jp)  # once, before the job starts: short, or in full with -v
    record = _Record(jp, launch)
    try:
        if jp.settings is not None:  # the built-in worker's files: a link there is refused before any rank starts
            from cpuperf.train.rundir import refuse_links

            refuse_links(jp.request.out_dir, asked.resume)
        script = jp.script
        if script is not None:
            _write_config_files(script.files)
        timeline.mark("say the plan")
        timeline.resume_collector()  # the plan is made; cpuperf now waits on the job, for as long as it runs
        res = execute(plan, echo=None if out.quiet else sys.stderr, stdout_is_product=user and not out.json_mode,
                      tee_stderr=script is not None and bool(script.added), output_log=record.output_log,
                      locked=record.begin, environ=_worker_environ(jp))
    except CpuperfError as exc:
        record.refused(out, int(exc.code))
        raise
    except BaseException:
        record.refused(out, None)
        raise
    code = _after(out, asked, jp, launch, res, record, again)
    record.end(out, res, code)
    return code


def _worker_environ(jp: JobPlan) -> Dict[str, str]:
    """The job's environment as the plan read it: ccl-env's own exports are the plan's to set, not inherited as
    yours. The built-in worker's messages are cpuperf's, wrapped as cpuperf's are: its output reaches the terminal
    through a pipe (tee'd to the log), so the terminal's width goes with it as COLUMNS where none is set."""
    from cpuperf.decide.runtime_env import users_own
    from cpuperf.output import message_width

    environ = dict(users_own(os.environ))
    width = message_width()
    if jp.settings is not None and width is not None and not os.environ.get("COLUMNS"):
        environ["COLUMNS"] = str(width)
    return environ


def _here(path: str) -> str:
    """A path as the summary shows it: relative to the current directory where that is shorter."""
    from cpuperf.render.run_report import where

    return where(path, os.getcwd())


class _Record:
    """The run's own record in its directory (cpuperf.run.record): plan.json when the run directory is locked,
    status.json when the job ends (or failed to start), and the summary said then. An unstarted run made for this
    command leaves no empty directory behind."""

    def __init__(self, jp: JobPlan, launch: Dict[str, Any]) -> None:
        plan = jp.launch
        self.jp, self.launch, self.started = jp, launch, None  # type: JobPlan, Dict[str, Any], Optional[float]
        self.run_dir = jp.request.out_dir
        direct = plan.launcher == "direct" and plan.log_dir is not None
        from cpuperf.run.record import OUTPUT_LOG

        self.output_log = os.path.join(plan.log_dir, OUTPUT_LOG) if direct and plan.log_dir else None
        self.log = self.output_log or (os.path.join(plan.log_dir, "launcher.log") if plan.log_dir else None)
        self.metrics: Optional[Dict[str, Any]] = None
        self.status: Optional[Dict[str, Any]] = None
        self.had_lightning_logs = True
        self.plan: Optional[str] = None  # plan.json, once written
        self.builtin: Dict[str, Optional[str]] = {}  # the built-in run's metrics file and plot, said in the summary

    def begin(self) -> None:
        """The run directory is this run's (locked): its plan in full, the lever report included."""
        from cpuperf.run.record import PLAN_NAME, now, write_json

        self.started = now()
        self.had_lightning_logs = os.path.isdir("lightning_logs")  # a run that makes it and leaves it empty removes it
        try:
            write_json(os.path.join(self.run_dir, PLAN_NAME), _dry_run_json(self.jp, self.launch))
            self.plan = os.path.join(self.run_dir, PLAN_NAME)
        except OSError as exc:  # NotOurs (a project's own plan.json under --out .), or a full disk: the job runs
            from cpuperf.output import message

            message(f"warning: no plan.json in the run directory: {getattr(exc, 'strerror', None) or exc}")

    def refused(self, out: Output, code: Optional[int]) -> None:
        if self.started is None:  # never started: the directory made for it goes (never anything in it)
            req = self.jp.request
            if req.asked.out_dir is None and not req.asked.resume:
                from cpuperf.train.rundir import remove_if_empty

                remove_if_empty(os.path.join(self.run_dir, "logs"))
                remove_if_empty(self.run_dir)
            return
        self._write(out, code if code is not None else int(ExitCode.LAUNCH_FAILED), 0.0, None, say=False)

    def end(self, out: Output, res: ExecResult, code: int) -> None:
        if self.started is None:
            return
        if self.metrics is None and self.jp.request.asked.user_argv:  # what a failed script reported all the same
            self.collect(out)
        self._write(out, code, res.wall_s, res.signal_name if res.interrupted else None)

    def collect(self, out: Output) -> None:
        """A user's script: what its framework reported (status.json's metrics), and its per-step loss where it
        logged one as metrics.jsonl, drawn as the built-in run's is (cpuperf plot)."""
        from cpuperf.errors import from_os_error
        from cpuperf.run.record import NotOurs, ours, remove_empty_lightning_dirs, script_metrics, step_records, write_steps

        assert self.started is not None  # the job ran
        # Lightning's default logger leaves an empty version_N per run of a script that logs nothing and keeps no
        # checkpoint: twenty runs, twenty empty folders
        remove_empty_lightning_dirs(os.getcwd(), self.started, self.had_lightning_logs)
        logs = [self.output_log] if self.output_log else [
            os.path.join(self.jp.launch.log_dir or "", "rank0.log"), *([self.log] if self.log else [])]
        self.metrics = script_metrics(logs, os.getcwd(), self.started)
        records = step_records(self.metrics, _logging_steps(self.jp))
        if not records:
            return
        path = os.path.join(self.run_dir, "metrics.jsonl")
        try:
            write_steps(path, records)
        except OSError as exc:
            out.warn(str(exc) if isinstance(exc, NotOurs) else from_os_error(exc).message)
            return
        plot = _plot(out, self.run_dir) if ours(os.path.join(self.run_dir, "plot.svg"), b"cpuperf train: ") else []
        self.builtin = {"metrics_file": path, "plot": plot[0] if plot else None}

    def _write(self, out: Output, code: int, wall_s: float, signal_name: Optional[str], say: bool = True) -> None:
        from cpuperf.errors import from_os_error
        from cpuperf.run.record import STATUS_NAME, status, write_json

        assert self.started is not None
        kind = "script" if self.jp.request.asked.user_argv else "builtin"
        self.status = status(kind=kind, command=list(self.jp.launch.rank_command), run_dir=self.run_dir,
                             started=self.started, wall_s=wall_s, code=code, signal_name=signal_name,
                             log=self.log, metrics=self.metrics, plan=self.plan)
        try:
            write_json(os.path.join(self.run_dir, STATUS_NAME), self.status)
        except OSError as exc:
            from cpuperf.run.record import NotOurs

            out.warn(str(exc) if isinstance(exc, NotOurs) else from_os_error(exc).message)
        if out.json_mode or not say:  # the object on stdout carries it all; a job that never started: its error does
            return
        from cpuperf.output import message
        from cpuperf.render.run_report import summary_lines

        extra = [("metrics", self.builtin.get("metrics_file")), ("plot", self.builtin.get("plot"))]
        for line in summary_lines(self.status, os.getcwd(), extra):
            message(line)  # under -q too: the errors and this summary are what -q keeps


def _logging_steps(jp: JobPlan) -> Optional[int]:
    """How often a Trainer that parses its command line logs (--logging_steps, else TrainingArguments' 500): the
    step of each of its loss lines. None for any other script: its lines carry no step cpuperf can tell."""
    from cpuperf.plan.user_script import script_kind

    reading = jp.script.reading if jp.script is not None else None
    if reading is None or script_kind(reading)[0] != "hf":
        return None
    named = reading.named()
    raw = next((named[k] for k in ("logging_steps", "--logging_steps", "--logging-steps") if k in named), "500")
    return int(raw) if str(raw).isdigit() and int(raw) > 0 else None


def _dry_run_json(jp: JobPlan, launch: Dict[str, Any]) -> Dict[str, Any]:
    """The plan as `train --dry-run --json` prints it (and a run writes as plan.json)."""
    return {"schema": DRY_RUN_SCHEMA, "auto": jp.request.auto, "launch": launch, "settings": _settings_json(jp),
            "decisions": [d.to_json() for d in jp.decisions], "hf_flags": _hf_json(jp), "applied": _applied(jp),
            "levers": _levers(jp), "workload": jp.rec.workload.to_json(), "notes": list(jp.notes),
            "global_batch": _global_batch(jp)}


def _say_levers(out: Output, jp: JobPlan) -> None:
    """The lever report before the job starts: in full with -v (the applied list, each lever and why), else in a
    few lines naming the full report's place."""
    applied = _applied(jp)
    if out.verbose:
        if applied is not None:
            from cpuperf.plan.user_script import applied_lines

            for line in applied_lines(applied):
                out.info(line)
        for line in _lever_lines(jp):
            out.info(line)
        return
    from cpuperf.render.run_report import short_levers, where

    flags = list(applied.get("flags") or []) if applied is not None else []
    here = where(os.path.join(jp.request.out_dir, "plan.json"), os.getcwd())
    full = here if not os.path.isabs(here) else "plan.json in the run directory"  # its path: in the summary
    for line in short_levers(_lever_report(jp), flags, full):
        out.info("cpuperf train: " + line)


def _after(out: Output, asked: PlanRequest, jp: JobPlan, launch: Dict[str, Any], res: ExecResult,
           record: _Record, again: Tuple[str, ...] = ()) -> int:
    """What the job's end says: the checks of what ran, then its result or its failure; the exit code."""
    from cpuperf.plan.launch import check_observations
    from cpuperf.run.launcher import result_summary_from_metrics

    plan, user = jp.launch, bool(jp.request.asked.user_argv)
    observed = [res.observations[r] for r in sorted(res.observations)]
    summary, runtime = (None, None)
    if jp.settings is not None:
        summary, runtime = result_summary_from_metrics(os.path.join(jp.request.out_dir, "metrics.jsonl"))
        if summary is not None:
            record.metrics = {"from": summary.get("metrics_file"), "samples_per_s": summary.get("samples_per_s"),
                              "tokens_per_s": summary.get("tokens_per_s"), "loss_last": summary.get("loss_last")}
    warnings = check_observations(plan, observed, runtime)
    for w in warnings:
        out.warn(w)
    verification = {"ranks": [o.to_json() for o in observed], "warnings": warnings, "worker_runtime": runtime}
    failed = _check_global_batch(out, jp, observed, verification, launch) \
        if user and res.code == 0 and not res.interrupted else None
    if failed is not None:
        return failed
    ckpt = os.path.join(jp.request.out_dir, "checkpoint.pt")
    has_ckpt = not user and os.path.isfile(ckpt)
    if res.interrupted:
        # Say "checkpoint" only where one exists: a run stopped before its first step has none.
        message = f"interrupted ({res.signal_name or 'SIGINT'}); the ranks were stopped" + (
            f", the last checkpoint is {ckpt}" if has_ckpt else ", no checkpoint was written")
        hint = f"{resume_hint(jp, again)} continues from it" if has_ckpt else None
        out.error(message, hint)
        code = exit_code_for_signal(res.signal_name)  # 128 + the signal
        if out.json_mode:
            out.json({"error": {"code": int(code), "name": code.name.lower(), "message": message,
                                "hint": hint}, "launch": launch, "applied": _applied(jp),
                      "supervisor": _supervisor(res)})
        return int(code)
    if res.code != 0:
        return _report_failure(out, jp, res, launch, verification, has_ckpt, again)
    result = _result(jp, res, summary, launch, verification, observed)
    if not user and summary is not None:
        result["run_dir"] = jp.request.out_dir  # said on stderr too: a new runs/train/version_N without --out
        result["plot"] = _plot(out, jp.request.out_dir)
        record.builtin = {"metrics_file": result.get("metrics_file"),
                          "plot": result["plot"][0] if result["plot"] else None}
    from cpuperf.run.record import STATUS_NAME

    result["run_files"] = {"plan": record.plan, "log": record.log,
                           "status": os.path.join(jp.request.out_dir, STATUS_NAME)}
    if user:
        record.collect(out)
        result["metrics"] = record.metrics
        result["plot"] = [record.builtin["plot"]] if record.builtin.get("plot") else []
    _say_result(out, jp, result)
    return 0


def _say_result(out: Output, jp: JobPlan, result: Dict[str, Any]) -> None:
    if out.json_mode:
        out.json(result)
        return
    if not jp.request.asked.user_argv:
        out.product(_human(result))
    elif result.get("gpu_memory"):  # the script's stdout is its own: its peak goes with the messages
        memory = result["gpu_memory"]
        out.info("cpuperf train: " + (_memory_line(memory).strip() or str(memory.get("not_reported"))))


def _check_global_batch(out: Output, jp: JobPlan, observed: List[RankObservation], verification: Dict[str, Any],
                        launch: Dict[str, Any]) -> Optional[int]:
    """The global batch the ranks trained, read back from them and said (and put in `verification`); a mismatch
    with the plan is an error, its exit code returned (issue 51: splitting a job into ranks keeps its global batch)."""
    from cpuperf.plan.user_script import batch_ran

    ran, mismatch = batch_ran(jp.rec, observed, jp.script.reading if jp.script is not None else None)
    if ran is not None:
        verification["global_batch"] = ran.to_json()
        out.info(f"cpuperf train: the ranks trained {ran.world_size} rank(s) x {ran.per_device} per device x "
                 f"{ran.grad_accum} accumulation = global batch {ran.global_batch} (planned {ran.planned}; read from "
                 f"{ran.ranks_read} rank(s)' own environment and command line)")
    if mismatch is None:
        return None
    fix = "the job changed its math: report it with the plan (cpuperf train --dry-run --json)"
    out.error(mismatch, fix)
    if out.json_mode:
        out.json({"error": {"code": int(ExitCode.FOUND_ERROR), "name": "found_error", "message": mismatch,
                            "hint": fix}, "launch": launch, "verification": verification})
    return int(ExitCode.FOUND_ERROR)


def _write_config_files(files: Tuple[Tuple[str, str], ...]) -> None:
    """The FSDP / DeepSpeed files the added flags name, in the run directory, before the script reads them: each
    created new (O_EXCL, never through a link), or left as it is where the same bytes are there already (this plan's
    file, from an earlier run into the same --out). Anything else there is not cpuperf's to overwrite: a link (a
    link to a file outside was written through), or a project's own fsdp_config.json under `--out .`."""
    import stat

    from cpuperf.errors import FilesystemError
    from cpuperf.fsutil import read_capped

    for path, text in files:
        data = (text + "\n").encode("utf-8")
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and st.st_size == len(data) and read_capped(path, len(data)) == data:
                    continue  # this very file: written by an earlier run of the same plan
                what = "a link" if stat.S_ISLNK(st.st_mode) else "a file cpuperf did not write"
                raise FilesystemError(f"{path} is there already ({what}): cpuperf does not overwrite it",
                                      hint="move it away, or give --out a directory of the run's own") from None
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except FilesystemError:
            raise
        except (OSError, ValueError) as exc:  # ValueError: fsutil.InputRefused (not a regular file, too big)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise FilesystemError(f"cannot write {path}: {why}",
                                  hint="check the run directory (--out): permissions, space") from exc


def _plot(out: Output, run_dir: str) -> List[str]:
    """The run's picture (plot.svg, plot.png with matplotlib); a failure to draw never fails the run."""
    from cpuperf.render.plot import plot_run

    try:
        files = plot_run(run_dir)["files"]
    except CpuperfError as exc:
        out.warn(f"no plot of the run: {exc.message}")
        return []
    return list(files)  # said in the run's summary


def _hf_json(jp: JobPlan) -> Optional[ScriptReport]:
    return jp.script.to_json() if jp.script is not None else None


def _lever_report(jp: JobPlan, observed: Sequence[RankObservation] = ()) -> Tuple[LeverState, ...]:
    """Each lever applied (where the job carries it) or not (why): cpuperf.plan.applied. After a run, `observed`:
    what each rank was read back running with, which the report is held to."""
    from cpuperf.plan.applied import lever_report, rendered_job

    job = rendered_job(jp)
    if observed:
        job = dataclasses.replace(job, ran_threads=tuple(o.omp_num_threads for o in observed))
    return lever_report(jp.rec.levers, job)


def _levers(jp: JobPlan, observed: Sequence[RankObservation] = ()) -> Dict[str, List[Dict[str, object]]]:
    from cpuperf.plan.applied import split

    return split(_lever_report(jp, observed))


def _lever_lines(jp: JobPlan, observed: Sequence[RankObservation] = ()) -> List[str]:
    from cpuperf.plan.applied import report_lines

    return ["lever " + line for line in (*_model_line(jp), *report_lines(_lever_report(jp, observed)))]


def _model_line(jp: JobPlan) -> List[str]:
    """The built-in model the host chose (no --model), as the worker gets it: said with the levers it shows."""
    why, preset = jp.rec.workload.why, jp.settings.preset if jp.settings is not None else None
    return [f"applied: model={preset} (worker setting preset={preset}; {why})"] if why and preset else []


def _applied(jp: JobPlan) -> Optional[Dict[str, Any]]:
    """Every flag, env var and launcher choice applied to a user's script (None for the built-in loop)."""
    script = jp.script
    if script is None:
        return None
    from cpuperf.plan.user_script import applied

    return applied(jp.launch, script)


def _report_failure(out: Output, jp: JobPlan, res: ExecResult, launch: Dict[str, Any], verification: Dict[str, Any],
                    has_ckpt: bool, again: Tuple[str, ...] = ()) -> int:
    code, message, hint = _failure(jp.launch, res, bool(jp.request.asked.user_argv))
    from cpuperf.plan.user_script import rejected_flags

    rejected = rejected_flags(res.code, res.wall_s, res.launcher_output, jp.script)
    if rejected:
        message, hint = rejected
    if hint is None and has_ckpt:
        hint = f"fix the cause, then {resume_hint(jp, again)} continues from the last checkpoint"
    if out.json_mode:
        out.json({"error": {"code": code, "name": "launch_failed" if code == ExitCode.LAUNCH_FAILED else "rank_failed",
                            "message": message, "hint": hint}, "launch": launch, "verification": verification,
                  "applied": _applied(jp), "supervisor": _supervisor(res)})
    out.error(message, hint)
    return code


def _result(jp: JobPlan, res: ExecResult, summary: Optional[Dict[str, Any]], launch: Dict[str, Any],
            verification: Dict[str, Any], observed: Sequence[RankObservation] = ()) -> Dict[str, Any]:
    plan = jp.launch
    if jp.request.asked.user_argv:
        mine = {"schema": SCHEMA, "user_command": list(plan.rank_command), "world_size": plan.world_size,
                "wall_s": round(res.wall_s, 3), "hf_flags": _hf_json(jp), "applied": _applied(jp),
                "decisions": [d.to_json() for d in jp.decisions], "levers": _levers(jp, observed),
                "launch": launch, "verification": verification, "supervisor": _supervisor(res)}
        memory = _script_memory(jp, verification)
        return mine if memory is None else {**mine, "gpu_memory": memory}
    if summary is None and plan.node_rank != 0:
        summary = {"schema": SCHEMA, "status": "completed", "node_rank": plan.node_rank,
                   "world_size": plan.world_size, "settings": _settings_json(jp),
                   "note": f"rank 0 runs on {plan.master_addr}: the run's summary and metrics are written there"}
    if summary is None:
        raise LaunchFailedError("the training run ended without a summary in its metrics file",
                                hint=f"see the logs under {plan.log_dir}")
    summary = {k: val for k, val in summary.items() if k != "type"}
    if summary.get("gpu_memory") and jp.request.auto:  # the plan's figure beside the real peak
        from cpuperf.decide.memory import planned_peak

        mem = summary["gpu_memory"]
        summary["gpu_memory"] = planned_peak(jp.rec.levers.batch_size.evidence, int(mem.get("batch_size") or 0), mem)
    return {**summary, "wall_s": round(res.wall_s, 3), "decisions": [d.to_json() for d in jp.decisions], "levers": _levers(jp, observed),
            "launch": launch,
            "verification": verification, "supervisor": _supervisor(res)}


def _script_memory(jp: JobPlan, verification: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Rank 0's real GPU peak beside the plan's figure, for a user's script asked to report it (plan/peak_report):
    the plan's figure for the per-device batch its ranks were read training; where rank 0 wrote nothing, why."""
    from cpuperf.boundary import GPU_PEAK_FILE
    from cpuperf.decide.memory import planned_peak
    from cpuperf.run.rank_peak import read_rank_peak

    path = jp.launch.env.get(GPU_PEAK_FILE)
    if path is None or jp.launch.node_rank != 0:  # not asked, or rank 0 runs on another node
        return None
    peak, why = read_rank_peak(path)
    if peak is None:
        return {"not_reported": why}
    ran = verification.get("global_batch") or {}
    dp, split = jp.rec.workload.parallel, jp.rec.split
    batch = ran.get("per_device") or (split.per_device if split is not None else None) or dp.per_device \
        or jp.rec.levers.batch_size.value
    measured = {"max_allocated_bytes": peak.max_allocated_bytes, "max_reserved_bytes": peak.max_reserved_bytes,
                "batch_size": int(batch)}
    return planned_peak(jp.rec.levers.batch_size.evidence, int(batch), measured)


def _supervisor(res: ExecResult) -> Optional[Dict[str, float]]:
    """cpuperf's own CPU time while the job ran: {cpu_s, wall_s, cpu_share (of one core)}."""
    return res.supervisor.to_json() if res.supervisor is not None else None


def _failure(plan: LaunchPlan, res: ExecResult, user: bool = False) -> Tuple[int, str, Optional[str]]:
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
        who = (f"your {plan.yours.launcher}" if plan.yours is not None else "your command" if user
               else "the training process")
        return res.code, f"{who} exited with code {res.code}" + _signal_name(res.code) + _passed(res.code), None
    code = parsed[1] if parsed and parsed[1] else None
    if rank is None:
        who = f"your {plan.yours.launcher}" if plan.yours is not None else plan.launcher
        return res.code or int(ExitCode.LAUNCH_FAILED), (f"{who} failed with exit code {res.code}{_passed(res.code)}; "
                                                          f"log: {os.path.join(plan.log_dir or '', 'launcher.log')}"), None
    log = os.path.join(plan.log_dir or "", f"rank{rank}.log")
    if code is None:
        code = res.code or int(ExitCode.LAUNCH_FAILED)
        how = f"{plan.launcher} exited with {res.code}"
    else:
        how = f"exit code {code}{_signal_name(code)}"
    return code, f"rank {rank} failed first ({how}){_passed(code)}; log: {log}", None


def _passed(code: int) -> str:
    """docs/exit-codes.md: a code of the job's own processes is passed through unchanged; where it is also one of
    cpuperf's codes (1-14), the line says whose it is, so `2` from a script never reads as cpuperf's usage error."""
    if code in {int(c) for c in ExitCode} and 0 < code < 128:
        return f" (code {code} is the job's own, passed through: not cpuperf's exit {code})"
    return ""


def _signal_name(code: int) -> str:
    import signal

    if code > 128:
        try:
            return f" = killed by {signal.Signals(code - 128).name}"
        except ValueError:
            return ""
    return ""


def _human(r: Dict[str, Any]) -> str:
    def f(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    st = r.get("settings") or {}
    return (f"{r.get('status', 'done')}: {r.get('steps')} steps on {r.get('world_size')} rank(s), "
            f"{st.get('dtype')}{' compile' if st.get('compile') else ''}{' ipex' if st.get('ipex') else ''}, "
            f"{r.get('threads')} thread(s)\n"
            f"loss {f(r.get('loss_first'), '.4f')} -> {f(r.get('loss_last'), '.4f')}, "
            f"{f(r.get('samples_per_s'), '.1f')} samples/s, {f(r.get('tokens_per_s'), '.0f')} tokens/s, "
            f"wall {r['wall_s']:.1f} s\n"
            f"metrics {r.get('metrics_file')}\ncheckpoint {r.get('checkpoint')}" + _memory_line(r.get("gpu_memory")))


def _memory_line(mem: Optional[Dict[str, Any]]) -> str:
    """'GPU memory (rank 0): peak 35.4 GiB allocated, 37.2 GiB reserved; planned 39.0 GiB (1.10x allocated)'."""
    if not mem or "max_allocated_bytes" not in mem:
        return ""
    line = (f"\nGPU memory (rank 0): peak {mem['max_allocated_bytes'] / 2**30:.1f} GiB allocated, "
            f"{mem['max_reserved_bytes'] / 2**30:.1f} GiB reserved")
    if mem.get("planned_bytes") is not None:
        line += f"; planned {mem['planned_bytes'] / 2**30:.1f} GiB"
        if mem.get("planned_over_allocated") is not None:
            line += f" ({mem['planned_over_allocated']:.2f}x allocated)"
    return line


def _print_plan(out: Output, jp: JobPlan) -> None:
    plan = jp.launch
    if plan.yours is not None:
        source = (f"({plan.nproc_per_node} per node x {plan.nnodes} nodes, from {plan.yours.source})"
                  if plan.nnodes > 1 else f"from {plan.yours.source}")
        lines = [f"# launcher: yours ({plan.yours.launcher}), {plan.world_size} rank(s) {source}"]
    else:
        lines = [f"# launcher: {plan.launcher}" + (f" ({plan.flavour})" if plan.flavour and plan.flavour != plan.launcher else "")
                 + f", {plan.world_size} rank(s)"]
    shared = plan.env.get("OMP_NUM_THREADS")  # every rank's, where no rank has its own (yours, kept)
    unset = f"OMP_NUM_THREADS={shared} (every rank)" if shared else "the launcher or torch default"
    for spec in plan.per_rank:
        lines.append(f"#   local rank {spec.local_rank}: CPUs {','.join(map(str, spec.cpus)) or 'unpinned'}, "
                     f"threads {spec.threads if spec.threads is not None else unset}")
    # A user's script gets the launch-level decisions; its own hyperparameters stay its own (the applied
    # list below says which Trainer flags, if any, carry a decision to it).
    shown = (("threads_per_rank", "nproc_per_node", "ddp_backend", "allocator", "plain") if jp.request.asked.user_argv else
             ("dtype", "compile", "ipex", "threads_per_rank", "ddp_backend", "allocator", "batch_size", "optimizer", "plain"))
    # Ranks given thread counts but no CPUs: the plan decided against pinning, and says why.
    if len(plan.per_rank) > 1 and any(s.threads for s in plan.per_rank) and not any(s.cpus for s in plan.per_rank):
        shown = (*shown, "affinity")
    if jp.settings is not None and jp.rec.workload.why:  # the built-in model, where the host chose it
        lines.append(f"# model = {jp.settings.preset}: {jp.rec.workload.why}")
    for d in jp.decisions:
        if d.overridden or d.id in shown or d.reason.startswith("tuned "):
            lines.append(f"# {d.id} = {d.value}: {d.reason}")
    for note in plan.notes:
        lines.append(f"# {note}")
    from cpuperf.probe.hf import NOT_RUN_IN_A_DRY_RUN

    if NOT_RUN_IN_A_DRY_RUN in (jp.rec.workload.found or ""):  # what it would have run a program of yours to know
        lines.append(f"# assumed: {jp.rec.workload.found}")
    applied = _applied(jp)
    if applied is not None:
        from cpuperf.plan.user_script import applied_lines

        lines.extend("# " + line for line in applied_lines(applied))
    lines.extend("# " + line for line in _lever_lines(jp))
    script = jp.script
    for path, text in (script.files if script is not None else ()):
        lines.append(f"# file {path} (written before the script starts): {text}")
    from cpuperf.output import message_width
    from cpuperf.render.run_report import shell_wrapped, wrap_comments

    width = message_width(stream=sys.stdout)  # COLUMNS or the terminal's; a pipe without COLUMNS: one line each
    out.product(wrap_comments("\n".join(lines), width) + "\n" + shell_wrapped(plan.argv, dict(plan.env), width))
    from cpuperf.run.said import first_time

    for note in jp.notes:  # in --json every time; on stderr the first time a plan carries it
        if not out.quiet and first_time("plan-notes", note):
            out.info(f"note: {note}")


__all__ = ["TrainOptions", "train_request", "run_train", "build_plan", "CpuperfError"]
