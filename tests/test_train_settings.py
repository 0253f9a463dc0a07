"""TrainSettings: JSON round-trip and one clear error per bad input."""

from __future__ import annotations

import json

import pytest

from cpuperf.train.errors import TrainExit
from cpuperf.worker_settings import ConfigError, TrainSettings


def test_defaults_round_trip_through_json(tmp_path) -> None:
    s = TrainSettings()
    assert TrainSettings.from_json(s.to_json()) == s
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"preset": "micro", "lr": 1, "threads_per_rank": 2, "model": {"n_layer": 1}}))
    t = TrainSettings.from_json(str(p))
    assert (t.preset, t.lr, t.threads_per_rank, t.model) == ("micro", 1.0, 2, {"n_layer": 1})
    assert isinstance(t.lr, float)


@pytest.mark.parametrize("obj, fragment", [
    ({"nope": 1}, "unknown setting"),
    ({"batch_size": "16"}, "batch_size must be an integer"),
    ({"compile": 1}, "compile must be true or false"),
    ({"dtype": "fp8"}, "dtype must be one of"),
    ({"dtype": "fp16"}, "fp16 needs device cuda"),
    ({"ddp_backend": "nccl"}, "nccl needs device cuda"),
    ({"max_steps": None, "time_budget_s": None}, "needs an end"),
    ({"threads_per_rank": 0}, "threads_per_rank must be >= 1"),
    ({"model": {"d_model": -1}}, "model.d_model must be at least 1"),
    ({"model": {"width": 3}}, "unknown model override"),
    ([], "must be a JSON object"),
])
def test_bad_settings_raise_config_error(obj, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        TrainSettings.from_dict(obj)
    assert info.value.code == TrainExit.BAD_CONFIG == 2


def test_the_worker_reports_bad_settings_as_one_line_with_exit_2(capsys) -> None:
    """ConfigError lives below train/ (cpuperf.worker_settings) and is no TrainError: the worker's error boundary
    still reports it as its one line, and as the record named bad_config."""
    from cpuperf.train.worker import main

    assert main(["--config", '{"lr": 0}', "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": {"code": 2, "name": "bad_config", "message": "lr must be > 0 (got 0.0)",
                                         "hint": None}}
    assert err == "cpuperf train: error: lr must be > 0 (got 0.0)\n"


def test_bad_json_and_missing_file() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        TrainSettings.from_json("{bad")
    with pytest.raises(ConfigError, match="cannot read settings file"):
        TrainSettings.from_json("/nonexistent/settings.json")


def test_the_worker_runs_the_planned_backend_else_torchs_own_default() -> None:
    torch = pytest.importorskip("torch")
    from cpuperf.train.loop import worker_backend

    assert worker_backend(torch, TrainSettings(ddp_backend="ccl")) == "ccl"
    # settings without a plan: torch's table decides, as init_process_group would
    assert worker_backend(torch, TrainSettings()) == "gloo"
    assert worker_backend(torch, TrainSettings(device="cuda")) == "nccl"
