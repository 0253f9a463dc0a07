"""`cpuperf recommend` and `cpuperf bench`: decisions with reasons, and the measurements behind them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from cpuperf.boundary import DEFAULT_MASTER_PORT
from cpuperf.output import Output

if TYPE_CHECKING:  # commands import their layers inside functions (fast start-up)
    import os

    from cpuperf.decide.records import Recommendation
    from cpuperf.knowledge.knobs import Overrides
    from cpuperf.plan.applied import LeverState
    from cpuperf.plan.build import NodePlan
    from cpuperf.plan.job import JobPlan
    from cpuperf.probe.facts import HostFacts
    from cpuperf.probe.hosts import Host
    from cpuperf.run.edge import Found


def build(sysroot: Optional[str], model: Optional[str], params: Optional[str], seq_len: Optional[int],
          batch_size: Optional[int], steps: Optional[int], nproc_per_node: Optional[int], nnodes: Optional[int],
          hostfile: Optional[str], unit: str, device: str, sets: List[str], config: Optional[str],
          measurements: Optional[str], python: Optional[str] = None, adapt_to_load: bool = False,
          out: Optional[Output] = None, master_addr: Optional[str] = None) -> Tuple[Found, Recommendation]:
    """The edge (cpuperf.run.edge: the host's facts, the hostfile, the Slurm job, the job's nodes), the workload,
    the measurements, then the decisions. Returns (what the edge found, the recommendation).

    Load changes from second to second, so it shapes the plan only with adapt_to_load (--adapt-to-load);
    otherwise the same host and stack give the same plan in every command, run after run."""
    import os

    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.knobs import coerce_entry, merge, parse_assignments
    from cpuperf.plan.request import PlanRequest
    from cpuperf.probe.slurm import slurm_environ
    from cpuperf.run import measure
    from cpuperf.run.edge import Sources, gather

    # The job's nodes as train and ccl-env count them in this shell (a Slurm allocation included); the plan sees
    # only the Slurm part of the shell (inside an allocation the job is the allocation's, as train runs it).
    found = gather(PlanRequest(nnodes=nnodes, master_addr=master_addr),
                   Sources(sysroot=sysroot, python=python, hostfile=hostfile, adapt_to_load=adapt_to_load),
                   slurm_environ(os.environ))
    facts = found.facts
    # The built-in run length (train's default --max-steps) unless given: every command plans the same job.
    workload = resolve_workload(model, params, seq_len, batch_size, 400 if steps is None else steps, host=facts)
    overrides: Overrides = {}
    if config:
        for key, raw in load_settings_file(config).items():
            overrides = merge(overrides, coerce_entry(key, raw))
    overrides = merge(overrides, parse_assignments(sets))

    # which measurement decides, with its figure (stderr: never the product; nothing under --quiet)
    log = (out or Output()).teller("cpuperf: ")

    meas = measure.load_file(measurements) if measurements else measure.planning_measurements(facts, log)
    rec = recommend(facts, workload, RecommendRequest(
        nproc_per_node=nproc_per_node, nnodes=found.nnodes, unit=unit, device=device, measurements=meas,
        overrides=overrides, environ=os.environ if facts.live else {}))
    return found, rec


def load_settings_file(path: str) -> Dict[str, str]:
    """A TOML or JSON file of decision overrides: {dtype = "fp32", compile = false}."""
    import json

    from cpuperf.data import MAX_DEPTH, too_deep
    from cpuperf.errors import UsageError

    hint = "write KEY = VALUE lines (TOML) or a JSON object, in UTF-8"
    from cpuperf.fsutil import InputRefused, read_capped

    try:
        raw = read_capped(path, 1024 * 1024)  # bounded and never blocking: a settings file is a few lines
    except OSError as exc:
        raise UsageError(f"cannot read settings file {path}: {exc.strerror}", hint="check the path") from exc
    except InputRefused as exc:
        raise UsageError(f"settings file {exc}", hint=hint) from None
    if b"\0" in raw:
        raise UsageError(f"settings file {path} is binary", hint=hint)
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.endswith(".json") else _toml(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and TOMLDecodeError are ValueErrors
        why = str(exc).splitlines()[0] if str(exc) else "nested too deeply"
        raise UsageError(f"settings file {path} is malformed: {why}", hint=hint) from exc
    if not isinstance(data, dict):
        raise UsageError(f"settings file {path} must hold a table of decisions", hint=hint)
    if too_deep(data, MAX_DEPTH):
        raise UsageError(f"settings file {path} nests deeper than {MAX_DEPTH} levels", hint=hint)
    return {str(k): ("none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)) for k, v in data.items()}


def _toml(text: str) -> Dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python < 3.11
        import tomli as tomllib
    parsed: Dict[str, Any] = tomllib.loads(text)
    return parsed


def job_plan(found: Found, facts: HostFacts, rec: Recommendation, master_addr: Optional[str] = None) -> JobPlan:
    """The plan `cpuperf train --auto -- python your_script.py` would run with these decisions (cpuperf.plan.build,
    the one planner), on the nodes and in the Slurm job the edge found."""
    from cpuperf.plan.build import build_job_plan, decided_inputs

    request, edge = decided_inputs(rec, found.hosts, found.environ, found.slurm, master_addr, found.mpi, found.euid)
    return build_job_plan(request, facts, edge)


def renderings(rec: Recommendation, jp: JobPlan) -> Dict[str, Any]:
    """Environment, launch line, HF flags and accelerate config for a recommendation."""
    from cpuperf.plan.launch_view import launch_view
    from cpuperf.render import recommendation as render

    transformers = rec.stack.get("transformers")
    env = jp.env_map()
    launch = launch_view(jp.launch)
    from cpuperf.plan.user_script import recommended_speed_flags

    files = {path: text for f in recommended_speed_flags(rec, transformers)[0] if f.file for path, text in [f.file]}
    return {
        "env": env,
        "launch": launch,
        "hf_args": render.hf_flags(rec, transformers),
        "hf_files": files,
        "hf_args_for": transformers or "newest known transformers",
        "accelerate_config": render.accelerate_config(rec, env.get("MASTER_ADDR", "127.0.0.1"),
                                                      int(env.get("MASTER_PORT", str(DEFAULT_MASTER_PORT)))),
        "accelerate_launch_args": render.accelerate_launch_args(rec),
        "data_notes": render.hf_notes(rec) + [f"the Trainer flags name {path}: write it with {text}"
                                              for path, text in files.items()],
    }


def run_recommend(out: Output, fmt: Optional[str], **kwargs: Any) -> int:
    """`cpuperf recommend`: decide, plan the job for your script (over a hostfile's nodes from each node's facts),
    save it with --save, and print it (--json, one rendering with --format, else the table)."""
    from cpuperf.decide.recommend import SCHEMA

    save = kwargs.pop("save", None)
    if save is not None:
        from cpuperf.fsutil import check_output_file

        check_output_file("--save", save)
    master_addr = kwargs.pop("master_addr", None)
    node_facts, probe_nodes = kwargs.pop("node_facts", None), kwargs.pop("probe_nodes", False)
    found, rec = build(**kwargs, out=out, master_addr=master_addr)
    facts = found.facts
    kwargs["nnodes"] = rec.levers.nnodes.value  # the job's count as decided: what --replan plans for again
    subs: List[NodePlan] = []
    if node_facts or probe_nodes:
        facts, rec, subs = cluster_plan(out, facts, rec, found.hosts, node_facts, found.mpi)
    jp = job_plan(found, facts, rec, master_addr)
    extra = renderings(rec, jp)
    report = _lever_report(rec, jp, extra["hf_args"])
    result = {
        "schema": SCHEMA,
        "decisions": [d.to_json() for d in rec.decisions],
        "overridden": [d.id for d in rec.decisions if d.overridden],
        "workload": rec.workload.to_json(),
        "placement": rec.placement.to_json(),
        "stack": rec.stack,
        "notes": list(rec.notes) + extra["data_notes"] + _levers_not_applied(facts, rec),
        **extra,
        "levers": _split(report),
    }
    if subs:
        result["nodes"] = {name: {"threads_per_rank": r.levers.threads_per_rank.value, "dtype": r.levers.dtype.value,
                                  "nproc_per_node": r.levers.nproc_per_node.value} for name, _, r, _ in subs}
    if save:
        result["saved"] = save_plan(save, facts, rec, jp, kwargs, subs)
        out.info(f"plan saved to {save}: run it with `cpuperf train --plan {save}` or `cpuperf ccl-env --plan {save}`")
    _print(out, fmt, result, report)
    return 0


def _print(out: Output, fmt: Optional[str], result: Dict[str, Any], report: Sequence[LeverState]) -> None:
    """The recommendation as asked: the JSON object, one rendering (--format), or the table; then each note on
    stderr the first time a plan carries it (the JSON carries them every time)."""
    from cpuperf.render import recommendation as render

    if out.json_mode:
        out.json(result)
        return
    if fmt == "env":
        out.product(render.env_exports(result["env"]))
    elif fmt == "hf":
        import shlex

        out.product(" ".join(shlex.quote(a) for a in result["hf_args"]))
    elif fmt == "accelerate":
        out.product(result["accelerate_config"])
    elif fmt == "launch":
        out.product(render.launch_line(result["launch"]))
    else:
        _table(out, result, report)
    from cpuperf.run.said import first_time

    for note in result["notes"]:  # in the result every time; on stderr the first time a plan carries it
        if not out.quiet and first_time("plan-notes", note):
            out.info(f"note: {note}")


def _levers_not_applied(facts: HostFacts, rec: Recommendation) -> List[str]:
    """The Arm levers this plan leaves out, each with why (the job's notes say the same: decide/runtime_env)."""
    from cpuperf.decide.arm_levers import arm_levers

    return [lever.line() for lever in arm_levers(facts, {"fp32_math_mode": rec.levers.fp32_math_mode.value}) if not lever.applied]


def cluster_plan(out: Output, facts: HostFacts, rec: Recommendation, hosts: Optional[Sequence[Host]],
                 node_facts: Optional[str], mpi: Optional[Tuple[str, str]]) -> Tuple[HostFacts, Recommendation, List[NodePlan]]:
    """One plan over the hostfile's nodes from each node's own facts (saved by `doctor --hostfile --save-facts`, or
    probed now): bf16 only if every node runs it natively, threads from each node's cores, refused (exit 14)
    where the stacks differ. Returns (first node's facts, its recommendation, [(name, facts, rec, job plan)]).
    `mpi`: the MPI launcher the edge found (run.edge.Found.mpi), which reaches the nodes when they are probed now."""
    import dataclasses
    import os

    from cpuperf.decide import cluster
    from cpuperf.errors import UnreachableError, UsageError
    from cpuperf.plan.build import cluster_plans

    if not hosts:
        raise UsageError("planning from every node's facts needs --hostfile FILE", hint="list the nodes, rank 0 first")
    names = [h.name for h in hosts]
    if node_facts:
        from cpuperf.probe.node import read_saved

        notes: List[str] = []
        results = read_saved(node_facts, notes)
        unfit = {r.name: r.error for r in results if r.facts is None and r.error and "saved facts" in r.error}
        planned = [n for n in names if n in unfit]
        if planned:  # planning needs every node's facts: a record that does not fit is the user's to fix (exit 2)
            raise UsageError(f"node {planned[0]}: {unfit[planned[0]]} ({node_facts}); planning needs every node's facts",
                             hint="save that node's facts again: cpuperf doctor --hostfile FILE --save-facts DIR/")
        for note in notes:
            out.warn(note)
    else:
        from cpuperf.run.nodes import choose_reach, probe_cluster, this_host_mpi

        # the nodes are reached from this host: its MPI launcher as the edge found it (a recorded host's is not it)
        here = mpi if facts.live else this_host_mpi()
        results = probe_cluster(names, choose_reach(None, hostfile=True, python=None, environ=os.environ, mpi=here))
    # Load of the moment rode along with each node's probe: a finding there, never an input here.
    by_name = {n: dataclasses.replace(f, load=None) for n, f in cluster.hosts_of(results).items()}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise UnreachableError(f"no facts for node(s) {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""),
                               hint="cpuperf doctor --hostfile FILE --save-facts DIR/ names why; then --node-facts DIR/")
    subs = cluster_plans(names, by_name, rec, hosts, _measured_allreduce(names, rec))
    for name, _, r, _ in subs:
        lv = r.levers
        out.info(f"node {name}: {lv.nproc_per_node.value} rank(s) x {lv.threads_per_rank.value} thread(s), {lv.dtype.value}")
    first = subs[0]
    return first[1], first[2], subs


def _measured_allreduce(names: List[str], rec: Recommendation) -> Optional[Dict[str, Any]]:
    """The cached allreduce across exactly these nodes (`cpuperf doctor --hostfile FILE --collectives`), unless
    the user set the DDP backend: what the planner picks the backend and bucket size from."""
    if rec.levers.ddp_backend.overridden:
        return None
    from cpuperf.run.collectives import read_cached

    return read_cached(names)


def save_plan(path: str, facts: HostFacts, rec: Recommendation, jp: JobPlan, inputs: Dict[str, Any],
              subs: Sequence[NodePlan] = ()) -> str:
    """Write the plan with the facts it was made from (cpuperf.plan.saved), atomically; never the host's name: the
    same facts give the same file on every node, and a plan shared or committed tells no one where it was made."""
    from cpuperf import __version__
    from cpuperf.errors import from_os_error, one_line
    from cpuperf.fsutil import atomic_write_bytes
    from cpuperf.plan import saved
    from cpuperf.plan.build import saved_plan_of

    plan = saved_plan_of(facts, rec, jp, inputs, __version__, None, subs)
    text = saved.dumps(plan)
    try:  # a plan is saved only where it loads back (a model path that is not UTF-8 was saved, then refused)
        saved.loads(text)
    except ValueError as exc:
        from cpuperf.errors import UsageError

        raise UsageError(f"--save {path}: this plan would not load back ({one_line(str(exc), 200)})",
                         hint="name the model with text a plan can hold (printable UTF-8)") from exc
    try:
        atomic_write_bytes(path, text.encode("utf-8"), make_parents=False)
    except OSError as exc:
        raise from_os_error(exc) from exc
    return path


def _lever_report(rec: Recommendation, jp: JobPlan, hf_args: Sequence[str]) -> Tuple[LeverState, ...]:
    """Each lever applied or not in what recommend renders (the environment, the launch line, the Trainer flags):
    cpuperf.plan.applied, as train --dry-run reports it."""
    import dataclasses

    from cpuperf.plan.applied import flag_groups, lever_report, rendered_job

    return lever_report(rec.levers, dataclasses.replace(rendered_job(jp), flags=flag_groups(hf_args)))


def _split(report: Sequence[LeverState]) -> Dict[str, List[Dict[str, object]]]:
    from cpuperf.plan.applied import split

    return split(report)


def _levers_not_in_table(report: Sequence[LeverState], report_lines: Callable[[Sequence[LeverState]], List[str]]) -> List[str]:
    """What the table does not say already: how many levers the lines above carry, and each one they do not, with
    why (--json holds every lever's state)."""
    missed = [s for s in report if not s.applied]
    head = (f"# levers: {len(report) - len(missed)} of {len(report)} applied by the environment, launch and flags "
            "above" + ("; not applied (why):" if missed else ""))
    return [head, *("# " + line for line in report_lines(missed))]


def _table(out: Output, result: Dict[str, Any], report: Sequence[LeverState]) -> None:
    from rich.table import Table

    from cpuperf.plan.applied import report_lines
    from cpuperf.render import recommendation as render
    t = Table(title=f"Recommendation for workload {result['workload']['name']}", title_justify="left")
    t.add_column("decision", style="bold")
    t.add_column("value")
    t.add_column("reason", overflow="fold")
    for d in result["decisions"]:
        value = d["value"]
        shown = "-" if value is None else ("(config)" if isinstance(value, dict) else str(value).lower() if isinstance(value, bool) else str(value))
        t.add_row(d["id"] + (" *" if d["overridden"] else ""), shown, d["reason"])
    out.table(t)
    lines = ["", "# environment", render.env_exports(result["env"]).rstrip(),
             "", "# launch", render.launch_line(result["launch"]),
             "", f"# Hugging Face Trainer flags ({result['hf_args_for']})", " ".join(result["hf_args"]),
             "", *_levers_not_in_table(report, report_lines)]
    from cpuperf.output import message_width
    from cpuperf.render.run_report import wrap_comments

    out.product(wrap_comments("\n".join(lines), message_width(stream=sys.stdout)))
    if result["overridden"]:
        out.info("* set by you: " + ", ".join(result["overridden"]))


def _writable_dir(path: Union[str, os.PathLike[str]]) -> None:
    """Create `path` and check that files can be written in it; else a one-line FilesystemError (exit 10)."""
    import os

    from cpuperf.errors import from_os_error

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise from_os_error(exc) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        import errno

        raise from_os_error(PermissionError(errno.EACCES, "Permission denied", str(path)))


def _bench_threads(facts: HostFacts, threads: Optional[int]) -> int:
    """bench's thread count: yours (--threads), within this host's usable CPUs, else the plan's per rank."""
    from cpuperf.decide.placement import plan_placement

    if threads is None:
        return plan_placement(facts).threads_per_rank
    usable = len(facts.usable_cpus()) or 1
    if not 1 <= threads <= usable:  # 100000 threads would fork until the machine runs out of processes
        from cpuperf.errors import UsageError

        raise UsageError(f"--threads {threads}: this host has {usable} usable CPU(s)",
                         hint=f"choose 1..{usable}")
    return threads


def run_bench(out: Output, threads: Optional[int], size: int, seconds: float, allocators: bool = True,
              compile: bool = False, refresh: bool = False, model: Optional[str] = None,
              sets: Sequence[str] = ()) -> int:
    """`cpuperf bench`. `sets` (--set KEY=VALUE, with --compile): the plan's constraints; torch.compile is measured
    at the dtype that plan runs (`--set dtype=fp32`: fp32), refused (exit 2) before measuring if one cannot be
    honoured."""
    from cpuperf.decide.recommend import compile_measured
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.knobs import parse_assignments
    from cpuperf.probe import probe_host
    from cpuperf.run import measure

    facts = probe_host()
    threads = _bench_threads(facts, threads)
    overrides = parse_assignments(sets)
    _writable_dir(measure.cache_dir())  # before minutes of measuring, not after
    workload = resolve_workload(model, host=facts)  # train --auto's model where none is named
    cached, path = measure.read_cached(facts)
    usable, flags = measure.assess(cached, facts) if cached is not None else (False, [])
    again = (measure.unfinished(cached) or measure.disturbed(cached)) if cached is not None and usable else None
    flags = flags + ([again] if again else [])
    fresh = cached is not None and usable and not flags and not refresh
    # your --set refused before minutes of measuring; the dtype again once the GEMM ratio it may rest on is measured
    dtype = measure.plan_dtype(facts, workload, measure.load_cached(facts) if usable else None, overrides) \
        if compile else None
    if fresh and dtype is not None and not compile_measured(workload, (cached or {}).get("compile_by_model", {}), dtype):
        # The rest is cached and trusted: only this model's torch.compile cost and gain at the plan's dtype.
        out.info(f"measuring torch.compile for {workload.name} on {threads} thread(s) (slow) ...")
        out.info(f"... eager and each torch.compile mode, {dtype}, side by side; inductor's cache is the "
                 "measurement's own (a cold compile)")
        results = {**(cached or {}), **measure.compile_measurement(threads, workload=workload, dtype=dtype,
                                                                   log=out.teller("cpuperf bench: "))}
        path = measure.save(facts, {k: v for k, v in results.items() if k not in ("schema", "host_id", "torch_build")})
        results = {**(measure.read_cached(facts)[0] or results), "cache": str(path), "from_cache": False}
    elif fresh:
        out.info(f"cached measurement ({measure.describe(cached or {})}); cpuperf bench --refresh measures again")
        results = {**(cached or {}), "cache": str(path), "from_cache": True}
    else:
        if cached is not None and (flags or not usable):
            out.info(f"measuring again: the cached one is {'; '.join(flags)}")
        out.info(f"measuring on {threads} thread(s): bf16/fp32 GEMM" + (", allocators" if allocators else "")
                 + (", torch.compile (slow)" if compile else "") + ", side by side ...")
        results, path = measure.measure_and_save(facts, threads, tries=0 if refresh else measure.tries_before(cached),
                                                 log=out.teller("cpuperf bench: "), allocators=allocators,
                                                 compile=compile, seconds=seconds, size=size, workload=workload,
                                                 done=cached if usable and not refresh and measure.unfinished(cached)
                                                 else None, overrides=overrides)
        results = {**(measure.read_cached(facts)[0] or results), "cache": str(path), "from_cache": False}
        _, flags = measure.assess(results, facts)
    results["trusted"] = not flags
    results["flags"] = flags
    if out.json_mode:
        out.json({"schema": "cpuperf.bench/1", **results})
    else:
        out.product("\n".join(_bench_lines(results, flags) + [f"cached at {path}"]))
    return 0


def run_bench_tune(out: Output, model: Optional[str], budget_s: Optional[float], refresh: bool = False) -> int:
    """`cpuperf bench --tune`: tune the plan's levers for --model's shape on this host (cached; --refresh redoes it)."""

    from cpuperf.decide.recommend import shape_key
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.errors import ProbeFailedError
    from cpuperf.probe import probe_host
    from cpuperf.run import measure
    from cpuperf.run.tune import rules as tune_rules
    from cpuperf.run.tune import tune_shape

    facts = probe_host()
    _writable_dir(measure.cache_dir())
    workload = resolve_workload(model, None, None, None, 400, host=facts)
    meas = measure.load_cached(facts)
    key = shape_key(workload)
    cached = meas.tuned_by_shape.get(key) if meas is not None else None
    if cached is None or refresh:
        out.info(f"tuning the plan's levers for {key} on this host (budget {budget_s or tune_rules().budget_s} s) ...")
        got = tune_shape(facts, workload, meas, out.teller("cpuperf bench: "), budget_s)
        if got is None:
            raise ProbeFailedError("nothing to tune: the plan trains on a GPU", hint="--tune tunes CPU training")
        entry = got[2]
        if got[0].stopped == "failed":
            raise ProbeFailedError("the rule's point failed to run: nothing tuned",
                                   hint="check that torch imports: cpuperf doctor")
        if entry.get("not_saved"):
            from cpuperf.errors import CpuperfError

            raise CpuperfError(f"--tune: not saved as a tuning: {entry['not_saved']}",
                               hint="the rules decide this shape's plans until a tuning compares two settings")
    else:
        out.info("cached tuning (cpuperf bench --tune --refresh tunes again)")
        entry = cached
    if out.json_mode:
        out.json({"schema": "cpuperf.bench-tune/1", "shape": key, "cache": str(measure.cache_dir()), **entry})
        return 0
    from cpuperf.decide.tune import Point

    best, start = entry.get("best_samples_per_s"), entry.get("start_samples_per_s")
    lines = [f"tuned for {key}: {Point.from_json(entry['best']).label()}" + (f", {best:.2f} samples/s" if best else "")
             + (f" vs the rule's point {start:.2f}" if start and best else "")]
    for lever, fig in (entry.get("levers") or {}).items():
        lines.append(f"  {lever}: {fig['value']} {fig['figure']:.2f}; alternatives "
                     + ", ".join(f"{k} {v:.2f}" for k, v in fig["alternatives"].items()))
    for lever, why in (entry.get("skipped") or {}).items():
        lines.append(f"  {lever}: not tuned: {why}")
    if entry.get("stopped") == "budget":
        lines.append(f"the {entry.get('budget_s')} s budget ended the search: the best point so far is kept")
    out.product("\n".join(lines))
    return 0


def _bench_lines(results: Dict[str, Any], flags: List[str]) -> List[str]:
    """The bench figures as text: GEMM rates and their spread, load, trust, allocators, torch.compile."""
    import statistics

    fp32, bf16 = results.get("gemm_fp32_gflops"), results.get("gemm_bf16_gflops")
    reps = results.get("repeats") or {}
    spread = ", ".join(f"{k[5:9]} {r['min']:.1f}-{r['max']:.1f} over {r['n']}" for k, r in reps.items())
    lines = [f"fp32 GEMM {fp32:.1f} GFLOP/s" + (f", bf16 GEMM {bf16:.1f} GFLOP/s ({bf16 / fp32:.2f}x)" if bf16 and fp32 else "")
             + f" on {results.get('threads')} thread(s)" + (f" (medians; {spread})" if spread else "")] if fp32 else []
    for r in (results.get("ratios") or {}).values():  # what decides: each ratio of runs side by side
        rounds = [x for x in r.get("rounds") or [] if isinstance(x, (int, float))] if isinstance(r, dict) else []
        if not rounds:
            continue
        v = r.get("verdict") or {}
        judged = (f"; interval {v['low']:.2f}-{v['high']:.2f} against {v['bar']:.2f}: {v['outcome']}"
                  if {"low", "high", "bar", "outcome"} <= set(v) else "")
        lines.append(f"{r.get('name')}: {statistics.median(rounds):.2f}x ({min(rounds):.2f}-{max(rounds):.2f} over "
                     f"{len(rounds)} rounds{judged})" + ("" if r.get("decided") else ": too noisy to decide, the rule decides"))
    load = results.get("load") or {}
    if load.get("figure"):
        lines.append(f"load around it: {load['figure']}")
    if flags:
        lines.append("NOT TRUSTED: " + "; ".join(flags) + " (cpuperf bench --refresh measures again, side by side)")
    for name, r in (results.get("allocator_speedup") or {}).items():
        if not name.endswith("_by_workload"):
            per = results["allocator_speedup"].get(f"{name}_by_workload") or {}
            lines.append(f"{name} preloaded: " + ", ".join(f"{w} {x:.2f}x" for w, x in per.items())
                         + " the default allocator")
    for key, c in (results.get("compile_by_model") or {}).items():
        from cpuperf.decide.judge import paired
        from cpuperf.decide.recommend import compile_crossover, compile_dtype
        from cpuperf.knowledge.tuning import tuning

        rounds = c.get("rounds") or []
        v = paired(rounds, bar=1.0, confidence=tuning().judge.confidence) if len(rounds) >= 2 else None
        cross = compile_crossover(c["compile_seconds"], c["step_seconds"], c["speedup"]) \
            if v is None or v.above else None
        noise = "" if v is None else f" ({v.low:.2f}-{v.high:.2f} over {v.n} rounds, {v.outcome})"
        lines.append(f"torch.compile for {c.get('model', key)}, {c.get('mode', 'default')}, {compile_dtype(c)}: "
                     f"{c['compile_seconds']:.0f} s to compile, "
                     f"{c['speedup']:.2f}x steady{noise} at {c['step_seconds']:.2f} s/step (batch {c['batch']}): "
                     + (f"pays back after {cross} steps" if cross else "never pays back"))
    return lines


