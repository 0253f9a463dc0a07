"""The tuner's own path as the suite's screen (issue 33: "screen less, not worse").

Every workload is tuned first as cpuperf tunes it (cpuperf.run.tune: coordinate descent from the rule's point,
each point run with the env and CPUs its own plan gives). An LM benchmark's shape is a cpuperf workload, so its
tuning is cached for that shape and "auto" is what `cpuperf train --auto` then plans; the MLP and the CNN are no
cpuperf workload, so the tuner runs on them as `train --tune` runs on a user's own script, and "auto" is the
tuner's answer there. `--quick` then takes the points the descent measured, ranked, as its sweep: the runners-up
go into the alternating rounds beside default, auto and run_cpu; `--full` runs the whole product instead.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from cpuperf.decide.tune import Candidates, Point, TuneResult

Log = Callable[[str], Any]
_MEASURED: Dict[str, Any] = {}  # this suite's once-per-host measurements (cpuperf's cache holds them across runs)


@dataclass(frozen=True)
class Tuned:
    """A workload's tuning: the descent, the levers it had, and the point auto runs (None: the plan says)."""

    result: Optional[TuneResult]
    cand: Optional[Candidates]
    applied: bool  # the tuned point is what auto runs (False: it failed: the rules decide)
    auto: Optional[Dict[str, Any]]  # the suite's auto config where no cpuperf plan exists for the workload
    note: Optional[str] = None


def lm_model_config(size: str, shape: Dict[str, int], vocab: int, root: Optional[Path] = None) -> str:
    """A config.json for a benchmark LM's shape (the one `--model` reads), so its tuning is cached for the same
    shape key that `train --auto --model` plans with; under `root` (default: the temporary directory)."""
    folder = (root or Path(tempfile.gettempdir())) / "cpuperf-bench-models" / f"lm-{size}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({"model_type": f"bench-lm-{size}", "n_layer": shape["n_layer"], "n_embd": shape["d_model"],
                                "n_head": shape["n_head"], "n_positions": shape["seq_len"], "vocab_size": vocab}))
    return str(path)


def path_scores(result: TuneResult) -> Dict[Point, float]:
    """Every point the descent measured, its median relative to the rule's point: each round's figures are
    divided by that round's incumbent, and the incumbents chained (the winner's score carries into the next
    round), so drift between rounds does not rank the points."""
    scores: Dict[Point, float] = {}
    for rnd in result.rounds:
        mine = rnd.samples.get(rnd.incumbent)
        if not mine:
            continue
        base = statistics.median(mine)
        level = scores.setdefault(rnd.incumbent, 1.0)
        for p, s in rnd.samples.items():
            if s and p not in scores:
                scores[p] = level * statistics.median(s) / base
    return scores


def screen(result: TuneResult, auto_point: Optional[Point], keep: int) -> List[Tuple[Point, float]]:
    """The `keep` best points of the tuner's path other than the one auto runs, best first, with their scores."""
    ranked = sorted(path_scores(result).items(), key=lambda kv: -kv[1])
    return [(p, s) for p, s in ranked if p != auto_point][:max(0, keep)]


def point_of(decisions: Dict[str, Any]) -> Point:
    """The tuner's point for a plan's decisions (dtype, allocator, optimizer, ranks x threads, pinning, compile)."""
    # a plan's --json decisions (id -> value), or decide.tune.decision_values: a dict either way
    return Point(dtype=str(decisions.get("dtype") or "fp32"), allocator=decisions.get("allocator"),
                 optimizer=decisions.get("optimizer"), ranks=int(decisions.get("nproc_per_node") or 1),
                 threads=int(decisions.get("threads_per_rank") or 1), pinned=decisions.get("affinity") == "auto",
                 compile=bool(decisions.get("compile")))


def lever_info(cand: Candidates) -> Dict[str, Any]:
    """The levers as the report names them: each one's values tried, or why it was left to the rule."""
    from cpuperf.decide.tune import LEVERS, label

    return {lever: {"values": [label(lever, v) for v in cand.values.get(lever, ())] or ["the rule's"],
                    "pruned": cand.skipped.get(lever), "notes": []} for lever in LEVERS}


def tuning_json(tuned: Tuned, screened: List[Tuple[Point, float]]) -> Dict[str, Any]:
    """What the results keep of the tuning: its figures, how it stopped, and the path's ranking."""
    if tuned.result is None:
        return {"note": tuned.note}
    scores = path_scores(tuned.result)
    return {**tuned.result.to_json(), "applied": tuned.applied, "note": tuned.note,
            "path": [{"point": p.label(), "vs_rule_point": round(s, 3)} for p, s in
                     sorted(scores.items(), key=lambda kv: -kv[1])],
            "kept": [p.label() for p, _ in screened]}


