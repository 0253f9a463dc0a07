"""A user's own script under `cpuperf train --auto`: first do no harm (issue 15).

Real scripts (tests/fixtures/scripts) run plainly and under cpuperf; each writes what it saw (argv,
hyperparameters, env, CPUs, the optimizer it built) to $FIXTURE_OUT, and the two runs are compared.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_util import cli_env, run_cli
from command_util import detect_parser, merge_flags, parse_command, plan_script
from levers_util import levers

from cpuperf.knowledge.tuning import tuning
from cpuperf.plan.user_script import (
    Flag,
    FlagContext,
    rejected_flags,
    speed_flags,
)
from cpuperf.probe import probe_host

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
PY = sys.executable
TUNING = tuning()
ALL = {"use_cpu", "bf16", "fp16", "optim", "optim_fused", "ddp_backend", "dataloader_num_workers",
       "per_device_train_batch_size", "torch_compile", "gradient_checkpointing", "tf32", "use_ipex"}
CPU_BF16 = {"device": "cpu", "dtype": "bf16", "tf32": False, "ddp_backend": None, "dataloader_workers": 0,
            "compile": False, "ipex": False, "batch_size": 16, "grad_accum_steps": 1, "grad_checkpointing": False,
            "optimizer": "adamw_fused", "pin_memory": False}


# -- pure planning -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, launcher, nproc, script, args", [
    (["python", "-u", "t.py", "--x", "1"], None, None, "t.py", ["--x", "1"]),
    (["accelerate", "launch", "--cpu", "--num_processes", "2", "--config_file", "c.py", "t.py", "a"],
     "accelerate", 2, "t.py", ["a"]),
    (["torchrun", "--nproc-per-node=2", "--standalone", "t.py"], "torchrun", 2, "t.py", []),
    (["python3", "-m", "torch.distributed.run", "--nproc_per_node", "3", "t.py", "--lr", "1"], "torchrun", 3, "t.py",
     ["--lr", "1"]),
    (["mpirun", "-np", "4", "--bind-to", "none", "python", "t.py", "-v"], "mpirun", 4, "t.py", ["-v"]),
    (["python", "-m", "mypkg.train", "--x"], None, None, None, ["--x"]),
])
def test_the_script_is_found_behind_launchers(argv, launcher, nproc, script, args):
    cmd = parse_command(argv)
    assert (cmd.launcher, cmd.nproc, cmd.script, list(cmd.script_args)) == (launcher, nproc, script, args)


def test_the_parser_decides_whether_trainer_flags_are_safe():
    hf = "from transformers import HfArgumentParser, Trainer, TrainingArguments\np = HfArgumentParser((TrainingArguments,)); p.parse_args_into_dataclasses()"
    assert detect_parser(hf, ["--output_dir", "o"])[0] == "hf"
    assert detect_parser(hf, ["args.json"])[0] == "args-file"
    own = "import argparse\nfrom transformers import HfArgumentParser, Trainer, TrainingArguments\np = argparse.ArgumentParser(); p.add_argument('--lr', type=float)\n" \
        "Trainer(args=TrainingArguments(output_dir='x'))"
    assert detect_parser(own, [])[0] == "argparse"
    assert detect_parser("from transformers import HfArgumentParser, Trainer, TrainingArguments\nargs = TrainingArguments(output_dir='x')", [])[0] == "in-code"
    # recognised by what it imports and calls, never a substring: Lightning's Trainer is not Hugging Face's
    lit = "import lightning as L\ntrainer = L.Trainer(max_epochs=1)\n# TrainingArguments HfArgumentParser Trainer("
    assert detect_parser(lit, [])[0] == "lightning"
    assert detect_parser(None, [])[0] == "unknown"
    ours = [Flag(("--use_cpu",), "device")]
    # auto: only an HfArgumentParser script; always: anyway; never: nothing
    assert plan_script(["python", "t.py"], ours, "auto", own).added == ()
    assert plan_script(["python", "t.py"], ours, "always", "import argparse").argv[-1] == "--use_cpu"
    assert plan_script(["python", "t.py"], ours, "never", hf).added == ()


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_trainer_flags_go_inside_a_shell_line_and_the_shell_hands_them_to_the_script(shell, tmp_path):
    # `bash -c 'python t.py ...'`: after the line a flag would be the shell's $0, never the script's
    (tmp_path / "t.py").write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    hf = "from transformers import HfArgumentParser, Trainer, TrainingArguments\np = HfArgumentParser((TrainingArguments,)); p.parse_args_into_dataclasses()"
    user = [shell, "-c", f"OMP_PROC_BIND=close {sys.executable} t.py --output_dir 'my out' --per_device_train_batch_size 4", "name"]
    cmd = parse_command(user)
    assert (cmd.script, list(cmd.script_args)) == ("t.py", ["--output_dir", "my out", "--per_device_train_batch_size", "4"])
    for mode in ("auto", "always"):
        plan = plan_script(user, [Flag(("--bf16",), "dtype"), Flag(("--use_cpu",), "device")], mode, hf)
        assert plan.added_args == ["--bf16", "--use_cpu"] and plan.argv[:2] == (shell, "-c") and plan.argv[-1] == "name"
        ran = subprocess.run(list(plan.argv), cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert json.loads(ran.stdout) == ["--output_dir", "my out", "--per_device_train_batch_size", "4", "--bf16", "--use_cpu"]
    assert plan_script(user, [Flag(("--bf16",), "dtype")], "never", hf).argv == tuple(user)


def test_a_shell_line_cpuperf_does_not_read_through_gets_no_flags_even_when_forced():
    user = ["bash", "-c", "cd data && python t.py --output_dir o"]
    plan = plan_script(user, [Flag(("--bf16",), "dtype")], "always", None)
    assert plan.argv == tuple(user) and plan.added == ()
    assert "does not read through" in plan.why and "would reach the shell, not your script" in plan.why


def test_a_tuning_run_of_a_shell_line_keeps_the_shell_and_sets_its_length_inside():
    from command_util import command_key

    from cpuperf.plan.user_script import tuning_argv

    user = ["bash", "-c", "python t.py --max_steps 900 --output_dir o --lr 1"]
    assert tuning_argv(parse_command(user), None, 5, "/tmp/x") == ["bash", "-c", "python t.py --lr 1 --max_steps 5 --output_dir /tmp/x"]
    # the run length and output directory are no part of the command's identity; the shell and the rest are
    assert command_key(user, "s") == command_key(["bash", "-c", "python t.py --output_dir p --lr 1"], "s")
    assert command_key(user, "s") != command_key(["python", "t.py", "--lr", "1"], "s")
    assert command_key(user, "s") != command_key(["bash", "-c", "python t.py --lr 2"], "s")


def test_torch_compile_for_a_trainer_when_measured_to_pay_back_on_cpu():
    """recommend turns compile on (CPU) only where this model's measured crossover is below the run's steps."""
    flags, _ = speed_flags(levers(dict(CPU_BF16, compile=True), set()), FlagContext("5.23.0", "2.13.0", 1, TUNING, ALL))
    compiled = [f for f in flags if f.args == ("--torch_compile",)]
    assert compiled and "pay back" in compiled[0].why
    flags, _ = speed_flags(levers(CPU_BF16, set()), FlagContext("5.23.0", "2.13.0", 1, TUNING, ALL))
    assert all(f.name != "--torch_compile" for f in flags)
    # On a GPU too, where the engine decided it: it decides compile for a script only when the script's own
    # --max_steps is long enough to pay back the compile time (tests/test_your_model.py plans both cases).
    gpu = dict(CPU_BF16, device="cuda", compile=True)
    assert any(f.name == "--torch_compile" for f in speed_flags(levers(gpu, set()), FlagContext("5.23.0", "2.13.0", 1, TUNING, ALL))[0])
    off = dict(gpu, compile=False)
    assert all(f.name != "--torch_compile" for f in speed_flags(levers(off, set()), FlagContext("5.23.0", "2.13.0", 1, TUNING, ALL))[0])


def test_no_hyperparameters_and_no_slower_optimizer():
    flags, skipped = speed_flags(levers(CPU_BF16, set()), FlagContext("5.23.0", "2.13.0+cpu", 1, TUNING, ALL))
    args = [a for f in flags for a in f.args]
    assert args == ["--use_cpu"]  # no batch size, no --optim: 5.x's default is fused already
    assert any(n == "--optim" and "already fused" in w for n, w in skipped)
    assert any(n == "--bf16" and "AMX" in w for n, w in skipped)  # measured slower here without AMX
    flags, _ = speed_flags(levers(CPU_BF16, set()), FlagContext("5.23.0", "2.13.0", 1, TUNING, ALL, bf16_gemm_ratio=4.0))
    assert [f.args for f in flags] == [("--use_cpu",), ("--bf16",)]
    # transformers 4.x defaults to foreach adamw_torch: the fused kernel of the same family, if torch has it
    flags, _ = speed_flags(levers(CPU_BF16, set()), FlagContext("4.46.0", "2.5.1", 1, TUNING, ALL))
    assert ("--optim", "adamw_torch_fused") in [f.args for f in flags]
    flags, _ = speed_flags(levers(CPU_BF16, set()), FlagContext("4.46.0", "2.3.1", 1, TUNING, ALL))  # no fused CPU AdamW before 2.4
    assert all(f.name != "--optim" for f in flags)
    # a hyperparameter only when set; the user's own optimizer family through --set
    values = dict(CPU_BF16, batch_size=4, optimizer="adafactor")
    flags, _ = speed_flags(levers(values, {"batch_size", "optimizer"}), FlagContext("5.23.0", "2.13.0", 1, TUNING, ALL))
    assert [f.args for f in flags][-2:] == [("--per_device_train_batch_size", "4"), ("--optim", "adafactor")]
    # a flag the installed transformers lacks is left out, and said so
    flags, skipped = speed_flags(levers(CPU_BF16, {"dtype"}), FlagContext("5.23.0", "2.13.0", 1, TUNING, ALL - {"bf16"}))
    assert [f.args for f in flags] == [("--use_cpu",)] and skipped[0][0] == "--bf16"


def test_flags_the_user_gave_or_contradicted_are_never_added():
    ours = [Flag(("--use_cpu",), ""), Flag(("--bf16",), ""), Flag(("--optim", "adamw_torch_fused"), "")]
    add, left = merge_flags(["--fp16", "--no-cuda"], ours)
    assert add == [ours[2]] and [n for n, _ in left] == ["--use_cpu", "--bf16"]
    add, left = merge_flags(["--bf16=False"], ours, "from transformers import TrainingArguments\n"
                                                      "args = TrainingArguments(optim='sgd')")
    assert add == [ours[0]] and "chooses its optimizer" in left[1][1]


def test_a_rejection_names_the_flags_and_the_command_without_them():
    script = plan_script(["python", "t.py", "--x"], [Flag(("--bf16",), "")], "always", None)
    message, hint = rejected_flags(2, 3.0, "t.py: error: unrecognized arguments: --bf16", script)
    assert "--bf16" in message
    assert hint.endswith("cpuperf train --auto --hf-flags never -- python t.py --x")
    assert rejected_flags(1, 3.0, "unrecognized arguments", script) is None
    assert rejected_flags(2, 300.0, "unrecognized arguments", script) is None
    # The command to run again is the user's whole command, the wrappers and the shell line in front kept.
    for argv, tail in ((["env", "A=1", "python", "t.py", "--x"], "-- env A=1 python t.py --x"),
                       (["bash", "-c", "python t.py --x"], "-- bash -c 'python t.py --x'")):
        wrapped = plan_script(argv, [Flag(("--bf16",), "")], "always", None)
        hint = rejected_flags(2, 3.0, "error: unrecognized arguments: --bf16", wrapped)[1]
        assert hint.endswith(tail), hint


# -- real scripts --------------------------------------------------------------------------------------

def _run(argv, out: Path, auto: bool, tmp_path: Path, extra=()):
    env = cli_env({"FIXTURE_OUT": str(out), "PYTHONWARNINGS": "ignore",
                   "PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")})
    if auto:
        cmd = [PY, "-m", "cpuperf", "train", "--auto", "--json", "--out", str(tmp_path / "run"), *extra, "--", *argv]
    else:
        cmd = list(argv)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=str(SCRIPTS))
    return proc


def _hf(tmp_path):
    return ["--output_dir", str(tmp_path / "o"), "--max_steps", "3", "--per_device_train_batch_size", "4",
            "--learning_rate", "0.001", "--report_to", "none", "--save_strategy", "no"]


CASES = {
    "hf_parser": lambda t: [PY, "hf_parser.py", *_hf(t)],
    "argparse_own": lambda t: [PY, "argparse_own.py", "--lr", "0.002", "--out", str(t / "o")],
    "args_json": lambda t: [PY, "args_json.py", "args.json"],
    "accelerate_launch": lambda t: ["accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
                                    "--mixed_precision", "no", "--dynamo_backend", "no", "accelerate_loop.py",
                                    "--steps", "4"],
    "torchrun_hf": lambda t: [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                              "hf_parser.py", *_hf(t)],
    "plain_loop": lambda t: [PY, "plain_loop.py", "--batch-size", "4"],
    # the Trainer script inside a shell line: its flags go into the line, where the shell hands them to the script
    "shell_line_hf": lambda t: ["bash", "-c", shlex.join([PY, "hf_parser.py", *_hf(t)])],
}


@pytest.mark.full  # real scripts and launchers
@pytest.mark.parametrize("case", list(CASES))
def test_real_scripts_keep_their_hyperparameters_and_see_what_was_applied(case, tmp_path):
    if case != "plain_loop":
        pytest.importorskip("transformers")
        pytest.importorskip("accelerate")
    argv = CASES[case](tmp_path)
    plain_out, auto_out = tmp_path / "plain.json", tmp_path / "auto.json"
    proc = _run(argv, plain_out, False, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _run(argv, auto_out, True, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cpuperf train: levers applied:" in proc.stderr  # the short report, printed before the script starts
    assert (tmp_path / "run" / "plan.json").is_file() and (tmp_path / "run" / "status.json").is_file()
    result = json.loads(proc.stdout)
    applied = result["applied"]
    plain, auto = json.loads(plain_out.read_text()), json.loads(auto_out.read_text())
    assert auto["hyper"] == plain["hyper"]  # do no harm
    # what was printed is what the script saw: its argv, env, CPUs and threads
    assert auto["argv"] == plain["argv"] + applied["flags"]
    for name, value in applied["env"].items():
        assert auto["env"].get(name) == value, name
    if applied["cpus"]:
        assert auto["cpus"] == applied["cpus"]
    if applied["threads"] and case != "accelerate_launch":
        assert auto["torch_threads"] == applied["threads"]
    assert applied["launcher"]["name"] == "direct"  # never a second launcher on top of the user's
    if case in ("accelerate_launch", "torchrun_hf"):
        assert applied["launcher"]["yours"] in ("accelerate", "torchrun")
    if case in ("hf_parser", "torchrun_hf", "shell_line_hf"):
        # GPUs to keep off, or --bf16 (transformers >= 4.52 refuses it without --use_cpu on a CPU): it decides something
        if probe_host().gpus or "--bf16" in applied["flags"]:
            assert "--use_cpu" in applied["flags"] and auto["speed"]["use_cpu"] == "True"
        else:  # one process on a host without GPUs is on the CPU anyway; the flag only cost time
            assert "--use_cpu" not in applied["flags"]
            assert any(f["flag"] == "--use_cpu" for f in applied["flags_not_added"])
        assert "--per_device_train_batch_size" not in applied["flags"]
        # never a slower optimizer than the script's default
        assert auto["optimizer"]["fused"] or not plain["optimizer"]["fused"]
    else:
        assert applied["flags"] == []


@pytest.mark.full  # real scripts
def test_a_script_that_rejects_forced_flags_gets_the_command_without_them(tmp_path):
    proc = run_cli(["train", "--auto", "--hf-flags", "always", "--set", "dtype=bf16", "--out", str(tmp_path / "run"),
                    "--", PY, str(SCRIPTS / "plain_loop.py"), "--steps", "1"],
                   extra_env={"FIXTURE_OUT": str(tmp_path / "o.json")}, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "rejected the Trainer flags cpuperf added:" in proc.stderr and "--bf16" in proc.stderr
    assert f"cpuperf train --auto --hf-flags never -- {PY} {SCRIPTS / 'plain_loop.py'} --steps 1" in proc.stderr


def test_dry_run_shows_the_same_applied_list(tmp_path):
    pytest.importorskip("transformers")
    argv = [PY, str(SCRIPTS / "hf_parser.py"), *_hf(tmp_path)]
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--set", "dtype=bf16", "--", *argv])
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["applied"]["flags"] == plan["launch"]["argv"][len(argv):] and "--bf16" in plan["applied"]["flags"]
    assert plan["applied"]["env"]["OMP_NUM_THREADS"] == plan["launch"]["env"]["OMP_NUM_THREADS"]
    text = run_cli(["train", "--auto", "--dry-run", "--set", "dtype=bf16", "--", *argv])
    assert text.returncode == 0 and "# applied: flag --bf16" in text.stdout


def test_a_launcher_command_refuses_a_second_launcher(tmp_path):
    proc = run_cli(["train", "--auto", "--nproc-per-node", "2", "--dry-run", "--", "torchrun", "--nproc-per-node=2",
                    "t.py"])
    assert proc.returncode == 2 and "own launcher (torchrun)" in proc.stderr


# -- --model CONFIG.json -------------------------------------------------------------------------------

def _gpt2_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 3, "n_head": 4, "n_embd": 64, "n_positions": 48,
                                "vocab_size": 1000}))
    return path


@pytest.mark.full  # a real run
def test_model_config_drives_the_builtin_loop(tmp_path):
    cfg = _gpt2_config(tmp_path)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--model", str(cfg)])
    assert proc.returncode == 0, proc.stderr
    model = json.loads(proc.stdout)["settings"]["model"]
    assert (model["n_layer"], model["n_head"], model["d_model"], model["seq_len"], model["vocab_size"]) == \
        (3, 4, 64, 48, 1000)
    proc = run_cli(["train", "--auto", "--json", "--model", str(cfg), "--max-steps", "2", "--out", str(tmp_path / "r")],
                   timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["steps"] == 2


def test_model_config_drives_a_user_scripts_memory_plan(tmp_path):
    cfg = _gpt2_config(tmp_path)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--model", str(cfg), "--", PY, "x.py"])
    assert proc.returncode == 0, proc.stderr
    workload = json.loads(proc.stdout)["workload"]
    assert (workload["source"], workload["n_layer"], workload["d_model"]) == ("hf-config", 3, 64)
    bad = run_cli(["train", "--dry-run", "--model", "nope"])
    assert bad.returncode == 2 and "tiny" in bad.stderr and "config" in bad.stderr


def test_builtin_loop_uses_the_fused_optimizer_where_torch_has_it():
    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import PRESETS
    from cpuperf.probe import probe_host

    rec = recommend(probe_host(), PRESETS["micro"])
    d = rec.levers.optimizer
    import torch

    fused_ok = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 4)
    assert d.value == ("adamw_fused" if fused_ok else "adamw"), d.reason


def test_accelerate_launch_gets_mixed_precision_only_where_the_rule_gave_bf16():
    from command_util import plan_script

    from cpuperf.plan.user_script import Flag

    bf16 = [Flag(("--bf16",), "dtype: bf16 autocast"), Flag(("--use_cpu",), "device: cpu")]
    user = ["accelerate", "launch", "--num_processes", "1", "train.py", "--lr", "1e-3"]
    plan = plan_script(user, bf16, "auto", "import argparse\nargparse.ArgumentParser().parse_args()\n")
    assert plan.argv[:4] == ("accelerate", "launch", "--mixed_precision", "bf16")
    assert plan.argv[4:] == tuple(user[2:])  # the script's own arguments untouched: argparse, no Trainer flags
    assert [f.args for f in plan.added] == [("--mixed_precision", "bf16")]
    # the user's own choice, a config file that may hold one, no bf16 decision, --hf-flags never: nothing added
    for argv, ours, mode in ((["accelerate", "launch", "--mixed_precision", "no", "train.py"], bf16, "auto"),
                             (["accelerate", "launch", "--config_file", "c.yaml", "train.py"], bf16, "auto"),
                             (user, [Flag(("--use_cpu",), "device: cpu")], "auto"),
                             (user, bf16, "never"),
                             (["torchrun", "--nproc-per-node", "2", "train.py"], bf16, "auto")):
        plan = plan_script(argv, ours, mode, "import argparse\nargparse.ArgumentParser().parse_args()\n")
        assert "--mixed_precision" not in plan.argv[2:4] or argv[2] == "--mixed_precision", argv
        assert all(f.args[0] != "--mixed_precision" for f in plan.added), argv


def test_a_flag_is_written_from_its_row_of_the_one_table(monkeypatch):
    """The option speed_flags writes comes from knowledge/hf_flags.TRAINER_FLAGS (FLAG_OPTIONS), and the lever it
    carries back (FLAG_LEVERS, read by plan/applied) from the same row: one place to change a lever's flag."""
    from cpuperf.knowledge import hf_flags

    for row in hf_flags.TRAINER_FLAGS:
        if row.id is not None:
            assert hf_flags.FLAG_OPTIONS[row.id] == row.option
        if row.lever is not None:
            assert hf_flags.FLAG_LEVERS[row.option] == row.lever
    monkeypatch.setitem(hf_flags.FLAG_OPTIONS, "use_cpu", "--use_cpu_renamed")
    flags, _ = speed_flags(levers(CPU_BF16, set()), FlagContext("5.23.0", "2.13.0+cpu", 1, TUNING, ALL))
    assert [f.args for f in flags] == [("--use_cpu_renamed",)]
