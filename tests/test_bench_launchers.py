"""benchmarks/user_launchers.py: the hand placement every rank gets, the commands compared, the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "scripts"))

import pin_rank  # noqa: E402

from benchmarks.user_launchers import commands, markdown_rows  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_hand_placement_gives_each_rank_its_own_cores(n):
    cpus = sorted(os.sched_getaffinity(0))
    blocks = pin_rank.blocks(cpus, n)
    assert len(blocks) == n and all(blocks)
    assert all(set(b) <= set(cpus) for b in blocks)
    flat = [c for b in blocks for c in b]
    cores = {pin_rank._core(c) for c in cpus}
    if len(cores) >= n:
        assert len(flat) == len(set(flat)) == len(cores)  # disjoint, one CPU per physical core, all cores used


def test_pin_rank_pins_each_local_rank_and_sets_its_threads():
    cpus = sorted(os.sched_getaffinity(0))
    n = min(2, len(cpus))
    seen = []
    for local in range(n):
        env = dict(os.environ, LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(n))
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scripts" / "pin_rank.py"), sys.executable, "-c",
                              "import json, os; print(json.dumps([sorted(os.sched_getaffinity(0)), "
                              "os.environ['OMP_NUM_THREADS']]))"], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        got, threads = json.loads(out.stdout)
        assert got == pin_rank.blocks(cpus, n)[local] and threads == str(len(got))
        seen.append(set(got))
    if n == 2 and len({pin_rank._core(c) for c in cpus}) >= 2:
        assert not seen[0] & seen[1]


def test_hand_runs_the_plain_command_behind_the_per_rank_step():
    for workload in ("launch-ddp", "launch-hf-1", "launch-hf-torchrun"):
        c = commands(workload, 2, 5)
        pin = c["hand"].index(str(ROOT / "benchmarks" / "scripts" / "pin_rank.py"))
        assert c["hand"][:pin] + c["hand"][pin + 1:] == c["plain"]
        if workload != "launch-hf-1":
            assert "--nproc-per-node=2" in c["plain"]
    assert "--use_cpu" in commands("launch-hf-torchrun", 2, 5)["plain"]  # the same DDP job in every configuration


def test_the_table_names_ratios_placements_and_misses():
    seen = {"plain": [{"rank": 0, "cpus": [0, 1], "torch_threads": 1}, {"rank": 1, "cpus": [0, 1], "torch_threads": 1}],
            "auto": [{"rank": 0, "cpus": [0], "torch_threads": 1}, {"rank": 1, "cpus": [1], "torch_threads": 1}],
            "hand": [{"rank": 0, "cpus": [0], "torch_threads": 1}, {"rank": 1, "cpus": [1], "torch_threads": 1}]}
    result = {"workload": "launch-ddp", "ranks": 2, "rounds": 3, "steps": 20, "ranks_seen": seen,
              "ratio_spread": {"auto_vs_plain": {"median": 1.1, "min": 1.0, "max": 1.2},
                               "auto_vs_hand": {"median": 0.9, "min": 0.85, "max": 0.99}},
              "auto_supervisor": [{"cpu_share": 0.0002}, None],
              "targets": {"auto_vs_plain >= 1.0": True, "auto_vs_hand >= 0.97": False}}
    row = markdown_rows([result])[-1]
    assert "1.10x (1.00-1.20)" in row and "0.90x (0.85-0.99)" in row
    assert "r0 CPUs 0-1 x1, r1 CPUs 0-1 x1; r0 CPUs 0 x1, r1 CPUs 1 x1" in row
    assert "0.02% of a core" in row and "MISSED: auto_vs_hand >= 0.97" in row
