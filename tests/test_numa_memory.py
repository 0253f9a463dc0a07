"""One process over several NUMA nodes gets a memory policy (compat/tuning.toml [numa_memory]: interleave over its
nodes, numactl --interleave=<nodes>), named in the plan's notes and in the lever report; none where the job's one
process sits on one node, or the job has a rank per socket; `--set numa_memory=none` opts out.

Planned on recorded multi-socket trees (--sysroot, tests/hosts.make_host: 2 sockets of one node each, 2 sockets of
two nodes each with SMT like an EPYC 7451, 4 sockets) and one-node trees, for every one-process command form."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Dict, Sequence

import pytest
from cli_util import run_cli
from hosts import make_host

from cpuperf.decide.placement import memory_policy, plan_placement
from cpuperf.plan.launch import LaunchSpec, plan_launch
from cpuperf.probe import probe_host

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
NO_GPU = {"CPUPERF_OVERRIDE_GPUS": "[]"}
MULTI = {"2x1": dict(sockets=2, cores_per_socket=4), "2x2-smt": dict(sockets=2, cores_per_socket=6, threads_per_core=2,
                                                                       nodes_per_socket=2),
         "4x1": dict(sockets=4, cores_per_socket=16)}
ONE = {"1x1": dict(sockets=1, cores_per_socket=4), "1x1-smt": dict(sockets=1, cores_per_socket=8, threads_per_core=2)}
NODES = {"2x1": "0,1", "2x2-smt": "0,1,2,3", "4x1": "0,1,2,3"}
# The job forms that stay one process on a multi-socket host (the same-job rule), and the built-in loop as one rank.
ONE_PROCESS = (["--", "python", "plain_loop.py", "--steps", "2"], ["--", "python", "ddp_loop.py"],
               ["--", "python", "-m", "some_package.train"], ["--", "env", "FOO=1", "python", "plain_loop.py"],
               ["--", "python", "hf_parser.py", "--output_dir", "o", "--per_device_train_batch_size", "1"],
               ["--nproc-per-node", "1"])


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("numa")
    return {name: make_host(root / name, flags=("avx2", "fma", "avx512f"), **spec) for name, spec in {**MULTI, **ONE}.items()}


def _plan(tree: Path, args: Sequence[str]) -> dict:
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree), *args], extra_env=NO_GPU,
                   cwd=str(SCRIPTS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _row(plan: dict) -> dict:
    rows = [r for side in ("applied", "not_applied") for r in plan["levers"][side] if r["id"] == "numa_memory"]
    assert len(rows) == 1, plan["levers"]
    return rows[0]


@pytest.mark.parametrize("name", sorted(MULTI))
def test_every_one_process_job_over_several_nodes_gets_the_policy(trees, name):
    for args in ONE_PROCESS:
        plan = _plan(trees[name], args)
        assert plan["launch"]["world_size"] == 1, args
        row = _row(plan)
        assert row["value"] == "interleave" and f"interleave over NUMA nodes {NODES[name]}" in row["why"], (args, row)
        # a recorded tree has no numactl of its own: the plan says so, and what would be run
        assert "numactl is not installed" in row["why"], row
        assert any(n.startswith(f"memory: interleave over NUMA nodes {NODES[name]}") for n in plan["launch"]["notes"]), args


@pytest.mark.parametrize("name", sorted(ONE))
def test_no_policy_on_one_node(trees, name):
    for args in ONE_PROCESS:
        out = json.dumps(_plan(trees[name], args))
        assert "numa_memory" not in out and "interleave" not in out, args


def test_a_rank_per_socket_has_no_policy(trees):
    plan = _plan(trees["2x2-smt"], ["--", "python", "hf_parser.py", "--output_dir", "o"])  # batch 8: split over sockets
    assert plan["launch"]["world_size"] == 2 and "numa_memory" not in json.dumps(plan["levers"])


def test_opting_out_and_asking_on_one_node(trees):
    plan = _plan(trees["2x1"], ["--set", "numa_memory=none", "--", "python", "plain_loop.py"])
    assert "numa_memory" not in json.dumps(plan["levers"]) and "numactl" not in plan["launch"]["argv"]
    assert any("numa_memory=none" in n for n in plan["notes"]), plan["notes"]
    plan = _plan(trees["1x1"], ["--set", "numa_memory=interleave", "--", "python", "plain_loop.py"])
    assert "numa_memory" not in json.dumps(plan["levers"])
    assert any("one NUMA node, nothing to interleave" in n for n in plan["notes"]), plan["notes"]
    bad = run_cli(["train", "--auto", "--dry-run", "--sysroot", str(trees["2x1"]), "--set", "numa_memory=bind", "--",
                   "python", "plain_loop.py"], extra_env=NO_GPU, cwd=str(SCRIPTS))
    assert bad.returncode == 2 and "numa_memory" in bad.stderr


def test_without_auto_only_when_asked(trees):
    plain = run_cli(["train", "--dry-run", "--json", "--sysroot", str(trees["2x1"]), "--", "python", "plain_loop.py"],
                    extra_env=NO_GPU, cwd=str(SCRIPTS))
    assert plain.returncode == 0 and "numa_memory" not in plain.stdout  # the plain baseline is torch's defaults
    asked = run_cli(["train", "--dry-run", "--json", "--sysroot", str(trees["2x1"]), "--set", "numa_memory=interleave",
                     "--", "python", "plain_loop.py"], extra_env=NO_GPU, cwd=str(SCRIPTS))
    assert asked.returncode == 0 and _row(json.loads(asked.stdout))["value"] == "interleave"


def test_where_numactl_is_installed_the_process_starts_under_it(trees):
    facts = probe_host(sysroot=str(trees["2x2-smt"]))
    assert facts.software is None or not facts.software.numactl  # a recorded tree: none
    placement = plan_placement(facts, nproc_per_node=1)
    policy, note = memory_policy(facts, placement, on_gpu=False, auto=True)
    assert policy is not None and policy.nodes == (0, 1, 2, 3) and note is None
    from cpuperf.probe.facts import Software

    software = Software(python="3.11.0", python_abi="cp311", executable="", prefix="", packages={}, mpi=(),
                        numactl="/usr/bin/numactl", openmp={}, allocators={})
    with_numactl = replace(facts, software=software)
    launch = plan_launch(with_numactl, placement, LaunchSpec(rank_command=["python", "x.py"], memory_policy=policy))
    assert launch.launcher == "direct"
    assert launch.argv == ("/usr/bin/numactl", "--interleave=0,1,2,3", "python", "x.py")
    assert launch.rank_command == ("python", "x.py")  # what the process runs once numactl has exec'd it
    assert launch.affinity  # pinned as before: numactl sets the memory policy only
    without = plan_launch(facts, placement, LaunchSpec(rank_command=["python", "x.py"], memory_policy=policy))
    assert without.argv == ("python", "x.py") and any("numactl is not installed" in n for n in without.notes)
    several = plan_placement(facts, nproc_per_node=2)
    assert memory_policy(facts, several, on_gpu=False, auto=True) == (None, None)  # a rank per socket
    assert memory_policy(facts, placement, on_gpu=True, auto=True) == (None, None)  # a GPU job
    assert memory_policy(facts, placement, on_gpu=False, auto=False)[0] is None  # the plain baseline
