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
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def _env_for(config: Dict[str, Any]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "MALLOC_CONF"))}
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONWARNINGS"] = "ignore"
    env.update(config.get("env", {}))
    return env


def run_config(config: Dict[str, Any], workload: str, size: str, seconds: float) -> Dict[str, Any]:
    settings = dict(config.get("settings", {}))
    settings.update(workload=workload, size=size, seconds=seconds)
    cmd = [sys.executable, "-m", "cpuperf.train.bench", json.dumps(settings)]
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
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def auto_config(steps: int) -> Dict[str, Any]:
    """Exactly what `cpuperf train --auto` applies: its measurements (once per host) and its plan."""
    from cpuperf.decide.placement import plan_placement
    from cpuperf.probe import probe_host
    from cpuperf.run import measure

    facts = probe_host()
    measure.measure_if_unsure(facts, plan_placement(facts).threads_per_rank,
                              log=lambda m: print(m, file=sys.stderr, flush=True))
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "train", "--auto", "--dry-run", "--json",
                           "--max-steps", str(steps)], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"cpuperf train --auto --dry-run failed: {proc.stderr.strip()[-500:]}")
    plan = json.loads(proc.stdout)
    launch, settings = plan["launch"], plan["settings"]
    decisions = {d["id"]: d["value"] for d in plan["decisions"]}
    slot = (launch.get("per_rank") or [{}])[0]
    return {"name": "auto", "env": dict(launch.get("env") or {}), "cpus": slot.get("cpus") or None,
            "settings": {"dtype": settings["dtype"], "threads_per_rank": settings.get("threads_per_rank"), "compile": settings["compile"],
                         "ipex": settings["ipex"], "fp32_math_mode": decisions.get("fp32_math_mode")},
            "decisions": {k: decisions.get(k) for k in ("dtype", "threads_per_rank", "compile", "ipex", "allocator", "affinity")}}


def sweep_configs(quick: bool) -> List[Dict[str, Any]]:
    """The knobs the engine decides, one at a time around the defaults (at most 6 in quick mode)."""
    from cpuperf.decide.placement import plan_placement
    from cpuperf.probe import probe_host

    facts = probe_host()
    cores = plan_placement(facts).threads_per_rank
    logical = len(facts.usable_cpus())
    out = [{"name": "threads=1", "env": {"OMP_NUM_THREADS": "1"}, "settings": {"threads_per_rank": 1}},
           {"name": f"threads={cores}", "env": {"OMP_NUM_THREADS": str(cores)}, "settings": {"threads_per_rank": cores}},
           {"name": "bf16", "settings": {"dtype": "bf16"}}]
    if logical > cores:
        out.append({"name": f"threads={logical} (SMT)", "env": {"OMP_NUM_THREADS": str(logical)},
                    "settings": {"threads_per_rank": logical}})
    allocators = facts.software.allocators if facts.software else {}
    for name in ("tcmalloc", "jemalloc"):
        libs = [p for p in allocators.get(name, ()) if "minimal" not in p and "debug" not in p]
        if libs:
            env = {"LD_PRELOAD": libs[0]}
            if name == "jemalloc":
                from cpuperf.data import load_builtin

                env["MALLOC_CONF"] = load_builtin("tuning.toml")["allocator"]["jemalloc_malloc_conf"]
            out.append({"name": name, "env": env, "settings": {}})
    if facts.software and facts.software.packages.get("intel_extension_for_pytorch"):
        out.append({"name": "ipex", "settings": {"ipex": True}})
    if not quick:
        out.append({"name": "compile", "settings": {"compile": True}})
    return out[:6] if quick else out


