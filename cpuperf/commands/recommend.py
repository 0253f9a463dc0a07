"""`cpuperf recommend` and `cpuperf bench`: decisions with reasons, and the measurements behind them."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from cpuperf.output import Output


def build(sysroot: Optional[str], model: Optional[str], params: Optional[str], seq_len: Optional[int],
          batch_size: Optional[int], steps: Optional[int], nproc_per_node: Optional[int], nnodes: int,
          hostfile: Optional[str], unit: str, device: str, sets: List[str], config: Optional[str],
          measurements: Optional[str], python: Optional[str] = None, adapt_to_load: bool = False):
    """Probe, resolve the workload, read measurements, decide. Returns (facts, recommendation, hosts).

    Load changes from second to second, so it shapes the plan only with adapt_to_load (--adapt-to-load);
    otherwise the same host and stack give the same plan in every command, run after run."""
    import os

    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.knobs import coerce_entry, merge, parse_assignments
    from cpuperf.probe import probe_host, with_load
    from cpuperf.probe.hosts import read_hostfile
    from cpuperf.run import measure

    facts = probe_host(sysroot=sysroot, python=python)
    if adapt_to_load:
        facts = with_load(facts)
    # The built-in run length (train's default --max-steps) unless given: every command plans the same job.
    workload = resolve_workload(model, params, seq_len, batch_size, 400 if steps is None else steps)
    hosts = read_hostfile(hostfile) if hostfile else None
    if hosts is not None and nnodes == 1:
        nnodes = len(hosts)
    overrides: Dict[str, Any] = {}
    if config:
        for key, raw in load_settings_file(config).items():
            overrides = merge(overrides, coerce_entry(key, raw))
    overrides = merge(overrides, parse_assignments(sets))

    def log(msg: str) -> None:  # which measurement decides, with its figure (stderr: never the product)
        import sys

        sys.stderr.write(f"cpuperf: {msg}\n")

    meas = measure.load_file(measurements) if measurements else planning_measurements(facts, log)
    rec = recommend(facts, workload, nproc_per_node=nproc_per_node, nnodes=nnodes, unit=unit, device=device,
                    measurements=meas, overrides=overrides, environ=os.environ if facts.live else {})
    return facts, rec, hosts


def planning_measurements(facts: Any, log: Any) -> Any:
    """The measurements every planning command (recommend, ccl-env, train --dry-run, train --auto) decides
    from: this host's cached ones as they stand (flagged if taken under load), else None, and the rules
    decide, each saying it was not measured. Planning never measures and never needs torch: `cpuperf bench`
    measures, and so does the start of a real `train --auto` where nothing is cached (measure_before_run)."""
    from cpuperf.run import measure

    return measure.load_cached(facts, log)  # a snapshot's recorded one, for a recorded host


def measure_before_run(facts: Any, threads: int, log: Any, workload: Any = None) -> Any:
    """A real `train --auto` on a host where a rule is unsure and nothing usable is cached: measure now (said,
    and cached, so the next plan in any command is the same one); with `workload`, tune the plan's levers on
    its shape where nothing is tuned for it yet (cpuperf.decide.tune, ~60 s). CPUPERF_MEASURE=0 skips both.
    A measurement that fails (no torch in this interpreter) leaves the rules to decide, and says so."""
    import os

    from cpuperf.errors import ProbeFailedError
    from cpuperf.run import measure

    if not facts.live or facts.gpus or os.environ.get("CPUPERF_MEASURE", "1").strip() == "0":
        return planning_measurements(facts, log)
    data, _ = measure.read_cached(facts)
    if data is not None and measure.assess(data, facts)[0]:
        meas = measure.load_cached(facts, log)
    else:
        try:
            meas = measure.measure_if_unsure(facts, threads, log=log)
        except ProbeFailedError as exc:
            log(f"could not measure this host ({exc.message}): the rules decide; `cpuperf bench` measures later")
            return planning_measurements(facts, log)
    if workload is None:
        return meas
    from cpuperf.data import load_builtin
    from cpuperf.decide.recommend import shape_key
    from cpuperf.decide.tune import too_noisy

    entry = meas.tuned_by_shape.get(shape_key(workload)) if meas is not None else None
    if entry is not None and not (entry.get("load") or {}).get("under_load") and \
            not too_noisy(entry, load_builtin("tuning.toml")["measure"]["max_spread"]):
        return meas  # tuned on a quiet host: kept; one tuned under load or too noisy is tuned again here
    log(f"tuning the plan's levers for {shape_key(workload)} on this host (about {_tune_rules()['budget_s']} s"
        + ("; the cached tuning was taken under load or too noisy" if entry is not None else ", once") + "; cached for later runs) ...")
    if tune_shape(facts, workload, meas, log) is None:
        return meas
    return measure.load_cached(facts)


def _tune_rules() -> Dict[str, Any]:
    from cpuperf.run.tune import rules

    return rules()


def tune_shape(facts: Any, workload: Any, meas: Any, log: Any, budget_s: Optional[float] = None) -> Any:
    """Coordinate descent over this plan's levers on the reference loop at the workload's shape, each point run
    with the env and CPUs its own plan gives (cpuperf.decide.tune); the result cached per host, torch build and
    shape. Returns (result, candidates, entry), or None where there is nothing to tune (a GPU plan)."""
    import time

    from cpuperf.data import load_builtin
    from cpuperf.decide import tune as dtune
    from cpuperf.decide.recommend import recommend, shape_key
    from cpuperf.run import measure
    from cpuperf.run import tune as rtune

    rule = rtune.rules()
    budget = float(budget_s if budget_s is not None else rule["budget_s"])
    rec = recommend(facts, workload, measurements=meas, shape_tuning=False, environ={})
    if rec.get("device") != "cpu":
        return None
    start, cand = dtune.start_point(rec), dtune.candidates(facts, rec, load_builtin("tuning.toml"))
    base = {"workload": "lm", "batch": workload.batch_size, "seconds": rule["seconds"], "steps": rule["steps"],
            "warmup": rule["warmup"], "windows": rule["windows"], "run_steps": workload.steps or 0,
            "shape": {"n_layer": workload.n_layer, "n_head": workload.n_head, "d_model": workload.d_model,
                      "seq_len": workload.seq_len, "vocab_size": workload.vocab}}

    def run_one(p: Any) -> Any:
        env, cpus = _point_env(facts, workload, meas, p)
        return rtune.bench_point(p, base, env, cpus)

    before = measure.load_now(facts, start.ranks * start.threads)
    result = rtune.tune(start, cand, run_one, budget, int(rule["passes"]), log)
    after = measure.load_now(facts, start.ranks * start.threads)
    entry = {**result.to_json(), "measured_at": int(time.time()), "budget_s": budget, "skipped": cand.skipped,
             "shape": shape_key(workload),
             "load": {**before, "under_load": before["under_load"] or after["under_load"], "after": after["figure"]}}
    for line in rtune.summary(result, cand):
        log(line)
    if result.stopped != "failed":
        measure.save_tuned(facts, "tuned_by_shape", shape_key(workload), entry)
    return result, cand, entry


def _point_env(facts: Any, workload: Any, meas: Any, p: Any) -> Any:
    """(env, CPUs per rank) of the plan with `p`'s values: what `train --auto` would run at that point."""
    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.tune import decision_values
    from cpuperf.run import measure

    sets = {k: ("none" if v is None else str(v).lower()) for k, v in decision_values(p).items()
            if not (k == "optimizer" and v is None)}
    rec = recommend(facts, workload, measurements=meas, overrides=sets, shape_tuning=False, environ={})
    jp = job_plan(facts, rec, None)
    env = dict(jp.env_map())
    if p.allocator and "LD_PRELOAD" not in env:
        env.update(measure.allocator_env(p.allocator, measure.allocator_libraries(facts)[p.allocator]))
    return env, [list(r.cpus) for r in jp.launch.per_rank]


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
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


