"""The timing edge of joint tuning (cpuperf.decide.tune): one timed run per point, in a fresh process.

Two kinds of run: the built-in reference loop on the workload's shape (cpuperf.train.bench, under torchrun
for several ranks), and a user's own Trainer command run by `cpuperf train --auto --set ...` itself for a
few steps, its throughput read from the Trainer's own `train_samples_per_second`.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.boundary import LAUNCHER_RANK_VARS
from cpuperf.decide.tune import UNDECIDED, Candidates, Point, Search, TuneResult, descend
from cpuperf.errors import CpuperfError
from cpuperf.knowledge.tuning import Tune as TuneRule
from cpuperf.knowledge.tuning import tuning
from cpuperf.knowledge.variables import variables

if TYPE_CHECKING:
    from cpuperf.decide.records import Measurements
    from cpuperf.decide.workload import Workload
    from cpuperf.plan.command import CommandLine
    from cpuperf.plan.job import JobPlan
    from cpuperf.plan.script_read import ScriptRead
    from cpuperf.plan.user_script import UserCommand
    from cpuperf.probe.facts import HostFacts
    from cpuperf.run.owned import Owner


def _not_inherited() -> Tuple[str, ...]:
    """Variables a run inherits from nowhere but its plan (a caller's preload or thread count would leak in): the
    threads, placement and allocator levers' (compat/variables.toml), the rendezvous, and torchrun's rank ones."""
    table = variables()
    levers = ("threads_per_rank", "affinity", "allocator")
    torchrun = next(v for v in LAUNCHER_RANK_VARS if v.launcher == "torchrun")
    return (*table.names(lever=levers), *table.prefixes(lever=levers), *table.names(launch=True),
            torchrun.rank, torchrun.local_rank, torchrun.world_size)


def rules() -> TuneRule:
    """compat/tuning.toml [tune], typed (cpuperf.knowledge.tuning)."""
    return tuning().tune


def clean_env(extra: Mapping[str, str]) -> Dict[str, str]:
    """This process's environment without what a plan sets, then `extra`; this cpuperf first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_not_inherited())}
    env.update(extra)
    env.setdefault("PYTHONWARNINGS", "ignore")
    pkg_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_point(point: Point, base: Mapping[str, Any], env: Mapping[str, str], cpus_per_rank: Sequence[Sequence[int]],
                python: str = sys.executable, timeout: float = 300.0, owner: Optional[Owner] = None,
                deadline: Optional[float] = None, prefix: Sequence[str] = ()) -> Optional[List[float]]:
    """One process of the reference loop at `point` with the plan's env and CPUs (started by `prefix`, numactl
    with the point's memory policy, where given): the samples/s of each of its
    timed windows (base['windows']), None if it failed. A process start costs seconds (torch's import): its
    windows are the short repeats. A compiled point's figures carry its compile time over the run's steps."""
    settings = {k: v for k, v in base.items() if k != "run_steps"}
    settings.update(dtype=point.dtype, compile=point.compile, threads_per_rank=point.threads)
    if point.optimizer:
        settings["optimizer"] = point.optimizer
    if point.pinned and cpus_per_rank:
        settings["cpus_per_rank"] = [list(c) for c in cpus_per_rank]
    cmd = [python, "-m", "cpuperf.train.bench", json.dumps(settings)]
    if point.ranks > 1:  # data parallel as the plan runs it: torchrun starts the ranks (gloo), rank 0 reports
        cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(point.ranks), "--master_addr",
               "127.0.0.1", "--master_port", str(_free_port()), "-m", "cpuperf.train.bench", json.dumps(settings)]
    cmd = [*prefix, *cmd]
    # torchrun sets the rendezvous itself (the free port above): the plan's placeholder address stays out
    rendezvous = variables().names(launch=True, runtime="torch-distributed")
    full = clean_env({k: v for k, v in env.items() if k not in rendezvous})
    if owner is not None:  # owned: its own session, stopped at the deadline, nothing of it left after
        left = timeout if deadline is None else min(timeout, deadline - time.monotonic())
        code, stdout = owner.run(cmd, full, left)
    else:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        code, stdout = proc.returncode, proc.stdout
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        return None
    try:
        res = json.loads(lines[-1])
        rates = [float(x) for x in res.get("window_rates") or [res["samples_per_s"]]]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # a line that is not the loop's report is no figure
    import math

    rates = [r for r in rates if math.isfinite(r) and r > 0]
    steps = int(base.get("run_steps") or 0)
    if point.compile and steps:
        batch, first = float(res.get("batch") or 1), float(res.get("first_step_s") or 0.0)
        rates = [steps * batch / (steps * batch / r + first) for r in rates if r > 0]
    return rates


