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
    launch = plan_launch(with_numactl, placement, LaunchSpec(rank_command=["python", "x.py"], memory_policy=policy),
                         mpi=None)  # one process, started directly: no MPI launcher asked
    assert launch.launcher == "direct"
    assert launch.argv == ("/usr/bin/numactl", "--interleave=0,1,2,3", "python", "x.py")
    assert launch.rank_command == ("python", "x.py")  # what the process runs once numactl has exec'd it
    assert launch.affinity  # pinned as before: numactl sets the memory policy only
    without = plan_launch(facts, placement, LaunchSpec(rank_command=["python", "x.py"], memory_policy=policy), mpi=None)
    assert without.argv == ("python", "x.py") and any("numactl is not installed" in n for n in without.notes)
    several = plan_placement(facts, nproc_per_node=2)
    assert memory_policy(facts, several, on_gpu=False, auto=True) == (None, None)  # a rank per socket
    assert memory_policy(facts, placement, on_gpu=True, auto=True) == (None, None)  # a GPU job
    assert memory_policy(facts, placement, on_gpu=False, auto=False)[0] is None  # the plain baseline


# -- train --tune compares the policy where the host has several nodes --------------------------------------------

def _with_numactl(facts):
    from cpuperf.probe.facts import Software

    return replace(facts, software=Software(python="3.11.0", python_abi="cp311", executable="", prefix="", packages={},
                                            mpi=(), numactl="/usr/bin/numactl", openmp={}, allocators={}))


def _one_process(facts, **request):
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import PRESETS

    return recommend(facts, PRESETS["micro"], RecommendRequest(nproc_per_node=1, **request))