def job_plan(facts: Any, rec: Any, hosts: Any, environ: Optional[Dict[str, str]] = None) -> Any:
    """The plan `cpuperf train --auto -- python your_script.py` would run (cpuperf.plan.job), built once."""
    from cpuperf.plan.job import JobRequest, plan_job
    from cpuperf.plan.launch_view import SCRIPT_PLACEHOLDER

    nnodes = max(1, int(rec.get("nnodes")))
    master = None if hosts else ("127.0.0.1" if nnodes > 1 else None)  # placeholder a user replaces
    request = JobRequest(auto=True, hosts=tuple(hosts) if hosts else None, nnodes=nnodes, master_addr=master,
                         launcher=None if not hosts or len(hosts) <= 1 else "torchrun")
    return plan_job(facts, rec, request, environ=environ or {}, rank_command=["python", SCRIPT_PLACEHOLDER],
                    python="python")


def renderings(facts: Any, rec: Any, hosts: Any, jp: Any = None) -> Dict[str, Any]:
    """Environment, launch line, HF flags and accelerate config for a recommendation."""
    from cpuperf.plan.launch_view import launch_view
    from cpuperf.render import recommendation as render

    jp = jp or job_plan(facts, rec, hosts)
    transformers = rec.stack.get("transformers")
    env = jp.env_map()
    launch = launch_view(jp.launch)
    return {
        "env": env,
        "launch": launch,
        "hf_args": render.hf_flags(rec, transformers),
        "hf_args_for": transformers or "newest known transformers",
        "accelerate_config": render.accelerate_config(rec, env.get("MASTER_ADDR", "127.0.0.1"),
                                                      int(env.get("MASTER_PORT", "29500"))),
        "accelerate_launch_args": render.accelerate_launch_args(rec),
        "data_notes": render.hf_notes(rec),
    }


