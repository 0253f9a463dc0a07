"""`python -m cpuperf.run.rankexec` with a malformed slot variable: one line, exit 2, no traceback (issue 32)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("slots", ["{", '{"a": 1}', "[1]", '[{"cpus": "x"}]', '[{"cpus": [0], "threads": "2"}]',
                                   '[{"cpus": [true]}]', '[{"cpus": [-1]}]', '[{"cpus": [0], "threads": 0}]',
                                   "[" * 30000 + "]" * 30000, '[{"cpus": [1e400]}]'])
def test_a_malformed_slot_variable_is_one_line_and_exit_2(tmp_path, slots):
    canary = tmp_path / "ran"
    env = {**os.environ, "CPUPERF_RANK_SLOTS": slots, "LOCAL_RANK": "0"}
    proc = subprocess.run([sys.executable, "-m", "cpuperf.run.rankexec", "--", "touch", str(canary)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "CPUPERF_RANK_SLOTS is malformed" in proc.stderr
    assert not canary.exists()


def test_a_good_slot_runs_the_command_pinned(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[0]
    env = {**os.environ, "CPUPERF_RANK_SLOTS": f'[{{"cpus": [{cpu}], "threads": 1}}]', "LOCAL_RANK": "0"}
    code = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'])"
    proc = subprocess.run([sys.executable, "-m", "cpuperf.run.rankexec", "--", sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [f"[{cpu}]", "1"]


@pytest.mark.parametrize("args", [[], ["--rank", "x", "--world", "2", "--master", "h", "--port", "1"],
                                  ["--rank", "2", "--world", "2", "--master", "h", "--port", "1"],
                                  ["--rank", "0", "--world", "2", "--master", "a;b", "--port", "1"],
                                  ["--rank", "0", "--world", "2", "--master", "h", "--port", "99999"],
                                  ["--rank", "0", "--world", "2", "--master", "h", "--port", "1", "--bucket-mb", "inf"]])
def test_the_allreduce_worker_refuses_bad_arguments_in_one_line(args):
    proc = subprocess.run([sys.executable, "-m", "cpuperf.train.collectives", *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("cpuperf.train.collectives: ")
