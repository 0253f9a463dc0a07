"""--quick's screen is the tuner's own path: its points ranked across rounds, auto's own point left out."""

from __future__ import annotations

from benchmarks.tuned import lever_info, path_scores, point_of, screen
from cpuperf.decide.tune import Candidates, Point, Search, descend

START = Point(dtype="fp32", allocator=None, optimizer="adamw", ranks=1, threads=2, pinned=True)
CAND = Candidates({"allocator": (None, "mimalloc"), "optimizer": ("adamw", "adamw_fused"),
                   "layout": ((1, 2), (2, 1)), "pinning": (True, False)},
                  {"dtype": "zen3 has no native bf16"})


def _descend(speed, drift=1.0):
    """The real descent over a table of speeds; every run after the first round `drift` times slower."""
    calls = {"n": 0}
    first_round = 1 + len(CAND.values) + 1

    def run(p):
        calls["n"] += 1
        scale = drift if calls["n"] > first_round else 1.0
        return [speed(p) * scale] * 3

    ticks = iter(range(10_000))
    return descend(START, CAND, run, Search(budget_s=1e9, passes=1, min_gain=0.02, confidence=0.90),
                   clock=lambda: float(next(ticks)))


def _speed(p):
    s = 10.0
    s *= 1.3 if p.allocator == "mimalloc" else 1.0
    s *= 1.1 if p.optimizer == "adamw_fused" else 1.0
    s *= 0.7 if p.ranks == 2 else 1.0
    return s * (0.99 if not p.pinned else 1.0)


def test_the_path_is_ranked_against_the_rule_point_across_rounds_and_drift_does_not_reorder_it():
    result = _descend(_speed, drift=0.5)  # the second round's runs all half as fast: the host got busy
    assert result.best == Point(dtype="fp32", allocator="mimalloc", optimizer="adamw_fused", ranks=1, threads=2,
                                pinned=True)
    scores = path_scores(result)
    assert scores[START] == 1.0
    # each score is the point's speed over the rule point's, whatever round (and drift) it was measured in
    for p, s in scores.items():
        assert abs(s - _speed(p) / _speed(START)) < 1e-9, p.label()
    assert max(scores, key=lambda p: scores[p]) == result.best


def test_the_screen_keeps_the_best_points_other_than_the_one_auto_runs():
    result = _descend(_speed)
    kept = screen(result, result.best, keep=2)
    assert [p for p, _ in kept] and result.best not in [p for p, _ in kept] and len(kept) == 2
    assert kept[0][1] >= kept[1][1]
    # auto on the rules' point (a too-noisy tuning is not applied): the tuned best is the sweep's first point
    assert screen(result, START, keep=1)[0][0] == result.best
    assert screen(result, result.best, keep=0) == []


def test_a_plan_decisions_name_the_tuner_point_auto_runs():
    decisions = {"dtype": "fp32", "allocator": "mimalloc", "optimizer": "adamw_fused", "nproc_per_node": 1,
                 "threads_per_rank": 2, "affinity": "auto", "compile": False, "ipex": False}
    assert point_of(decisions) == Point(dtype="fp32", allocator="mimalloc", optimizer="adamw_fused", ranks=1,
                                        threads=2, pinned=True, compile=False)
    assert not point_of({**decisions, "affinity": None}).pinned


def test_the_levers_say_what_was_tried_and_why_one_was_not():
    info = lever_info(CAND)
    assert info["allocator"]["values"] == ["default allocator", "mimalloc"] and info["allocator"]["pruned"] is None
    assert info["layout"]["values"] == ["1x2", "2x1"]
    assert info["dtype"]["pruned"] == "zen3 has no native bf16"


def test_a_benchmark_lm_is_tuned_and_planned_for_the_shape_bench_tune_caches(tmp_path):
    from benchmarks.tuned import lm_model_config
    from cpuperf.decide.recommend import shape_key
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.models import PRESETS
    from cpuperf.train.bench import LM_SHAPES

    vocab = PRESETS["tiny"].vocab_size
    small = lm_model_config("small", LM_SHAPES["small"], vocab, tmp_path)
    assert small.startswith(str(tmp_path))
    # the small LM is the tiny preset's shape: `cpuperf bench --tune` (default model) tunes what the suite plans
    assert shape_key(resolve_workload(small, None, None, 16, 200)) == shape_key(resolve_workload("tiny", None, None, None, 400))
    gpt2 = resolve_workload(lm_model_config("gpt2", LM_SHAPES["gpt2"], vocab, tmp_path), None, None, 2, 200)
    assert shape_key(gpt2) == "L12-d768-h12-T128-V768-B2" and gpt2.steps == 200


def test_the_report_names_each_levers_verdict_beside_the_tuning():
    """The results keep each lever's verdict (cpuperf.decide.judge), and the report line names it: the tuning is
    applied whole and no note says it was too noisy (the gate of issue 52 is gone)."""
    from benchmarks.report import _tuning
    from benchmarks.tuned import Tuned, tuning_json

    result = _descend(_speed)
    line = _tuning({"tuning": tuning_json(Tuned(result, CAND, True, None), [])})
    assert "judged: allocator moved (mimalloc 1.30x, 1.30-1.30)" in line and "too noisy" not in line
    assert "layout kept (2x1 0.70x" in line
    from benchmarks.tuned import _note
    assert _note(True, {}) is None and _note(False, {}) == "the rule's point failed: auto is the rules' point"
    assert _note(True, {"pinning": "pinning undecided: unpinned 1.02x (0.88-1.17) against the bar 1.02"}) == (
        "pinning undecided: unpinned 1.02x (0.88-1.17) against the bar 1.02: those are the rules'")