# transformers 5 prints its metrics formatted as strings ('4.145'), earlier releases as numbers
_TRAINER_RATE = re.compile(r"""['"]train_samples_per_second['"]\s*:\s*['"]?([0-9][0-9.eE+-]*|inf|nan)""")
_TRAINER_RUNTIME = re.compile(r"""['"]train_runtime['"]\s*:\s*['"]?([0-9][0-9.eE+-]*)""")


def _last_figure(pattern: re.Pattern[str], output: str) -> Optional[float]:
    """The last figure `pattern` finds, when it is a finite positive number the cache holds (at most
    readback.MAX_FIGURE: 1e308 samples/s was written, and dropped by the reader later); else None."""
    import math

    from cpuperf.readback import MAX_FIGURE

    found = pattern.findall(output)
    try:
        value = float(found[-1]) if found else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and 0 < value <= MAX_FIGURE else None


def trainer_rate(output: str) -> Optional[float]:
    """The Trainer's own train_samples_per_second from what it printed (its final metrics): a finite positive
    figure, else None (inf, 0 or garbage is no figure)."""
    return _last_figure(_TRAINER_RATE, output)


def script_point(point: Point, tuned: Sequence[str], argv: Sequence[str], owner: Owner, deadline: float,
                 python: str = sys.executable, timeout: float = 600.0
                 ) -> Tuple[Optional[List[float]], str, Optional[int]]:
    """One short run of the user's command under `cpuperf train --auto`, the tuned levers set, owned (its own
    session, stopped at `deadline` on the monotonic clock, nothing of it left after): (samples/s or None, what
    it printed, its exit code: the command's own, which `train` returns; None where it was stopped)."""
    from cpuperf.decide.tune import DECISIONS, decision_values

    values = decision_values(point)
    sets: List[str] = []
    for lever in tuned:
        for decision in DECISIONS[lever]:
            value = values[decision]
            sets += ["--set", f"{decision}={'none' if value is None else str(value).lower()}"]
    out_dir = os.path.join(owner.workdir, f"run{time.monotonic_ns()}")
    cmd = [python, "-m", "cpuperf", "train", "--auto", "--out", out_dir, *sets, "--", *argv]
    env = clean_env({"CPUPERF_MEASURE": "0", "NO_COLOR": "1"})
    code, output = owner.run(cmd, env, min(timeout, deadline - time.monotonic()), cwd=os.getcwd())
    if code is None:
        return None, "stopped at the budget", None
    rate = trainer_rate(output) if code == 0 else None
    return ([rate] if rate else None), output, code


@dataclass
class CommandTuning:
    """What `train --tune` found: the search (None where it could not start), the steps per run, and why it is
    not a tuning (None: it is one)."""

    result: Optional[TuneResult]
    steps: int
    why_not: Optional[str]
    code: int = 0  # the first run's exit code where it failed: the command's own, which --tune returns


