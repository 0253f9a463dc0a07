"""Inputs that were taken silently (issue 62's smaller items), each now one line and a documented exit code: an
empty path for any path option (`train --out ''` wrote the run into the current directory, `doctor --save-snapshot ''`
was no option), `--replan` without `--plan`, `compat --why-not ''`, CPUPERF_LOAD_WINDOW=-1, a GPU override of -1 bytes
or with a key cpuperf does not read (`memory_total`), `recommend --save` into a directory that does not exist (the
whole path was made), and a model name that is not UTF-8 with an ASCII stdio encoding."""

from __future__ import annotations

import json
import os

import pytest
from cli_util import run_cli

from cpuperf.cli import PATH_METAVARS
from cpuperf.errors import ExitCode


def _one_line(proc, code: ExitCode, *words: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-800:], proc.stderr[-1500:])
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(said) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for word in words:
        assert word in said[0], (word, said[0])


def _created(root) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def _path_options():
    """Every option and argument of every typer command that names a path (cpuperf.cli.PATH_METAVARS)."""
    import typer.main

    from cpuperf.cli import app

    for name, command in sorted(typer.main.get_command(app).commands.items()):
        for param in command.params:
            if param.metavar in PATH_METAVARS:
                yield name, param.opts[0], param.metavar


PATHS = list(_path_options())


def test_the_path_options_are_the_ones_users_name():
    names = {(cmd, opt) for cmd, opt, _ in PATHS}
    for expected in [("train", "--out"), ("doctor", "--save-snapshot"), ("recommend", "--save"), ("train", "--plan"),
                     ("plot", "run_dir"), ("install", "--venv"), ("doctor", "--sysroot")]:
        assert expected in names, names


@pytest.mark.parametrize("blank", ["", " ", "\t"])
@pytest.mark.parametrize("command,option,metavar", PATHS, ids=[f"{c}{o}" for c, o, _ in PATHS])
def test_an_empty_path_is_refused_by_every_path_option(tmp_path, command, option, metavar, blank):
    extra = ["--dry-run"] if command in ("train", "install") else []
    args = [command, *extra, blank] if not option.startswith("-") else [command, *extra, option, blank]
    proc = run_cli(args, cwd=str(tmp_path))
    _one_line(proc, ExitCode.USAGE, "an empty path", option if option.startswith("-") else metavar)
    assert _created(tmp_path) == []  # nothing written into the current directory


@pytest.mark.parametrize("args", [["ccl-env", "--plan", ""], ["ccl-env", "--sysroot", " "], ["ccl-env", "--hostfile", ""],
                                  ["ccl-env", "--python", ""]])
def test_ccl_env_takes_the_same_rule(args):
    _one_line(run_cli(args), ExitCode.USAGE, "an empty path", args[1])


def test_train_out_empty_writes_no_run_into_the_current_directory(tmp_path):
    """The reproducer, a real run refused before it starts (the built-in loop, two steps, micro preset)."""
    proc = run_cli(["train", "--out", "", "--model", "micro", "--max-steps", "2"], cwd=str(tmp_path))
    _one_line(proc, ExitCode.USAGE, "--out ''")
    assert _created(tmp_path) == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("args", [["train", "--dry-run", "--replan"], ["train", "--replan", "--dry-run", "--auto"],
                                  ["ccl-env", "--replan"], ["ccl-env", "--replan", "--json"]])
def test_replan_without_a_plan_is_refused(args):
    proc = run_cli(args)
    _one_line(proc, ExitCode.USAGE, "--replan without --plan")
    if "--json" in args:
        assert json.loads(proc.stdout)["error"]["code"] == ExitCode.USAGE


@pytest.mark.parametrize("value", ["", " ", "torch", "==", "torch==", "==2.1"])
def test_why_not_takes_only_a_package_and_version(value):
    _one_line(run_cli(["compat", "--why-not", value]), ExitCode.USAGE, "--why-not expects PKG==VERSION")


@pytest.mark.parametrize("window", ["-1", "-0.5", "nan", "inf", "3601", "1e9", "soon"])
def test_a_load_window_that_is_not_seconds_is_refused(window):
    proc = run_cli(["doctor"], extra_env={"CPUPERF_LOAD_WINDOW": window})
    _one_line(proc, ExitCode.USAGE, "CPUPERF_LOAD_WINDOW")


@pytest.mark.parametrize("row,said", [
    ({"name": "NVIDIA A100", "compute_capability": "8.0", "memory_total": -1}, "unknown key 'memory_total'"),
    ({"name": "NVIDIA A100", "compute_capability": "8.0", "memory_bytes": -1}, "memory_bytes -1"),
    ({"name": "NVIDIA A100", "compute_capability": "8.0", "memory_bytes": 0}, "memory_bytes 0"),
    ({"name": "NVIDIA A100", "cc": "8.0", "memory_bytes": 85899345920, "free_bytes": -5}, "free_bytes -5"),
    ({"name": "NVIDIA A100", "memory_bytes": 2 ** 70}, "memory_bytes"),
    ({"name": "NVIDIA A100", "memory_bytes": 85899345920, "index": -3}, "index -3"),
    ({"name": "NVIDIA A100", "memory_bytes": 85899345920, "numa_node": -7}, "numa_node -7"),
])
@pytest.mark.parametrize("command", [["doctor"], ["recommend", "--device", "cuda"]])
def test_a_gpu_override_of_impossible_memory_is_refused(row, said, command):
    proc = run_cli(command, extra_env={"CPUPERF_OVERRIDE_GPUS": json.dumps([row])})
    _one_line(proc, ExitCode.USAGE, "CPUPERF_OVERRIDE_GPUS", said)


