"""The GPU check's figures (benchmarks/device_check.sh), read from its steps' outputs into RESULTS_DIR/summary.json.

`python -m benchmarks.device_summary RESULTS_DIR BUDGET_S TOOK_S`. Each figure is what a step printed: the built-in
runs' summaries (MFU, attention kernel, rank 0's real GPU peak beside the plan's figure), the compile crossover's
parts (the compiled run's first step against the eager one's, and the steady-state gain), the Trainer script's own
peak (its TRAINER_RESULT line) beside the plan's figure for its shape and batch (recommend's per_rank_bytes), and the
benchmark's ratios. A step that did not run or printed nothing leaves its figure out (null).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

SCHEMA = "cpuperf.device-check/1"
_RUN_KEYS = ("status", "samples_per_s", "tokens_per_s", "warmup_s", "mfu", "attention_kernel", "gpu_memory",
             "batch_trial")


def _text(dest: Path, name: str) -> Optional[str]:
    try:
        return (dest / f"{name}.out").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def last_json(dest: Path, name: str) -> Optional[Dict[str, Any]]:
    """The JSON object a step printed on stdout (the whole output, else its last line that is one); None if none."""
    text = _text(dest, name)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
        for line in reversed(text.splitlines()):
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                break
    return value if isinstance(value, dict) else None


def run_figures(dest: Path, name: str) -> Optional[Dict[str, Any]]:
    """A `train --json` run's figures."""
    summary = last_json(dest, name)
    return {k: summary.get(k) for k in _RUN_KEYS} if summary else None


def planned_bytes(dest: Path, name: str) -> Optional[int]:
    """The memory plan's figure per rank from a `recommend --json` step."""
    rec = last_json(dest, name) or {}
    batch = next((d for d in rec.get("decisions", []) if isinstance(d, dict) and d.get("id") == "batch_size"), {})
    value = (batch.get("evidence") or {}).get("per_rank_bytes")
    return value if isinstance(value, int) else None


def trainer_result(dest: Path, name: str) -> Optional[Dict[str, Any]]:
    """The Trainer script's own last `TRAINER_RESULT {json}` line."""
    lines: List[str] = [ln for ln in (_text(dest, name) or "").splitlines() if ln.startswith("TRAINER_RESULT ")]
    if not lines:
        return None
    value = json.loads(lines[-1].split(" ", 1)[1])
    return value if isinstance(value, dict) else None


def summarise(dest: Path, budget_s: int, took_s: int) -> Dict[str, Any]:
    """summary.json's object."""
    out: Dict[str, Any] = {"schema": SCHEMA, "budget_s": budget_s, "took_s": took_s,
                           "builtin_auto": run_figures(dest, "builtin_auto"),
                           "builtin_compile": run_figures(dest, "builtin_compile")}
    eager, compiled = out["builtin_auto"] or {}, out["builtin_compile"] or {}
    if eager.get("tokens_per_s") and compiled.get("tokens_per_s") and compiled.get("warmup_s") is not None:
        out["compile_crossover"] = {"first_step_s": compiled["warmup_s"], "eager_first_step_s": eager.get("warmup_s"),
                                    "steady_gain": round(compiled["tokens_per_s"] / eager["tokens_per_s"], 4)}
    result, plan = trainer_result(dest, "trainer_auto"), planned_bytes(dest, "trainer_plan")
    if result is not None:
        gib = float(2**30)
        peak = {k: int(result[src] * gib) if isinstance(result.get(src), (int, float)) else None
                for k, src in (("peak_allocated_bytes", "peak_alloc_gib"), ("peak_reserved_bytes", "peak_reserved_gib"))}
        trainer: Dict[str, Any] = {"samples_per_s": (result.get("metrics") or {}).get("train_samples_per_second"),
                                   **peak, "planned_bytes": plan}
        for key, real in peak.items():
            if plan and real:
                trainer["planned_over_" + key[5:-6]] = round(plan / real, 4)
        plain = trainer_result(dest, "trainer_plain")
        plain_rate = (plain.get("metrics") or {}).get("train_samples_per_second") if plain else None
        trainer["plain_samples_per_s"] = plain_rate
        if plain_rate and trainer["samples_per_s"]:
            trainer["auto_over_plain"] = round(trainer["samples_per_s"] / plain_rate, 4)
        out["trainer"] = trainer
    bench = sorted((dest / "bench").glob("gpu-*.json")) if (dest / "bench").is_dir() else []
    if bench:
        b = json.loads(bench[-1].read_text())
        out["bench_gpu"] = {"file": str(bench[-1].relative_to(dest)), "rounds": b.get("rounds"),
                            "ratios": b.get("ratios"), "mfu": b.get("mfu"), "best_sweep": b.get("best_sweep")}
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """Write RESULTS_DIR/summary.json and print it."""
    args = sys.argv[1:] if argv is None else argv
    dest = Path(args[0])
    out = summarise(dest, int(args[1]), int(args[2]))
    (dest / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
