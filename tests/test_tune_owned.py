"""`train --tune` owns what it starts (issue 42): commands that hang, fork, never report or report `inf`, and a
cpuperf stopped or killed mid-search. Real processes throughout: the budget holds within a few seconds, nothing
of the command's is left running (every process it started carries FAKE_TAG in its environment), the search's
temporary directories are gone, and a tuning that compared nothing is not saved and says why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List

import pytest
from cli_util import cli_env

from cpuperf.errors import ExitCode

FAKE = str(Path(__file__).parent / "fixtures" / "scripts" / "fake_trainer.py")
SLACK_S = 12.0  # cpuperf's own start (probe, plan) on a loaded 2-core host, and the kill of the last run


def _left(tag: str) -> List[int]:
    """Processes that still carry the test's tag in their environment."""
    needle = f"FAKE_TAG={tag}".encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if needle in fh.read() + b"\0":
                        found.append(int(name))
            except OSError:
                pass
    return found


def _gone(tag: str, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while _left(tag) and time.monotonic() < end:
        time.sleep(0.1)
    leftover = _left(tag)
    for pid in leftover:  # never leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return not leftover


def _env(tmp: Path, mode: str, tag: str, **extra: str) -> Dict[str, str]:
    (tmp / "tmp").mkdir(exist_ok=True)
    (tmp / "runs").mkdir(exist_ok=True)
    return cli_env({"CPUPERF_CACHE_DIR": str(tmp / "cache"), "TMPDIR": str(tmp / "tmp"), "FAKE_MODE": mode,
                    "FAKE_TAG": tag, "FAKE_DIR": str(tmp / "runs"), **extra})


def _tune(tmp: Path, mode: str, budget: float, **extra: str):
    tag = uuid.uuid4().hex
    argv = [sys.executable, "-m", "cpuperf", "train", "--tune", "--budget", str(budget), "--json", "--",
            sys.executable, FAKE, "--output_dir", str(tmp / "o")]
    began = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(tmp, mode, tag, **extra),
                          timeout=budget + 120)
    return proc, time.monotonic() - began, tag


def _cached_commands(tmp: Path) -> Dict[str, object]:
    files = list((tmp / "cache" / "measurements").glob("*.json"))
    return json.loads(files[0].read_text()).get("tuned_by_command", {}) if files else {}


@pytest.mark.full  # real tuning runs within their budget
@pytest.mark.parametrize("mode", ["hang", "fork", "silent", "inf"])
def test_a_misbehaving_command_cannot_outlive_the_budget_or_leave_anything(tmp_path, mode):
    budget = 10.0
    proc, took, tag = _tune(tmp_path, mode, budget)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-2000:]
    assert took <= budget + SLACK_S, (mode, took, proc.stderr[-2000:])
    assert _gone(tag), f"{mode}: processes left: {_left(tag)}"
    assert list((tmp_path / "tmp").iterdir()) == []  # the search's and its runs' temporary directories
    assert list((tmp_path / "runs").iterdir())  # the command did run
    if mode == "fork":  # a figure per run: either a tuning of two settings or more, or refused saying why
        if proc.returncode == 0:
            got = json.loads(proc.stdout)
            assert got["levers"] and len(_cached_commands(tmp_path)) == 1
        else:
            assert proc.returncode == ExitCode.FOUND_ERROR and "not saved as a tuning" in proc.stderr
            assert "--budget" in proc.stderr and _cached_commands(tmp_path) == {}
        return
    # hang: stopped at the budget; silent and inf: no figure (inf samples/s is none), so nothing tuned
    assert proc.returncode in (ExitCode.FOUND_ERROR, ExitCode.LAUNCH_FAILED), proc.stderr[-2000:]
    assert _cached_commands(tmp_path) == {}
    json.loads(proc.stdout)  # --json: the error as an object
    if mode == "hang":
        assert "did not end within the 10 s budget" in proc.stderr and "not saved as a tuning" in proc.stderr


