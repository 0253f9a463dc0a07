"""Rank 0's real GPU memory peak from inside a user's own script (cpuperf/rank_hook, plan/peak_report.py,
run/rank_peak.py): asked for on a GPU under --auto only, reported beside the plan's figure, and never a change
to the job (its own sitecustomize still runs, its sys.path is as it was).

No card here: CPUPERF_OVERRIDE_GPUS stands for the card, CPUPERF_RECORDED_GPU_PEAK for what torch.cuda reported
on the recorded H100 (tests/fixtures/hosts/h100-emeraldrapids-16c: the 1.1B Llama Trainer run, batch 8 x 1024).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from cli_util import run_cli

from cpuperf.plan.peak_report import HOOK_DIR

HOST = Path(__file__).parent / "fixtures" / "hosts" / "h100-emeraldrapids-16c"
CARD = (Path(__file__).parent / "fixtures" / "gpus" / "h100-80gb-hbm3.json").read_text()
# torch.cuda.max_memory_allocated / max_memory_reserved as the recorded Trainer run printed them (35.44, 37.22 GiB)
RECORDED = {"max_allocated_bytes": 38054655590, "max_reserved_bytes": 39964000000, "device_name": "NVIDIA H100 80GB HBM3"}


def _child(tmp_path: Path, code: str, env: Optional[Dict[str, str]] = None,
           pythonpath: Optional[List[str]] = None) -> subprocess.CompletedProcess:
    """A real interpreter started as cpuperf starts a rank: the hook first on PYTHONPATH."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CPUPERF_", "RANK", "LOCAL_RANK", "PYTHON"))}
    full.update({"PYTHONPATH": os.pathsep.join([HOOK_DIR, *(pythonpath or [])]),
                 "CPUPERF_GPU_PEAK_FILE": str(tmp_path / "gpu_peak.json"), **(env or {})})
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_the_jobs_own_sitecustomize_still_runs_and_its_path_is_its_own(tmp_path):
    theirs = tmp_path / "site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\nMARK = 'theirs'\n")
    proc = _child(tmp_path, "import os, sys, sitecustomize; print(os.environ.get('THEIRS_RAN'), sitecustomize.MARK, "
                            f"any(os.path.abspath(p) == {HOOK_DIR!r} for p in sys.path))", pythonpath=[str(theirs)])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.split() == ["yes", "theirs", "False"]
    assert not (tmp_path / "gpu_peak.json").exists()  # no torch imported: nothing to report


def test_a_failing_sitecustomize_of_the_jobs_is_said_as_python_says_it(tmp_path):
    theirs = tmp_path / "site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("raise RuntimeError('broken on purpose')\n")
    proc = _child(tmp_path, "print('ran')", pythonpath=[str(theirs)])
    assert proc.returncode == 0 and proc.stdout.strip() == "ran"
    assert "Error in sitecustomize" in proc.stderr and "RuntimeError: broken on purpose" in proc.stderr


@pytest.mark.full  # a child that imports torch
@pytest.mark.parametrize("rank_env, writes", [({}, True), ({"RANK": "0"}, True), ({"RANK": "1"}, False),
                                              ({"LOCAL_RANK": "1"}, False)])
def test_rank_zero_alone_reports_where_the_job_imported_torch(tmp_path, rank_env, writes):
    proc = _child(tmp_path, "import torch; print('trained')",
                  {"CPUPERF_RECORDED_GPU_PEAK": json.dumps(RECORDED), **rank_env})
    assert proc.returncode == 0 and proc.stdout.strip() == "trained", proc.stderr
    path = tmp_path / "gpu_peak.json"
    assert path.exists() == writes
    if writes:
        report = json.loads(path.read_text())
        assert {k: report[k] for k in RECORDED} == RECORDED and isinstance(report["pid"], int)


@pytest.mark.full  # a child that imports torch
def test_a_job_that_used_no_card_reports_nothing_and_exits_as_it_would(tmp_path):
    proc = _child(tmp_path, "import sys, torch; torch.ones(2).sum(); sys.exit(3)")
    assert proc.returncode == 3 and proc.stderr == ""
    assert not (tmp_path / "gpu_peak.json").exists()  # torch.cuda never initialised


