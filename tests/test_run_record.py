"""What a run leaves and says: real `cpuperf train` runs of the built-in loop and of small user scripts (a plain loop,
an HF Trainer, a Lightning script). Each run's directory holds its plan, its full log, its exit status and timings,
and the metrics its framework reported; the end of every run fits one 80x24 screen; `cpuperf plot` draws such a
run or says why not in one line; no empty directory is left behind."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List

import pytest
from cli_util import run_cli

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
NARROW = {"COLUMNS": "80", "PYTHONWARNINGS": "ignore"}


def _tail_after(stderr: str, last_own: str) -> List[str]:
    """The stderr lines after the job's last line of its own (all of them where it has none)."""
    lines = stderr.splitlines()
    marks = [i for i, line in enumerate(lines) if last_own and last_own in line]
    return lines[marks[-1] + 1:] if marks else lines


def _fits_one_screen(stderr: str, last_own: str) -> None:
    tail = _tail_after(stderr, last_own)
    assert len(tail) <= 24, "\n".join(tail)
    assert all(len(line) <= 80 for line in tail), "\n".join(line for line in tail if len(line) > 80)


def _run_dir(cwd: Path) -> Path:
    found = sorted((cwd / "runs" / "train").iterdir())
    assert len(found) == 1, found
    return found[0]


def _status(run: Path) -> dict:
    status = json.loads((run / "status.json").read_text())
    assert status["schema"] == "cpuperf.run-status/1" and status["run_dir"] == str(run)
    assert status["wall_s"] > 0 and status["started"] <= status["ended"]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["schema"] == "cpuperf.train-plan/1" and plan["levers"]["applied"]  # the full lever report
    return status