@pytest.mark.full  # a real tuning run
@pytest.mark.parametrize("code", [1, 3])
def test_a_command_that_fails_gives_tune_its_own_exit_code(tmp_path, code):
    """`--tune` on a command that exits 1 returned 8 ("a launcher missing or a rank died"): a run of the command
    returns the command's code, and so does a tuning of it (issue 53, case 15)."""
    proc, _, tag = _tune(tmp_path, "fail", 30.0, FAKE_CODE=str(code))
    assert proc.returncode == code, proc.stderr[-2000:]
    assert f"exited with code {code}" in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == code
    assert _gone(tag) and _cached_commands(tmp_path) == {}


@pytest.mark.full  # real tuning runs, real signals
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_cpuperf_stopped_or_killed_mid_search_leaves_nothing(tmp_path, sig):
    tag = uuid.uuid4().hex
    argv = [sys.executable, "-m", "cpuperf", "train", "--tune", "--budget", "120", "--", sys.executable, FAKE,
            "--output_dir", str(tmp_path / "o")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path, "hang", tag))
    try:
        end = time.monotonic() + 90
        while not list((tmp_path / "runs").iterdir()) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        assert list((tmp_path / "runs").iterdir()), "the command never started"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)  # stopped at once, not at the budget
    finally:
        proc.kill()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 128 + sig, err[-2000:]
        assert "stopped by" in err and "Traceback" not in err
    assert _gone(tag, within=8.0), f"left: {_left(tag)}"
    end = time.monotonic() + 8  # SIGKILL: the watchdog removes the directories once the pipe closes
    while list((tmp_path / "tmp").iterdir()) and time.monotonic() < end:
        time.sleep(0.1)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert _cached_commands(tmp_path) == {}


@pytest.mark.full  # a real tuning run
def test_a_command_too_slow_for_the_budget_takes_fewer_steps_or_says_what_budget_would_do(tmp_path):
    """The run's length is the test's (FAKE_SECONDS): no budget holds 7 runs of it, at any step count (its
    train_runtime is a small part of the run), so the command says so and what budget would, and saves nothing."""
    proc, took, tag = _tune(tmp_path, "slow", 20.0, FAKE_SECONDS="6")
    assert proc.returncode == ExitCode.FOUND_ERROR, proc.stderr[-2000:]
    assert "not saved as a tuning" in proc.stderr and "--budget " in proc.stderr, proc.stderr[-2000:]
    assert took <= 20.0 + SLACK_S and _gone(tag) and _cached_commands(tmp_path) == {}


def test_the_key_is_the_exact_argument_list_and_the_script(tmp_path):
    from command_util import command_key

    script = tmp_path / "t.py"
    base = ["python", str(script), "--model", "a", "--model", "b", "--output_dir", "x", "--max_steps", "3"]
    assert command_key(base, "v1") == command_key([*base[:6], "--max_steps", "500", "--output_dir", "y"], "v1")
    assert command_key(base, "v1") != command_key(["python", str(script), "--model", "b", "--model", "a",
                                                  "--output_dir", "x"], "v1")  # order is the command's
    assert command_key(base, "v1") != command_key(base, "v2")  # an edited script is another command


@pytest.mark.full  # a real tuning run
def test_an_auto_run_says_which_tuning_it_used(tmp_path):
    """The fake reports steady figures: a tuning of several settings is saved, and the next --auto plan names it
    (each lever as judged: a lever a loaded host left undecided is the rule's, and named, the others stand)."""
    proc, _, tag = _tune(tmp_path, "ok", 60.0)
    assert _gone(tag)
    env = _env(tmp_path, "ok", tag)
    plan = subprocess.run([sys.executable, "-m", "cpuperf", "train", "--auto", "--dry-run", "--", sys.executable, FAKE,
                           "--output_dir", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=120)
    assert plan.returncode == 0, plan.stderr[-2000:]
    said = plan.stdout + plan.stderr
    if proc.returncode == 0:
        assert "the tuning of this command from" in said, said[-3000:]
    else:  # the budget compared nothing on a loaded host: refused, and the plan says none is cached
        assert "not saved as a tuning" in proc.stderr
        assert "no tuning of this command is cached" in said
    (tmp_path / "other.py").write_text(Path(FAKE).read_text() + "\n# edited\n")
    plan = subprocess.run([sys.executable, "-m", "cpuperf", "train", "--auto", "--dry-run", "--", sys.executable,
                           str(tmp_path / "other.py"), "--output_dir", str(tmp_path / "o")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert "no tuning of this command is cached" in plan.stdout + plan.stderr
