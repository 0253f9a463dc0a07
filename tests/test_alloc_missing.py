"""Do no harm with allocators: where the plan decided an allocator whose library is not in this environment (a saved
plan from a node that had it, a recorded host's measurement, ccl-env's preload on a machine without it), the job
preloads none, never another allocator nobody decided, and every command says that the decided one is not applied
because its library is missing here, with the fix. Allocators are described at the OS edge only: a recorded host's
stack (its `.cpuperf/stack.json`) and library files in a directory on LD_LIBRARY_PATH, where the probe looks."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest
from cli_util import run_cli

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"  # where the recorded host had it


def _recorded_host(root: Path, allocators: Dict[str, List[str]]) -> Path:
    """A recorded 4-core host (tests/hosts.py), its stack with `allocators`, and its measurement: jemalloc 1.30x the
    default on the reference LM, tcmalloc 0.99x (the default kept where jemalloc is not there)."""
    import time

    from hosts import make_host

    make_host(root, cores_per_socket=4)
    package = {"local": None, "build": None, "cuda": None, "location": "VENV/lib/python3.11/site-packages"}
    stack = {"schema": "cpuperf.snapshot-stack/1", "gpus": [], "software": {
        "python": "3.11.9", "python_abi": "cp311", "executable": "python3", "prefix": "VENV", "mpi": [], "numactl": None,
        "packages": {"torch": {**package, "version": "2.13.0+cpu", "local": "cpu", "build": "cpu"}},
        "openmp": {"gomp": [], "iomp": [], "omp": []},
        "allocators": {"tcmalloc": [], "jemalloc": [], "mimalloc": [], **allocators}}}
    measured = {"schema": "cpuperf.measurement/2", "host_id": "recorded", "measured_at": int(time.time()),
                "torch_build": {"version": "2.13.0+cpu", "local": "cpu", "git": None}, "method": "side-by-side/2",
                "ratios": {}, "undecided": {}, "threads": 4, "torch": "2.13.0+cpu", "gemm_fp32_gflops": 100.0,
                "allocator_speedup": {"jemalloc": 1.3, "jemalloc_by_workload": {"lm": 1.3, "mlp": 1.3},
                                      "tcmalloc": 0.99, "tcmalloc_by_workload": {"lm": 0.99, "mlp": 0.99}}}
    (root / ".cpuperf").mkdir()
    (root / ".cpuperf" / "stack.json").write_text(json.dumps(stack))
    (root / ".cpuperf" / "measurements.json").write_text(json.dumps(measured))
    return root


@pytest.fixture
def hosts(tmp_path):
    """(the host the plan was made on: jemalloc and tcmalloc; the same host without jemalloc; an environment whose
    library directory holds only tcmalloc, where ccl-env --preload looks)."""
    system = ("/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
              "/lib/x86_64-linux-gnu", "/lib64")
    if any(glob.glob(f"{d}/libjemalloc.so*") for d in system):
        pytest.skip("this machine has a libjemalloc: the case is a machine without it")
    tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
    had = _recorded_host(tmp_path / "had", {"jemalloc": [JEMALLOC], "tcmalloc": [tcmalloc]})
    lacks = _recorded_host(tmp_path / "lacks", {"tcmalloc": [tcmalloc]})
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "libtcmalloc.so.4").write_bytes(b"")  # the first of ALLOCATORS' order: the old fallback's pick
    env = {"CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "LD_LIBRARY_PATH": str(libs), "HOME": str(tmp_path)}
    return had, lacks, libs, env


def _run(args: List[str], env: Dict[str, str], rc: int = 0) -> Dict[str, Any]:
    proc = run_cli([args[0], "--json", *args[1:]], env)
    assert proc.returncode == rc, (args, proc.stdout[-1500:], proc.stderr[-1500:])
    out: Dict[str, Any] = json.loads(proc.stdout)
    return out


def _allocator_lever(levers: Dict[str, Any]) -> Dict[str, Any]:
    return next(d for part in ("applied", "not_applied") for d in levers[part] if d["id"] == "allocator")


def test_ccl_env_preloads_no_other_allocator_than_the_one_decided(hosts):
    """The recorded host decided jemalloc (measured 1.30x); this machine has only tcmalloc: --preload adds no
    allocator (the old fallback preloaded tcmalloc, measured slower than the default there), and says why and how."""
    had, _, libs, env = hosts
    out = _run(["ccl-env", "--preload", "--sysroot", str(had)], env)
    lever = _allocator_lever(out["levers"])
    assert lever["value"] == "jemalloc" and lever in out["levers"]["not_applied"], lever
    preload = out["env"].get("LD_PRELOAD", "")
    assert "tcmalloc" not in preload and "jemalloc" not in preload and "MALLOC_CONF" not in out["env"], out["env"]
    assert "library (libjemalloc.so) is not found here" in lever["why"] and "libjemalloc2" in lever["why"], lever
    assert any("the plan decided jemalloc" in n and "no allocator is preloaded" in n for n in out["notes"]), out["notes"]


def test_ccl_env_without_a_decision_still_falls_back_to_the_first_installed(hosts, tmp_path):
    """The documented fallback stands where nothing decided an allocator (nothing measured): the first installed."""
    _, lacks, libs, env = hosts
    (lacks / ".cpuperf" / "measurements.json").unlink()
    out = _run(["ccl-env", "--preload", "--sysroot", str(lacks)], env)
    assert _allocator_lever(out["levers"])["value"] is None
    assert str(libs / "libtcmalloc.so.4") in out["env"]["LD_PRELOAD"].split(":"), out["env"]


def test_a_saved_plan_runs_without_the_allocator_this_host_lacks(hosts, tmp_path):
    """A plan saved where jemalloc was decided and preloaded, run on the same host and stack without libjemalloc:
    train --plan and ccl-env --plan preload no allocator (not jemalloc's missing file, not tcmalloc), drop jemalloc's
    MALLOC_CONF, and the lever report says jemalloc is not applied, its library missing here, with the fix."""
    had, lacks, _, env = hosts
    plan = tmp_path / "plan.json"
    saved = _run(["recommend", "--sysroot", str(had), "--save", str(plan)], env)
    assert next(d["value"] for d in saved["decisions"] if d["id"] == "allocator") == "jemalloc"
    assert JEMALLOC in saved["env"]["LD_PRELOAD"] and "MALLOC_CONF" in saved["env"], saved["env"]
    out = _run(["train", "--plan", str(plan), "--dry-run", "--sysroot", str(lacks)], env)
    job_env = out["launch"]["env"]
    assert "LD_PRELOAD" not in job_env and "MALLOC_CONF" not in job_env, job_env
    lever = _allocator_lever(out["levers"])
    assert lever["value"] == "jemalloc" and lever in out["levers"]["not_applied"], lever
    assert "is not found here" in lever["why"] and "libjemalloc2" in lever["why"], lever
    ccl = _run(["ccl-env", "--plan", str(plan), "--preload", "--sysroot", str(lacks)], env)
    assert "jemalloc" not in ccl["env"].get("LD_PRELOAD", "") and "tcmalloc" not in ccl["env"].get("LD_PRELOAD", "")
    assert "MALLOC_CONF" not in ccl["env"], ccl["env"]
    assert "is not found here" in _allocator_lever(ccl["levers"])["why"]


def test_train_plans_on_this_host_never_preload_another_allocator(hosts, tmp_path):
    """train --auto --dry-run on the host without jemalloc, built-in loop and a script: the measurement names jemalloc
    but the decision reads only what is installed (tcmalloc, 0.99x): the default kept, nothing preloaded."""
    _, lacks, _, env = hosts
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    for tail in ([], ["--", "python", str(script)]):
        out = _run(["train", "--auto", "--dry-run", "--sysroot", str(lacks), *tail], env)
        assert _allocator_lever(out["levers"])["value"] is None
        assert "LD_PRELOAD" not in out["launch"]["env"], (tail, out["launch"]["env"])


def test_the_interpreter_named_beside_a_recorded_host_has_its_own_libraries(tmp_path):
    """--sysroot (the recorded /proc and /sys) with --python (a real interpreter here): the libraries of that
    interpreter's environment (an allocator wheel in its site-packages) are read from this machine's files, not
    looked for inside the recorded tree."""
    from fakeenv import make_venv, site_packages
    from hosts import make_host

    from cpuperf.probe import probe_host

    root = tmp_path / "host"
    make_host(root, cores_per_socket=2)
    venv = make_venv(tmp_path / "venv")
    lib = site_packages(venv) / "cmeel.prefix" / "lib"
    lib.mkdir(parents=True)
    (lib / "libmimalloc.so").write_bytes(b"")
    python = str(venv / "bin" / "python")
    facts = probe_host(sysroot=str(root), python=python, use_cache=False)
    assert facts.software is not None and facts.software.allocators["mimalloc"] == (str(lib / "libmimalloc.so"),)
    assert facts.topology.physical_cores == 2  # the hardware is still the recorded host's
    out = _run(["doctor", "--sysroot", str(root), "--python", python],
               {"CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)})
    assert out["software"]["allocators"]["mimalloc"] == [str(lib / "libmimalloc.so")], out["software"]
    shutil.rmtree(venv)
