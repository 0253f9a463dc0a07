"""A run directory belongs to one run, and nothing outlives cpuperf: real `cpuperf train` processes,
real signals, /proc scanned for survivors. Micro model, so each run takes seconds."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_util import cli_env, run_cli

pytestmark = pytest.mark.full  # real training runs, signals, locks

pytest.importorskip("torch")

MICRO = ["--model", "micro", "--set", "eval_every=0", "--set", "log_every=5"]


def start(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cpuperf", "train", *MICRO, *args, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())


def wait_for(cond, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def steps_logged(out: Path) -> int:
    try:
        return sum('"type": "step"' in line for line in (out / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def survivors(marker: str) -> list[int]:
    """Pids of live processes whose command line mentions marker (the run's unique out dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(entry))
    return found


def all_json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # a torn line fails here


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_second_run_into_a_busy_out_is_refused(tmp_path):
    out = tmp_path / "run"
    first = start(out, "--max-steps", "100000", "--set", "ckpt_every=10", "--json")
    try:
        assert wait_for(lambda: (out / "checkpoint.pt").is_file() and steps_logged(out) >= 2)
        for extra in ([], ["--resume"]):  # refused by the lock, resume or not
            second = run_cli(["train", *MICRO, "--max-steps", "5", "--out", str(out), *extra], timeout=60)
            assert second.returncode == 12, second.stderr
            errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "in use by another run" in errors[0] and f"pid {first.pid}" in errors[0]
            assert "Traceback" not in second.stderr
        # the worker itself refuses too, run by hand into the same directory
        cfg = json.dumps({"preset": "micro", "out_dir": str(out), "max_steps": 3})
        worker = subprocess.run([sys.executable, "-m", "cpuperf.train.worker", "--config", cfg, "--resume"],
                                capture_output=True, text=True, env=cli_env(), timeout=60)
        assert worker.returncode == 12 and "in use by another run" in worker.stderr
        first.send_signal(signal.SIGTERM)
        stdout, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, stderr[-2000:]  # SIGTERM: 128 + 15, as docs/exit-codes.md says
    records = all_json_lines(out / "metrics.jsonl")
    assert [r["type"] for r in records].count("settings") == 1  # only the first run wrote
    import torch

    ckpt = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["step"] >= 10
    assert "the last checkpoint is" in stderr


def test_two_workers_at_once_one_is_refused(tmp_path):
    out = tmp_path / "run"
    cfg = json.dumps({"preset": "micro", "out_dir": str(out), "max_steps": 40, "log_every": 1,
                      "eval_every": 0, "ckpt_every": 5, "threads_per_rank": 1, "progress": "off"})
    env = cli_env({"OMP_NUM_THREADS": "1"})
    procs = [subprocess.Popen([sys.executable, "-m", "cpuperf.train.worker", "--config", cfg, "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [p.communicate(timeout=180) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 12], results
    records = all_json_lines(out / "metrics.jsonl")
    steps = [r["step"] for r in records if r["type"] == "step"]
    assert steps == list(range(1, 41)) and records[-1]["type"] == "summary"
    import torch

    assert torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)["step"] == 40


def test_existing_run_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    done = run_cli(["train", *MICRO, "--max-steps", "10", "--out", str(out)], timeout=120)
    assert done.returncode == 0, done.stderr
    before = {name: digest(out / name) for name in ("metrics.jsonl", "checkpoint.pt")}
    again = run_cli(["train", *MICRO, "--max-steps", "5", "--out", str(out), "--json"], timeout=120)
    assert again.returncode == 2, again.stderr
    err = json.loads(again.stdout)["error"]
    assert "already holds a run" in err["message"] and "--resume" in err["hint"]
    assert len([line for line in again.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "Traceback" not in again.stderr
    assert {name: digest(out / name) for name in before} == before
    # a resumed run appends: the first run's lines stay, byte for byte, at the start
    old = (out / "metrics.jsonl").read_bytes()
    resumed = run_cli(["train", *MICRO, "--max-steps", "15", "--out", str(out), "--resume"], timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "metrics.jsonl").read_bytes().startswith(old)
    assert [r["type"] for r in all_json_lines(out / "metrics.jsonl")].count("summary") == 2


def test_stale_lock_of_a_dead_run_is_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                           "started": time.time() - 60, "token": "x"}))
    proc = run_cli(["train", *MICRO, "--max-steps", "3", "--out", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "stale lock" in proc.stderr and f"pid {dead.pid}" in proc.stderr
    # a lock file holding garbage (binary) is no obstacle either
    (out / ".lock").write_bytes(b"\xff\xfe\x00garbage")
    proc = run_cli(["train", *MICRO, "--max-steps", "6", "--out", str(out), "--resume"], timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("sig,ranks", [(signal.SIGKILL, 2), (signal.SIGHUP, 1), (signal.SIGTERM, 2)])
def test_no_rank_outlives_cpuperf(tmp_path, sig, ranks):
    out = tmp_path / f"run-{sig.name}-{ranks}"
    proc = start(out, "--max-steps", "100000", "--nproc-per-node", str(ranks), "--set", "ckpt_every=1000")
    try:
        assert wait_for(lambda: steps_logged(out) >= 1), proc.stderr.read() if proc.poll() is not None else ""
        assert len(survivors(str(out))) >= 1 + ranks  # cpuperf (+ torchrun) and the ranks, by cmdline
        proc.send_signal(sig)
        gone = wait_for(lambda: not [p for p in survivors(str(out)) if p != proc.pid], timeout=25)
        left = survivors(str(out))
        assert gone, f"still running after {sig.name}: {left}"
        proc.wait(timeout=30)
    finally:
        for pid in survivors(str(out)):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    if sig != signal.SIGKILL:
        assert proc.returncode == 128 + sig  # SIGHUP 129, SIGTERM 143
        assert "Traceback" not in proc.stderr.read()


@pytest.mark.full  # a real run, SIGKILL, a resumed run
def test_a_run_killed_and_resumed_draws_one_series(tmp_path):
    """SIGKILL of the built-in loop before its first checkpoint, then --resume (from step 0): metrics.jsonl kept
    the killed attempt's lines and `cpuperf plot` drew steps 1, 10, 1, 10, 20 (issue 53, case 4). Each attempt
    starts with its settings record (resumed_from); the plot draws each step once, the last attempt's."""
    from cpuperf.render.plot import parse_metrics

    out = tmp_path / "run"
    proc = start(out, "--max-steps", "100000", "--set", "ckpt_every=100000")
    try:
        assert wait_for(lambda: steps_logged(out) >= 2), proc.stderr.read() if proc.poll() is not None else ""
        for pid in survivors(str(out)):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        for pid in survivors(str(out)):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    killed = steps_logged(out)
    resumed = run_cli(["train", *MICRO, "--max-steps", "15", "--out", str(out), "--resume", "--json"], timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = all_json_lines(out / "metrics.jsonl")
    assert [r.get("resumed_from") for r in records if r["type"] == "settings"] == [None, None]  # both marked
    assert steps_logged(out) > killed
    steps = [x for x, _ in parse_metrics((out / "metrics.jsonl").read_text()).loss]
    assert steps == sorted(set(steps)) and steps[-1] == 15, steps
    drawn = json.loads(run_cli(["plot", str(out), "--json"]).stdout)["series"]
    assert [pt[0] for pt in drawn["loss"]] == steps


def test_stop_before_the_first_step_claims_no_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = start(out, "--max-steps", "100000", "--json")
    try:
        assert wait_for(lambda: [p for p in survivors(str(out)) if p != proc.pid], timeout=60)
        proc.send_signal(signal.SIGTERM)  # the worker is still starting: nothing to checkpoint
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-2000:]
    if not (out / "checkpoint.pt").exists():
        assert "no checkpoint was written" in stderr and "the last checkpoint" not in stderr
        assert json.loads(stdout)["error"]["hint"] is None


def test_readme_line_runs_twice_without_out_each_in_a_new_version_dir(tmp_path):
    """`cpuperf train --auto` twice in a row (the README's first line): runs/train/version_0, then version_1,
    both exit 0 and say where they wrote; --resume without --out continues the newest; --dry-run creates nothing."""
    env = {"PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = ["train", "--auto", *MICRO, "--max-steps", "3"]
    dry = run_cli([*args, "--dry-run", "--json"], extra_env=env, cwd=str(tmp_path))
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["settings"]["out_dir"] == str(tmp_path / "runs" / "train" / "version_0")
    assert not (tmp_path / "runs").exists()  # a plan writes nothing
    for n in (0, 1):
        proc = run_cli(args, extra_env=env, cwd=str(tmp_path), timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        where = tmp_path / "runs" / "train" / f"version_{n}"
        assert f"run directory {where.relative_to(tmp_path)}" in proc.stderr
        assert f"  run dir: {where.relative_to(tmp_path)}" in proc.stderr  # and in the closing summary
        assert (where / "checkpoint.pt").is_file()
    resumed = run_cli(["train", "--auto", *MICRO, "--max-steps", "5", "--resume"], extra_env=env,
                      cwd=str(tmp_path), timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    said = " ".join(resumed.stderr.split())  # a message wrapped to the terminal, read as one line
    assert f"resuming {Path('runs') / 'train' / 'version_1'} (the newest run with a checkpoint)" in said
    assert sorted(p.name for p in (tmp_path / "runs" / "train").iterdir()) == ["version_0", "version_1"]
    # --out keeps its meaning: an existing run is refused without --resume
    again = run_cli([*args, "--out", str(tmp_path / "runs" / "train" / "version_0")], extra_env=env,
                    cwd=str(tmp_path), timeout=180)
    assert again.returncode == 2 and "already holds a run" in again.stderr
