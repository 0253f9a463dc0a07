"""The worker as users run it: real subprocesses, real checkpoints, real signals, real torchrun."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from worker_util import ROOT, _env, _settings, run_worker  # noqa: E402  (after the skip)

pytestmark = pytest.mark.full  # real worker runs, torchrun, Open MPI


@pytest.fixture(scope="module")
def tok_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tokcache"))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_short_run_learns_and_writes_metrics(tmp_path, tok_cache) -> None:
    out = tmp_path / "run"
    p = run_worker("--config", _settings(out, tok_cache, max_steps=30), "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["schema"] == "cpuperf.train/1" and summary["status"] == "completed"
    assert summary["steps"] == 30 and summary["world_size"] == 1 and summary["device"] == "cpu"
    assert summary["loss_last"] < summary["loss_first"] - 0.5, summary
    assert summary["eval_loss"] is not None and summary["eval_loss"] < summary["loss_first"]
    assert summary["samples_per_s"] > 0 and summary["tokens_per_s"] == pytest.approx(
        summary["samples_per_s"] * 32, rel=1e-3)
    assert summary["warmup_s"] > 0
    # MFU against the hardware peak (where compat/cpu_peaks.toml knows this CPU); the GEMM ceiling
    # measured with the run's threads beside it
    assert summary["achievable"]["source"].startswith("measured") and summary["achievable"]["dtype"] == "fp32"
    assert 0 < summary["pct_of_achievable"] <= 100
    if summary["peak"] is not None:
        assert summary["peak"]["source"].startswith("hardware:") and 0 < summary["mfu"] <= 1
    assert summary["attention_kernel"]["kernel"] == "flash"  # the CPU flash kernel
    assert summary["amp"] == {"dtype": "fp32", "autocast": False, "grad_scaler": False}
    assert summary["batch_trial"] is None  # CPU: no trial step
    assert len(summary["param_checksums"]) == 1
    assert "Traceback" not in p.stderr and "step 30/30 loss" in p.stderr

    recs = _records(Path(summary["metrics_file"]))
    assert recs[0]["type"] == "settings" and recs[-1]["type"] == "summary"
    assert recs[0]["runtime"]["n_allowed_cpus"] >= 1 and recs[0]["runtime"]["torch"]
    assert recs[0]["runtime"]["torch"]["num_threads"] == 1
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 5, 10, 15, 20, 25, 30]
    for r in steps:
        assert {"step", "loss", "lr", "samples_per_s", "tokens_per_s"} <= set(r)
    assert Path(summary["checkpoint"]).is_file()


def test_resume_reaches_the_same_step_and_weights(tmp_path, tok_cache) -> None:
    # A constant LR (no warm-up, no decay) makes the schedule independent of max_steps, so
    # "10 steps, then resume to 20" must equal "20 steps" bit for bit.
    flat = {"warmup": 0, "min_lr_ratio": 1.0}
    whole = run_worker("--config", _settings(tmp_path / "a", tok_cache, max_steps=20, **flat),
                       "--json")
    assert whole.returncode == 0, whole.stderr
    half = run_worker("--config", _settings(tmp_path / "b", tok_cache, max_steps=10, **flat),
                      "--json")
    assert half.returncode == 0, half.stderr
    rest = run_worker("--config", _settings(tmp_path / "b", tok_cache, max_steps=20, **flat),
                      "--resume", "--json")
    assert rest.returncode == 0, rest.stderr
    a, b = json.loads(whole.stdout), json.loads(rest.stdout)
    assert (b["steps"], b["steps_this_run"], b["resumed_from"]) == (20, 10, 10)
    # Model, optimizer, schedule and data position all restored: bit-identical weights.
    assert a["param_checksums"] == b["param_checksums"]
    recs = _records(tmp_path / "b" / "metrics.jsonl")
    assert [r["type"] for r in recs].count("settings") == 2  # appended, one per segment
    assert not list((tmp_path / "b").glob(".*.tmp"))


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143)])  # SIGINT: the same handler; test_launch_run.py sends it
def test_signal_leaves_a_loadable_checkpoint(tmp_path, tok_cache, sig, code) -> None:
    import torch

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cpuperf.train.worker", "--json", "--config",
         _settings(out, tok_cache, max_steps=100_000, ckpt_every=0, eval_every=0, log_every=1)],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:
        if metrics.exists() and '"step": 3,' in metrics.read_text():
            break
        time.sleep(0.1)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert f"{sig.name} at step" in stderr and "Traceback" not in stderr
    summary = json.loads(stdout)
    assert summary["status"] == "interrupted"
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ck["step"] == summary["steps"] >= 3
    assert ck["schema"] == "cpuperf.train.ckpt/1" and "optimizer" in ck and "rng" in ck
    done = run_worker("--config", _settings(out, tok_cache, max_steps=ck["step"] + 3), "--resume",
                      "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == ck["step"] + 3


def test_errors_are_one_line_with_distinct_codes(tmp_path, tok_cache) -> None:
    bad = run_worker("--config", '{"preset": "huge"}', "--json")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "preset must be one of" in bad.stderr
    assert json.loads(bad.stdout)["error"]["code"] == 2
    try:
        import intel_extension_for_pytorch  # noqa: F401
    except ImportError:
        miss = run_worker("--config", _settings(tmp_path, tok_cache, ipex=True, max_steps=1))
        assert miss.returncode == 3 and "intel_extension_for_pytorch" in miss.stderr
        assert "Traceback" not in miss.stderr


def test_two_rank_gloo_run_keeps_ranks_in_sync(tmp_path, tok_cache) -> None:
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "cpuperf.train.worker", "--json", "--config",
           _settings(out, tok_cache, max_steps=12, ddp_backend="gloo", grad_accum_steps=2)]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])  # rank 0 alone prints
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    sums = summary["param_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]
    assert summary["steps"] == 12 and summary["loss_last"] < summary["loss_first"]
    settings_rec = _records(out / "metrics.jsonl")[0]
    assert settings_rec["rank_launcher"] == "torchrun"


def test_time_budget_ends_the_run(tmp_path, tok_cache) -> None:
    p = run_worker("--config", _settings(tmp_path, tok_cache, max_steps=None, time_budget_s=1.5),
                   "--set", "log_every=1000", "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["status"] == "time_budget" and summary["steps"] >= 2
    assert 1.5 <= summary["train_s"] < 15


def test_two_ranks_from_mpich_style_variables(tmp_path, tok_cache) -> None:
    # What mpirun (Intel MPI / MPICH Hydra) gives each rank, without needing mpirun installed.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "mpi"
    cfg = _settings(out, tok_cache, max_steps=6, log_every=3)
    procs = []
    for rank in range(2):
        env = {**_env(), "PMI_RANK": str(rank), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(rank),
               "MPI_LOCALNRANKS": "2", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "cpuperf.train.worker", "--json", "--config", cfg], cwd=ROOT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    assert results[1][0] == ""  # only rank 0 prints the summary
    summary = json.loads(results[0][0])
    assert summary["world_size"] == 2 and len(set(summary["param_checksums"])) == 1
    assert _records(out / "metrics.jsonl")[0]["rank_launcher"] == "mpich"


def _open_mpi() -> bool:
    import shutil

    exe = shutil.which("mpirun")
    if exe is None:
        return False
    p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return "Open MPI" in p.stdout + p.stderr


@pytest.mark.skipif(not _open_mpi(), reason="needs Open MPI's mpirun")
def test_two_ranks_under_real_open_mpi(tmp_path, tok_cache) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**_env(), "MASTER_PORT": str(port), "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    out = tmp_path / "ompi"
    cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
           "-x", "MASTER_PORT", sys.executable, "-m", "cpuperf.train.worker", "--json",
           "--config", _settings(out, tok_cache, max_steps=6, log_every=3)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and len(set(summary["param_checksums"])) == 1
    assert _records(out / "metrics.jsonl")[0]["rank_launcher"] == "openmpi"
