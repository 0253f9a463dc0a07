"""A user's first hour with `cpuperf train`: an option is never silently dropped, every hint printed is a command that
works as printed, and a command that cannot start fails before launch with one line and its own documented code
(docs/exit-codes.md, docs/commands.md). Real processes: the CLI in-process (tests/cli_util.py) starting real
scripts; the resume hint after a real SIGINT of a real built-in run (full tier)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from cli_util import cli_env, run_cli

# A plain script (argparse, no Trainer, no torch): it records the arguments it ran with, and exits with --code.
PLAIN = '''
import argparse, json, sys
ap = argparse.ArgumentParser()
ap.add_argument("--max-steps", type=int, default=20)
ap.add_argument("--code", type=int, default=0)
a = ap.parse_args()
open(sys.argv[0] + ".ran", "w").write(json.dumps({"max_steps": a.max_steps}))
sys.exit(a.code)
'''

PATH_ENV = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "plain_train.py"
    script.write_text(PLAIN)
    return script


def _ran(script: Path) -> object:
    ran = Path(str(script) + ".ran")
    return json.loads(ran.read_text()) if ran.is_file() else None


def _hint(stderr: str) -> str:
    """The command a `hint: cpuperf ...` line prints (up to the words that say what it does)."""
    line = next(x for x in stderr.splitlines() if x.strip().startswith("hint:"))
    found = re.search(r"(cpuperf train .*?)(?: continues from|$)", line)
    assert found, line
    return found.group(1)


def _error_lines(stderr: str) -> List[str]:
    return [x for x in stderr.splitlines() if x.startswith("error:")]


def test_a_command_without_dashes_whose_options_train_would_take_is_refused_and_the_hint_runs(tmp_path):
    script = _script(tmp_path)
    proc = run_cli(["train", "--auto", "--out", str(tmp_path / "run"), "python", str(script), "--max-steps", "3"],
                   extra_env=PATH_ENV, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert len(_error_lines(proc.stderr)) == 1 and "--max-steps" in proc.stderr and "`--`" in proc.stderr
    assert _ran(script) is None  # refused before anything ran
    hint = _hint(proc.stderr)
    assert " -- python " in hint
    again = run_cli(shlex.split(hint)[1:], extra_env=PATH_ENV, cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr[-2000:]
    assert _ran(script) == {"max_steps": 3}  # the script's own option reached it


@pytest.mark.parametrize("option", [["--max-steps", "3"], ["--time-budget", "5"], ["--seed", "1"], ["--resume"],
                                    ["--batch-size", "4"], ["--set", "dtype=bf16"], ["--model", "small"]])
def test_an_option_your_command_cannot_take_is_refused_before_it_runs(tmp_path, option):
    script = _script(tmp_path)
    proc = run_cli(["train", "--auto", *option, "--out", str(tmp_path / "run"), "--", "python", str(script),
                    "--max-steps", "10"], extra_env=PATH_ENV, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and option[0] in errors[0], proc.stderr
    assert "your script its own option" in proc.stderr or "your script's own arguments" in proc.stderr
    assert _ran(script) is None


@pytest.mark.parametrize("before", [[], ["torchrun", "--nproc-per-node", "2"]])
def test_a_missing_script_fails_before_launch_with_exit_2(tmp_path, before):
    launcher = [os.path.join(os.path.dirname(sys.executable), "torchrun")] if before else ["python"]
    proc = run_cli(["train", "--out", str(tmp_path / "run"), "--", *launcher, *before[1:], "nosuch.py"],
                   extra_env=PATH_ENV, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert _error_lines(proc.stderr) == [f"error: nosuch.py: no such script (your command runs "
                                         f"{shlex.join([*launcher, *before[1:], 'nosuch.py'])} in {tmp_path})"]
    assert "Traceback" not in proc.stderr and "can't open file" not in proc.stderr  # nothing was launched


def test_a_missing_program_is_command_not_found_exit_8(tmp_path):
    proc = run_cli(["train", "--out", str(tmp_path / "run"), "--", "pythn", "x.py"], cwd=str(tmp_path))
    assert proc.returncode == 8, proc.stderr
    assert _error_lines(proc.stderr) == ["error: pythn: command not found (no such program on PATH or at that path)"]
    assert "--launcher" not in proc.stderr


def test_out_naming_a_file_is_exit_2(tmp_path):
    script = _script(tmp_path)
    proc = run_cli(["train", "--out", str(script), "--", "python", str(script)], extra_env=PATH_ENV, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert _error_lines(proc.stderr) == [f"error: --out {script}: not a directory (a file of that name is there)"]
    assert _ran(script) is None


@pytest.mark.parametrize("code", [1, 2, 8, 42])
def test_your_commands_own_code_passes_through_and_is_said_as_its_own(tmp_path, code):
    script = _script(tmp_path)
    proc = run_cli(["train", "--json", "--out", str(tmp_path / "run"), "--", "python", str(script), "--code",
                    str(code)], extra_env=PATH_ENV, cwd=str(tmp_path))
    assert proc.returncode == code, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == code and error["name"] != "usage"
    assert f"your command exited with code {code}" in error["message"]
    # a code cpuperf gives a meaning of its own (docs/exit-codes.md) is said to be the job's
    assert ("passed through: not cpuperf's" in error["message"]) == (code != 42)


@pytest.mark.full  # a real built-in run, a real SIGINT, the printed hint run as printed
def test_the_resume_hint_after_ctrl_c_runs_as_printed(tmp_path):
    out = tmp_path / "run"
    first = ["train", "--auto", "--model", "micro", "--max-steps", "30", "--set", "log_every=1", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "cpuperf", *first], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env(), cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 180
        metrics = out / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.is_file() and '"type": "step"' in metrics.read_text()):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    hint = _hint(stderr)
    words = shlex.split(hint)
    assert words[:2] == ["cpuperf", "train"] and "--resume" in words and str(out) in words
    assert {"--auto", "--model", "micro", "--max-steps", "30"} <= set(words)
    # run from another directory: the hint names the run directory as a whole path
    again = subprocess.run([sys.executable, "-m", "cpuperf", *words[1:], "--json"], capture_output=True, text=True,
                           env=cli_env(), cwd=str(tmp_path.parent), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    data = json.loads(again.stdout)
    assert data["resumed_from"] >= 1 and data["steps"] == 30


def test_a_plain_scripts_run_says_nothing_untrue(tmp_path):
    """An --auto run of a plain script: no `--tune` suggested (it takes Trainer scripts only), no `--preload` (train has
    none), --auto said as the recommended settings (a short run is not tuned), the batch lever as the plan's figure."""
    script = _script(tmp_path)
    proc = run_cli(["train", "--auto", "-v", "--out", str(tmp_path / "run"), "--", "python", str(script)],
                   extra_env=PATH_ENV, cwd=str(tmp_path))  # -v: each lever's line, the batch's included
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--tune" not in proc.stderr and "--preload" not in proc.stderr and "tuned (--auto)" not in proc.stderr
    assert "the recommended settings (--auto)" in proc.stderr
    said = " ".join(proc.stderr.split())  # lines wrapped to the terminal, read whole
    batch = said[said.index("lever not applied: batch_size="):]
    assert "the plan's figure, not passed to it" in batch[:400]


