"""Side-by-side throughput: plain defaults vs `--auto` vs a sweep vs torch's run_cpu; tool latency.

Every configuration runs in a fresh process (cpuperf.train.bench) with warm-up; rounds alternate
(A B C A B C ...) so drift hits every configuration alike; we report medians and ratios, never a
single absolute time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


# Variables a configuration sets (threads, OpenMP, allocators, huge pages): none leaks in from the suite's own shell.
RUNTIME_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MALLOC_CONF", "MIMALLOC_", "GLIBC_TUNABLES", "THP_MEM_ALLOC_ENABLE")


def _env_for(config: Dict[str, Any]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(RUNTIME_PREFIXES)}
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONWARNINGS"] = "ignore"
    env.update(config.get("env", {}))
    return env


# Per-workload run lengths: the gpt2-sized LM (85M parameters, ~1.4 GB of training state) runs a few
# steps (one warm-up), enough for the allocator and memory levers to show, within the quick budget.
RUN_SHAPE = {("lm", "gpt2"): {"steps": 2, "warmup": 1}}


def run_config(config: Dict[str, Any], workload: str, size: str, seconds: float,
               run_steps: Optional[int] = None) -> Dict[str, Any]:
    """One run of `config` in a fresh process: its result line. A compiled run's figure carries its first step
    (the compile) over the `run_steps` steps of the job auto plans, as the tuner counts it; the timed steps'
    own rate stays beside it (steady_samples_per_s)."""
    res = _run_config(config, workload, size, seconds)
    if run_steps and (config.get("settings") or {}).get("compile") and res.get("samples_per_s"):
        steady, batch, first = float(res["samples_per_s"]), float(res.get("batch") or 1), float(res.get("first_step_s") or 0)
        res.update(steady_samples_per_s=steady, compile_carried_over_steps=run_steps,
                   samples_per_s=run_steps * batch / (run_steps * batch / steady + first))
    return res


def _run_config(config: Dict[str, Any], workload: str, size: str, seconds: float) -> Dict[str, Any]:
    settings = dict(config.get("settings", {}))
    settings.update(workload=workload, size=size, seconds=seconds, **RUN_SHAPE.get((workload, size), {}))
    cmd = [sys.executable, "-m", "cpuperf.train.bench", json.dumps(settings)]
    if int(config.get("ranks") or 1) > 1:  # data parallel: torchrun starts the ranks (gloo), rank 0 reports
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(config["ranks"]),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "cpuperf.train.bench", json.dumps(settings)]
    if config.get("run_cpu"):
        # run_cpu launches a script path with its own defaults (threads, allocator, OpenMP, pinning).
        cmd = [sys.executable, "-m", "torch.backends.xeon.run_cpu", str(ROOT / "cpuperf" / "train" / "bench.py"),
               json.dumps(settings)]
    cpus = config.get("cpus")
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env_for(config), timeout=900,
                          preexec_fn=preexec, cwd=str(ROOT))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {_failure_line(proc.stderr)}"}
    return json.loads(lines[-1])


def _failure_line(stderr: str) -> str:
    """The line that says why a run failed: the last exception or signal line (torchrun ends its report
    with a rule of '=' characters), else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not set(ln.strip()) <= set("=-")]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln or "Signal" in ln or "exitcode" in ln:
            return ln[:300]
    return (lines or ["?"])[-1][:300]