def run_recommend(out: Output, fmt: Optional[str], **kwargs: Any) -> int:
    from cpuperf.decide.recommend import SCHEMA
    from cpuperf.render import recommendation as render

    save = kwargs.pop("save", None)
    node_facts, probe_nodes = kwargs.pop("node_facts", None), kwargs.pop("probe_nodes", False)
    facts, rec, hosts = build(**kwargs)
    subs: List[Any] = []
    if node_facts or probe_nodes:
        facts, rec, subs = cluster_plan(out, facts, rec, hosts, node_facts)
    jp = job_plan(facts, rec, hosts)
    extra = renderings(facts, rec, hosts, jp)
    result = {
        "schema": SCHEMA,
        "decisions": [d.to_json() for d in rec.decisions],
        "overridden": [d.id for d in rec.decisions if d.overridden],
        "workload": rec.workload.to_json(),
        "placement": rec.placement.to_json(),
        "stack": rec.stack,
        "notes": list(rec.notes) + extra["data_notes"],
        **extra,
    }
    if subs:
        result["nodes"] = {name: {"threads_per_rank": r.get("threads_per_rank"), "dtype": r.get("dtype"),
                                  "nproc_per_node": r.get("nproc_per_node")} for name, _, r, _ in subs}
    if save:
        result["saved"] = save_plan(save, facts, rec, jp, kwargs, subs)
        out.info(f"plan saved to {save}: run it with `cpuperf train --plan {save}` or `cpuperf ccl-env --plan {save}`")
    if out.json_mode:
        out.json(result)
        return 0
    if fmt == "env":
        out.product(render.env_exports(extra["env"]))
    elif fmt == "hf":
        import shlex

        out.product(" ".join(shlex.quote(a) for a in extra["hf_args"]))
    elif fmt == "accelerate":
        out.product(extra["accelerate_config"])
    elif fmt == "launch":
        out.product(render.launch_line(extra["launch"]))
    else:
        _table(out, result)
    for note in result["notes"]:
        out.info(f"note: {note}")
    return 0


def cluster_plan(out: Output, facts: Any, rec: Any, hosts: Any, node_facts: Optional[str]) -> Any:
    """One plan over the hostfile's nodes from each node's own facts (saved by `doctor --hostfile --save-facts`, or
    probed now): bf16 only if every node runs it natively, threads from each node's cores, refused (exit 14)
    where the stacks differ. Returns (first node's facts, its recommendation, [(name, facts, rec, job plan)])."""
    import dataclasses
    import os

    from cpuperf.decide import cluster
    from cpuperf.decide.recommend import recommend
    from cpuperf.errors import UnreachableError, UsageError

    if not hosts:
        raise UsageError("planning from every node's facts needs --hostfile FILE", hint="list the nodes, rank 0 first")
    names = [h.name for h in hosts]
    if node_facts:
        from cpuperf.probe.node import read_saved

        results = read_saved(node_facts)
    else:
        from cpuperf.run.nodes import choose_reach, probe_cluster

        results = probe_cluster(names, choose_reach(None, bool(os.environ.get("SLURM_JOB_ID")), None, os.environ))
    # Load of the moment rode along with each node's probe: a finding there, never an input here.
    by_name = {n: dataclasses.replace(f, load=None) for n, f in cluster.hosts_of(results).items()}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise UnreachableError(f"no facts for node(s) {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""),
                               hint="cpuperf doctor --hostfile FILE --save-facts DIR/ names why; then --node-facts DIR/")
    cons = cluster.constraints({n: by_name[n] for n in names})
    cons.require_one_stack()
    fixed = {d.id: d.value for d in rec.decisions if d.overridden}
    if not cons.bf16 and "dtype" not in fixed:
        fixed["dtype"] = "fp32"
    ddp = _measured_backend(names, fixed)
    subs = []
    for name in names:
        node = by_name[name]
        r = recommend(node, rec.workload, nnodes=len(names), overrides=fixed, environ={})
        if ddp is not None and len(names) > 1:  # measured across these nodes: the figure goes in the plan
            r = dataclasses.replace(r, decisions=tuple(
                dataclasses.replace(x, value=ddp.backend, reason=ddp.reason,
                                    evidence={**ddp.evidence, "bucket_cap_mb": ddp.bucket_cap_mb})
                if x.id == "ddp_backend" else x for x in r.decisions))
        if "dtype" in fixed and not any(x.id == "dtype" and x.overridden for x in rec.decisions):
            r = dataclasses.replace(r, decisions=tuple(
                dataclasses.replace(x, reason=cons.dtype_reason, overridden=False) if x.id == "dtype" else x
                for x in r.decisions))
        subs.append((name, node, r, job_plan(node, r, hosts)))
        out.info(f"node {name}: {r.get('nproc_per_node')} rank(s) x {r.get('threads_per_rank')} thread(s), {r.get('dtype')}")
    first = subs[0]
    return first[1], first[2], subs