@pytest.mark.parametrize("name", sorted(MULTI))
def test_tune_compares_interleave_with_first_touch_on_several_nodes(trees, name):
    from cpuperf.decide.tune import candidates, neighbours, start_point
    from cpuperf.knowledge.tuning import tuning

    facts = _with_numactl(probe_host(sysroot=str(trees[name])))
    rec = _one_process(facts)
    cand = candidates(facts, rec, tuning(), script=True)
    assert cand.values["memory"] == ("interleave", None) and "memory" not in cand.skipped
    assert cand.memory_argv == ("/usr/bin/numactl", f"--interleave={NODES[name]}")  # what a bench point runs under
    start = start_point(rec, cand)
    assert start.memory == "interleave" and start.ranks == 1  # the rule's point: the plan's own policy
    first_touch = [q for lever, q in neighbours(start, cand) if lever == "memory"]
    assert first_touch == [start.with_value("memory", None)] and "interleave" in start.label()
    assert not cand.allowed(start.with_value("layout", (2, start.threads // 2)))  # no policy on a rank per socket
    # where numactl is not installed the plan cannot apply it: not a candidate, said why
    bare = candidates(probe_host(sysroot=str(trees[name])), rec, tuning(), script=True)
    assert "memory" not in bare.values and "numactl, which is not installed" in bare.skipped["memory"]
    # --set numa_memory is yours; a rank per socket keeps each rank's memory on its own node
    assert candidates(facts, rec, tuning(), memory_asked=None).skipped["memory"] == "numa_memory is set by you"
    several = candidates(facts, _one_process(facts, overrides={"nproc_per_node": 2}), tuning())
    assert "memory" not in several.values and "a rank per socket" in several.skipped["memory"]


@pytest.mark.parametrize("name", sorted(ONE))
def test_tune_has_no_memory_lever_on_one_node(trees, name):
    from cpuperf.decide.tune import candidates, start_point
    from cpuperf.knowledge.tuning import tuning

    facts = _with_numactl(probe_host(sysroot=str(trees[name])))
    rec = _one_process(facts)
    cand = candidates(facts, rec, tuning(), script=True)
    assert "memory" not in cand.values and "memory" not in cand.skipped and cand.memory_argv == ()
    assert start_point(rec, cand).memory is None and "first touch" not in start_point(rec, cand).label()


def test_a_tuned_first_touch_is_what_later_runs_of_the_command_start(trees):
    """A tuning that judged first touch faster: the next plan of the command starts without the policy, and says
    why; what you set still wins; the cache entry reads back with its memory value."""
    from cpuperf.decide.measurement_schema import tuning as schema
    from cpuperf.decide.tune import Candidates, Point, Search, decision_values, descend
    from cpuperf.plan.build import build_job_plan, decided_inputs

    def planned(facts, rec):
        request, edge = decided_inputs(rec)
        return build_job_plan(request, facts, edge)

    facts = probe_host(sysroot=str(trees["2x1"]))
    start = Point(ranks=1, threads=8, memory="interleave")
    cand = Candidates({"memory": ("interleave", None)})
    clock = [0.0]

    def run(p):
        clock[0] += 1
        return [12.0, 12.1, 11.9] if p.memory is None else [10.0, 10.1, 9.9]

    result = descend(start, cand, run, Search(budget_s=100, passes=2, min_gain=0.02, confidence=0.95),
                     clock=lambda: clock[0])
    assert result.best.memory is None and result.judged()["memory"]["outcome"] == "moved"
    assert decision_values(result.best)["numa_memory"] is None
    entry = {**result.to_json(), "measured_at": 1795516100}
    assert schema()(json.loads(json.dumps(entry))) is None  # the cache's reader keeps it
    assert Point.from_json(entry["best"]).memory is None and Point.from_json(entry["start"]).memory == "interleave"
    rec = _one_process(facts, tuned=(entry, "on this command"))
    assert rec.options["numa_memory"].value is None
    jp = planned(facts, rec)
    assert jp.memory is None
    assert any(n.startswith("numa_memory: first touch, tuned on this command") for n in jp.notes), jp.notes
    yours = planned(facts, _one_process(facts, tuned=(entry, "on this command"),
                                                overrides={"numa_memory": "interleave"}))
    assert yours.memory is not None and yours.memory.nodes == (0, 1)


# -- a saved plan carries the policy -------------------------------------------------------------------------------

def _save(tree: Path, path: Path, *args: str) -> dict:
    proc = run_cli(["recommend", "--sysroot", str(tree), "--nproc-per-node", "1", "--save", str(path), *args],
                   extra_env=NO_GPU)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(path.read_text())


def _run_plan(tree: Path, path: Path, *args: str):
    return run_cli(["train", "--plan", str(path), "--sysroot", str(tree), "--dry-run", "--json", *args, "--", "python",
                    "plain_loop.py"], extra_env=NO_GPU, cwd=str(SCRIPTS))


def test_recommend_save_writes_the_policy_and_train_plan_applies_it_as_saved(trees, tmp_path):
    path = tmp_path / "plan.json"
    saved = _save(trees["2x1"], path)
    assert saved["memory"]["mode"] == "interleave" and saved["memory"]["nodes"] == [0, 1] and saved["memory"]["reason"]
    proc = _run_plan(trees["2x1"], path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    assert _row(plan)["value"] == "interleave" and "interleave over NUMA nodes 0,1" in _row(plan)["why"]
    assert not any("numa_memory" in n for n in plan["notes"]), plan["notes"]  # as cpuperf decides here: nothing to say
    # saved as you asked it: first touch, and run so
    none = tmp_path / "none.json"
    assert "memory" not in _save(trees["2x1"], none, "--set", "numa_memory=none")
    proc = _run_plan(trees["2x1"], none)
    assert proc.returncode == 0 and "numa_memory" not in json.dumps(json.loads(proc.stdout)["levers"])
    # a plan saved before cpuperf planned the policy runs as saved (first touch), the difference said
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in saved.items() if k != "memory"}))
    proc = _run_plan(trees["2x1"], old)
    plan = json.loads(proc.stdout)
    assert proc.returncode == 0 and "numa_memory" not in json.dumps(plan["levers"])
    assert any("numa_memory: the plan says first touch, cpuperf decides interleave over NUMA nodes 0,1 here" in n
               for n in plan["notes"]), plan["notes"]
    # one NUMA node: no policy to save
    assert "memory" not in _save(trees["1x1"], tmp_path / "one.json")


def test_a_saved_policy_over_nodes_this_host_lacks_is_refused_or_planned_again(trees, tmp_path):
    path = tmp_path / "plan.json"
    saved = _save(trees["2x1"], path)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**saved, "memory": {**saved["memory"], "nodes": [0, 7]}}))
    proc = _run_plan(trees["2x1"], edited)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "no NUMA node 7 (it has 0,1)" in lines[0], proc.stderr
    # a plan made for four nodes on a host of two: another host (exit 13), or planned again here with --replan
    four = tmp_path / "four.json"
    assert _save(trees["4x1"], four)["memory"]["nodes"] == [0, 1, 2, 3]
    proc = _run_plan(trees["2x1"], four)
    assert proc.returncode == 13 and "numa nodes: planned for 4, this host has 2" in proc.stderr, proc.stderr
    proc = _run_plan(trees["2x1"], four, "--replan")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interleave over NUMA nodes 0,1" in _row(json.loads(proc.stdout))["why"]
    # a policy of one process on a placement of several ranks is no plan
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_save(trees["2x1"], tmp_path / "two.json", "--nproc-per-node", "2"),
                               "memory": saved["memory"]}))
    proc = _run_plan(trees["2x1"], bad)
    assert proc.returncode == 2 and "the placement has 2 ranks per node" in proc.stderr, proc.stderr
