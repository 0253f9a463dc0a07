"""Inputs that reached a job or an internal error unbounded (issue 53, cases 11-14): COLUMNS that is no width, a
user's command that is no program, a thread count set by `env` in front of the command, and a launcher's node count
that no launcher starts. Each is refused with exit 2 and one line, or read within its bounds; through the real CLI
(in process) and the parse it goes through."""

from __future__ import annotations

import json
import sys

import pytest
from cli_util import run_cli
from command_util import command_environ, split_launcher

from cpuperf.errors import UsageError
from cpuperf.output import piped_width
from cpuperf.plan.user_launcher import launcher_ranks

PY = sys.executable


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


# -- case 11: COLUMNS ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("columns, width", [
    ("abc", 100), ("", 100), (None, 100), ("-5", 100), ("1e3", 100), ("\u0663\u0660", 100),  # Arabic-Indic digits
    ("0", 20), ("3", 20), ("120", 120), ("99999", 1000), ("9" * 5000, 1000),
])
def test_columns_is_a_width_within_bounds_or_the_default(columns, width):
    assert piped_width(columns) == width


@pytest.mark.parametrize("args", [["doctor"], ["recommend"], ["ccl-env", "--explain"]])
@pytest.mark.parametrize("columns", ["abc", "0", "-3"])
def test_a_columns_that_is_no_width_still_prints_the_report(args, columns):
    """COLUMNS=abc was an internal error (ValueError) in doctor, recommend and ccl-env --explain; COLUMNS=0 and
    negative printed an empty doctor with exit 0."""
    proc = run_cli(args, extra_env={"COLUMNS": columns})
    assert proc.returncode in (0, 1), proc.stderr[-1500:]  # doctor exits 1 where it finds a problem
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert len(proc.stdout.strip().splitlines()) >= 3, (args, columns, proc.stdout)


# -- case 12: a command that is no program ---------------------------------------------------------------------