def _measured_backend(names: List[str], fixed: Dict[str, Any]) -> Any:
    """The DDP backend and bucket size a cached allreduce across exactly these nodes chose
    (`cpuperf doctor --hostfile FILE --collectives`), unless the user set the backend."""
    if "ddp_backend" in fixed:
        return None
    from cpuperf.decide.cluster import choose_ddp
    from cpuperf.run.collectives import read_cached

    measured = read_cached(names)
    return choose_ddp(measured) if measured else None


def save_plan(path: str, facts: Any, rec: Any, jp: Any, inputs: Dict[str, Any], subs: Any = ()) -> str:
    """Write the plan with the facts it was made from (cpuperf.plan.saved), atomically."""
    import dataclasses
    import socket

    from cpuperf import __version__
    from cpuperf.errors import from_os_error
    from cpuperf.fsutil import atomic_write_bytes
    from cpuperf.plan import saved

    plan = saved.make(facts, rec, jp.env, {k: inputs.get(k) for k in saved.INPUT_KEYS}, __version__,
                      socket.gethostname() if facts.live else None)
    if subs:
        nodes = tuple((name, saved.make(f, r, j.env, plan.inputs, __version__, name)) for name, f, r, j in subs)
        plan = dataclasses.replace(plan, nodes=nodes)
    try:
        atomic_write_bytes(path, saved.dumps(plan).encode("utf-8"))
    except OSError as exc:
        raise from_os_error(exc) from exc
    return path


def _table(out: Output, result: Dict[str, Any]) -> None:
    from rich.table import Table

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
             "", f"# Hugging Face Trainer flags ({result['hf_args_for']})", " ".join(result["hf_args"])]
    out.product("\n".join(lines))
    if result["overridden"]:
        out.info("* set by you: " + ", ".join(result["overridden"]))


def _writable_dir(path: Any) -> None:
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


