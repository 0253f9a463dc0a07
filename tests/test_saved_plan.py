"""Plans are deterministic and can be saved (issue 23): the same host, stack and arguments give the same plan in
recommend, ccl-env and train, run after run, with or without other work on the host; `recommend --save` writes
one plan that `train --plan` and `ccl-env --plan` use as it stands, and refuse on another host or stack."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cli_util import run_cli, run_json
from hosts import make_host

from cpuperf.decide.placement import plan_placement
from cpuperf.errors import ExitCode
from cpuperf.probe import probe_host

STACK = json.dumps({"torch": "2.13.0+cpu", "transformers": "5.23.0"})


def _stable(rec):
    """What a plan is: decisions (values and reasons), placement and runtime env."""
    return ([(d["id"], d["value"], d["reason"]) for d in rec["decisions"]], rec["placement"], rec["env"])


@pytest.fixture
def foreign_busy_process():
    """Another user's busy loop on one of the CPUs the job would use."""
    cpus = [c for s in plan_placement(probe_host()).slots for c in s.compute_cpus]
    code = f"import os\nos.sched_setaffinity(0, {{{cpus[-1]}}})\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.3)
    yield
    proc.kill()
    proc.wait()


def test_the_same_plan_run_after_run_and_with_a_foreign_busy_process(foreign_busy_process):
    first, _ = run_json(["recommend"])
    second, _ = run_json(["recommend"])
    assert _stable(first) == _stable(second)
    threads = next(d["value"] for d in first["decisions"] if d["id"] == "threads_per_rank")
    assert first["env"]["OMP_NUM_THREADS"] == str(threads)
    # ccl-env and train --dry-run plan the same: test_one_plan.py's test_recommend_ccl_env_and_train_dry_run_agree


def test_a_saved_plan_is_run_and_rendered_as_it_stands(tmp_path):
    path = str(tmp_path / "plan.json")
    rec, _ = run_json(["recommend", "--save", path])
    saved = json.loads(open(path).read())
    assert saved["schema"] == "cpuperf.plan/1" and saved["host"]["usable_cpus"] and saved["stack"]["python"]
    assert "MASTER_ADDR" not in {e["name"] for e in saved["env"]}  # a launch's own, not the plan's
    dry, _ = run_json(["train", "--plan", path, "--dry-run"])
    assert {d["id"]: d["value"] for d in dry["decisions"]} == {d["id"]: d["value"] for d in rec["decisions"]}
    for var in saved["env"]:
        assert dry["launch"]["env"][var["name"]] == var["value"], var
    assert any("run as saved" in n for n in dry["notes"])
    ccl, _ = run_json(["ccl-env", "--plan", path])
    for var in saved["env"]:
        if var["name"] not in ("LD_PRELOAD", "MALLOC_CONF"):
            assert ccl["env"][var["name"]] == var["value"], var
    again, _ = run_json(["ccl-env"])
    assert again["env"] == ccl["env"]


def test_a_plan_saved_with_params_reads_back_and_plans_again(tmp_path):
    """recommend --params 124M --save wrote "params": "124M", which the reader refused (a whole number only): the
    plan it had just written could not be run. The count is kept as given and read as --params reads it; a whole
    number (a plan written by hand) still reads."""
    from cpuperf.plan import saved

    path = tmp_path / "plan.json"
    rec, _ = run_json(["recommend", "--params", "124M", "--seq-len", "128", "--save", str(path)])
    assert json.loads(path.read_text())["inputs"]["params"] == "124M"
    plan = saved.loads(path.read_text())
    assert plan.inputs["params"] == "124M"
    dry, _ = run_json(["train", "--plan", str(path), "--replan", "--dry-run"])
    assert dry["workload"]["params"] == rec["workload"]["params"]
    by_hand = json.loads(path.read_text())
    by_hand["inputs"]["params"] = 124000000
    assert saved.loads(json.dumps(by_hand)).inputs["params"] == 124000000
    by_hand["inputs"]["params"] = "many"
    with pytest.raises(ValueError, match="inputs.params 'many' is not a parameter count"):
        saved.loads(json.dumps(by_hand))


def test_a_plan_for_another_stack_is_refused_naming_the_difference(tmp_path):
    path = str(tmp_path / "plan.json")
    run_json(["recommend", "--save", path], {"CPUPERF_OVERRIDE_PACKAGES": STACK})
    other = json.dumps({"torch": "2.8.0+cpu", "transformers": "5.23.0"})
    for argv in (["train", "--plan", path, "--dry-run"], ["ccl-env", "--plan", path]):
        proc = run_cli(argv, {"CPUPERF_OVERRIDE_PACKAGES": other})
        assert proc.returncode == ExitCode.PLAN_MISMATCH == 13, proc.stderr
        assert "torch: planned for 2.13.0+cpu, this host has 2.8.0+cpu" in proc.stderr and "--replan" in proc.stderr
    data, _ = run_json(["train", "--plan", path, "--replan", "--dry-run"], {"CPUPERF_OVERRIDE_PACKAGES": other})
    assert any("--replan" in n and "torch" in n for n in data["notes"])


def test_one_plan_serves_identical_nodes_and_refuses_a_different_one(tmp_path):
    env = {"CPUPERF_OVERRIDE_PACKAGES": STACK}
    node_a = str(make_host(tmp_path / "a", sockets=2, cores_per_socket=8, flags=("avx2", "fma", "avx512f")))
    node_b = str(make_host(tmp_path / "b", sockets=2, cores_per_socket=8, flags=("avx2", "fma", "avx512f")))
    small = str(make_host(tmp_path / "c", sockets=2, cores_per_socket=6, flags=("avx2", "fma", "avx512f")))
    path = str(tmp_path / "plan.json")
    run_json(["recommend", "--sysroot", node_a, "--save", path], env)
    for node in (node_a, node_b):
        data, _ = run_json(["train", "--plan", path, "--sysroot", node, "--dry-run"], env)
        assert [r["cpus"] for r in data["launch"]["per_rank"]] == [list(range(8)), list(range(8, 16))]
    proc = run_cli(["train", "--plan", path, "--sysroot", small, "--dry-run"], env)
    assert proc.returncode == ExitCode.PLAN_MISMATCH and "physical cores: planned for 16, this host has 12" in proc.stderr


@pytest.mark.parametrize("content", ["", "{", "[]", '{"schema": "cpuperf.plan/1"}', "\x00\x01binary",
                                     '{"schema": "cpuperf.plan/2", "decisions": []}'])
def test_a_file_that_is_not_a_plan_gets_one_line(tmp_path, content):
    path = tmp_path / "plan.json"
    path.write_bytes(content.encode("latin-1"))
    proc = run_cli(["train", "--plan", str(path), "--dry-run"])
    assert proc.returncode == ExitCode.USAGE and "Traceback" not in proc.stderr
    assert f"plan file {path}" in proc.stderr


def test_a_saved_plan_fixes_the_decisions(tmp_path):
    path = str(tmp_path / "plan.json")
    run_json(["recommend", "--save", path])
    proc = run_cli(["train", "--plan", path, "--set", "dtype=bf16", "--dry-run"])
    assert proc.returncode == ExitCode.USAGE and "fixes the decisions" in proc.stderr
    proc = run_cli(["train", "--plan", str(tmp_path), "--dry-run"])
    assert proc.returncode == ExitCode.USAGE and "not a regular file" in proc.stderr
