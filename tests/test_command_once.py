"""The user's command is read once (cpuperf.plan.command.read_command): every later step of `train --auto
--dry-run` reads the one record it makes, never the argv again (issue 54)."""

from __future__ import annotations

import json

import pytest

from cpuperf.plan import command as command_mod
from tests.cli_util import run_cli


def _count_calls(monkeypatch, function, *modules):
    """The argv each call of `function` gets, wherever `modules` look it up (the list fills as cpuperf runs)."""
    calls = []

    def counting(argv):
        calls.append(tuple(argv))
        return function(argv)

    for module in modules:
        monkeypatch.setattr(module, function.__name__, counting)
    return calls


@pytest.mark.parametrize("argv", [
    ["torchrun", "--nproc-per-node", "2", "script.py", "--per_device_train_batch_size", "4"],
    ["env", "OMP_NUM_THREADS=2", "python", "script.py", "--per_device_train_batch_size", "4"],
], ids=["torchrun", "env-python"])
def test_the_command_is_read_once(monkeypatch, tmp_path, argv):
    calls = _count_calls(monkeypatch, command_mod.read_command, command_mod)
    res = run_cli(["train", "--auto", "--dry-run", "--json", "--out", str(tmp_path / "out"), "--", *argv],
                  cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["launch"]["argv"], plan
    assert calls == [tuple(argv)]


def test_the_record_has_the_parts():
    cmd = command_mod.read_command(["nice", "-n", "5", "torchrun", "--nproc-per-node", "2", "t.py", "--lr", "1"])
    assert [w.name for w in cmd.wrappers] == ["nice"]
    assert cmd.launcher is not None and cmd.launcher.launcher == "torchrun"
    assert cmd.launcher.option(["--nproc-per-node", "--nproc_per_node"]) == "2"
    assert cmd.script.script == "t.py" and cmd.script.script_args == ("--lr", "1") and cmd.script.nproc == 2
    assert cmd.words == ("torchrun", "--nproc-per-node", "2", "t.py", "--lr", "1")


def test_the_script_report_says_which_flags_were_yours():
    from command_util import plan_script

    from cpuperf.plan.user_script import Flag

    hf = "from transformers import HfArgumentParser, TrainingArguments\n" \
         "HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()\n"
    report = plan_script(["python", "t.py", "--bf16"], [Flag(("--bf16",), "dtype")], "always", hf).to_json()
    kept_yours = report["kept_yours"]
    assert kept_yours == ["--bf16"] and report["added"] == [] and "files" not in report


def test_a_real_run_reads_the_command_once_from_plan_to_launch(monkeypatch, tmp_path):
    """The launch reads the plan (LaunchPlan.own_session), not the argv: `setsid CMD` runs as the run itself, and
    the words are unwrapped once, by read_command, from the options to the exit."""
    import sys

    from cpuperf.plan import user_launcher

    calls = _count_calls(monkeypatch, user_launcher.unwrap, user_launcher, command_mod)
    marker = tmp_path / "session"
    code = f"import os, time; time.sleep(0.5); open({str(marker)!r}, 'w').write(str(os.getsid(0) == os.getpid()))"
    argv = ["setsid", sys.executable, "-c", code]
    res = run_cli(["train", "--out", str(tmp_path / "out"), "--", *argv], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert marker.read_text() == "True"  # the run was setsid's own process, in its own session, not a fork
    assert calls == [tuple(argv)]



def test_the_record_says_whether_the_command_opens_its_own_session():
    """Read with the command, so `setsid --fork` is refused (exit 2) before anything is probed or measured."""
    from cpuperf.errors import UsageError

    assert command_mod.read_command(["env", "A=1", "setsid", "python", "t.py"]).own_session
    assert not command_mod.read_command(["python", "t.py"]).own_session
    with pytest.raises(UsageError, match="setsid --fork") as refused:
        command_mod.read_command(["setsid", "--fork", "python", "t.py"])
    assert refused.value.code == 2