@pytest.mark.full  # a real run of the built-in loop
def test_the_builtin_run_ends_on_one_screen_and_records_itself(tmp_path):
    pytest.importorskip("torch")
    proc = run_cli(["train", "--model", "micro", "--max-steps", "4", "--set", "log_every=2", "--set", "eval_every=0"],
                   extra_env=NARROW, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _fits_one_screen(proc.stderr, "step 4/4")
    assert "lever applied" not in proc.stderr  # the short report, once, before the job
    assert proc.stderr.count("levers applied:") == 1 and "the full lever report: runs/train/version_0/plan.json" in proc.stderr
    run = _run_dir(tmp_path)
    status = _status(run)
    assert (status["kind"], status["status"], status["exit_code"], status["signal"]) == ("builtin", "completed", 0, None)
    assert status["metrics"]["samples_per_s"] > 0 and (run / "logs" / "output.log").stat().st_size > 0
    assert "cpuperf train: completed in" in proc.stderr and "  plot: runs/train/version_0/plot.svg" in proc.stderr


@pytest.mark.full  # a real torch loop
def test_a_plain_script_run_holds_its_log_plan_status_and_timings(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "fixture.json"
    proc = run_cli(["train", "--auto", "--", sys.executable, str(SCRIPTS / "plain_loop.py"), "--steps", "2"],
                   extra_env={**NARROW, "FIXTURE_OUT": str(out)}, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _fits_one_screen(proc.stderr, "")  # the script says nothing: the whole of stderr fits
    run = _run_dir(tmp_path)
    status = _status(run)
    assert (status["kind"], status["status"], status["exit_code"]) == ("script", "completed", 0)
    assert status["command"][-3:] == [str(SCRIPTS / "plain_loop.py"), "--steps", "2"]
    assert status["log"] == str(run / "logs" / "output.log") and status["metrics"] is None
    assert "run dir: runs/train/version_0" in proc.stderr and "log: runs/train/version_0/logs/output.log" in proc.stderr
    plot = run_cli(["plot", str(run)])  # nothing to draw: said in the run's terms, on one line
    errors = [line for line in plot.stderr.splitlines() if line.startswith("error:")]
    assert plot.returncode == 2 and len(errors) == 1 and "is a run of plain_loop.py (exit 0)" in errors[0], plot.stderr


def test_quiet_keeps_the_summary_and_verbose_gives_the_full_report(tmp_path):
    script = tmp_path / "says_hi.py"
    script.write_text("print('hi')\n")
    argv = ["--", sys.executable, str(script)]
    env = NARROW
    quiet = run_cli(["train", "--auto", "-q", *argv], extra_env=env, cwd=str(tmp_path), timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.startswith("cpuperf train: completed in") and "levers" not in quiet.stderr, quiet.stderr
    loud = run_cli(["train", "--auto", "-v", *argv], extra_env=env, cwd=str(tmp_path), timeout=300)
    assert loud.returncode == 0, loud.stderr
    assert "lever applied: threads_per_rank=" in loud.stderr and "applied: launcher direct" in loud.stderr
    tail = _tail_after(loud.stderr, "lever ")  # the full report comes before the job, never after it
    assert tail[0].startswith("cpuperf train: completed in") and len(tail) <= 24, loud.stderr


def test_a_failing_script_records_its_exit_code_and_says_so(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    proc = run_cli(["train", "--", sys.executable, str(script)], extra_env=NARROW, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 3, proc.stderr
    run = _run_dir(tmp_path)
    status = _status(run)
    assert (status["status"], status["exit_code"]) == ("failed", 3)
    assert "about to fail" in (run / "logs" / "output.log").read_text()  # tee'd: shown and kept
    assert "about to fail" in proc.stdout  # the script's stdout is still its own, on ours
    assert "cpuperf train: failed in" in proc.stderr and ", exit 3" in proc.stderr


def test_a_command_that_cannot_start_is_refused_before_any_run_directory(tmp_path):
    """Its program found on no PATH: one error line, exit 8, before anything is made (no empty version_N left)."""
    proc = run_cli(["train", "--", str(tmp_path / "no-such-program")], extra_env=NARROW, cwd=str(tmp_path))
    assert proc.returncode == 8, proc.stderr[-2000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")] == [proc.stderr.splitlines()[0]]
    assert "command not found" in proc.stderr and not (tmp_path / "runs").exists()


@pytest.mark.full  # a real Trainer run
def test_a_trainer_run_holds_its_metrics_and_plots(tmp_path):
    pytest.importorskip("transformers")
    argv = [sys.executable, str(SCRIPTS / "hf_logged.py"), "--output_dir", str(tmp_path / "hf"), "--max_steps", "4",
            "--per_device_train_batch_size", "2", "--logging_steps", "1", "--report_to", "none",
            "--save_strategy", "no", "--disable_tqdm", "true"]
    proc = run_cli(["train", "--auto", "--", *argv], extra_env=NARROW, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _fits_one_screen(proc.stderr, "hf_logged: done")
    run = _run_dir(tmp_path)
    metrics = _status(run)["metrics"]
    assert metrics["framework"] == "transformers" and metrics["train_samples_per_second"] > 0
    assert "samples/s (transformers)" in proc.stderr
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and all(s["loss"] > 0 for s in steps)
    plot = run_cli(["plot", str(run), "--json"])
    assert plot.returncode == 0 and json.loads(plot.stdout)["steps"] == 4, plot.stderr


@pytest.mark.full  # a real Lightning run
def test_a_lightning_run_holds_its_logged_loss(tmp_path):
    pytest.importorskip("lightning")
    proc = run_cli(["train", "--auto", "--", sys.executable, str(SCRIPTS / "lightning_csv.py")], extra_env=NARROW,
                   cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _fits_one_screen(proc.stderr, "lightning_csv: done")
    run = _run_dir(tmp_path)
    metrics = _status(run)["metrics"]
    assert metrics["framework"] == "lightning" and "train_loss" in metrics
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4


@pytest.mark.full  # a real Lightning run, twice
def test_lightnings_empty_version_dirs_are_not_left_behind(tmp_path):
    pytest.importorskip("lightning")
    script = tmp_path / "quiet_lightning.py"  # Lightning's default logger, nothing logged, no checkpoint
    script.write_text((SCRIPTS / "lightning_loop.py").read_text().replace("logger=False, ", "")
                      .replace("from _record import record\n", "").replace("record({", "print({"))
    for _ in range(2):
        proc = run_cli(["train", "--", sys.executable, str(script)], extra_env=NARROW,
                       cwd=str(tmp_path), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tmp_path / "lightning_logs").exists()  # each run's empty version_N removed, then the folder
    assert [p.name for p in sorted((tmp_path / "runs" / "train").iterdir())] == ["version_0", "version_1"]
    assert all((p / "status.json").is_file() for p in (tmp_path / "runs" / "train").iterdir())


def test_messages_are_wrapped_to_the_width_and_errors_stay_one_line(capsys, monkeypatch):
    from cpuperf.output import Output, message

    monkeypatch.setenv("COLUMNS", "80")
    long = "cpuperf train: " + " ".join(f"word{i}" for i in range(40))
    message(long)
    Output().error(long, hint="a hint")
    err = capsys.readouterr().err.splitlines()
    wrapped = [line for line in err if not line.startswith(("error:", "  hint:"))]
    assert len(wrapped) > 1 and all(len(line) <= 80 for line in wrapped)
    assert " ".join(line.strip() for line in wrapped) == long
    assert [line for line in err if line.startswith("error:")] == [f"error: {long}"]


def test_the_dry_run_command_is_wrapped_and_still_one_shell_command(tmp_path):
    import subprocess

    from cpuperf.render.run_report import shell_wrapped

    config = json.dumps({f"key{i}": f"it's {i}" for i in range(40)})
    argv = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", "--config", config]
    env = {"A": "one two", "B": "x" * 150}
    for width in (80, 120):
        text = shell_wrapped(argv, env, width)
        assert all(len(line) <= width for line in text.splitlines()), text
        ran = subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=True)
        assert json.loads(ran.stdout) == ["--config", config]
    dry = run_cli(["train", "--auto", "--dry-run"], extra_env={"COLUMNS": "80"}, cwd=str(tmp_path))
    assert dry.returncode == 0 and all(len(line) <= 80 for line in dry.stdout.splitlines()), dry.stdout
    assert not os.path.exists(tmp_path / "runs")


def test_a_projects_own_files_are_not_replaced_under_out_dot(tmp_path):
    """`--out .` in a project that keeps its own plan.json (cpuperf recommend --save plan.json) and status.json:
    the run leaves them as they are, says so, and runs."""
    (tmp_path / "plan.json").write_text('{"mine": true}\n')
    (tmp_path / "status.json").write_text("my own\n")
    script = tmp_path / "says_hi.py"
    script.write_text("print('hi')\n")
    proc = run_cli(["train", "--out", ".", "--", sys.executable, str(script)], extra_env={"COLUMNS": "400"},
                   cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "plan.json").read_text() == '{"mine": true}\n' and (tmp_path / "status.json").read_text() == "my own\n"
    assert "no plan.json in the run directory" in proc.stderr and "status.json is not cpuperf's" in proc.stderr
    assert "hi" in (tmp_path / "logs" / "output.log").read_text()
    assert "  plan: " not in proc.stderr  # the summary names no plan it did not write