def test_a_gpu_override_with_no_numa_node_reported_is_a_card_of_unknown_node():
    """-1 is what sysfs says of a device without NUMA affinity: taken, as unknown."""
    row = {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_bytes": 85899345920, "numa_node": -1}
    proc = run_cli(["doctor", "--json"], extra_env={"CPUPERF_OVERRIDE_GPUS": json.dumps([row])})
    assert proc.returncode in (0, 1), proc.stderr[-1500:]
    gpus = json.loads(proc.stdout)["host"]["gpus"]
    assert [(g["memory_bytes"], g["numa_node"]) for g in gpus] == [(85899345920, None)]


@pytest.mark.parametrize("where", ["no/such/dir/p.json", "no/p.json", "a-file/p.json"])
def test_recommend_save_needs_its_directory(tmp_path, where):
    (tmp_path / "a-file").write_text("x")
    proc = run_cli(["recommend", "--save", where], cwd=str(tmp_path))
    _one_line(proc, ExitCode.FILESYSTEM, f"--save {where}")
    assert _created(tmp_path) == ["a-file"] and sorted(os.listdir(tmp_path)) == ["a-file"]  # no directory made


@pytest.mark.parametrize("option,where", [("--write-lock", "no/such/dir/l.json"), ("--write-lock", "a-file/l.json"),
                                           ("--download", "no/such/wheels"), ("--download", "a-file/wheels")])
def test_install_outputs_need_their_directory(tmp_path, option, where):
    """Checked before pip is asked anything: the path the user typed is never made (a lock's directory, a
    wheelhouse's parent)."""
    (tmp_path / "a-file").write_text("x")
    proc = run_cli(["install", "--dry-run", "--yes", option, where, "--find-links", str(tmp_path)], cwd=str(tmp_path))
    _one_line(proc, ExitCode.FILESYSTEM, f"{option} {where}")
    assert sorted(os.listdir(tmp_path)) == ["a-file"]


def test_recommend_save_into_a_directory_that_exists(tmp_path):
    (tmp_path / "plans").mkdir()
    proc = run_cli(["recommend", "--save", "plans/p.json"], cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert _created(tmp_path) == [os.path.join("plans", "p.json")]
    _one_line(run_cli(["recommend", "--save", "plans"], cwd=str(tmp_path)), ExitCode.FILESYSTEM, "is a directory")


@pytest.mark.parametrize("name", [b"caf\xe9", b"\xff\xfe", b"model-\x80.json"])
@pytest.mark.parametrize("command", [["recommend"], ["train", "--dry-run", "--json"]])
def test_a_model_name_that_is_not_utf8_is_named_with_ascii_stdio(name, command):
    """The name as the OS hands it over (surrogate escapes), said as a model that is not found, by a real process
    whose streams are ASCII: never "input is not valid UTF-8" (an encoding error of the message itself)."""
    proc = run_cli([*command, "--model", os.fsdecode(name)], extra_env={"PYTHONIOENCODING": "ascii"}, process=True)
    _one_line(proc, ExitCode.USAGE, "is neither a preset")
    assert "not valid UTF-8" not in proc.stderr


@pytest.mark.parametrize("name", [b"d\xe9.json", b"\xff.json", b"tab\there.json"])
def test_a_plan_that_would_not_load_back_is_not_saved(tmp_path, name):
    """A model config whose path is not printable UTF-8 was saved into the plan, which `train --plan` then refused as
    holding a control character: refused at --save, nothing written."""
    config = os.path.join(os.fsencode(str(tmp_path)), name)
    with open(config, "w") as fh:
        json.dump({"n_layer": 2, "n_head": 2, "hidden_size": 64, "vocab_size": 100, "max_position_embeddings": 32}, fh)
    proc = run_cli(["recommend", "--model", os.fsdecode(config), "--save", "p.json"], cwd=str(tmp_path))
    _one_line(proc, ExitCode.USAGE, "--save p.json: this plan would not load back", "inputs.model")
    assert not (tmp_path / "p.json").exists()


def test_a_plan_of_a_printable_utf8_model_path_saves_and_runs(tmp_path):
    (tmp_path / "dé").mkdir()
    (tmp_path / "dé" / "config.json").write_text(json.dumps(
        {"n_layer": 2, "n_head": 2, "hidden_size": 64, "vocab_size": 100, "max_position_embeddings": 32}))
    saved = run_cli(["recommend", "--model", "dé/config.json", "--save", "p.json"], cwd=str(tmp_path))
    assert saved.returncode == 0, saved.stderr[-1500:]
    ran = run_cli(["train", "--dry-run", "--plan", "p.json"], cwd=str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-1500:]