def tune_on_command(jp: JobPlan, command: CommandLine, budget: Optional[float], log: Callable[[str], object]
                    ) -> Tuple[CommandTuning, Candidates, float]:
    """`train --tune`'s search from the rules' plan `jp` of the command (as read once): its candidates
    (cpuperf.decide.tune), the budget (`budget`, else the rule's), the descent (tune_command). Returns what it found,
    the candidates and the budget it held."""
    from cpuperf.decide import tune as dtune

    rule = rules()
    cand = dtune.candidates(jp.facts, jp.rec, tuning(), script=True, own_launcher=jp.launch.yours is not None,
                            memory_asked=jp.request.asked.decided.get("numa_memory", "auto"))
    start = dtune.start_point(jp.rec, cand)
    spend = float(budget or rule.script_budget_s)
    log(f"tuning {', '.join(cand.values) or 'nothing'} on your command ({rule.script_steps} steps per run, "
        f"{rule.script_passes} interleaved passes, budget {spend:.0f} s) ...")
    read = jp.script.reading if jp.script is not None else None
    found = tune_command(start, cand, command.script, spend, log, rule.script_steps, rule.script_passes,
                         read=read)
    return found, cand, spend


def cache_command_tuning(facts: HostFacts, command: CommandLine, script_text: Optional[str], found: CommandTuning,
                         cand: Candidates, budget: float, read: Optional[ScriptRead] = None) -> Tuple[Dict[str, Any], Path]:
    """A tuning `train --tune` found, cached for this command line and script (what later `--auto` runs of it
    read): (the entry, the cache file)."""
    from cpuperf.plan.user_script import key_of_command, script_digest
    from cpuperf.run import measure

    assert found.result is not None  # the caller says why there is none
    entry = {**found.result.to_json(), "measured_at": int(time.time()), "budget_s": budget, "skipped": cand.skipped,
             "command": list(command.given), "steps": found.steps, "script_sha256": script_digest(script_text)}
    return entry, measure.save_tuned(facts, "tuned_by_command", key_of_command(command.script, read, script_text), entry)


def runs_to_compare(passes: int) -> int:
    """Runs that compare two settings: each `passes` times, the incumbent once more, then the confirming pair."""
    return 2 * passes + 3


def tune_command(start: Point, cand: Candidates, command: UserCommand, budget: float, log: Callable[[str], object],
                 steps: int, passes: int, min_steps: int = 2, read: Optional[ScriptRead] = None) -> CommandTuning:
    """The descent on the user's own command (as read once), every run owned (cpuperf.run.owned) and the budget held: a first
    run of the rule's point times the command; where the budget cannot hold two settings and the confirming
    pair at `steps` steps, fewer steps per run (from the Trainer's own train_runtime), or it says it cannot."""
    import math
    import tempfile

    from cpuperf.plan.user_script import tuning_argv
    from cpuperf.run.owned import Owner

    needed = runs_to_compare(passes)
    with tempfile.TemporaryDirectory(prefix="cpuperf-tune-") as work, Owner(work) as owner:
        t0 = time.monotonic()
        deadline = t0 + budget

        def once(p: Point, n: int) -> Tuple[Optional[List[float]], str, Optional[int]]:
            return script_point(p, list(cand.values), tuning_argv(command, read, n, os.path.join(work, "out")), owner,
                                deadline)

        first, output, code = once(start, steps)
        cost = time.monotonic() - t0
        if first is None:
            if output == "stopped at the budget":
                return CommandTuning(None, steps, f"one run of your command ({steps} steps) did not end within the "
                                     f"{budget:.0f} s budget, so nothing could be compared; two settings and the "
                                     f"confirming pair take {needed} runs: give --budget well above {needed} runs' time")
            return CommandTuning(None, steps, None, code or 0)  # failed at the rule's point: said by the caller
        left = deadline - time.monotonic()
        if cost * needed > left:
            fewer = _fewer_steps(steps, cost, _last_figure(_TRAINER_RUNTIME, output), left / needed, min_steps)
            if fewer is None:
                want = math.ceil(cost * (needed + 1) / 10) * 10
                return CommandTuning(None, steps, f"one run of your command takes {cost:.0f} s here ({steps} steps); "
                                     f"two settings and the confirming pair take {needed} runs, more than the "
                                     f"{budget:.0f} s budget holds even at {min_steps} steps: --budget {want} would "
                                     "hold them")
            log(f"a run of {steps} steps took {cost:.0f} s: {fewer} steps per run, so the budget holds two settings "
                "and the confirming pair")
            steps, first = fewer, None
        reuse = {start: first} if first is not None else {}

        def run_one(p: Point) -> Optional[List[float]]:
            if p in reuse:
                return reuse.pop(p)
            return once(p, steps)[0]

        result = tune(start, cand, run_one, max(0.0, deadline - time.monotonic()), passes, log)
    if result.stopped != "failed" and result.measured() < 2:
        mean = result.elapsed_s / max(1, result.runs)
        want = math.ceil((mean * needed + cost) / 10) * 10
        return CommandTuning(result, steps, f"only {result.measured()} setting was measured in the {budget:.0f} s "
                             f"budget (a run took about {mean:.0f} s): nothing was compared; two settings and the "
                             f"confirming pair take {needed} runs: --budget {want} would hold them")
    return CommandTuning(result, steps, None)


