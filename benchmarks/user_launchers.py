"""A user's own launcher under `cpuperf train --auto` (issue 23): plain vs auto vs the best hand placement.

Workloads (benchmarks/scripts/): plain torch DDP (gloo) under `torchrun --nproc-per-node N`; the Hugging
Face Trainer script as one process and under `torchrun --nproc-per-node N`. Each runs in three
configurations, in rotating order round after round (A B C, B C A, C A B ...), each a fresh job:

- plain: the command as the user types it;
- auto: `cpuperf train --auto --json -- <the same command>`;
- hand: every rank pinned to its own disjoint physical cores with OMP_NUM_THREADS = its share
  (scripts/pin_rank.py, started per rank by the same launcher: `torchrun ... pin_rank.py script.py ...`).

Reported: auto/plain and auto/hand per round (median, min-max), what every rank ran with, seen from inside
the rank (CPUs, torch threads, OMP_NUM_THREADS), and what cpuperf says it applied and verified.
`python -m benchmarks.user_launchers --rounds 1 --steps 5` runs just these.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from benchmarks.suite import _failure_line

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = ("launch-ddp", "launch-hf-1", "launch-hf-torchrun")
CONFIGS = ("plain", "auto", "hand")
TARGETS = {"auto_vs_plain": 1.0, "auto_vs_hand": 0.97}


def _torchrun(ranks: int) -> List[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]


def _hf_args(steps: int, ddp: bool) -> List[str]:
    # Under torchrun the user asks for DDP on CPU themselves (--use_cpu): plain, auto and hand then run
    # the same job and differ only in placement (without it, plain torchrun on a CPU host may start
    # independent copies, and a --use_cpu added by cpuperf would change the job, not its speed).
    return ["--output_dir", "/tmp/cpuperf-bench-launch-hf", "--max_steps", str(steps + 3),
            "--per_device_train_batch_size", "8", "--report_to", "none", "--save_strategy", "no",
            "--disable_tqdm", "true", "--logging_strategy", "no", *(["--use_cpu"] if ddp else [])]


def commands(workload: str, ranks: int, steps: int) -> Dict[str, List[str]]:
    """The plain and hand commands of a workload (auto is plain behind `cpuperf train --auto --`)."""
    pin = str(SCRIPTS / "pin_rank.py")
    if workload == "launch-ddp":
        script = [str(SCRIPTS / "ddp_gpt2.py"), "--steps", str(steps)]
        return {"plain": [*_torchrun(ranks), *script], "hand": [*_torchrun(ranks), pin, *script]}
    if workload == "launch-hf-1":
        script = [str(SCRIPTS / "hf_gpt2.py"), *_hf_args(steps, ddp=False)]
        return {"plain": [sys.executable, *script], "hand": [sys.executable, pin, *script]}
    if workload == "launch-hf-torchrun":
        script = [str(SCRIPTS / "hf_gpt2.py"), *_hf_args(steps, ddp=True)]
        return {"plain": [*_torchrun(ranks), *script], "hand": [*_torchrun(ranks), pin, *script]}
    raise ValueError(f"unknown workload {workload} (one of {', '.join(WORKLOADS)})")


def _env(result: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "MALLOC_CONF", "CPUPERF_"))}
    env.pop("LD_PRELOAD", None)
    env.update(PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", NO_COLOR="1", BENCH_RESULT=result,
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    return env


def run_once(config: str, argv: List[str], work: Path) -> Dict[str, Any]:
    """One fresh job: the script's result, what each rank saw from inside, and (auto) cpuperf's report."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result = work / "result.json"
    cmd = [sys.executable, "-m", "cpuperf", "train", "--auto", "--json", "--out", str(work / "run"), "--", *argv] \
        if config == "auto" else argv
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(str(result)), timeout=1200, cwd=str(work))
    out: Dict[str, Any] = {}
    try:
        out = json.loads(result.read_text())
    except (OSError, ValueError):
        return {"error": f"exit {proc.returncode}: {_failure_line(proc.stderr)}"}
    out["ranks_seen"] = [json.loads(p.read_text()) for p in sorted(work.glob("result.json.rank*.json"),
                                                                    key=lambda p: int(p.name.split("rank")[1][:-5]))]
    if proc.returncode != 0:  # the script reported, then the job failed (at exit, or another rank)
        out["error"] = f"exit {proc.returncode}: {_failure_line(proc.stderr)}"
        (work / "stderr.txt").write_text(proc.stderr)
    if config == "auto":
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            report = {}
        out["applied"] = report.get("applied")
        out["verified"] = [{k: r.get(k) for k in ("rank", "allowed_cpus", "omp_num_threads", "openmp")}
                           for r in (report.get("verification") or {}).get("ranks") or []]
        out["per_rank_plan"] = (report.get("launch") or {}).get("per_rank")
        out["supervisor"] = report.get("supervisor")
    return out


