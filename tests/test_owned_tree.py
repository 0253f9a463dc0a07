"""The run's processes are found by a handle that `env -i` and `setsid` cannot escape (issue 53, case 6): cpuperf
adopts what its job detaches (PR_SET_CHILD_SUBREAPER), so the process tree under it holds them, and they are ended
after the run, when cpuperf is killed (the watchdog noted them), and after each `--tune` candidate. Real processes:
each `sleep` has a number of its own, found in /proc by its command line."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from cli_util import cli_env

FAKE = str(Path(__file__).parent / "fixtures" / "scripts" / "fake_trainer.py")


def _sleeping(seconds: int) -> List[int]:
    """Live processes running `sleep SECONDS` (SECONDS is the test's own number)."""
    needle = f"sleep\0{seconds}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if cmd.endswith(needle) and state != "Z":
            found.append(int(name))
    return found


def _gone(*numbers: int, within: float = 8.0) -> bool:
    end = time.monotonic() + within
    while any(_sleeping(n) for n in numbers) and time.monotonic() < end:
        time.sleep(0.1)
    left = [pid for n in numbers for pid in _sleeping(n)]
    for pid in left:  # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    return not left


def _number() -> int:
    return random.randrange(5_000_000, 9_000_000)


@pytest.mark.full  # a real run of a user's command
def test_what_a_command_detaches_with_setsid_and_env_i_ends_with_the_run(tmp_path):
    u = _number()
    line = f"env -i setsid sh -c 'trap \"\" TERM HUP; exec sleep {u}' & exit 0"
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "train", "--auto", "--out", str(tmp_path / "r"), "--",
                           "bash", "-c", line], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert _gone(u, within=2.0), "a process the command detached outlived the run"


@pytest.mark.full  # a real run, SIGKILL of cpuperf
def test_what_a_command_detaches_ends_when_cpuperf_is_killed(tmp_path):
    """`train --auto -- bash -c 'env -i setsid sleep A & sleep B & wait'`, then kill -9 of cpuperf: sleep A (no
    group, no marker) survived."""
    a, b = _number(), _number()
    proc = subprocess.Popen([sys.executable, "-m", "cpuperf", "train", "--auto", "--out", str(tmp_path / "r"), "--",
                             "bash", "-c", f"env -i setsid sleep {a} & sleep {b} & wait"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env())
    try:
        end = time.monotonic() + 60
        while not (_sleeping(a) and _sleeping(b)) and time.monotonic() < end:
            time.sleep(0.1)
        assert _sleeping(a) and _sleeping(b), "the command never started"
        time.sleep(0.6)  # the watchdog notes the tree four times a second
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone(a, b), "still running after SIGKILL of cpuperf"
    finally:
        if proc.poll() is None:
            proc.kill()
        _gone(a, b, within=0)


@pytest.mark.full  # real tuning runs
def test_no_tune_candidate_leaves_what_it_detached(tmp_path):
    """`train --tune` on a command whose script starts `setsid env -i sh -c "trap '' TERM HUP; exec sleep N"`: one
    such process was left per candidate (12)."""
    u = _number()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "runs").mkdir()
    env = cli_env({"CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp"),
                   "FAKE_MODE": "detach", "FAKE_SLEEP": str(u), "FAKE_DIR": str(tmp_path / "runs")})
    try:
        proc = subprocess.run([sys.executable, "-m", "cpuperf", "train", "--tune", "--budget", "30", "--",
                               sys.executable, FAKE, "--output_dir", str(tmp_path / "o")],
                              capture_output=True, text=True, env=env, timeout=180)
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-2000:]
        assert proc.returncode in (0, 1), proc.stderr[-2000:]  # tuned, or not saved and said why
        assert list((tmp_path / "runs").iterdir())  # the command ran (once or per candidate), detaching its sleep
    finally:
        assert _gone(u, within=3.0), "a candidate's detached process outlived the search"