def _fewer_steps(steps: int, cost: float, runtime: Optional[float], per_run: float, min_steps: int) -> Optional[int]:
    """Steps per run so that one run takes at most `per_run` seconds, from a run of `steps` that took `cost` s of
    which `runtime` training (the rest is start-up, paid by every run); None when even `min_steps` does not fit."""
    if runtime is None or runtime >= cost or steps <= min_steps:
        return None
    per_step, start_up = runtime / steps, cost - runtime
    fits = int((per_run - start_up) / per_step) if per_run > start_up else 0
    return min(steps - 1, fits) if fits >= min_steps else None


def tune(start: Point, cand: Candidates, run_one: Callable[[Point], Optional[List[float]]], budget_s: float,
         passes: int, log: Callable[[str], object]) -> TuneResult:
    """The descent with the real clock, each run said as it ends."""
    from cpuperf.output import Progress

    rule, judge = rules(), tuning().judge
    began = time.monotonic()
    runs = 0

    def timed(p: Point) -> Optional[List[float]]:
        nonlocal runs
        runs += 1
        progress.update(f"run {runs}: {p.label()}", left_s=max(0.0, budget_s - (time.monotonic() - began)))
        got = run_one(p)
        log(f"  {p.label()}: " + (", ".join(f"{x:.2f}" for x in got) + " samples/s" if got else "failed"))
        return got

    # A run is a fresh process (torch's import, a warm-up): on a busy host tens of seconds with nothing to say.
    with Progress(log, "tuning") as progress:
        search = Search(budget_s=budget_s, passes=passes, min_gain=float(rule.min_gain),
                        confidence=float(judge.confidence), resolution=float(judge.resolution))
        return descend(start, cand, timed, search, clock=time.monotonic)


def summary(result: TuneResult, cand: Candidates) -> List[str]:
    """Lines for the user: the winner against the rule's point, each lever's figures, what was not tuned."""
    best, start = result.median(result.best), result.median(result.start)
    lines = [f"tuned: {result.best.label()}" + (f" {best:.2f} samples/s" if best else "")
             + (f" vs the rule's point {start:.2f} ({best / start:.2f}x)" if best and start and result.best != result.start
                else " (the rule's point)" if result.best == result.start else "")
             + f"; {result.runs} runs in {result.elapsed_s:.0f} s, {len(result.rounds)} round(s)"]
    if result.stopped == "budget":
        lines.append("the time budget ended the search: the best point so far is kept")
    elif result.stopped == "failed":
        lines.append("the rule's point failed to run: nothing tuned")
    judged = result.judged()
    figures = result.lever_figures()
    for lever, fig in figures.items():
        alts = ", ".join(f"{k} {v:.2f}" for k, v in fig["alternatives"].items())
        j = judged.get(lever)
        lines.append(f"  {lever}: {fig['value']} {fig['figure']:.2f}; alternatives {alts}" + (f"; {_verdict(j)}" if j else ""))
    for lever, j in judged.items():
        if lever not in figures and j["outcome"] == UNDECIDED:  # compared, but never beside the best
            lines.append(f"  {lever}: {_verdict(j)}")
    for lever, why in cand.skipped.items():
        lines.append(f"  {lever}: not tuned: {why}")
    return lines


