"""benchmarks/compile_modes.py: each compile mode against eager, compile time and steady state apart."""

from __future__ import annotations

import pytest

from benchmarks.compile_modes import configs, crossover, render, summarise
from cpuperf.train.bench import COMPILE_MODES, BenchConfig


def test_crossover_is_the_compile_over_the_time_saved_per_step():
    # eager 100 samples/s, compiled 125 samples/s at batch 10: 0.1 s vs 0.08 s a step, 0.02 s saved; 30 s extra
    assert crossover(30.0, 100.0, 125.0, 10) == pytest.approx(1500)
    assert crossover(30.0, 100.0, 90.0, 10) is None  # slower in steady state: never pays back
    assert crossover(-1.0, 100.0, 125.0, 10) == 0.0  # a first step no slower than eager's: paid at once


def _round(eager: float, compiled: float, first: float):
    return {"eager": {"samples_per_s": eager, "first_step_s": 0.5, "batch": 16},
            "default": {"samples_per_s": compiled, "first_step_s": first, "batch": 16}}


def test_a_steady_gain_well_above_the_noise_is_judged_above_with_its_crossover():
    rounds = [_round(100, 130, 40.5), _round(98, 128, 41.5), _round(102, 131, 39.5)]
    res = summarise(rounds, ["eager", "default"])["default"]
    assert res["verdict"]["outcome"] == "above" and 1.25 < res["steady_ratio"] < 1.35
    assert res["compile_s"] == 40.5 - 0.5 and res["crossover_steps"] > 0
    assert "above" in render({"lm-small": {"eager": {}, "default": res}})


def test_a_mode_that_is_slower_never_pays_back():
    rounds = [_round(100, 90, 20), _round(101, 92, 21), _round(99, 89, 20)]
    res = summarise(rounds, ["eager", "default"])["default"]
    assert res["verdict"]["outcome"] == "below" and res["crossover_steps"] is None
    assert "never" in render({"lm-small": {"default": res}})


def test_a_mode_that_failed_is_said():
    rounds = [{"eager": {"samples_per_s": 100, "first_step_s": 0.5}, "default": {"error": "exit 1: no compiler"}}]
    assert summarise(rounds, ["eager", "default"])["default"] == {"error": "exit 1: no compiler"}


def test_every_mode_is_a_configuration_and_an_unknown_one_is_refused():
    names = [c["name"] for c in configs("bf16", list(COMPILE_MODES))]
    assert names == ["eager", *COMPILE_MODES]
    assert BenchConfig.from_json({"compile": True, "compile_mode": "regional"}).compile_mode == "regional"
    torch = pytest.importorskip("torch")
    from cpuperf.train.bench import compiled_model

    with pytest.raises(SystemExit, match="unknown compile_mode"):
        compiled_model(torch, torch.nn.Linear(2, 2), "fastest")