def run_bench(out: Output, threads: Optional[int], size: int, seconds: float, allocators: bool = True,
              compile: bool = False, refresh: bool = False, model: Optional[str] = None) -> int:
    from cpuperf.decide.placement import plan_placement
    from cpuperf.decide.recommend import model_key
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.probe import probe_host
    from cpuperf.run import measure

    facts = probe_host()
    if threads is None:
        threads = plan_placement(facts).threads_per_rank
    usable = len(facts.usable_cpus()) or 1
    if not 1 <= threads <= usable:  # 100000 threads would fork until the machine runs out of processes
        from cpuperf.errors import UsageError

        raise UsageError(f"--threads {threads}: this host has {usable} usable CPU(s)",
                         hint=f"choose 1..{usable}")
    _writable_dir(measure.cache_dir())  # before minutes of measuring, not after
    workload = resolve_workload(model)
    cached, path = measure.read_cached(facts)
    usable, flags = measure.assess(cached, facts) if cached is not None else (False, [])
    fresh = cached is not None and usable and not flags and not refresh
    if fresh and compile and model_key(workload) not in (cached or {}).get("compile_by_model", {}):
        # The rest is cached and trusted: only this model's torch.compile cost and gain are measured.
        out.info(f"measuring torch.compile for {workload.name} on {threads} thread(s) (slow) ...")
        results = {**(cached or {}), **measure.compile_measurement(threads, workload=workload)}
        path = measure.save(facts, {k: v for k, v in results.items() if k not in ("schema", "host_id", "torch_build")})
        results = {**(measure.read_cached(facts)[0] or results), "cache": str(path), "from_cache": False}
    elif fresh:
        out.info(f"cached measurement ({measure.describe(cached or {})}); cpuperf bench --refresh measures again")
        results = {**(cached or {}), "cache": str(path), "from_cache": True}
    else:
        if cached is not None and (flags or not usable):
            out.info(f"measuring again: the cached one is {'; '.join(flags)}")
        out.info(f"measuring on {threads} thread(s): GEMM fp32/bf16" + (", allocators" if allocators else "")
                 + (", torch.compile (slow)" if compile else "") + " ...")
        results = measure.run_micro(facts, threads, allocators=allocators, compile=compile, seconds=seconds, size=size,
                                    workload=workload)
        path = measure.save(facts, results)
        results = {**(measure.read_cached(facts)[0] or results), "cache": str(path), "from_cache": False}
        _, flags = measure.assess(results, facts)
    results["trusted"] = not flags
    results["flags"] = flags
    if out.json_mode:
        out.json({"schema": "cpuperf.bench/1", **results})
    else:
        ratio = results["gemm_bf16_gflops"] / results["gemm_fp32_gflops"] if results.get("gemm_fp32_gflops") else None
        reps = results.get("repeats") or {}
        spread = ", ".join(f"{k[5:9]} {r['min']:.1f}-{r['max']:.1f} over {r['n']}" for k, r in reps.items())
        lines = [f"fp32 GEMM {results['gemm_fp32_gflops']:.1f} GFLOP/s, bf16 GEMM {results['gemm_bf16_gflops']:.1f} "
                 f"GFLOP/s ({ratio:.2f}x) on {results['threads']} thread(s)" + (f" (medians; {spread})" if spread else "")]
        load = results.get("load") or {}
        if load.get("figure"):
            lines.append(f"load around it: {load['figure']}")
        if flags:
            lines.append("NOT TRUSTED: " + "; ".join(flags) + " (cpuperf bench --refresh on a quiet host)")
        for name, r in (results.get("allocator_speedup") or {}).items():
            if not name.endswith("_by_workload"):
                per = results["allocator_speedup"].get(f"{name}_by_workload") or {}
                lines.append(f"{name} preloaded: " + ", ".join(f"{w} {x:.2f}x" for w, x in per.items())
                             + " the default allocator")
        for key, c in (results.get("compile_by_model") or {}).items():
            from cpuperf.decide.recommend import compile_crossover

            cross = compile_crossover(c["compile_seconds"], c["step_seconds"], c["speedup"])
            lines.append(f"torch.compile for {c.get('model', key)}: {c['compile_seconds']:.0f} s to compile, "
                         f"{c['speedup']:.2f}x steady at {c['step_seconds']:.2f} s/step (batch {c['batch']}): "
                         + (f"pays back after {cross} steps" if cross else "never pays back"))
        lines.append(f"cached at {path}")
        out.product("\n".join(lines))
    return 0


def run_bench_tune(out: Output, model: Optional[str], budget_s: Optional[float], refresh: bool = False) -> int:
    """`cpuperf bench --tune`: tune the plan's levers for --model's shape on this host (cached; --refresh redoes it)."""
    import sys

    from cpuperf.decide.recommend import shape_key
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.errors import ProbeFailedError
    from cpuperf.probe import probe_host
    from cpuperf.run import measure

    facts = probe_host()
    _writable_dir(measure.cache_dir())
    workload = resolve_workload(model, None, None, None, 400)
    meas = measure.load_cached(facts)
    key = shape_key(workload)
    cached = meas.tuned_by_shape.get(key) if meas is not None else None
    if cached is None or refresh:
        out.info(f"tuning the plan's levers for {key} on this host (budget {budget_s or _tune_rules()['budget_s']} s) ...")
        got = tune_shape(facts, workload, meas, lambda m: sys.stderr.write(f"cpuperf bench: {m}\n"), budget_s)
        if got is None:
            raise ProbeFailedError("nothing to tune: the plan trains on a GPU", hint="--tune tunes CPU training")
        entry = got[2]
        if got[0].stopped == "failed":
            raise ProbeFailedError("the rule's point failed to run: nothing tuned",
                                   hint="check that torch imports: cpuperf doctor")
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