def test_the_report_is_read_as_data(tmp_path):
    from cpuperf.run.rank_peak import read_rank_peak

    path = tmp_path / "gpu_peak.json"
    peak, why = read_rank_peak(str(path))
    assert peak is None and "reported no GPU memory peak" in str(why)
    for bad in ('{"max_allocated_bytes": -1, "max_reserved_bytes": 1}', '{"max_allocated_bytes": 1}', "[1]",
                '{"max_allocated_bytes": 1, "max_allocated_bytes": 2, "max_reserved_bytes": 3}', "x" * (2 << 20)):
        path.write_text(bad)
        peak, why = read_rank_peak(str(path))
        assert peak is None and why is not None and str(path) in why, bad
    path.write_text(json.dumps({**RECORDED, "pid": 7}))
    peak, why = read_rank_peak(str(path))
    assert why is None and peak is not None
    assert (peak.max_allocated_bytes, peak.max_reserved_bytes, peak.device_name) == (38054655590, 39964000000,
                                                                                RECORDED["device_name"])


TRAINER = ["python3", "trainer_script.py", "--model_name_or_path", "llama1b", "--per_device_train_batch_size", "8",
           "--output_dir", "o"]


def _dry(where: Path, args: List[str], env: Optional[Dict[str, str]] = None) -> Dict[str, object]:
    proc = run_cli(["train", "--sysroot", str(HOST / "snapshot"), "--dry-run", "--json", *args, "--", *TRAINER],
                   extra_env=env, cwd=str(where))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


def test_auto_on_a_card_asks_rank_zero_and_keeps_the_users_pythonpath(tmp_path):
    shutil.copytree(HOST / "trainer", tmp_path / "check")
    plan = _dry(tmp_path / "check", ["--auto"], {"PYTHONPATH": "/their/lib"})
    env = plan["launch"]["env"]  # type: ignore[index]
    assert env["PYTHONPATH"] == os.pathsep.join([HOOK_DIR, "/their/lib"])
    assert env["CPUPERF_GPU_PEAK_FILE"].endswith(os.path.join("version_0", "gpu_peak.json"))
    assert "real GPU memory peak" in plan["launch"]["env_reasons"]["PYTHONPATH"]  # type: ignore[index]
    plain = _dry(tmp_path / "check", [])  # a plain run is the job as given: nothing added
    assert "CPUPERF_GPU_PEAK_FILE" not in plain["launch"]["env"]  # type: ignore[index]
    assert "PYTHONPATH" not in plain["launch"]["env"]  # type: ignore[index]


def test_a_cpu_job_is_not_asked(tmp_path):
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--", "python", "s.py"],
                   extra_env={"CPUPERF_OVERRIDE_GPUS": "[]"}, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = json.loads(proc.stdout)["launch"]["env"]
    assert "CPUPERF_GPU_PEAK_FILE" not in env and "PYTHONPATH" not in env


@pytest.mark.full  # a real `cpuperf train` of a script under torchrun
def test_the_run_reports_rank_zeros_peak_beside_the_plan(tmp_path):
    """The recorded 1.1B Llama case run again with a stand-in script: the plan for batch 8 x 1024 beside what rank 0
    of the job reported, in --json and in the closing message, within 15% (the plan budgets 38.96 GiB)."""
    where = tmp_path / "check"
    shutil.copytree(HOST / "trainer" / "llama1b", where / "llama1b")
    (where / "trainer_script.py").write_text("import sys\n\nimport torch  # noqa: F401\n\nprint('ran', len(sys.argv))\n")
    # torch 2.8 plans no --numa-binding, which this host's CPU torch could not honour
    env = {"CPUPERF_OVERRIDE_GPUS": CARD, "CPUPERF_RECORDED_GPU_PEAK": json.dumps(RECORDED),
           "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.8.0+cu128", "transformers": "5.17.0"})}
    proc = run_cli(["train", "--auto", "--json", "--", *TRAINER, "--seq_len", "1024"], extra_env=env, cwd=str(where),
                   process=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mem = json.loads(proc.stdout)["gpu_memory"]
    assert (mem["max_allocated_bytes"], mem["max_reserved_bytes"], mem["batch_size"]) == (
        RECORDED["max_allocated_bytes"], RECORDED["max_reserved_bytes"], 8)
    assert 0.85 <= mem["planned_over_allocated"] <= 1.15 and 0.85 <= mem["planned_over_reserved"] <= 1.15
    human = run_cli(["train", "--auto", "--", *TRAINER, "--seq_len", "1024"], extra_env=env, cwd=str(where),
                    process=True, timeout=600)
    assert human.returncode == 0, human.stderr[-3000:]
    assert "GPU memory (rank 0): peak 35.4 GiB allocated, 37.2 GiB reserved; planned 39.0 GiB (1.10x allocated)" \
        in human.stderr