def _verdict(j: Mapping[str, Any]) -> str:
    """A lever's verdict in words: 'moved: mimalloc 1.62x (1.54-1.70, bar 1.02)', an undecided one with why."""
    return (f"{j['outcome']}: {j['alternative']} {j['ratio']:.2f}x ({j['low']:.2f}-{j['high']:.2f}, bar {j['bar']:.2f})"
            + ((f" ({j['why']})" if j.get("why") else "") + ", so the rule decides it" if j["outcome"] == UNDECIDED else ""))


def _bench_tune_hint(facts: HostFacts, workload: Workload) -> str:
    """` (`cpuperf bench --tune --model NAME` tunes this shape once, ...)` where that command tunes this very shape (a
    preset at the batch bench plans it with); '' where it would tune another (your --batch-size, a config file)."""
    from cpuperf.decide.recommend import shape_key
    from cpuperf.decide.workload import resolve_workload

    if workload.source != "preset":
        return ""
    try:
        bench = resolve_workload(workload.name, None, None, None, 400, host=facts)
    except CpuperfError:
        return ""
    if shape_key(bench) != shape_key(workload):
        return ""
    return f" (`cpuperf bench --tune --model {workload.name}` tunes this shape once, for every later run)"


def tune_before_run(facts: HostFacts, workload: Workload, meas: Optional[Measurements],
                    log: Callable[[str], object]) -> Optional[Measurements]:
    """The start of a real `train --auto` of the built-in loop: tune its shape where nothing quiet and steady is
    tuned for it, and only where the run is long enough for the budget to be a small part of it (a short run
    pays the budget and gains little: the rules decide it, and say how to tune)."""
    from cpuperf.decide.recommend import shape_key
    from cpuperf.decide.tune import not_judged
    from cpuperf.run import measure

    entry = meas.tuned_by_shape.get(shape_key(workload)) if meas is not None else None
    load = entry.get("load") if entry is not None else None
    if entry is not None and not (isinstance(load, dict) and load.get("under_load")) and not not_judged(entry):
        return meas  # tuned on a quiet host: kept; one tuned under load or before levers were judged is tuned again
    rule = rules()
    steps_needed = rule.tune_when_run_exceeds_steps
    if (workload.steps or 0) < steps_needed:
        if entry is None:
            log(f"not tuned: a {workload.steps}-step run is shorter than the {steps_needed} steps that pay for "
                f"about {rule.budget_s} s of tuning" + _bench_tune_hint(facts, workload))
        return meas
    log(f"tuning the plan's levers for {shape_key(workload)} on this host (about {rule.budget_s} s"
        + ("; the cached tuning was taken under load or before each lever was judged" if entry is not None
           else ", once")
        + "; cached for later runs) ...")
    if tune_shape(facts, workload, meas, log) is None:
        return meas
    return measure.load_cached(facts)