def measure_compile_for(model: str, log) -> Optional[str]:
    """`cpuperf bench --compile --model MODEL` once (cached per host and model), as a user would before
    `train --auto`: the plan then decides compile from this host's measured crossover, not an assumption.
    Returns why it was not measured, or None."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.pop("LD_PRELOAD", None)
    log(f"measuring torch.compile for --model {model} (cpuperf bench --compile; cached for later runs) ...")
    # Allocators too: on a host with nothing cached this is its first measurement, and the plan needs them.
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "bench", "--compile", "--model", model, "--json"],
                          capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return None


def auto_config(steps: int, model: Optional[Tuple[str, int]]) -> Dict[str, Any]:
    """Exactly what `cpuperf train --auto --model M --batch-size B` applies: its plan, with the tuning cached for
    the shape (benchmarks.tuned runs it first) and the once-per-host measurements (model None: the built-in
    model's plan, without --model)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    shape = ["--model", model[0], "--batch-size", str(model[1])] if model else []
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "train", "--auto", "--dry-run", "--json",
                           "--max-steps", str(steps), *shape],
                          capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"cpuperf train --auto --dry-run failed: {proc.stderr.strip()[-500:]}")
    plan = json.loads(proc.stdout)
    launch, settings = plan["launch"], plan["settings"]
    decisions = {d["id"]: d["value"] for d in plan["decisions"]}
    run_env = {k: v for k, v in (launch.get("env") or {}).items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    reasons = {d["id"]: d["reason"] for d in plan["decisions"] if d["id"] in ("compile", "allocator", "dtype", "optimizer")}
    if decisions.get("allocator"):
        from cpuperf.probe import probe_host
        from cpuperf.run import measure

        run_env.update(measure.allocator_env(decisions["allocator"], measure.allocator_libraries(probe_host())[decisions["allocator"]]))
    slots = [r.get("cpus") for r in launch.get("per_rank") or [] if r.get("cpus")]
    ranks = int(launch.get("nproc_per_node") or 1)
    out = {"name": "auto", "env": run_env, "ranks": ranks,
           "settings": {"dtype": settings["dtype"], "threads_per_rank": settings.get("threads_per_rank"),
                        "compile": settings["compile"], "ipex": settings["ipex"],
                        "fp32_math_mode": decisions.get("fp32_math_mode"), "optimizer": settings.get("optimizer")},
           "decisions": {k: decisions.get(k) for k in ("dtype", "threads_per_rank", "nproc_per_node", "compile", "ipex",
                                                       "allocator", "affinity", "optimizer")},
           "reasons": reasons}
    if slots and len(slots) == ranks:
        out["settings"]["cpus_per_rank"] = slots
    return out


def sweep_configs(quick: bool, auto_point: Optional[Dict[str, Any]] = None, gemm: Optional[Dict[str, float]] = None
                  ) -> Tuple[List[Dict[str, Any]], Dict[str, Any], List[Dict[str, Any]]]:
    """The sweep's points (the product of the host's levers, less what it cannot win: sweep.winnable), the levers
    with what was pruned, and what was left out and why."""
    from benchmarks import sweep
    from cpuperf.decide.allocator import allocator_rule
    from cpuperf.probe import probe_host

    facts = probe_host()
    found = sweep.levers(facts, full=not quick)
    points, left_out = sweep.winnable(facts, sweep.product(facts, found), auto_point, gemm,
                                      allocator_rule().not_with_ranks)
    if facts.software and facts.software.packages.get("intel_extension_for_pytorch"):
        points.append({"name": "ipex", "settings": {"ipex": True}, "sweep": True, "point": {"ipex": True}})
    return points, {k: v.to_json() for k, v in found.items()}, left_out


def sweep_point_of(decisions: Dict[str, Any]) -> Dict[str, Any]:
    """A plan's decisions as a sweep point (sweep.config_for's keys)."""
    optimizer = decisions.get("optimizer")
    return {"dtype": decisions.get("dtype") or "fp32", "compile": bool(decisions.get("compile")),
            "optimizer": None if optimizer in (None, "adamw") else optimizer, "allocator": decisions.get("allocator"),
            "ranks": int(decisions.get("nproc_per_node") or 1), "threads_per_rank": int(decisions.get("threads_per_rank") or 1),
            "pinned": decisions.get("affinity") == "auto"}


def summarise(configs: List[Dict[str, Any]], rounds: List[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """Medians and per-round ratios over the runs that count (ran as planned, undisturbed: benchmarks.checks)."""
    from benchmarks.checks import counted

    def series(name: str) -> List[Optional[float]]:
        return [counted(r.get(name)) for r in rounds]

    def ratio(a: str, b: str) -> Dict[str, Optional[float]]:
        per_round = [x / y for x, y in zip(series(a), series(b)) if x and y]
        if not per_round:
            return {"median": None, "min": None, "max": None}
        return {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}

    sweep_names = [c["name"] for c in configs if c.get("sweep")]
    medians = {c["name"]: statistics.median([s for s in series(c["name"]) if s] or [0.0]) for c in configs}
    best: Optional[str] = max(sweep_names + ["default"], key=lambda n: medians.get(n, 0.0))
    if not medians.get(best or ""):
        best = None  # no sweep run counted
    ratios = {"auto_vs_default": ratio("auto", "default"), "auto_vs_best_sweep": ratio("auto", best or ""),
              "auto_vs_run_cpu": ratio("auto", "run_cpu")}
    return {"medians": medians, "best_sweep": best, "ratios": ratios}


def machine_info() -> Dict[str, Any]:
    from cpuperf.knowledge.bf16 import bf16_native
    from cpuperf.probe import probe_host

    f = probe_host()
    return {"cpu": f.cpu.model_name, "microarchitecture": f.cpu.microarchitecture, "isa": list(f.cpu.isa),
            "bf16_native": bf16_native(f), "physical_cores": f.topology.physical_cores,
            "logical_cpus": f.topology.logical_cpus, "sockets": f.topology.sockets,
            "torch": f.software.packages["torch"].version if f.software and f.software.packages.get("torch") else None,
            "python": platform.python_version(), "kernel": platform.release()}


def peak_gemm(threads: int) -> Dict[str, float]:
    """The achievable ceiling: measured GEMM rates (GFLOP/s), never an MFU denominator."""
    from cpuperf.run.measure import gemm_rates

    r = gemm_rates(threads=threads, size=1024, seconds=1.5)
    return {"fp32": r["gemm_fp32_gflops"], "bf16": r["gemm_bf16_gflops"]}


def hardware_peaks(cores: int, achievable_gflops: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """cores x FLOPs/cycle x clock per dtype (compat/cpu_peaks.toml), with the clocks named; a clock the
    measured GEMM beats gives way to the generation's highest boost clock (cpuperf.train.peak)."""
    from cpuperf.train.peak import this_hardware_peak

    out: Dict[str, Any] = {}
    for dtype in ("fp32", "bf16"):
        gflops = (achievable_gflops or {}).get(dtype)
        peak, info = this_hardware_peak(dtype, cores, achievable_tflops=gflops / 1e3 if gflops else None)
        out[dtype] = {"tflops": peak.tflops if peak else None, "source": peak.source if peak else None, **info}
    return out


def _rotated(configs: List[Dict[str, Any]], r: int) -> List[Dict[str, Any]]:
    """Round r runs the configurations in a rotated order: no configuration always runs first or last."""
    k = r % len(configs)
    return configs[k:] + configs[:k]


# --quick leaves the runtime levers out of these workloads' rounds (--full keeps them): a gpt2-sized run takes about
# 10 s on 2 cores alone (host D), so 8 more points over 5 rounds would add 7 minutes to the 9 the small ones add.
SLOW = (("lm", "gpt2"),)

BEST_SWEEP_BAR = 0.97  # auto's target against the best point of the sweep (docs/benchmarks.md)


def _targets(ratios: Dict[str, Optional[float]], lever_applied: bool,
             auto_as_planned: bool = True) -> Dict[str, Optional[bool]]:
    def at_least(key: str, bar: float) -> Optional[bool]:
        v = ratios.get(key)
        return None if v is None else v >= bar

    out = {"auto >= 1.0x default": at_least("auto_vs_default", 1.0),
           f"auto >= {BEST_SWEEP_BAR}x best of sweep": at_least("auto_vs_best_sweep", BEST_SWEEP_BAR),
           "auto >= 1.0x run_cpu": at_least("auto_vs_run_cpu", 1.0)}
    if lever_applied:
        v = ratios.get("auto_vs_run_cpu")
        out["auto > run_cpu (a measured lever applied)"] = None if v is None else v > 1.0
    out["auto ran its plan"] = auto_as_planned  # what it ran, read back inside every run (benchmarks.checks)
    return out


def lm_model(workload: str, size: str) -> Optional[Tuple[str, int]]:
    """(config.json, global batch) of a benchmark LM as cpuperf plans it: tuning and `train --auto` share its shape."""
    if workload != "lm":
        return None
    from benchmarks.tuned import lm_model_config
    from cpuperf.knowledge.models import PRESETS
    from cpuperf.train.bench import BATCH, LM_SHAPES, SIZE_BATCH

    return (lm_model_config(size, LM_SHAPES[size], PRESETS["tiny"].vocab_size),
            SIZE_BATCH.get((workload, size), BATCH[workload]))


def auto_and_sweep(workload: str, size: str, quick: bool, steps: int, keep: int, log, tune_budget: Optional[float],
                   gemm: Optional[Dict[str, float]] = None
                   ) -> Tuple[Dict[str, Any], Dict[str, Any], List[Dict[str, Any]], Dict[str, Any], List[Dict[str, Any]]]:
    """(auto, the tuning, the sweep's points, its levers). The workload is tuned first, as cpuperf tunes it, so auto
    is the tuned plan in both modes; --quick's sweep is the tuner's own path (its `keep` best points other than
    auto's), --full's the whole product."""
    from benchmarks import sweep, tuned
    from cpuperf.probe import probe_host

    model = lm_model(workload, size)
    log(f"tuning {workload}-{size} as cpuperf does (cpuperf.run.tune" + ("; its path is --quick's screen" if quick else "")
        + ") ...")
    t = tuned.tune_workload(workload, size, model, log, tune_budget, steps)
    if t.auto is not None:
        auto = t.auto
    elif model is not None:
        auto = auto_config(steps, model)
    else:
        raise SystemExit(f"{workload}-{size}: {t.note}")
    screened: List[Tuple[Any, float]] = []
    left_out: List[Dict[str, Any]] = []
    if quick and t.result is not None and t.cand is not None:
        screened = tuned.screen(t.result, tuned.point_of(auto["decisions"]), keep)
        facts = probe_host()
        points = [sweep.config_for(facts, p.dtype, p.compile, p.allocator, (p.ranks, p.threads), p.pinned, p.optimizer)
                  for p, _ in screened]
        info = tuned.lever_info(t.cand)
    else:
        points, info, left_out = sweep_configs(quick, sweep_point_of(auto["decisions"]), gemm)
    return auto, tuned.tuning_json(t, screened), points, info, left_out


def runtime_configs(auto: Dict[str, Any], log) -> Dict[str, Any]:
    """The runtime levers' points at auto's point (benchmarks.sweep.runtime_points), as configurations, with what
    this host could not try and why."""
    from benchmarks import sweep
    from cpuperf.probe import probe_host

    host = sweep.runtime_host(probe_host())
    d = auto.get("decisions") or {}
    points, pruned = sweep.runtime_points(host, d.get("allocator"), int(d.get("threads_per_rank") or 1))
    for lever, why in pruned.items():
        log(f"runtime lever not tried: {lever}: {why}")
    return {"configs": [sweep.runtime_config(auto, p, host.allocators) for p in points], "pruned": pruned,
            "thp_mode": host.thp, "glibc": ".".join(map(str, host.glibc)) if host.glibc else None,
            "points": [p.name for p in points]}


def run_rounds(configs: List[Dict[str, Any]], workload: str, size: str, rounds: int, seconds: float,
               log, max_repeats: Optional[int] = None, run_steps: Optional[int] = None) -> List[Dict[str, Dict[str, Any]]]:
    """`rounds` alternating rounds of every configuration, the order rotated each round; each run checked for
    disturbance (repeated while disturbed, within a bound) and for what ran (benchmarks.checks)."""
    from benchmarks import checks

    repeats = checks.MAX_REPEATS if max_repeats is None else max_repeats
    all_rounds: List[Dict[str, Dict[str, Any]]] = []
    for r in range(rounds):
        results: Dict[str, Dict[str, Any]] = {}
        for c in _rotated(configs, r):
            res = checks.run_checked(lambda cfg: run_config(cfg, workload, size, seconds, run_steps), c, log, repeats)
            results[c["name"]] = res
            sps = res.get("samples_per_s")
            share = checks.disturbance(res).get("others_cpu_share")
            log(f"  {workload}/{size} round {r + 1}/{rounds} {c['name']:<40} "
                + (res["error"] if "error" in res else f"{sps:8.2f} samples/s" if sps else "?")
                + (f"  (others {share * 100:.1f}% of a CPU" + (", left out)" if res.get("disturbed") else ")")
                   if share is not None else ""))
        all_rounds.append(results)
    return all_rounds


def head_to_head(auto: Dict[str, Any], best: Dict[str, Any], pairs: int, run_one: Callable[[Dict[str, Any]], Dict[str, Any]],
                 log: Callable[[str], Any], max_repeats: Optional[int] = None) -> Dict[str, Any]:
    """auto against the sweep's best in `pairs` fresh rounds of the two side by side, which runs first alternating.

    The best was picked as the highest of many medians taken from the sweep's own runs, so its median carries the
    luck that picked it (a configuration run twice as auto and as its sweep twin reads below 1.0x of itself); fresh
    runs, adjacent in time, measure the two on the same footing. Each run is checked as the rounds' are. The pairs
    are judged as cpuperf judges every comparison (cpuperf.decide.judge.paired) against the target's bar: above
    (auto holds it with confidence), below, or undecided (too few pairs, or too noisy to say)."""
    from benchmarks import checks
    from cpuperf.decide.judge import paired
    from cpuperf.knowledge.tuning import tuning

    repeats = checks.MAX_REPEATS if max_repeats is None else max_repeats
    best_name, best = best["name"], dict(best, name="best")
    rounds: List[Dict[str, Dict[str, Any]]] = []
    for p in range(pairs):
        results: Dict[str, Dict[str, Any]] = {}
        for c in ((auto, best) if p % 2 == 0 else (best, auto)):
            results[c["name"]] = checks.run_checked(run_one, c, log, repeats)
        a, b = checks.counted(results["auto"]), checks.counted(results["best"])
        log(f"  head to head {p + 1}/{pairs}: auto " + (f"{a:.2f}" if a else "not counted") + ", best "
            + (f"{b:.2f}" if b else "not counted") + (f" ({a / b:.2f}x)" if a and b else ""))
        rounds.append(results)
    per_pair = [a / b for a, b in ((checks.counted(r["auto"]), checks.counted(r["best"])) for r in rounds) if a and b]
    ratio = ({"median": statistics.median(per_pair), "min": min(per_pair), "max": max(per_pair)} if per_pair
             else {"median": None, "min": None, "max": None})
    verdict = paired(per_pair, BEST_SWEEP_BAR, tuning().judge.confidence)
    return {"best": best_name, "pairs": pairs, "pairs_counted": len(per_pair), "ratio": ratio,
            "verdict": verdict.to_json(), "checks": checks.tally(rounds),
            "medians": {name: statistics.median([x for x in (checks.counted(r[name]) for r in rounds) if x] or [0.0])
                        for name in ("auto", "best")},
            "runs": {name: _config_runs(name, rounds) for name in ("auto", "best")}}


def with_head_to_head(summary: Dict[str, Any], confirmed: Dict[str, Any]) -> Dict[str, Any]:
    """The summary whose auto / best of sweep is the head-to-head figure (the one the target reads), the rounds' own
    beside it; unchanged where no pair counted."""
    if confirmed["ratio"]["median"] is None:
        return summary
    ratios = dict(summary["ratios"], auto_vs_best_sweep=confirmed["ratio"],
                  auto_vs_best_sweep_in_rounds=summary["ratios"]["auto_vs_best_sweep"])
    return dict(summary, ratios=ratios)


def checked_result(configs: List[Dict[str, Any]], all_rounds: List[Dict[str, Dict[str, Any]]],
                   medians: Dict[str, float]) -> Dict[str, Any]:
    """The results' record of the rounds: each configuration with its figures, what it ran and each run's checks;
    the tally of disturbed runs; what auto ran differently from its plan."""
    from benchmarks.checks import tally

    return {
        "checks": tally(all_rounds),
        "auto_not_as_planned": sorted({line for r in all_rounds for line in (r.get("auto") or {}).get("not_as_planned") or []}),
        "configs": [{"name": c["name"], "point": c.get("point"),
                     "settings": {**c.get("settings", {}), **({"env": c["env"]} if c.get("env") else {}),
                                  **({"ranks": c["ranks"]} if c.get("ranks") else {}),
                                  **({"launcher": "torch.backends.xeon.run_cpu"} if c.get("run_cpu") else {})},
                     "samples_per_s": [r.get(c["name"], {}).get("samples_per_s") for r in all_rounds],
                     "median": medians.get(c["name"]),
                     "ran": _what_ran(c["name"], all_rounds),
                     "runs": _config_runs(c["name"], all_rounds)}
                    for c in configs],
    }


def _config_runs(name: str, all_rounds: List[Dict[str, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Per round: the figure, whether it counts, its disturbance and what ran differently (the record's view)."""
    from benchmarks.checks import counted, disturbance

    out = []
    for rnd in all_rounds:
        res = rnd.get(name) or {}
        out.append({"samples_per_s": res.get("samples_per_s"), "steady_samples_per_s": res.get("steady_samples_per_s"),
                    "counted": counted(res) is not None,
                    **{k: v for k, v in disturbance(res).items()}, "window": res.get("window"),
                    "attempts": res.get("attempts"), "not_as_planned": res.get("not_as_planned"),
                    "error": res.get("error")})
    return out


def _what_ran(name: str, all_rounds: List[Dict[str, Dict[str, Any]]]) -> Optional[List[Dict[str, Any]]]:
    """What a configuration ran, read back inside its first run that counted (else its first that reported)."""
    from benchmarks.checks import counted

    runs = [rnd.get(name) or {} for rnd in all_rounds]
    return next((r.get("ran") for r in runs if counted(r) is not None), None) or next(
        (r.get("ran") for r in runs if r.get("ran")), None)


def bench_workload(workload: str, size: str, rounds: int, seconds: float, quick: bool, steps: int,
                   peak: Dict[str, float], log, hardware: Optional[Dict[str, Any]] = None,
                   keep: int = 1, tune_budget: Optional[float] = None, pairs: int = 0,
                   runtime_levers: bool = True) -> Dict[str, Any]:
    compile_note = None
    if (workload, size) == ("lm", "small") and any(shutil.which(c) for c in ("cc", "gcc", "g++")):
        # The rule's compile decision reads this host's crossover for the tiny preset (the small LM's shape);
        # the gpt2-sized LM would spend minutes compiling.
        compile_note = measure_compile_for("tiny", log)
    t0 = time.monotonic()
    auto, tuning, points, lever_info, left_out = auto_and_sweep(workload, size, quick, steps, keep, log, tune_budget, peak)
    for entry in left_out:
        log(f"left out of the sweep: {entry['points']} point(s), {entry['rule']}: {entry['why']}")
    tuning["wall_s"] = round(time.monotonic() - t0, 1)
    configs = [{"name": "default", "settings": {}}, auto, {"name": "run_cpu", "run_cpu": True, "settings": {}}] + points
    runtime = runtime_configs(auto, log) if runtime_levers else None
    configs += (runtime or {}).get("configs", [])
    all_rounds = run_rounds(configs, workload, size, rounds, seconds, log, run_steps=steps)
    summary = summarise(configs, all_rounds)
    if runtime is not None:
        from benchmarks.sweep import lever_verdicts
        from cpuperf.knowledge import tuning as tuning_table  # not `tuning`: that name holds this run's tuning

        judge = tuning_table.tuning().judge
        runtime = {k: v for k, v in runtime.items() if k != "configs"}
        runtime["verdicts"] = lever_verdicts(configs, all_rounds, judge.confidence, judge.resolution)
    confirmed = None
    if pairs and summary["best_sweep"]:
        best_cfg = next(c for c in configs if c["name"] == summary["best_sweep"])
        log(f"auto against the sweep's best ({summary['best_sweep']}), {pairs} fresh rounds side by side ...")
        confirmed = head_to_head(auto, best_cfg, pairs, lambda cfg: run_config(cfg, workload, size, seconds, steps), log)
        summary = with_head_to_head(summary, confirmed)

    auto_dtype = auto["settings"]["dtype"]
    fps = next((r["auto"].get("flops_per_sample") for r in all_rounds if r.get("auto", {}).get("flops_per_sample")), None)
    achieved = fps * summary["medians"]["auto"] / 1e12 if fps and summary["medians"].get("auto") else None
    hw = (hardware or {}).get("bf16" if auto_dtype == "bf16" else "fp32") or {}
    mfu = achieved / hw["tflops"] if achieved and hw.get("tflops") else None
    ceiling = peak.get("bf16" if auto_dtype == "bf16" else "fp32")
    pct_achievable = achieved * 1e3 / ceiling * 100 if achieved and ceiling else None
    achievable_note = None
    if pct_achievable is not None and pct_achievable > 100:
        # The ceiling was measured once at the start; a host busier then than during the runs gives >100%.
        achievable_note = (f"{pct_achievable:.0f}% of the measured GEMM rate: the ceiling was measured while the host "
                           "was busier; not reported")
        pct_achievable = None
    ratios = {k: v["median"] for k, v in summary["ratios"].items()}
    d = auto["decisions"]
    lever_applied = bool(d.get("allocator") or d.get("compile") or d.get("ipex") or
                         (d.get("dtype") == "bf16") or (d.get("nproc_per_node") or 1) > 1)
    return {
        "schema": "cpuperf.bench-suite/2",
        "workload": f"{workload}-{size}",
        "mode": "quick" if quick else "full",
        "rounds": rounds,
        "seconds_per_run": seconds,
        "ratios": ratios,
        "ratio_spread": summary["ratios"],
        "targets": _targets(ratios, lever_applied, not any((r.get("auto") or {}).get("not_as_planned") for r in all_rounds)),
        "best_sweep": summary["best_sweep"],
        "head_to_head": confirmed,
        "auto_decisions": d,
        "auto_reasons": auto.get("reasons", {}),
        "compile_measurement_note": compile_note,
        "levers": lever_info,
        "left_out": left_out,
        "tuning": tuning,
        "runtime_levers": runtime,
        "mfu_auto": mfu,
        "mfu_denominator": {"kind": "hardware peak", "tflops": hw.get("tflops"), "source": hw.get("source"),
                            "clock_used": hw.get("clock_used"), "clock_used_ghz": hw.get("clock_used_ghz"),
                            "clock_note": hw.get("clock_note"), "clock_nominal_ghz": hw.get("clock_nominal_ghz"),
                            "clock_measured_ghz": hw.get("clock_measured_ghz"),
                            "why_none": hw.get("why_none")},
        "pct_of_achievable_auto": pct_achievable,
        "achievable_note": achievable_note,
        "achievable_gemm_gflops": peak,
        "first_step_s": {c["name"]: [r.get(c["name"], {}).get("first_step_s") for r in all_rounds] for c in configs},
        **checked_result(configs, all_rounds, summary["medians"]),
        "machine": machine_info(),
    }


def interleaved_times(cmds: Dict[str, List[str]], repeat: Dict[str, int]) -> Dict[str, Dict[str, float]]:
    """Each command's wall and CPU (user + system) time, the commands run in turn round after round, so load from
    other work falls on all of them alike (a command needing fewer runs sits out the later rounds)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an install has its bytecode
    walls: Dict[str, List[float]] = {n: [] for n in cmds}
    cpus: Dict[str, List[float]] = {n: [] for n in cmds}
    for r in range(max(repeat.values())):
        for name, argv in cmds.items():
            if r >= repeat[name]:
                continue
            t = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            _, _, usage = os.wait4(proc.pid, 0)
            proc.returncode = 0
            walls[name].append(time.perf_counter() - t)
            cpus[name].append(usage.ru_utime + usage.ru_stime)
    return {n: {"median_s": statistics.median(walls[n]), "min_s": min(walls[n]), "max_s": max(walls[n]),
                "cpu_median_s": statistics.median(cpus[n]), "runs": repeat[n]} for n in cmds}


def tool_latency(repeat: int) -> Dict[str, Any]:
    py = sys.executable
    cmds = {
        "python -c pass": [py, "-c", "pass"],
        "import typer, rich": [py, "-c", "import typer, rich"],
        "cpuperf --help": [py, "-m", "cpuperf", "--help"],
        "cpuperf doctor --json": [py, "-m", "cpuperf", "doctor", "--json"],
        "cpuperf ccl-env": [py, "-m", "cpuperf", "ccl-env"],
        "torch.utils.collect_env": [py, "-m", "torch.utils.collect_env"],
    }
    for argv in cmds.values():  # once each before timing: bytecode written, ccl-env's remembered answer in place
        subprocess.run(argv, capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    out: Dict[str, Any] = dict(interleaved_times(cmds, {n: max(3, repeat // 3) if "collect_env" in n else repeat
                                                        for n in cmds}))
    floor = out["import typer, rich"]["median_s"]
    out["ratios"] = {
        "doctor_vs_collect_env": out["cpuperf doctor --json"]["median_s"] / out["torch.utils.collect_env"]["median_s"],
        "ccl_env_vs_typer_rich_floor": out["cpuperf ccl-env"]["median_s"] / floor,
        "help_vs_typer_rich_floor": out["cpuperf --help"]["median_s"] / floor,
        # CPU time: what the command itself costs, less moved by other work on a shared host than wall time
        "doctor_vs_collect_env_cpu": out["cpuperf doctor --json"]["cpu_median_s"] / out["torch.utils.collect_env"]["cpu_median_s"],
        "ccl_env_vs_typer_rich_floor_cpu": out["cpuperf ccl-env"]["cpu_median_s"] / out["import typer, rich"]["cpu_median_s"],
    }
    out["load_avg_1m"] = os.getloadavg()[0]
    out["targets"] = {"doctor <= 0.2x collect_env": out["ratios"]["doctor_vs_collect_env"] <= 0.2,
                      "ccl-env <= 1.5x typer+rich": out["ratios"]["ccl_env_vs_typer_rich_floor"] <= 1.5}
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="the default (~25 minutes on 2 cores): small LM, MLP and the "
                    "gpt2-sized LM, each tuned as cpuperf tunes it, against defaults, run_cpu and the tuner's own path "
                    "as the sweep (its best --keep points besides auto's in the rounds), and the tools' latency")
    ap.add_argument("--users", action="store_true", help="only your own scripts and launchers: the HF Trainer and "
                    "accelerate scripts, DDP and the Trainer under torchrun (plain vs auto vs hand)")
    ap.add_argument("--full", action="store_true", help="every workload, tuned, against the whole sweep product in every round, "
                    "and the --users part")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (medians and spread over them; "
                    "default 5, --full 4: one workload's full sweep in about 20 minutes on 2 cores)")
    ap.add_argument("--keep", type=int, default=1, help="--quick: points of the tuner's path kept for the rounds "
                    "beside auto (the best ones; default 1)")
    ap.add_argument("--pairs", type=int, default=None, help="fresh rounds of auto beside the sweep's best after the "
                    "sweep, which runs first alternating (the target's auto / best figure; default --full 8, --quick 4; "
                    "0: the sweep rounds' own ratio)")
    ap.add_argument("--tune-budget", type=float, default=None, metavar="S",
                    help="seconds each workload's tuning may take (default: compat/tuning.toml's budget_s, 60)")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per run")
    ap.add_argument("--only", default=None, help="comma list of workload-size, e.g. lm-small,mlp-small")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-runtime-levers", action="store_true", help="leave out the runtime levers tried at auto's "
                    "point (OpenMP wait policy, libiomp5's KMP_BLOCKTIME, each allocator, transparent huge pages, fewer threads: "
                    "benchmarks.sweep.runtime_points; --quick "
                    "tries them on the small workloads only)")
    ap.add_argument("--skip-user-scripts", action="store_true", help="skip the HF Trainer / accelerate script rows")
    ap.add_argument("--user-launchers", action="store_true",
                    help="only the user-launcher workloads (DDP and HF Trainer under torchrun; plain vs auto vs hand)")
    ap.add_argument("--skip-user-launchers", action="store_true", help="leave the user-launcher workloads out")
    ap.add_argument("--ranks", type=int, default=2, help="user launchers: torchrun --nproc-per-node")
    ap.add_argument("--launcher-steps", type=int, default=20, help="user launchers: timed steps per run")
    ap.add_argument("--out", "--results", dest="out", default=str(RESULTS), metavar="DIR",
                    help="where the results and summary go (default benchmarks/results; e.g. results/zen4-full for a "
                    "--full run beside the quick results)")
    ap.add_argument("--gpu", action="store_true", help="the NVIDIA GPU section instead (benchmarks/gpu.py)")
    ap.add_argument("--steps", type=int, default=30, help="--gpu: optimizer steps per run")
    ap.add_argument("--batch", type=int, default=8, help="--gpu: the per-step batch of the plain default")
    ap.add_argument("--global-batch", type=int, default=64, help="--gpu: samples per optimizer step")
    ap.add_argument("--joint", action="store_true", help="--gpu: the product of the decided levers (at least 3 rounds), "
                    "then --pairs rounds of auto against its best head to head")
    args = ap.parse_args(argv)
    if args.rounds is None:
        args.rounds = 4 if args.full else 5
    if args.pairs is None:
        args.pairs = 8 if args.full else 4
    if args.gpu:  # a separate path: GPU results never mix with the CPU suite's
        from benchmarks import gpu

        return gpu.main(args.rounds, args.steps, args.batch, args.global_batch, Path(args.out), joint=args.joint,
                        pairs=args.pairs)
    if args.user_launchers:
        return _user_launchers_only(args)
    if args.users:
        return _users_only(args)
    quick = not args.full
    seconds = args.seconds or (2.0 if quick else 4.0)
    every = [(w, s) for w in ("lm", "mlp", "conv") for s in ("small", "large")] + [("lm", "gpt2")]
    workloads = [("lm", "small"), ("mlp", "small"), ("lm", "gpt2")] if quick else every
    launchers: Optional[List[str]] = None  # None: all of them
    if args.only:
        wanted = set(args.only.split(","))
        workloads = [(w, s) for w, s in workloads + every if f"{w}-{s}" in wanted]
        workloads = list(dict.fromkeys(workloads))
        from benchmarks.user_launchers import WORKLOADS as LAUNCH_WORKLOADS

        launchers = [w for w in LAUNCH_WORKLOADS if w in wanted]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    began = time.monotonic()

    def log(msg: str) -> None:  # seconds since the start: where the quick budget goes
        print(f"[{time.monotonic() - began:6.0f} s] {msg}", file=sys.stderr, flush=True)

    from cpuperf.decide.placement import plan_placement
    from cpuperf.probe import probe_host

    placement = plan_placement(probe_host())
    threads = placement.threads_per_rank
    peak = peak_gemm(threads)
    # The GEMM ran on one rank's threads; every rank's cores together beat at most that many times it.
    hardware = hardware_peaks(threads * placement.nproc_per_node,
                              {k: v * placement.nproc_per_node for k, v in peak.items()})
    log(f"achievable GEMM on {threads} threads: fp32 {peak['fp32']:.1f} GFLOP/s, bf16 {peak['bf16']:.1f} GFLOP/s; "
        f"hardware peak fp32 {hardware['fp32'].get('tflops')} TFLOP/s ({hardware['fp32'].get('source') or hardware['fp32'].get('why_none')})")
    results = []
    for workload, size in workloads:
        res = bench_workload(workload, size, args.rounds, seconds, quick, steps=200, peak=peak, log=log,
                             hardware=hardware, keep=args.keep, tune_budget=args.tune_budget, pairs=args.pairs,
                             runtime_levers=not args.skip_runtime_levers and (args.full or (workload, size) not in SLOW))
        (out / f"{workload}-{size}.json").write_text(json.dumps(res, indent=2))
        results.append(res)
    user_results: List[Dict[str, Any]] = []
    launcher_results: List[Dict[str, Any]] = []
    if args.full or args.only:  # --quick leaves them to --users: together they take ~30 minutes on 2 cores
        user_results, launcher_results = _user_parts(args, out, log, launchers)
    latency = None
    if not args.skip_latency:
        latency = tool_latency(repeat=9)
        (out / "latency.json").write_text(json.dumps(latency, indent=2))
    from benchmarks.report import write_report

    write_report(out, results, latency, user_results, launcher_results)
    with open(out / "summary.md", "a") as summary:
        summary.write(f"\nWall time: {time.monotonic() - began:.0f} s (`python -m benchmarks "
                      + " ".join(argv if argv is not None else sys.argv[1:]) + "`).\n")
    print((out / "summary.md").read_text())
    failed = [r["workload"] for r in results if r.get("auto_not_as_planned")]
    if failed:  # an auto that did not run its plan is an error, not a slow number
        print(f"auto did not run its plan on {', '.join(failed)}: see summary.md", file=sys.stderr)
        return 1
    return 0


def _user_parts(args: argparse.Namespace, out: Path, log, launchers: Optional[List[str]]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Your own scripts (HF Trainer, accelerate: plain vs auto) and launchers (plain vs auto vs hand)."""
    user_results = []
    from benchmarks.user_scripts import WORKLOADS as SCRIPT_WORKLOADS

    if not args.skip_user_scripts and (not args.only or any(w in args.only for w in SCRIPT_WORKLOADS)):
        from benchmarks.user_scripts import bench_user_script

        for name in SCRIPT_WORKLOADS:
            if args.only and name not in args.only:
                continue
            res = bench_user_script(name, args.rounds, steps=20, log=log)
            (out / f"user-{name}.json").write_text(json.dumps(res, indent=2))
            user_results.append(res)
    launcher_results = []
    if not args.skip_user_launchers and (launchers is None or launchers):
        from benchmarks.user_launchers import run_all

        launcher_results = run_all(args.rounds, args.ranks, args.launcher_steps, out, log, launchers)
    return user_results, launcher_results


def _users_only(args: argparse.Namespace) -> int:
    """`--users`: your own scripts and launchers only (`--only hf-trainer,launch-ddp,...` picks among them)."""
    from benchmarks.report import write_report
    from benchmarks.user_launchers import WORKLOADS as LAUNCH_WORKLOADS

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only.split(",")) if args.only else None
    launchers = [w for w in LAUNCH_WORKLOADS if wanted is None or w in wanted]
    user_results, launcher_results = _user_parts(args, out, lambda m: print(m, file=sys.stderr, flush=True),
                                                 launchers)
    write_report(out, [], None, user_results, launcher_results, name="summary-users.md")
    print((out / "summary-users.md").read_text())
    return 0


def _user_launchers_only(args: argparse.Namespace) -> int:
    """`--user-launchers`: just the user-launcher workloads (`--only launch-ddp,...` picks among them)."""
    from benchmarks.report import write_report
    from benchmarks.user_launchers import WORKLOADS as LAUNCH_WORKLOADS
    from benchmarks.user_launchers import run_all

    only = [w for w in (args.only.split(",") if args.only else []) if w in LAUNCH_WORKLOADS] or None
    out = Path(args.out)
    results = run_all(args.rounds, args.ranks, args.launcher_steps, out,
                      lambda m: print(m, file=sys.stderr, flush=True), only)
    write_report(out, [], None, None, results, name="summary-launchers.md")
    print((out / "summary-launchers.md").read_text())
    return 0