def tune_workload(workload: str, size: str, lm_model: Optional[Tuple[str, int]], log: Log,
                  budget_s: Optional[float], steps: int) -> Tuned:
    """Tune one benchmark workload on this host (cpuperf's once-per-host measurements first, as `train --auto`
    takes them): an LM through cpuperf's own shape tuning (cached), anything else on its own loop. `steps`: the
    run length auto plans for (the compile-crossover rule reads it)."""
    from cpuperf.decide.placement import plan_placement
    from cpuperf.probe import probe_host
    from cpuperf.run import measure

    facts = probe_host()
    if "meas" not in _MEASURED:  # once per suite: a flagged measurement is not taken again for every workload
        _MEASURED["meas"] = measure.measure_if_unsure(facts, plan_placement(facts).threads_per_rank, log=log)
    meas = _MEASURED["meas"]
    if lm_model is not None:
        return _tune_lm(facts, meas, lm_model, log, budget_s, steps)
    return _tune_reference(facts, meas, workload, size, log, budget_s, steps)


def _tune_lm(facts: Any, meas: Any, model: Tuple[str, int], log: Log, budget_s: Optional[float], steps: int) -> Tuned:
    """cpuperf's own shape tuning (what `cpuperf bench --tune --model` runs), cached for the shape and batch."""
    from cpuperf.decide.tune import undecided_levers
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.run.tune import tune_shape

    workload = resolve_workload(model[0], None, None, model[1], steps)
    got = tune_shape(facts, workload, meas, log, budget_s)
    if got is None:
        return Tuned(None, None, False, None, "nothing tuned: the plan trains on a GPU")
    result, cand, entry = got
    applied = result.stopped != "failed"
    return Tuned(result, cand, applied, None, _note(applied, undecided_levers(entry)))


def _note(applied: bool, undecided: Dict[str, str]) -> Optional[str]:
    """What the report says beside a tuning: failed, or the levers it left undecided (each the rule's)."""
    if not applied:
        return "the rule's point failed: auto is the rules' point"
    return ("; ".join(undecided.values()) + ": those are the rules'") if undecided else None


def _tune_reference(facts: Any, meas: Any, workload: str, size: str, log: Log, budget_s: Optional[float],
                    steps: int) -> Tuned:
    """The tuner on the MLP or CNN loop itself (not cached: no cpuperf plan has this shape), from the rules'
    point for the built-in model with the allocator the engine decides for this workload's family."""
    from cpuperf.decide import tune as dtune
    from cpuperf.decide.allocator import decide_allocator
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.tuning import tuning
    from cpuperf.run.tune import bench_point, point_env, rules, tune

    plan_wl = resolve_workload(None, None, None, None, steps)
    rec = recommend(facts, plan_wl, RecommendRequest(measurements=meas, shape_tuning=False, environ={}))
    if rec.levers.device.value != "cpu":
        return Tuned(None, None, False, None, "nothing tuned: the plan trains on a GPU")
    start = dtune.start_point(rec)
    if meas is not None:
        start = replace(start, allocator=decide_allocator(facts, meas, False, "mlp", start.ranks).value)
    cand = dtune.candidates(facts, rec, tuning())  # the allocator's values: default and every one
    rule = rules()
    base = {"workload": workload, "size": size, "seconds": rule.seconds, "steps": rule.steps,
            "warmup": rule.warmup, "windows": rule.windows, "run_steps": 0}

    def run_one(p: Point) -> Optional[List[float]]:
        env, cpus = point_env(facts, plan_wl, meas, p)
        return bench_point(p, base, env, cpus)

    budget = float(budget_s if budget_s is not None else rule.budget_s)
    result = tune(start, cand, run_one, budget, rule.passes, log)
    applied = result.stopped != "failed"
    point = result.best if applied else start  # its undecided levers are the start's: the rules'
    env, cpus = point_env(facts, plan_wl, meas, point)
    note = _note(applied, dtune.undecided_levers(result.to_json()))
    return Tuned(result, cand, applied, auto_for_point(point, env, cpus, result if applied else None), note)


def auto_for_point(p: Point, env: Dict[str, str], cpus: List[List[int]], result: Optional[TuneResult]) -> Dict[str, Any]:
    """The suite's auto config at a point: the env and CPUs its plan gives; the tuning's figures as reasons
    (`result` None: the rules' point, the tuning not applied)."""
    from cpuperf.decide.tune import decision_values

    settings: Dict[str, Any] = {"dtype": p.dtype, "threads_per_rank": p.threads, "compile": p.compile, "ipex": False}
    if p.optimizer:
        settings["optimizer"] = p.optimizer
    if p.pinned and cpus:
        settings["cpus_per_rank"] = cpus
    reasons = {lever: f"tuned on this workload: {fig['value']} {fig['figure']:.2f} samples/s; alternatives "
               + ", ".join(f"{k} {v:.2f}" for k, v in fig["alternatives"].items())
               for lever, fig in (result.lever_figures() if result is not None else {}).items()}
    return {"name": "auto", "env": {k: v for k, v in env.items() if not k.startswith("MASTER_")}, "ranks": p.ranks,
            "settings": settings, "decisions": decision_values(p), "reasons": reasons}
