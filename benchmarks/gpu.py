"""GPU side by side: plain defaults vs `--auto` vs a sweep of the decided knobs, on one NVIDIA GPU.

`python -m benchmarks --gpu`. The workload is the built-in GPT-2-small-shaped LM (cpuperf.train,
preset gpt2-small). Plain defaults are what a script gets without cpuperf: fp32, TF32 off (PyTorch's
default for matmul since 1.12), eager, the batch as given. `auto` is the engine's decisions
(cpuperf.decide.recommend for this host). The sweep changes one decided knob at a time from the defaults
(dtype, tf32, compile, batch). Every run is a fresh worker process; rounds alternate (A B C A B C)
so drift hits every configuration alike; results are medians, ratios and MFU
(model FLOPs per token x tokens/s / the card's peak for the dtype used), written to
benchmarks/results/gpu-<card>.json. On a host without an NVIDIA GPU it says so in one line and exits 0.

`--gpu --joint` sweeps the product of the decided levers instead (each at the default's value and at auto's; TF32
left out under a 16-bit dtype, where it changes no matmul), at least 3 alternating rounds, then `--pairs` rounds of
auto against the product's best head to head, the order alternating, decided by every pair against 0.97x
(gpu-<card>-joint.json). 16 configurations on a bf16 card: about 18 minutes for 3 rounds at the recorded H100's 22 s
a run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = "cpuperf.bench-gpu/1"
WORKLOAD = "gpt2-small"

# What a plain script runs with (no cpuperf): fp32, TF32 off, eager, plain AdamW, the batch as given.
PLAIN = {"dtype": "fp32", "tf32": False, "compile": False, "optimizer": "adamw",
         "grad_checkpointing": False, "dataloader_workers": 0, "confirm_batch": False}


def card_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (the results file name)."""
    text = re.sub(r"^(nvidia|tesla)\s+", "", name.strip(), flags=re.I)
    text = re.sub(r"^(nvidia|tesla)\s+", "", text, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def auto_settings(values: Dict[str, Any]) -> Dict[str, Any]:
    """Worker settings from the engine's decisions (recommend values) for one rank."""
    return {"dtype": values["dtype"], "tf32": bool(values["tf32"]), "compile": bool(values["compile"]),
            "batch_size": int(values["batch_size"]), "grad_accum_steps": int(values["grad_accum_steps"]),
            "optimizer": "adamw_fused" if values["optimizer"] == "adamw_fused" else "adamw",
            "grad_checkpointing": bool(values["grad_checkpointing"]),
            "dataloader_workers": int(values["dataloader_workers"]), "confirm_batch": True}


def build_configs(values: Dict[str, Any], batch: int, global_batch: int,
                  with_compile: bool = True) -> List[Dict[str, Any]]:
    """default, auto, then one sweep entry per decided knob that differs from the defaults.

    Every configuration steps with the same global batch: the default as a script would (`batch` per
    step, accumulating to `global_batch`), auto with the engine's batch and accumulation.
    """
    default = {**PLAIN, "batch_size": batch, "grad_accum_steps": max(1, -(-global_batch // batch))}
    auto = auto_settings(values)
    configs: List[Dict[str, Any]] = [{"name": "default", "settings": default},
               {"name": "auto", "settings": auto, "decisions": dict(values)}]
    sweep: List[Tuple[str, Dict[str, Any]]] = []
    if auto["dtype"] != "fp32":
        sweep.append((f"dtype={auto['dtype']}", {"dtype": auto["dtype"]}))
    sweep.append(("tf32", {"tf32": True}))
    if with_compile:
        sweep.append(("compile", {"compile": True}))
    if auto["batch_size"] != batch:
        sweep.append((f"batch={auto['batch_size']}", {"batch_size": auto["batch_size"],
                                                       "grad_accum_steps": auto["grad_accum_steps"]}))
    if auto["optimizer"] != "adamw":
        sweep.append(("adamw_fused", {"optimizer": "adamw_fused"}))
    for name, change in sweep:
        configs.append({"name": name, "settings": {**default, **change}, "sweep": True})
    return configs


# Under a 16-bit autocast every matmul of the built-in model (its linears, SDPA) runs in that dtype: TF32 only changes
# fp32 matmuls, so a 16-bit point with TF32 on is the point with it off, and is not run twice.
TF32_UNDER_AUTOCAST = "tf32 is not swept under a 16-bit dtype: autocast runs every matmul of the model in 16-bit"


def _axes(default: Dict[str, Any], auto: Dict[str, Any], batch: int) -> List[Tuple[str, List[Dict[str, Any]]]]:
    """Each decided lever as (name, [the default's change (none), auto's change]) where auto differs from the default;
    TF32 and compile both ways (auto may leave them off: the sweep says whether it should have)."""
    axes: List[Tuple[str, List[Dict[str, Any]]]] = []
    if auto["dtype"] != default["dtype"]:
        axes.append(("dtype", [{}, {"dtype": auto["dtype"]}]))
    axes.append(("tf32", [{}, {"tf32": True}]))
    axes.append(("compile", [{}, {"compile": True}]))
    if auto["batch_size"] != batch:
        axes.append(("batch", [{}, {"batch_size": auto["batch_size"], "grad_accum_steps": auto["grad_accum_steps"]}]))
    if auto["optimizer"] != default["optimizer"]:
        axes.append(("optimizer", [{}, {"optimizer": auto["optimizer"]}]))
    return axes


def _point_name(settings: Dict[str, Any], default: Dict[str, Any]) -> str:
    parts = []
    for key, label in (("dtype", None), ("tf32", "tf32"), ("compile", "compile"), ("batch_size", None),
                       ("optimizer", None)):
        if settings[key] == default[key]:
            continue
        parts.append(label or (f"batch={settings[key]}" if key == "batch_size" else str(settings[key])))
    return "+".join(parts) or "default"


def joint_configs(values: Dict[str, Any], batch: int, global_batch: int) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(configurations, what was left out and why): default, auto, then every combination of the decided levers (as
    `--full` sweeps the product on CPUs), each lever at the default's value and at auto's; the same global batch
    everywhere."""
    import itertools

    default = {**PLAIN, "batch_size": batch, "grad_accum_steps": max(1, -(-global_batch // batch))}
    auto = auto_settings(values)
    configs: List[Dict[str, Any]] = [{"name": "default", "settings": default},
                                     {"name": "auto", "settings": auto, "decisions": dict(values)}]
    pruned: List[str] = []
    axes = _axes(default, auto, batch)
    for combo in itertools.product(*[changes for _, changes in axes]):
        settings = dict(default)
        for change in combo:
            settings.update(change)
        if settings["dtype"] != "fp32" and settings["tf32"]:
            if TF32_UNDER_AUTOCAST not in pruned:
                pruned.append(TF32_UNDER_AUTOCAST)
            continue
        name = _point_name(settings, default)
        if name != "default":
            configs.append({"name": name, "settings": settings, "sweep": True, "joint": True})
    return configs, pruned


def head_to_head(auto: List[Optional[float]], best: List[Optional[float]], target: float = 0.97) -> Dict[str, Any]:
    """Auto against the sweep's best in paired runs (one pair a round, the order alternating): the ratios, their
    median and range, and what they decide against `target` (every pair at or above it: auto is at the best; every
    pair below: the best beats auto; a range that straddles it: undecided, the noise is larger than the effect)."""
    ratios = [a / b for a, b in zip(auto, best) if a and b]
    if len(ratios) < 3:
        return {"ratios": ratios, "median": None, "min": None, "max": None, "target": target,
                "verdict": "undecided", "why": f"{len(ratios)} paired run(s): at least 3 decide"}
    lo, hi = min(ratios), max(ratios)
    if lo >= target:
        verdict, why = "auto at the best", f"every pair at {lo:.3f}x or above, target {target}x"
    elif hi < target:
        verdict, why = "the best beats auto", f"every pair at {hi:.3f}x or below, under the target {target}x"
    else:
        verdict, why = "undecided", f"the pairs range {lo:.3f}x-{hi:.3f}x across the target {target}x"
    return {"ratios": ratios, "median": statistics.median(ratios), "min": lo, "max": hi, "target": target,
            "verdict": verdict, "why": why}


def _median(xs: List[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x]
    return statistics.median(vals) if vals else None


def summarise(configs: List[Dict[str, Any]], rounds: List[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """Medians of tokens/s and MFU per configuration; per-round ratios of auto to default and to
    the best sweep entry (round by round, so drift cancels)."""
    names = [c["name"] for c in configs]

    def series(name: str, key: str) -> List[Optional[float]]:
        return [r.get(name, {}).get(key) for r in rounds]

    medians = {n: _median(series(n, "tokens_per_s")) for n in names}
    mfu = {n: _median(series(n, "mfu")) for n in names}
    sweep = [c["name"] for c in configs if c.get("sweep")]
    best = max(sweep + ["default"], key=lambda n: medians.get(n) or 0.0)

    def ratio(a: str, b: str) -> Dict[str, Optional[float]]:
        per = [x / y for x, y in zip(series(a, "tokens_per_s"), series(b, "tokens_per_s")) if x and y]
        if not per:
            return {"median": None, "min": None, "max": None}
        return {"median": statistics.median(per), "min": min(per), "max": max(per)}

    errors = {n: [r[n]["error"] for r in rounds if r.get(n, {}).get("error")] for n in names}
    return {"medians_tokens_per_s": medians, "mfu": mfu, "best_sweep": best,
            "ratios": {"auto_vs_default": ratio("auto", "default"), "auto_vs_best_sweep": ratio("auto", best),
                       **{f"{n}_vs_default": ratio(n, "default") for n in sweep}},
            "errors": {n: e for n, e in errors.items() if e}}


def result_record(card: Dict[str, Any], configs: List[Dict[str, Any]],
                  rounds: List[Dict[str, Dict[str, Any]]], steps: int) -> Dict[str, Any]:
    """The gpu-<card>.json object."""
    summary = summarise(configs, rounds)
    return {
        "schema": SCHEMA, "workload": WORKLOAD, "card": card, "rounds": len(rounds), "steps_per_run": steps,
        "ratios": {k: v["median"] for k, v in summary["ratios"].items()},
        "ratio_spread": summary["ratios"], "best_sweep": summary["best_sweep"],
        "mfu": summary["mfu"], "medians_tokens_per_s": summary["medians_tokens_per_s"],
        "errors": summary["errors"],
        "configs": [{"name": c["name"], "settings": c["settings"],
                     "tokens_per_s": [r.get(c["name"], {}).get("tokens_per_s") for r in rounds],
                     "mfu": [r.get(c["name"], {}).get("mfu") for r in rounds],
                     "attention_kernel": next((r[c["name"]].get("attention_kernel") for r in rounds
                                               if r.get(c["name"], {}).get("attention_kernel")), None),
                     "batch_trial": next((r[c["name"]].get("batch_trial") for r in rounds
                                          if r.get(c["name"], {}).get("batch_trial")), None)}
                    for c in configs],
        "auto_decisions": next((c.get("decisions") for c in configs if c["name"] == "auto"), None),
    }


def no_gpu_reason(facts: Any) -> Optional[str]:
    """One line saying why this host cannot run the GPU benchmarks, or None when it can."""
    if not facts.gpus:
        return "no NVIDIA GPU on this host: the GPU benchmarks need one (nothing to do)"
    torch = facts.software.packages.get("torch") if facts.software else None
    if torch is None:
        return "torch is not installed: the GPU benchmarks need a CUDA build (cpuperf install --yes)"
    if torch.build == "cpu":
        return f"torch {torch.version} is a CPU-only build: the GPU benchmarks need a CUDA build"
    return None


def run_worker(settings: Dict[str, Any], out_dir: Path, timeout: float = 900) -> Dict[str, Any]:
    """One worker run in a fresh process; its JSON summary, or {'error': ...}."""
    cfg = {"preset": WORKLOAD, "device": "cuda", "eval_every": 0, "ckpt_every": 0, "eval_batches": 1,
           "progress": "off", "out_dir": str(out_dir), "tokenizer_cache": str(out_dir.parent / "tok"),
           **settings}
    env = dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                     if os.environ.get("PYTHONPATH") else ""))
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    proc = subprocess.run([sys.executable, "-m", "cpuperf.train.worker", "--config", json.dumps(cfg), "--json"],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=str(ROOT))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def main(rounds: int = 3, steps: int = 30, batch: int = 8, global_batch: int = 64, out: Path = RESULTS,
         log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
         facts: Any = None, runner: Callable[[Dict[str, Any], Path], Dict[str, Any]] = run_worker,
         joint: bool = False, pairs: int = 3) -> int:
    """Probe (or take `facts`), decide, run every configuration `rounds` times alternately, write
    the results. `runner` runs one configuration (default: a fresh worker process on the GPU). `joint`: the product
    of the decided levers instead of one lever at a time (at least 3 rounds), then `pairs` rounds of auto against
    the product's best head to head (gpu-<card>-joint.json)."""
    import tempfile

    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.probe import probe_host

    facts = facts if facts is not None else probe_host()
    reason = no_gpu_reason(facts)
    if reason:
        print(f"benchmarks --gpu: {reason}")
        return 0
    gpu = facts.gpus[0]
    workload = resolve_workload(WORKLOAD, steps=steps, batch_size=global_batch)
    rec = recommend(facts, workload, RecommendRequest(nproc_per_node=1, environ={"CUDA_VISIBLE_DEVICES": str(gpu.index)}))
    values = {d.id: d.value for d in rec.decisions}
    pruned: List[str] = []
    if joint:
        if rounds < 3:
            log(f"benchmarks --gpu --joint: {rounds} round(s) asked; the joint sweep runs at least 3")
            rounds = 3
        configs, pruned = joint_configs(values, batch, global_batch)
    else:
        configs = build_configs(values, batch, global_batch)
    all_rounds: List[Dict[str, Dict[str, Any]]] = []
    pair_runs: Dict[str, List[Optional[float]]] = {"auto": [], "best": []}
    with tempfile.TemporaryDirectory(prefix="cpuperf-bench-gpu-") as tmp:
        def one(c: Dict[str, Any], label: str) -> Dict[str, Any]:
            res = runner({**c["settings"], "max_steps": steps}, Path(tmp) / c["name"].replace("=", "-"))
            tps = res.get("tokens_per_s")
            log(f"  {label} {c['name']:<18} "
                + (f"{tps:10.0f} tokens/s  MFU {res.get('mfu') or 0:.3f}" if tps else res.get("error", "?")))
            return res

        for r in range(rounds):
            all_rounds.append({c["name"]: one(c, f"round {r + 1}/{rounds}") for c in configs})
        best_name = summarise(configs, all_rounds)["best_sweep"] if joint else None
        best = next((c for c in configs if c["name"] == best_name), None)
        auto = configs[1]
        for p in range(pairs if best is not None and best_name != "default" else 0):
            order = [("auto", auto), ("best", best)] if p % 2 == 0 else [("best", best), ("auto", auto)]
            for key, c in order:
                pair_runs[key].append(one(c, f"pair {p + 1}/{pairs}").get("tokens_per_s"))
    card = {"name": gpu.name, "compute_capability": gpu.compute_capability, "memory_bytes": gpu.memory_bytes,
            "driver_version": gpu.driver_version}
    record = result_record(card, configs, all_rounds, steps)
    if joint:
        record["joint"] = {"points": sum(1 for c in configs if c.get("joint")), "pruned": pruned, "best": best_name,
                           "best_settings": best["settings"] if best is not None else None,
                           "pairs": pair_runs, "head_to_head": head_to_head(pair_runs["auto"], pair_runs["best"])}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-{card_slug(gpu.name)}{'-joint' if joint else ''}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    ratios = record["ratios"]
    fmt = (lambda v: "-" if v is None else f"{v:.2f}x")
    print(f"{gpu.name}: auto vs default {fmt(ratios['auto_vs_default'])}, auto vs best sweep "
          f"({record['best_sweep']}) {fmt(ratios['auto_vs_best_sweep'])}, MFU auto "
          f"{record['mfu'].get('auto') or 0:.3f}; {path}")
    return 0


def cli(argv: Optional[List[str]] = None) -> int:
    """`python -m benchmarks.gpu` (the same as `python -m benchmarks --gpu`)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks --gpu", description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    ap.add_argument("--batch", type=int, default=8, help="the per-step batch the plain default uses")
    ap.add_argument("--global-batch", type=int, default=64, help="samples per optimizer step (all configs)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--joint", action="store_true", help="the product of the decided levers, then auto against its best")
    ap.add_argument("--pairs", type=int, default=3, help="--joint: paired rounds of auto against the best")
    args = ap.parse_args(argv)
    return main(args.rounds, args.steps, args.batch, args.global_batch, Path(args.out), joint=args.joint,
                pairs=args.pairs)


if __name__ == "__main__":
    sys.exit(cli())