def _spread(values: List[float]) -> Dict[str, Optional[float]]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_launcher(workload: str, rounds: int, ranks: int, steps: int, log: Callable[[str], None],
                   work: Optional[Path] = None) -> Dict[str, Any]:
    """Rotating rounds of plain, auto and hand; ratios per round, medians with min-max."""
    cmds = commands(workload, ranks, steps)
    cmds["auto"] = cmds["plain"]
    base = work or Path(tempfile.mkdtemp(prefix="cpuperf-bench-launch-"))
    runs: List[Dict[str, Dict[str, Any]]] = []
    for r in range(rounds):
        order = CONFIGS[r % 3:] + CONFIGS[:r % 3]
        got: Dict[str, Dict[str, Any]] = {}
        for name in order:
            got[name] = run_once(name, cmds[name], base / name)
            res = got[name]
            log(f"  {workload} round {r + 1}/{rounds} {name:<5} "
                + (f"{res['samples_per_s']:8.2f} samples/s" if "samples_per_s" in res else res.get("error", "?")))
        runs.append(got)

    def sps(run: Dict[str, Any]) -> Optional[float]:
        return None if run.get("error") else run.get("samples_per_s")

    def ratios(a: str, b: str) -> List[float]:
        return [sps(p[a]) / sps(p[b]) for p in runs if sps(p[a]) and sps(p[b])]  # type: ignore[operator]

    spread = {"auto_vs_plain": _spread(ratios("auto", "plain")), "auto_vs_hand": _spread(ratios("auto", "hand"))}
    first = {name: next((p[name] for p in runs if sps(p[name])), {}) for name in CONFIGS}
    auto = first["auto"]
    return {
        "schema": "cpuperf.bench-user-launcher/1",
        "workload": workload, "ranks": ranks if workload != "launch-hf-1" else 1, "rounds": rounds, "steps": steps,
        "commands": {name: cmds[name] if name != "auto" else
                     ["cpuperf", "train", "--auto", "--json", "--out", "DIR", "--", *cmds["plain"]] for name in CONFIGS},
        "ratios": {k: v["median"] for k, v in spread.items()}, "ratio_spread": spread,
        "samples_per_s": {name: [sps(p[name]) for p in runs] for name in CONFIGS},
        "medians": {name: _spread([s for s in (sps(p[name]) for p in runs) if s])["median"] for name in CONFIGS},
        "errors": {name: [p[name]["error"] for p in runs if p[name].get("error")] for name in CONFIGS},
        "ddp": {name: first[name].get("ddp") for name in CONFIGS},
        "ranks_seen": {name: first[name].get("ranks_seen") for name in CONFIGS},
        "auto_applied": auto.get("applied"), "auto_verified": auto.get("verified"),
        "auto_per_rank_plan": auto.get("per_rank_plan"),
        "auto_supervisor": [p["auto"].get("supervisor") for p in runs],
        "targets": {f"{k} >= {t}": spread[k]["median"] is not None and spread[k]["median"] >= t  # type: ignore[operator]
                    for k, t in TARGETS.items()},
    }


def _placement(seen: Optional[List[Dict[str, Any]]]) -> str:
    """'r0 CPUs 0 x1, r1 CPUs 1 x1': each rank's CPUs and torch threads, as the rank saw them."""
    from cpuperf.probe.parse import format_cpulist

    if not seen:
        return "-"
    return ", ".join(f"r{s['rank']} CPUs {format_cpulist(s['cpus'])} x{s['torch_threads']}" for s in seen)


def markdown_rows(results: List[Dict[str, Any]]) -> List[str]:
    """The README's table: ratios, and what each rank ran with under plain, auto and hand."""
    def fmt(s: Dict[str, Optional[float]]) -> str:
        return "n/a" if s["median"] is None else f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"

    m = results[0].get("machine") if results else None
    lines = [""]
    if m:
        lines.append(f"User launchers on {m['cpu']} ({m['microarchitecture']}, {m['physical_cores']} cores), torch "
                     f"{m['torch']}: {results[0]['rounds']} rotating rounds of plain, auto and hand, "
                     f"{results[0]['steps']} timed steps per run, medians with (min-max) over rounds.")
        lines.append("")
    lines += ["| user launcher | auto / plain (min-max) | auto / hand (min-max) | ranks as seen inside: plain; auto; hand "
             "(CPUs x torch threads) | cpuperf supervisor CPU | targets |", "|---|---|---|---|---|---|"]
    for r in results:
        seen = r["ranks_seen"]
        shares = [s["cpu_share"] for s in r["auto_supervisor"] if s]
        sup = f"{max(shares) * 100:.2f}% of a core (max)" if shares else "n/a"
        ok = all(r["targets"].values())
        lines.append(f"| {r['workload']} ({r['ranks']} rank{'s' if r['ranks'] > 1 else ''}) | "
                     f"{fmt(r['ratio_spread']['auto_vs_plain'])} | {fmt(r['ratio_spread']['auto_vs_hand'])} | "
                     f"{_placement(seen['plain'])}; {_placement(seen['auto'])}; {_placement(seen['hand'])} | {sup} | "
                     + ("met" if ok else "MISSED: " + ", ".join(k for k, v in r["targets"].items() if not v)) + " |")
    return lines


def run_all(rounds: int, ranks: int, steps: int, out: Path, log: Callable[[str], None],
            only: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Every user-launcher workload (or `only` those); results/launcher-<name>.json each."""
    from benchmarks.suite import machine_info

    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    results = []
    for name in only or WORKLOADS:
        res = bench_launcher(name, rounds, ranks, steps, log)
        res["machine"] = machine
        (out / f"{name}.json").write_text(json.dumps(res, indent=2))
        results.append(res)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.user_launchers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2, help="torchrun --nproc-per-node")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run (after 3 warm-up steps)")
    ap.add_argument("--only", default=None, help=f"comma list of {', '.join(WORKLOADS)}")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else None
    for name in only or []:
        if name not in WORKLOADS:
            ap.error(f"unknown workload {name} (one of {', '.join(WORKLOADS)})")
    results = run_all(args.rounds, args.ranks, args.steps, Path(args.out), lambda m: print(m, file=sys.stderr, flush=True),
                      only)
    print("\n".join(markdown_rows(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
