"""The worker's command line and schedule: pure parts, no torch needed (peaks: test_train_gpu.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from cpuperf.train.worker import _human, _lr_lambda, build_parser, load_settings
from cpuperf.worker_settings import ConfigError, TrainSettings

ROOT = Path(__file__).resolve().parents[1]


def _load(*argv: str) -> TrainSettings:
    return load_settings(build_parser().parse_args(list(argv)))


def test_set_overrides_config_and_flags_win() -> None:
    s = _load("--config", '{"preset": "micro", "model": {"n_layer": 3}, "lr": 0.01}',
              "--set", "lr=0.002", "--set", "model.d_model=32", "--set", "optimizer=adamw_fused",
              "--set", "threads_per_rank=null", "--out-dir", "/tmp/x", "--resume")
    assert (s.preset, s.lr, s.optimizer, s.threads_per_rank) == ("micro", 0.002, "adamw_fused", None)
    assert s.model == {"n_layer": 3, "d_model": 32}
    assert (s.out_dir, s.resume) == ("/tmp/x", True)
    assert _load() == TrainSettings()


def test_set_needs_key_value() -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        _load("--set", "lr")


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    s = TrainSettings(warmup=10, max_steps=110, min_lr_ratio=0.1)
    f = _lr_lambda(s, 110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.55)
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert all(f(i) >= f(i + 1) for i in range(10, 120))
    assert math.isclose(_lr_lambda(TrainSettings(warmup=0, min_lr_ratio=1.0), 10)(5), 1.0)


def test_human_summary() -> None:
    text = _human({"status": "completed", "steps": 3, "train_s": 1.0, "world_size": 1,
                   "device": "cpu", "loss_first": 6.6, "loss_last": 5.0, "eval_loss": None,
                   "samples_per_s": 10.0, "tokens_per_s": 1280.0, "warmup_s": 0.5, "mfu": 0.25,
                   "metrics_file": "m", "checkpoint": "c"})
    assert "6.6000 -> 5.0000" in text and "MFU 25.0%" in text and "eval loss -" in text
    gpu = _human({"status": "completed", "steps": 3, "train_s": 1.0, "world_size": 1,
                  "device": "cuda:0 (Tesla T4)", "loss_first": 6.6, "loss_last": 5.0, "eval_loss": None,
                  "samples_per_s": 10.0, "tokens_per_s": 1280.0, "warmup_s": 0.5, "mfu": 0.25,
                  "metrics_file": "m", "checkpoint": "c",
                  "attention_kernel": {"kernel": "mem_efficient"},
                  "amp": {"dtype": "fp16", "autocast": True, "grad_scaler": True},
                  "batch_trial": {"adjusted": True, "planned_batch": 64, "batch": 24, "grad_accum_steps": 3}})
    assert "attention mem_efficient, fp16 autocast + GradScaler, batch 64 -> 24 x 3 (trial step)" in gpu
    peak = _human({"status": "completed", "steps": 3, "train_s": 1.0, "world_size": 1,
                   "device": "cuda:0 (NVIDIA H100 80GB HBM3)", "loss_first": 6.6, "loss_last": 5.0, "eval_loss": None,
                   "samples_per_s": 10.0, "tokens_per_s": 1280.0, "warmup_s": 0.5, "mfu": 0.25,
                   "metrics_file": "m", "checkpoint": "c",
                   "gpu_memory": {"max_allocated_bytes": 38054211584, "max_reserved_bytes": 39965179904,
                                  "batch_size": 8}})
    assert "GPU memory peak 35.4 GiB allocated, 37.2 GiB reserved" in peak


def test_importing_the_package_does_not_import_torch() -> None:
    code = ("import sys, cpuperf.train, cpuperf.train.worker, cpuperf.train.model, "
            "cpuperf.worker_settings, cpuperf.train.corpus, cpuperf.train.dist_env, "
            "cpuperf.train.runtime_check, cpuperf.train.batches, cpuperf.train.checkpoint; "
            "assert 'torch' not in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