@pytest.mark.parametrize("tail, said", [
    (["--"], "`--` is not a program"),
    (["--", "script.py"], "`--` is not a program"),
    ([""], "empty word"),
    (["  ", "script.py"], "empty word"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_a_command_after_the_separator_that_is_no_program_exits_2(tail, said, dry, tmp_path):
    """`train --auto -- --` planned the built-in loop; `train --auto --dry-run -- ''` exited 0."""
    args = ["train", "--auto", *(["--dry-run"] if dry else []), "--out", str(tmp_path / "run"), "--", *tail]
    proc = run_cli(args)
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert said in _one_error_line(proc.stderr)
    assert not (tmp_path / "run").exists()  # refused before anything is written
    proc = run_cli([*args[:2], "--json", *args[2:]])
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == 2


# -- case 13: OMP_NUM_THREADS set by env in front of the command -----------------------------------------------

@pytest.mark.parametrize("value", ["abc", "0", "-4", "2.5", ""])
@pytest.mark.parametrize("line", ["env OMP_NUM_THREADS={v} torchrun --nproc-per-node 2 s.py",
                                  "env OMP_NUM_THREADS={v} python s.py",
                                  "env -u X OMP_NUM_THREADS={v} nice -n 1 python s.py"])
def test_a_thread_count_set_by_env_that_no_openmp_reads_exits_2(line, value):
    """The same value on a launcher's line (`mpirun -x OMP_NUM_THREADS=abc`) exits 2: set by env(1) in front of
    the command it reaches the program whatever cpuperf sets, so it exits 2 too."""
    argv = line.format(v=value).split(" ")
    with pytest.raises(UsageError) as err:
        command_environ(argv, {})
    assert "OMP_NUM_THREADS=" in err.value.message and "env" in err.value.message
    proc = run_cli(["train", "--auto", "--dry-run", "--", *argv])
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "OMP_NUM_THREADS" in _one_error_line(proc.stderr)


def test_a_good_thread_count_set_by_env_is_kept_and_said():
    assert command_environ(["env", "OMP_NUM_THREADS=4", "python", "s.py"], {"OMP_NUM_THREADS": "2"})[
        "OMP_NUM_THREADS"] == "4"


def test_the_report_says_the_thread_count_the_command_really_gets(tmp_path):
    """`-- env OMP_NUM_THREADS=4 python s.py` reported "applied: env OMP_NUM_THREADS=2" while the script got 4."""
    script = tmp_path / "s.py"
    script.write_text("print('hello')\n")
    proc = run_cli(["train", "--auto", "--dry-run", "--set", "threads_per_rank=1", "--json", "--",
                    "env", "OMP_NUM_THREADS=4", PY, str(script)])
    assert proc.returncode == 0, proc.stderr[-1500:]
    got = json.loads(proc.stdout)
    assert not [lv for lv in got["levers"]["applied"] if lv["id"] == "threads_per_rank"], got["levers"]
    threads = next(lv for lv in got["levers"]["not_applied"] if lv["id"] == "threads_per_rank")
    assert threads["value"] == 1 and "OMP_NUM_THREADS=4" in threads["why"], threads
    assert "OMP_NUM_THREADS" not in got["applied"]["env"] and got["applied"]["env_yours"] == {"OMP_NUM_THREADS": "4"}
    assert got["applied"]["threads"] is None
    text = run_cli(["train", "--auto", "--dry-run", "--set", "threads_per_rank=1", "--",
                    "env", "OMP_NUM_THREADS=4", PY, str(script)])
    assert "# applied: env OMP_NUM_THREADS" not in text.stdout and "lever applied: threads_per_rank" not in text.stdout
    assert "not applied: env OMP_NUM_THREADS (the command behind your wrappers gets OMP_NUM_THREADS=4)" in text.stdout


# -- case 14: a launcher's node count -------------------------------------------------------------------------

def _ranks(line: str):
    return launcher_ranks(split_launcher(line.split()), logical_cpus=8, physical_cores=8, interpreter=PY)


@pytest.mark.parametrize("nodes", ["3:1", "0", "-5", "a:b", "1:2:3", "0:2", "", "1:", "9" * 30])
def test_a_torchrun_node_count_no_torchrun_starts_exits_2(nodes):
    with pytest.raises(UsageError) as err:
        _ranks(f"torchrun --nnodes={nodes} --nproc-per-node 2 t.py")
    assert "--nnodes" in err.value.message and "nodes" in err.value.message


@pytest.mark.parametrize("machines", ["999999999999999999999999999999", "0", "-1", "two", "5000"])
def test_an_accelerate_machine_count_out_of_bounds_exits_2(machines):
    with pytest.raises(UsageError) as err:
        _ranks(f"accelerate launch --num_machines {machines} --num_processes 4 t.py")
    assert "--num_machines" in err.value.message


@pytest.mark.parametrize("line, nodes", [
    ("torchrun --nnodes 3 --nproc-per-node 1 t.py", 3), ("torchrun --nnodes=1:4 --nproc-per-node 1 t.py", 4),
    ("torchrun --nnodes 2:2 --nproc-per-node 1 t.py", 2), ("torchrun --nproc-per-node 1 t.py", 1),
    ("accelerate launch --num_machines 4096 --num_processes 4096 t.py", 4096),
])
def test_a_node_count_within_bounds_is_the_jobs(line, nodes):
    assert _ranks(line).nodes == nodes


def test_a_bad_node_count_exits_2_through_the_cli():
    proc = run_cli(["train", "--auto", "--dry-run", "--", "torchrun", "--nnodes", "3:1", "--nproc-per-node", "1",
                    "t.py"])
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "--nnodes" in _one_error_line(proc.stderr)


# -- case 7, from the command line: a batch or accumulation no step finishes ---------------------------------------

@pytest.mark.parametrize("args, said", [
    (["--batch-size", str(10**15)], "--batch-size 1000000000000000: at most 1048576"),
    (["--set", f"grad_accum_steps={2**62}"], "grad_accum_steps=4611686018427387904: at most 65536"),
    (["--set", "batch_size=1048577"], "batch_size=1048577: at most 1048576"),
    (["--set", "dataloader_workers=1000000"], "dataloader_workers=1000000: at most 4096"),
])
def test_a_batch_or_accumulation_no_step_finishes_exits_2(args, said):
    proc = run_cli(["train", "--dry-run", *args])
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert said in _one_error_line(proc.stderr)
