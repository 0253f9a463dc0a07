"""A user's own script run plainly vs under `cpuperf train --auto`: a Hugging Face Trainer script, an accelerate
script and a Lightning script (benchmarks/scripts/), alternating rounds, medians of the throughput ratio and of the
wall-time ratio (the whole command, cpuperf's own start and end included); the optimizer named (issue 15)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _argv(workload: str, steps: int) -> List[str]:
    if workload == "hf-trainer":
        return [sys.executable, str(SCRIPTS / "hf_gpt2.py"), "--output_dir", "/tmp/cpuperf-bench-hf",
                "--max_steps", str(steps), "--per_device_train_batch_size", "8", "--report_to", "none",
                "--save_strategy", "no", "--disable_tqdm", "true", "--logging_strategy", "no"]
    if workload == "lightning":
        return [sys.executable, str(SCRIPTS / "lightning_lm.py"), "--steps", str(steps)]
    # Mixed precision left to accelerate's default (a user who did not choose): cpuperf may add its own.
    return ["accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
            "--dynamo_backend", "no", str(SCRIPTS / "accel_gpt2.py"), "--steps", str(steps)]


def _once(argv: List[str], auto: bool) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "MALLOC_CONF"))}
    env.pop("LD_PRELOAD", None)
    env.update(PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", NO_COLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    cmd = [sys.executable, "-m", "cpuperf", "train", "--auto", "--json", "--out", "/tmp/cpuperf-bench-user",
           "--", *argv] if auto else argv
    began = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    wall = time.monotonic() - began
    # Under `--json` the script's own output goes to stderr; cpuperf's result object is stdout.
    lines = [ln for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.startswith('{"samples_per_s"')]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"}
    res = json.loads(lines[-1])
    res["wall_s"] = wall
    if auto:
        try:
            res["applied"] = json.loads(proc.stdout).get("applied")
        except ValueError:
            res["applied"] = None
    return res


# What each script imports: without it the workload cannot run, and says so (the rest of the suite goes on).
NEEDS = {"hf-trainer": ("transformers", "accelerate"), "accelerate": ("transformers", "accelerate"),
         "lightning": ("lightning",)}
WORKLOADS = tuple(NEEDS)


def missing_modules(workload: str) -> List[str]:
    """The modules `workload` needs that this interpreter cannot import (pip install -e '.[bench]')."""
    import importlib.util

    return [m for m in NEEDS.get(workload, ()) if importlib.util.find_spec(m) is None]


def skipped(workload: str, why: str) -> Dict[str, Any]:
    """A result for a workload that could not run: the table says why instead of a figure."""
    return {"schema": "cpuperf.bench-user-script/1", "workload": workload, "skipped": why, "ratio_median": None,
            "ratio_min": None, "ratio_max": None, "ratios": [], "optimizer_plain": None, "optimizer_auto": None,
            "applied": None, "targets": {}}


def bench_user_script(workload: str, rounds: int, steps: int, log: Callable[[str], None]) -> Dict[str, Any]:
    """Alternating plain/auto rounds; the ratio per round and its median."""
    missing = missing_modules(workload)
    if missing:
        why = f"not run: {', '.join(missing)} not installed (pip install -e '.[bench]')"
        log(f"  {workload}: {why}")
        return skipped(workload, why)
    argv = _argv(workload, steps)
    runs: List[Dict[str, Dict[str, Any]]] = []
    for r in range(rounds):
        pair = {}
        for name in (("plain", "auto") if r % 2 == 0 else ("auto", "plain")):
            pair[name] = _once(argv, name == "auto")
            log(f"  {workload} round {r + 1}/{rounds} {name:<6} "
                + (f"{pair[name]['samples_per_s']:.2f} samples/s" if "samples_per_s" in pair[name] else pair[name]["error"]))
        runs.append(pair)
    ratios = [p["auto"]["samples_per_s"] / p["plain"]["samples_per_s"] for p in runs
              if "samples_per_s" in p["auto"] and "samples_per_s" in p["plain"]]
    auto0 = next((p["auto"] for p in runs if "samples_per_s" in p["auto"]), {})
    plain0 = next((p["plain"] for p in runs if "samples_per_s" in p["plain"]), {})
    med: Optional[float] = statistics.median(ratios) if ratios else None
    walls = [p["plain"]["wall_s"] / p["auto"]["wall_s"] for p in runs
             if "wall_s" in p["auto"] and "wall_s" in p["plain"]]
    wall_med: Optional[float] = statistics.median(walls) if walls else None
    return {"schema": "cpuperf.bench-user-script/1", "workload": workload, "rounds": rounds, "steps": steps,
            "command": argv, "ratio_median": med, "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None, "ratios": ratios,
            "wall_ratio_median": wall_med, "wall_ratios": walls,
            "plain_wall_s": [p["plain"].get("wall_s") for p in runs], "auto_wall_s": [p["auto"].get("wall_s") for p in runs],
            "plain_samples_per_s": [p["plain"].get("samples_per_s") for p in runs],
            "auto_samples_per_s": [p["auto"].get("samples_per_s") for p in runs],
            "optimizer_plain": plain0.get("optimizer"), "optimizer_auto": auto0.get("optimizer"),
            "applied": auto0.get("applied"),
            "targets": {"median >= 1.0": med is not None and med >= 1.0,
                        "every round >= 0.97": bool(ratios) and min(ratios) >= 0.97,
                        "wall median >= 1.0": wall_med is not None and wall_med >= 1.0}}


def markdown_rows(results: List[Dict[str, Any]]) -> List[str]:
    """Rows for the README's table: auto/plain, optimizer, what was applied."""
    lines = ["", "| user script | auto / plain (min-max) | wall: plain / auto | optimizer (plain -> auto) | applied by --auto "
             "| targets |", "|---|---|---|---|---|---|"]
    for r in results:
        a = r.get("applied") or {}
        flags = list((a.get("flags_why") or {}).keys()) or list(a.get("flags") or [])  # "--optim X" as one
        applied = ", ".join([f"{k}={v}" for k, v in (a.get("env") or {}).items()] + flags
                            + ([f"pinned {len(a['cpus'])} CPUs"] if a.get("cpus") else []))
        ratio = "n/a" if r["ratio_median"] is None else \
            f"{r['ratio_median']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        if r.get("skipped"):
            lines.append(f"| {r['workload']} | {r['skipped']} | - | - | - | - |")
            continue
        wall = "n/a" if r.get("wall_ratio_median") is None else f"{r['wall_ratio_median']:.2f}x"
        ok = all(r["targets"].values())
        lines.append(f"| {r['workload']} | {ratio} | {wall} | {r['optimizer_plain']} -> {r['optimizer_auto']} | {applied or '-'} | "
                     + ("met" if ok else "MISSED: " + ", ".join(k for k, v in r["targets"].items() if not v)) + " |")
    return lines