def read_plan_file(path: str) -> Any:
    """A saved plan (cpuperf.plan.saved.SavedPlan) from FILE: a regular file of bounded size, or one line (exit 2)."""
    import os
    import stat

    from cpuperf.errors import UsageError, from_os_error
    from cpuperf.plan import saved

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block us
    except OSError as exc:
        if exc.errno in (2, 20):  # ENOENT, ENOTDIR
            raise UsageError(f"plan file {path} does not exist", hint="make one with: cpuperf recommend --save FILE") from None
        raise from_os_error(exc) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"plan file {path} is not a regular file", hint="give the JSON file cpuperf recommend --save wrote")
        raw = os.read(fd, saved.MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > saved.MAX_BYTES:
        raise UsageError(f"plan file {path} is over {saved.MAX_BYTES // 2**20} MiB: not a cpuperf plan",
                         hint="make one with: cpuperf recommend --save FILE")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"plan file {path} is not UTF-8 text", hint="make one with: cpuperf recommend --save FILE") from None
    return saved.read(path, text)


def this_node_names(hosts: Any = None, node_rank: Optional[int] = None) -> List[str]:
    """The names this machine may have in a plan over several nodes: its hostfile entry, its host name."""
    import socket

    names = [hosts[node_rank].name] if hosts and node_rank is not None and node_rank < len(hosts) else []
    full = socket.gethostname()
    return names + [full, full.split(".")[0]]


def plan_fits(path: str, plan: Any, facts: Any, replan: bool, names: Any = ()) -> Any:
    """(the plan for this node, the ways this host differs from it); refused (exit 13) unless `replan` asks to
    plan again. A plan over several nodes gives this node's own part (by its names, else its facts)."""
    from cpuperf.errors import PlanMismatchError, UsageError
    from cpuperf.plan import saved

    plan, node = saved.for_this_node(plan, facts, list(names) or this_node_names())
    diffs = saved.differences(plan, facts)
    if diffs and node:
        diffs = [f"node {node}: {d}" for d in diffs]
    foreign = saved.foreign_preloads(plan, facts) if not diffs else []
    if foreign:  # never a library the probe does not know as an allocator or OpenMP runtime here
        raise UsageError(f"plan {path}: env LD_PRELOAD names {foreign[0]}, which is not an allocator or OpenMP runtime "
                         "found in this environment", hint=f"make a new plan here: cpuperf recommend --save {path}")
    if diffs and not replan:
        more = f" (and {len(diffs) - 1} more difference(s))" if len(diffs) > 1 else ""
        raise PlanMismatchError(f"plan {path} was made for another host or stack: {diffs[0]}{more}",
                                hint=f"make a new plan here (cpuperf recommend --save {path}), or pass --replan to plan again "
                                     "from this host's facts")
    return plan, diffs


def fresh_differences(plan: Any, facts: Any) -> List[str]:
    """How a saved plan (that fits this host) differs from what cpuperf decides here from the same inputs, with the
    cached measurements only (never measures): every decision, the placement and the variables."""
    from cpuperf.plan import saved
    from cpuperf.plan.job import JobRequest, runtime_vars

    fresh = replan_from(plan, facts)
    nnodes = max(1, int(fresh.get("nnodes") or 1))  # the rendezvous is this launch's: a placeholder, not compared
    request = JobRequest(auto=True, nnodes=nnodes, master_addr="127.0.0.1" if nnodes > 1 else None)
    env, _ = runtime_vars(facts, fresh, request, environ={})
    return saved.decision_differences(plan, fresh, env)


def replan_from(plan: Any, facts: Any, log: Any = None) -> Any:
    """The plan's own inputs decided again on this host's facts (--replan), from what planning reads (never measures)."""
    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.knobs import parse_assignments

    i = plan.inputs
    workload = resolve_workload(i.get("model"), i.get("params"), i.get("seq_len"), i.get("batch_size"), i.get("steps"))
    overrides = {d.id: d.value for d in plan.rec.decisions if d.overridden}
    overrides.update(parse_assignments([str(s) for s in i.get("sets") or []]))
    import os

    return recommend(facts, workload, nproc_per_node=i.get("nproc_per_node"), nnodes=int(i.get("nnodes") or 1),
                     unit=str(i.get("unit") or "socket"), device=str(i.get("device") or "auto"),
                     measurements=planning_measurements(facts, log), overrides=overrides,
                     environ=os.environ if facts.live else {})

