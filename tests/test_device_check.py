"""benchmarks/device_check.sh: the GPU check in one command; it skips cleanly where there is no GPU to check, and its
summary reads the figures from what the steps printed (here: what the recorded H100 check printed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_util import cli_env, run_cli

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device_check.sh"
HOST = Path(__file__).parent / "fixtures" / "hosts" / "h100-emeraldrapids-16c"


def _check(dest: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(dest)], capture_output=True, text=True, timeout=120,
                          env=cli_env({"PYTHON": sys.executable, **env}), cwd=str(ROOT))


def test_no_gpu_skips_cleanly_with_one_line_saying_why(tmp_path):
    proc = _check(tmp_path / "results", {"CPUPERF_OVERRIDE_GPUS": "[]"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["device_check: skipped: no NVIDIA GPU on this host: the GPU benchmarks need "
                                        "one (nothing to do)"]
    assert not (tmp_path / "results").exists()  # nothing ran, nothing written


def test_a_card_torch_cannot_use_skips_too(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine's torch sees a GPU")
    gpus = (Path(__file__).parent / "fixtures" / "gpus" / "h100-80gb-hbm3.json").read_text()
    proc = _check(tmp_path / "results", {"CPUPERF_OVERRIDE_GPUS": gpus,
                                         "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cu128"})})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("device_check: skipped: torch ") and "sees no CUDA device" in proc.stdout
    assert not (tmp_path / "results").exists()


def test_an_interpreter_that_cannot_probe_is_an_error_not_a_skip(tmp_path):
    proc = _check(tmp_path / "results", {"PYTHON": "/bin/false"})
    assert proc.returncode == 1 and proc.stdout == ""
    assert "cannot probe this host" in proc.stderr


def test_the_summary_sets_the_trainer_peak_beside_the_plan(tmp_path):
    from benchmarks.device_summary import summarise

    dest = tmp_path / "results"
    dest.mkdir()
    # What the recorded check's Trainer run printed, and the plan for its shape as the check asks for it.
    (dest / "trainer_auto.out").write_text((HOST / "results" / "trainer_auto.stdout.txt").read_text())
    plan = run_cli(["recommend", "--sysroot", str(HOST / "snapshot"), "--model",
                    str(HOST / "trainer" / "llama1b" / "config.json"), "--seq-len", "1024", "--batch-size", "8",
                    "--json"])
    assert plan.returncode == 0, plan.stderr
    (dest / "trainer_plan.out").write_text(plan.stdout)
    out = summarise(dest, 480, 300)
    trainer = out["trainer"]
    assert trainer["peak_allocated_bytes"] == int(35.44063472747803 * 2**30)
    assert 0.85 <= trainer["planned_over_allocated"] <= 1.15 and 0.85 <= trainer["planned_over_reserved"] <= 1.15
    assert trainer["plain_samples_per_s"] is None and "auto_over_plain" not in trainer
    # the plain run's figure the recorded check logged (results/device-log-run1.txt in the shared record)
    (dest / "trainer_plain.out").write_text('TRAINER_RESULT {"metrics": {"train_samples_per_second": 5.684}}\n')
    trainer = summarise(dest, 480, 300)["trainer"]
    assert trainer["auto_over_plain"] == round(28.035 / 5.684, 4)
    assert out["builtin_auto"] is None and "compile_crossover" not in out and "bench_gpu" not in out


def test_the_summary_reads_the_builtin_runs_and_the_crossover(tmp_path):
    from benchmarks.device_summary import summarise

    dest = tmp_path / "results"
    dest.mkdir()
    eager = {"status": "completed", "tokens_per_s": 479108.0, "warmup_s": 0.23, "mfu": 0.304,
             "gpu_memory": {"max_allocated_bytes": 24 << 30, "max_reserved_bytes": 25 << 30, "planned_bytes": 26 << 30}}
    (dest / "builtin_auto.out").write_text(json.dumps(eager, indent=2))  # train --json prints one indented object
    (dest / "builtin_compile.out").write_text("noise\n" + json.dumps({**eager, "tokens_per_s": 527018.8,
                                                                      "warmup_s": 41.0}) + "\n")
    out = summarise(dest, 480, 300)
    assert out["builtin_auto"]["gpu_memory"]["planned_bytes"] == 26 << 30 and out["builtin_auto"]["mfu"] == 0.304
    assert out["compile_crossover"] == {"first_step_s": 41.0, "eager_first_step_s": 0.23, "steady_gain": 1.1}
    assert "trainer" not in out