def summarise(configs: List[Dict[str, Any]], rounds: List[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    def series(name: str) -> List[Optional[float]]:
        return [r.get(name, {}).get("samples_per_s") for r in rounds]

    def ratio(a: str, b: str) -> Dict[str, Optional[float]]:
        per_round = [x / y for x, y in zip(series(a), series(b)) if x and y]
        if not per_round:
            return {"median": None, "min": None, "max": None}
        return {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}

    sweep_names = [c["name"] for c in configs if c.get("sweep")]
    medians = {c["name"]: statistics.median([s for s in series(c["name"]) if s] or [0.0]) for c in configs}
    best = max(sweep_names + ["default"], key=lambda n: medians.get(n, 0.0))
    ratios = {"auto_vs_default": ratio("auto", "default"), "auto_vs_best_sweep": ratio("auto", best),
              "auto_vs_run_cpu": ratio("auto", "run_cpu")}
    return {"medians": medians, "best_sweep": best, "ratios": ratios}


def machine_info() -> Dict[str, Any]:
    from cpuperf.probe import probe_host

    f = probe_host()
    return {"cpu": f.cpu.model_name, "microarchitecture": f.cpu.microarchitecture, "isa": list(f.cpu.isa),
            "bf16_native": f.cpu.bf16_native, "physical_cores": f.topology.physical_cores,
            "logical_cpus": f.topology.logical_cpus, "sockets": f.topology.sockets,
            "torch": f.software.packages["torch"].version if f.software and f.software.packages.get("torch") else None,
            "python": platform.python_version(), "kernel": platform.release()}


def peak_gemm(threads: int) -> Dict[str, float]:
    from cpuperf.run.measure import gemm_rates

    r = gemm_rates(threads=threads, size=1024, seconds=1.5)
    return {"fp32": r["gemm_fp32_gflops"], "bf16": r["gemm_bf16_gflops"]}


def bench_workload(workload: str, size: str, rounds: int, seconds: float, quick: bool, steps: int,
                   peak: Dict[str, float], log) -> Dict[str, Any]:
    auto = auto_config(steps)
    configs = [{"name": "default", "settings": {}}, auto, {"name": "run_cpu", "run_cpu": True, "settings": {}}]
    for c in sweep_configs(quick):
        c["sweep"] = True
        configs.append(c)
    all_rounds: List[Dict[str, Dict[str, Any]]] = []
    for r in range(rounds):
        results: Dict[str, Dict[str, Any]] = {}
        for c in configs:
            res = run_config(c, workload, size, seconds)
            results[c["name"]] = res
            sps = res.get("samples_per_s")
            log(f"  {workload}/{size} round {r + 1}/{rounds} {c['name']:<22} "
                + (f"{sps:8.2f} samples/s" if sps else res.get("error", "?")))
        all_rounds.append(results)
    summary = summarise(configs, all_rounds)
    auto_dtype = auto["settings"]["dtype"]
    fps = next((r["auto"].get("flops_per_sample") for r in all_rounds if r.get("auto", {}).get("flops_per_sample")), None)
    mfu = None
    if fps and summary["medians"].get("auto"):
        rate = peak["bf16" if auto_dtype == "bf16" else "fp32"] * 1e9
        mfu = fps * summary["medians"]["auto"] / rate if rate else None
    ratios = {k: v["median"] for k, v in summary["ratios"].items()}
    return {
        "schema": "cpuperf.bench-suite/1",
        "workload": f"{workload}-{size}",
        "mode": "quick" if quick else "full",
        "rounds": rounds,
        "seconds_per_run": seconds,
        "ratios": ratios,
        "ratio_spread": summary["ratios"],
        "best_sweep": summary["best_sweep"],
        "auto_decisions": auto["decisions"],
        "mfu_auto": mfu,
        "peak_gemm_gflops": peak,
        "first_step_s": {c["name"]: [r.get(c["name"], {}).get("first_step_s") for r in all_rounds] for c in configs},
        "configs": [{"name": c["name"], "settings": {**c.get("settings", {}), **({"env": c["env"]} if c.get("env") else {}),
                                                     **({"cpus": c["cpus"]} if c.get("cpus") else {}),
                                                     **({"launcher": "torch.backends.xeon.run_cpu"} if c.get("run_cpu") else {})},
                     "samples_per_s": [r.get(c["name"], {}).get("samples_per_s") for r in all_rounds],
                     "median": summary["medians"].get(c["name"]),
                     "loaded": [{"allocator": r.get(c["name"], {}).get("allocator"), "openmp": r.get(c["name"], {}).get("openmp"),
                                 "threads": r.get(c["name"], {}).get("threads")} for r in all_rounds][:1]}
                    for c in configs],
        "machine": machine_info(),
    }


def time_command(argv: List[str], repeat: int) -> Dict[str, float]:
    times = []
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, timeout=300)
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": repeat}


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
    out: Dict[str, Any] = {}
    for name, argv in cmds.items():
        out[name] = time_command(argv, max(3, repeat // 3) if "collect_env" in name else repeat)
    floor = out["import typer, rich"]["median_s"]
    out["ratios"] = {
        "doctor_vs_collect_env": out["cpuperf doctor --json"]["median_s"] / out["torch.utils.collect_env"]["median_s"],
        "ccl_env_vs_typer_rich_floor": out["cpuperf ccl-env"]["median_s"] / floor,
        "help_vs_typer_rich_floor": out["cpuperf --help"]["median_s"] / floor,
    }
    out["targets"] = {"doctor <= 0.2x collect_env": out["ratios"]["doctor_vs_collect_env"] <= 0.2,
                      "ccl-env <= 1.5x typer+rich": out["ratios"]["ccl_env_vs_typer_rich_floor"] <= 1.5}
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="the default: LM and MLP at the small size, sweep of at most 6")
    ap.add_argument("--full", action="store_true", help="every workload at both sizes, compile in the sweep")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per run")
    ap.add_argument("--only", default=None, help="comma list of workload-size, e.g. lm-small,mlp-small")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-user-scripts", action="store_true", help="skip the HF Trainer / accelerate script rows")
    ap.add_argument("--user-launchers", action="store_true",
                    help="only the user-launcher workloads (DDP and HF Trainer under torchrun; plain vs auto vs hand)")
    ap.add_argument("--skip-user-launchers", action="store_true", help="leave the user-launcher workloads out")
    ap.add_argument("--ranks", type=int, default=2, help="user launchers: torchrun --nproc-per-node")
    ap.add_argument("--launcher-steps", type=int, default=20, help="user launchers: timed steps per run")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--gpu", action="store_true", help="the NVIDIA GPU section instead (benchmarks/gpu.py)")
    ap.add_argument("--steps", type=int, default=30, help="--gpu: optimizer steps per run")
    ap.add_argument("--batch", type=int, default=8, help="--gpu: the per-step batch of the plain default")
    ap.add_argument("--global-batch", type=int, default=64, help="--gpu: samples per optimizer step")
    args = ap.parse_args(argv)
    if args.gpu:  # a separate path: GPU results never mix with the CPU suite's
        from benchmarks import gpu

        return gpu.main(args.rounds, args.steps, args.batch, args.global_batch, Path(args.out))
    if args.user_launchers:
        return _user_launchers_only(args)
    quick = not args.full
    seconds = args.seconds or (4.0 if quick else 8.0)
    workloads = [("lm", "small"), ("mlp", "small")] if quick else \
        [(w, s) for w in ("lm", "mlp", "conv") for s in ("small", "large")]
    launchers: Optional[List[str]] = None  # None: all of them
    if args.only:
        wanted = set(args.only.split(","))
        workloads = [(w, s) for w, s in workloads + [(w, s) for w in ("lm", "mlp", "conv") for s in ("small", "large")]
                     if f"{w}-{s}" in wanted]
        workloads = list(dict.fromkeys(workloads))
        from benchmarks.user_launchers import WORKLOADS as LAUNCH_WORKLOADS

        launchers = [w for w in LAUNCH_WORKLOADS if w in wanted]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from cpuperf.decide.placement import plan_placement
    from cpuperf.probe import probe_host

    threads = plan_placement(probe_host()).threads_per_rank
    peak = peak_gemm(threads)
    log(f"peak GEMM on {threads} threads: fp32 {peak['fp32']:.1f} GFLOP/s, bf16 {peak['bf16']:.1f} GFLOP/s")
    results = []
    for workload, size in workloads:
        res = bench_workload(workload, size, args.rounds, seconds, quick, steps=200, peak=peak, log=log)
        (out / f"{workload}-{size}.json").write_text(json.dumps(res, indent=2))
        results.append(res)
    user_results = []
    if not args.skip_user_scripts and (not args.only or any(w in args.only for w in ("hf-trainer", "accelerate"))):
        from benchmarks.user_scripts import bench_user_script

        for name in ("hf-trainer", "accelerate"):
            if args.only and name not in args.only:
                continue
            res = bench_user_script(name, args.rounds, steps=20, log=log)
            (out / f"user-{name}.json").write_text(json.dumps(res, indent=2))
            user_results.append(res)
    launcher_results = []
    if not args.skip_user_launchers and (launchers is None or launchers):
        from benchmarks.user_launchers import run_all

        launcher_results = run_all(args.rounds, args.ranks, args.launcher_steps, out, log, launchers)
    latency = None
    if not args.skip_latency:
        latency = tool_latency(repeat=9)
        (out / "latency.json").write_text(json.dumps(latency, indent=2))
    from benchmarks.report import write_report

    write_report(out, results, latency, user_results, launcher_results)
    print((out / "summary.md").read_text())
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