def tune_shape(facts: HostFacts, workload: Workload, meas: Optional[Measurements], log: Callable[[str], object],
               budget_s: Optional[float] = None) -> Optional[Tuple[TuneResult, Candidates, Dict[str, Any]]]:
    """Coordinate descent over this plan's levers on the reference loop at the workload's shape, each point run
    with the env and CPUs its own plan gives (cpuperf.decide.tune); the result cached per host, torch build and
    shape. Returns (result, candidates, entry), or None where there is nothing to tune (a GPU plan)."""
    import time

    from cpuperf.decide import tune as dtune
    from cpuperf.decide.recommend import RecommendRequest, recommend, shape_key
    from cpuperf.decide.records import compile_mode_of
    from cpuperf.run import measure

    rule = rules()
    budget = float(budget_s if budget_s is not None else rule.budget_s)
    rec = recommend(facts, workload, RecommendRequest(measurements=meas, shape_tuning=False, environ={}))
    if rec.levers.device.value != "cpu":
        return None
    cand = dtune.candidates(facts, rec, tuning())
    start = dtune.start_point(rec, cand)
    base = {"workload": "lm", "batch": workload.batch_size, "seconds": rule.seconds, "steps": rule.steps,
            "warmup": rule.warmup, "windows": rule.windows, "run_steps": workload.steps or 0,
            "compile_mode": compile_mode_of(rec.levers.compile),  # a compiled point runs the mode the plan would
            "shape": {"n_layer": workload.n_layer, "n_head": workload.n_head, "d_model": workload.d_model,
                      "seq_len": workload.seq_len, "vocab_size": workload.vocab}}

    import tempfile

    from cpuperf.run.owned import Owner

    before = measure.load_now(facts, start.ranks * start.threads)
    with tempfile.TemporaryDirectory(prefix="cpuperf-tune-") as work, Owner(work) as owner:
        deadline = time.monotonic() + budget

        def run_one(p: Point) -> Optional[List[float]]:
            env, cpus = point_env(facts, workload, meas, p)
            return bench_point(p, base, env, cpus, owner=owner, deadline=deadline,
                               prefix=cand.memory_argv if p.memory else ())

        result = tune(start, cand, run_one, budget, rule.passes, log)
    after = measure.load_now(facts, start.ranks * start.threads)
    entry = {**result.to_json(), "measured_at": int(time.time()), "budget_s": budget, "skipped": cand.skipped,
             "shape": shape_key(workload),
             "load": {**before, "under_load": before["under_load"] or after["under_load"], "after": after["figure"]}}
    for line in summary(result, cand):
        log(line)
    if result.stopped != "failed" and result.measured() < 2:
        import math

        mean = result.elapsed_s / max(1, result.runs)
        entry["not_saved"] = (f"only {result.measured()} setting was measured in the {budget:.0f} s budget (a run took "
                              f"about {mean:.0f} s): nothing was compared; two settings and the confirming pair take "
                              f"{runs_to_compare(int(rule.passes))} runs: --budget "
                              f"{math.ceil(mean * (runs_to_compare(int(rule.passes)) + 1) / 10) * 10} would hold them")
        log(f"not saved as a tuning: {entry['not_saved']}")
    elif result.stopped != "failed":
        measure.save_tuned(facts, "tuned_by_shape", shape_key(workload), entry)
    return result, cand, entry


def point_env(facts: HostFacts, workload: Workload, meas: Optional[Measurements],
              p: Point) -> Tuple[Dict[str, str], List[List[int]]]:
    """(env, CPUs per rank) of the plan with `p`'s values: what `train --auto` would run at that point."""
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.tune import decision_values
    from cpuperf.plan.build import build_job_plan, decided_inputs
    from cpuperf.run import measure

    sets = {k: ("none" if v is None else str(v).lower()) for k, v in decision_values(p).items()
            if not (k == "optimizer" and v is None)}
    rec = recommend(facts, workload, RecommendRequest(measurements=meas, overrides=sets, shape_tuning=False, environ={}))
    request, edge = decided_inputs(rec)
    jp = build_job_plan(request, facts, edge)
    env = dict(jp.env_map())
    if p.allocator and "LD_PRELOAD" not in env:
        env.update(measure.allocator_env(p.allocator, measure.allocator_libraries(facts)[p.allocator]))
    return env, [list(r.cpus) for r in jp.launch.per_rank]