def test_a_progress_repeat_never_says_the_same_step_again():
    """The timer's repeat of a line whose step has moved on says work goes on after it ('GEMM round 3' said twice read
    as a round measured twice)."""
    from cpuperf.output import Progress

    lines: List[str] = []
    with Progress(lines.append, "measuring", every=0.3, gap=10) as p:
        p.update("GEMM round 3: bf16/fp32 2.4x", now=True)
        time.sleep(1.0)
    assert lines[0].startswith("measuring: GEMM round 3: bf16/fp32 2.4x (")
    assert len(lines) >= 2 and all(x.startswith("measuring: still working; last: GEMM round 3") for x in lines[1:])


def test_the_rank_torchrun_stopped_with_sigterm_is_not_the_cause():
    """Rank 0 exits 2 and torchrun stops rank 1 with SIGTERM, both seen gone within one poll: rank 0 failed first (the
    line said `rank 1 failed first (exit code 143 = killed by SIGTERM)`); a SIGKILL stays the cause."""
    from cpuperf.plan.launch import first_failure

    text = ("Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 2 (pid: 1)\n"
            "[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : {code} (pid: 2)\n")
    assert first_failure(text.format(code=-15), [0, 1]) == (0, 2)
    assert first_failure(text.format(code=-9), [0, 1]) == (1, 137)


@pytest.mark.full  # real ranks under torchrun
def test_a_rank_of_yours_that_fails_first_is_named_with_its_own_code(tmp_path):
    script = tmp_path / "rank_fails.py"
    script.write_text("import os, sys, time\nif os.environ.get('RANK') == '0':\n    sys.exit(2)\ntime.sleep(60)\n")
    proc = run_cli(["train", "--nproc-per-node", "2", "--out", str(tmp_path / "run"), "--", "python", str(script)],
                   extra_env=PATH_ENV, cwd=str(tmp_path), process=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert _error_lines(proc.stderr)[0].startswith("error: rank 0 failed first (exit code 2) (code 2 is the job's own")
