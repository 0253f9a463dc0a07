"""Newcomer paths: the README's benchmark line installs what its workloads import, or a workload that
cannot run says why and the rest goes on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from benchmarks import user_scripts

ROOT = Path(__file__).resolve().parent.parent


def _extra(name: str) -> list:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [re.split(r"[<>=!~ \[]", req, maxsplit=1)[0].lower() for req in data["project"]["optional-dependencies"][name]]


def test_bench_extra_installs_every_module_a_workload_imports():
    bench = set(_extra("bench"))
    needed = {m for mods in user_scripts.NEEDS.values() for m in mods}
    assert needed <= bench, needed - bench
    # and NEEDS is true to the scripts: every third-party module they import is listed
    for script in (ROOT / "benchmarks" / "scripts").glob("*.py"):
        imported = set(re.findall(r"^\s*(?:from|import) (transformers|accelerate|lightning)\b", script.read_text(), re.M))
        assert imported <= needed, (script.name, imported - needed)


def test_a_workload_whose_modules_are_missing_says_why_and_the_table_keeps_going(monkeypatch):
    monkeypatch.setitem(user_scripts.NEEDS, "hf-trainer", ("cpuperf_no_such_module",))
    lines: list = []
    res = user_scripts.bench_user_script("hf-trainer", rounds=3, steps=5, log=lines.append)
    assert res["skipped"] == "not run: cpuperf_no_such_module not installed (pip install -e '.[bench]')"
    assert lines == [f"  hf-trainer: {res['skipped']}"]
    rows = user_scripts.markdown_rows([res])
    assert rows[-1].startswith("| hf-trainer | not run: cpuperf_no_such_module not installed")


def test_default_run_dir_numbers_like_lightning(tmp_path):
    import pytest

    from cpuperf.train.rundir import default_run_dir
    from cpuperf.worker_settings import ConfigError

    base = str(tmp_path / "runs" / "train")
    assert default_run_dir(base) == f"{base}/version_0" and not (tmp_path / "runs").exists()  # a plan creates nothing
    with pytest.raises(ConfigError):
        default_run_dir(base, resume=True)  # nothing to resume
    first, second = default_run_dir(base, create=True), default_run_dir(base, create=True)
    assert (first, second) == (f"{base}/version_0", f"{base}/version_1")
    (tmp_path / "runs" / "train" / "version_7").mkdir()
    (tmp_path / "runs" / "train" / "version_x").mkdir()  # not a version: ignored
    assert default_run_dir(base, create=True) == f"{base}/version_8"
    with pytest.raises(ConfigError) as none:
        default_run_dir(base, resume=True)  # no run holds a checkpoint: nothing to continue
    assert "no run under" in none.value.message and "has a checkpoint" in none.value.message
    (tmp_path / "runs" / "train" / "version_1" / "checkpoint.pt").write_bytes(b"x")
    # the newest run that holds a checkpoint, not the newest directory (an empty user-script run's)
    assert default_run_dir(base, resume=True) == f"{base}/version_1"
    (tmp_path / "runs" / "train" / "version_8" / "checkpoint.pt").write_bytes(b"x")
    assert default_run_dir(base, resume=True) == f"{base}/version_8"
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        default_run_dir(str(tmp_path / "file" / "train"), create=True)


# -- the small things a newcomer meets first (issue 44) ----------------------------------------------

def test_help_lists_every_command_with_a_whole_summary_at_80_columns():
    from cli_util import run_cli

    proc = run_cli(["--help"], {"COLUMNS": "80"})
    assert proc.returncode == 0
    commands = proc.stdout.split("Commands:")[1].strip().splitlines()
    assert len(commands) >= 8 and all(len(line) <= 80 and not line.rstrip().endswith("...") for line in commands)


def test_a_json_usage_error_names_the_same_help_as_the_text_one():
    import json

    from cli_util import run_cli

    text = run_cli(["train", "--no-such-option"])
    data = run_cli(["train", "--no-such-option", "--json"])
    assert text.returncode == data.returncode == 2
    hint = json.loads(data.stdout)["error"]["hint"]
    assert hint == "cpuperf train --help" and f"hint: {hint}" in text.stderr


def test_the_ipex_reason_names_its_retirement_once():
    from cli_util import run_json

    data, _ = run_json(["recommend", "--set", "dtype=fp32"], {"CPUPERF_OVERRIDE_PACKAGES": '{"torch": "2.13.0+cpu"}'})
    (reason,) = [d["reason"] for d in data["decisions"] if d["id"] == "ipex"]
    assert reason.count("archived") == 1 and reason.count("last CPU release") == 1, reason
    assert "torch.compile" in reason  # what to use instead is still said


def test_a_saved_plan_carries_no_host_name(tmp_path):
    import socket

    from cli_util import run_cli

    plan = tmp_path / "plan.json"
    proc = run_cli(["recommend", "--save", str(plan)])
    assert proc.returncode == 0, proc.stderr
    text = plan.read_text()
    assert '"made_on"' not in text and f'"{socket.gethostname()}"' not in text
    assert "never its name" in (ROOT / "docs" / "saved-plans.md").read_text()  # what the docs promise


@pytest.mark.full  # a real run
def test_a_run_says_what_it_does_before_its_first_step_and_between_log_lines(tmp_path, monkeypatch):
    """The worker's start-up (torch's import, tokenizer, model, the first step) is said as it goes; between log
    lines a plain log says the step at least every EVERY_S seconds."""
    import io
    import time

    import pytest

    from cpuperf.train import progress

    pytest.importorskip("torch")
    from cli_util import run_cli

    proc = run_cli(["train", "--model", "micro", "--max-steps", "3", "--out", str(tmp_path / "run")], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    starting = [i for i, ln in enumerate(lines) if ln.startswith("cpuperf train: starting: ")]
    first = next(i for i, ln in enumerate(lines) if ln.startswith("step 1/3 "))
    assert starting and starting[0] < first and "importing torch" in lines[starting[0]]
    assert any("the first step" in lines[i] for i in starting)
    assert not [i for i in starting if i > first]  # it ends with the first step's own line
    monkeypatch.setattr(progress, "EVERY_S", 0.2)
    stream = io.StringIO()
    bar = progress.Progress("plain", 100, stream=stream)
    bar.update(1)
    time.sleep(0.3)
    bar.update(2)
    assert stream.getvalue().startswith("step 2/100 eta ")
    time.sleep(0.8)  # no step ends: the timer says where the run is all the same
    bar.close()
    assert stream.getvalue().count("step 2/100 eta ") >= 2


def test_readme_examples_run_on_a_two_core_host_or_say_what_they_need():
    import re

    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [ln for b in blocks for ln in b.splitlines() if ln.strip()]
    assert lines
    for line in lines:
        ranks = re.search(r"--nproc[-_]per[-_]node[ =](\d+)", line)
        if ranks and int(ranks.group(1)) > 1:
            assert f"needs {ranks.group(1)}+ cores" in line, line
        if "--hostfile" in line:
            assert "needs a hostfile" in line, line
