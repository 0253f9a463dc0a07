"""torch.compile for CPU training, each way it can be asked, against eager: compile time and steady state apart.

`python -m benchmarks.compile_modes [--only lm-small,mlp-small] [--dtype bf16] [--rounds 3] [--seconds 5]
[--out DIR]` runs each reference workload (cpuperf.train.bench, the suite's models) eagerly and under every mode of
cpuperf.train.bench.COMPILE_MODES that the installed torch has, each run a fresh process, the configurations
rotated round by round so drift hits all alike. For each mode: the first step's extra seconds over eager's (the
compile), the steady-state ratio against eager judged by decide/judge.py (rounds side by side: effect against
noise), and the crossover: the steps a run needs before the compile has paid for itself, or "never" when the steady
state is not faster. `cpuperf bench --compile --model M` measures the same for a model the plan trains and caches
each mode for the compile rule (compat/tuning.toml [compile]); this runs the suite's reference workloads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from benchmarks.suite import _rotated, machine_info, run_config
from cpuperf.decide import judge
from cpuperf.train.bench import COMPILE_MODES


def configs(dtype: str, modes: List[str]) -> List[Dict[str, Any]]:
    eager = {"name": "eager", "settings": {"dtype": dtype}}
    return [eager] + [{"name": m, "settings": {"dtype": dtype, "compile": True, "compile_mode": m}} for m in modes]


def crossover(extra_first_s: float, eager_rate: float, rate: float, batch: int) -> Optional[float]:
    """Steps after which a compiled run has caught up with eager: its extra first step over the time it saves per
    step; None when it saves nothing."""
    saved = batch / eager_rate - batch / rate
    return None if saved <= 0 else max(0.0, extra_first_s) / saved


def summarise(rounds: List[Dict[str, Dict[str, Any]]], names: List[str]) -> Dict[str, Any]:
    def figures(name: str, key: str) -> List[float]:
        return [float(r[name][key]) for r in rounds if name in r and r[name].get(key)]

    eager_rates, eager_first = figures("eager", "samples_per_s"), figures("eager", "first_step_s")
    out: Dict[str, Any] = {"eager": {"samples_per_s": statistics.median(eager_rates) if eager_rates else None}}
    batch = next((int(r["eager"]["batch"]) for r in rounds if "eager" in r and r["eager"].get("batch")), 1)
    for name in names[1:]:
        errors = [r[name]["error"] for r in rounds if name in r and r[name].get("error")]
        pairs = [float(r[name]["samples_per_s"]) / float(r["eager"]["samples_per_s"]) for r in rounds
                 if r.get(name, {}).get("samples_per_s") and r.get("eager", {}).get("samples_per_s")]
        if not pairs:
            out[name] = {"error": (errors or ["no figure"])[0]}
            continue
        verdict = judge.paired(pairs, bar=1.0, confidence=0.9, resolution=0.02)
        extra = statistics.median(figures(name, "first_step_s")) - statistics.median(eager_first or [0.0])
        rate = statistics.median(figures(name, "samples_per_s"))
        steps = crossover(extra, out["eager"]["samples_per_s"], rate, batch)
        out[name] = {"steady_ratio": round(verdict.ratio, 3), "verdict": verdict.to_json(),
                     "compile_s": round(extra, 1), "crossover_steps": None if steps is None else round(steps)}
    return out


def render(results: Dict[str, Dict[str, Any]]) -> str:
    lines = ["| workload | mode | steady state vs eager (90% interval, verdict) | compile s | pays back after |",
             "|---|---|---|---|---|"]
    for workload, res in results.items():
        for name, r in res.items():
            if name == "eager":
                continue
            if "error" in r:
                lines.append(f"| {workload} | {name} | failed: {r['error'][:80]} | | |")
                continue
            v = r["verdict"]
            pays = "never" if r["crossover_steps"] is None else f"{r['crossover_steps']} steps"
            lines.append(f"| {workload} | {name} | {r['steady_ratio']:.2f}x ({v['low']:.2f}-{v['high']:.2f}, "
                         f"{v['outcome']}) | {r['compile_s']} | {pays} |")
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compile_modes", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="lm-small,mlp-small")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--modes", default=",".join(COMPILE_MODES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    results: Dict[str, Dict[str, Any]] = {}
    raw: Dict[str, List[Dict[str, Dict[str, Any]]]] = {}
    for item in args.only.split(","):
        workload, size = item.split("-", 1)
        cfgs = configs(args.dtype, modes)
        rounds: List[Dict[str, Dict[str, Any]]] = []
        for r in range(args.rounds):
            figures: Dict[str, Dict[str, Any]] = {}
            for cfg in _rotated(cfgs, r):
                figures[cfg["name"]] = run_config(cfg, workload, size, args.seconds)
                print(f"{item} round {r + 1} {cfg['name']}: {figures[cfg['name']].get('samples_per_s')}",
                      file=sys.stderr)
            rounds.append(figures)
        raw[item] = rounds
        results[item] = summarise(rounds, [c["name"] for c in cfgs])
    table = render(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compile-modes.json").write_text(json.dumps({"machine": machine_info(), "dtype": args.dtype,
                                                             "results": results, "rounds": raw}, indent=1) + "\n")
        (out / "compile-modes.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
