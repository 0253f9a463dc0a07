"""The first recorded host with a real card: one H100 80GB HBM3 + 16 cores of Emerald Rapids (AMX).

tests/fixtures/hosts/h100-emeraldrapids-16c/ holds what `doctor --save-snapshot` wrote on that machine (the /proc +
/sys tree and the installed stack with the GPU NVML reported), the Trainer script and model config it trained, and
what cpuperf printed there (results/). Planning from the tree here must give the plans the live host printed.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any, Dict, List

from cli_util import run_cli, run_json

HOST = Path(__file__).parent / "fixtures" / "hosts" / "h100-emeraldrapids-16c"
SNAP = str(HOST / "snapshot")
RESULTS = HOST / "results"
# The command the check ran (tests/fixtures/hosts/h100-emeraldrapids-16c/results/dry_trainer.json), from its folder.
TRAINER = ["python3", "trainer_script.py", "--model_name_or_path", "llama1b", "--per_device_train_batch_size", "8",
           "--max_steps", "12", "--logging_steps", "4", "--report_to", "none", "--save_strategy", "no",
           "--dataloader_num_workers", "2", "--output_dir", "o"]


def _trainer_dir(tmp_path: Path) -> Path:
    where = tmp_path / "check"
    shutil.copytree(HOST / "trainer", where)
    return where


def _values(decisions: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {d["id"]: d["value"] for d in decisions}


def test_doctor_reads_the_card_and_the_cpu_as_recorded():
    rep, _ = run_json(["doctor", "--sysroot", SNAP])
    (gpu,) = rep["host"]["gpus"]
    assert (gpu["name"], gpu["compute_capability"], gpu["memory_bytes"], gpu["driver_version"]) == \
        ("NVIDIA H100 80GB HBM3", "9.0", 85520809984, "580.159.04")
    assert gpu["bf16"] and gpu["tf32"] and gpu["memory_free_bytes"] == 85017493504
    cpu = rep["host"]["cpu"]
    assert (cpu["microarchitecture"], cpu["family"], cpu["model"]) == ("emeraldrapids", 6, 207)
    assert cpu["bf16_native"] and cpu["amx"]["supported"] and "amx_bf16" in cpu["isa"]
    assert rep["software"]["packages"]["torch"]["cuda"] == "13.0"
    # what doctor said on the live host: one note, no warning or error
    live = json.loads((RESULTS / "doctor.json").read_text())
    ids = [(f["id"], f["severity"]) for f in rep["findings"]]
    assert ids == [(f["id"], f["severity"]) for f in live["findings"]] == [("no-fast-allocator", "info")]
    assert rep["host"]["gpus"] == live["host"]["gpus"]


def test_recommend_plans_the_card():
    rep, _ = run_json(["recommend", "--sysroot", SNAP])
    levers = _values(rep["decisions"])
    assert (levers["device"], levers["dtype"], levers["tf32"]) == ("cuda", "bf16", True)
    assert levers["nproc_per_node"] == 1 and levers["ddp_backend"] is None and levers["ipex"] is False
    assert levers["threads_per_rank"] == 16 and levers["optimizer"] == "adamw_fused"
    live = json.loads((RESULTS / "recommend.json").read_text())
    assert levers == _values(live["decisions"])


def test_the_builtin_dry_run_is_the_one_the_live_host_printed(tmp_path):
    plan, _ = run_json(["train", "--sysroot", SNAP, "--auto", "--dry-run"])
    # The last line of dry_builtin.txt is the worker's command line: its --config is the settings.
    line = (RESULTS / "dry_builtin.txt").read_text().strip().splitlines()[-1]
    live = json.loads(shlex.split(line)[-1])
    differ = {k: (plan["settings"].get(k), v) for k, v in live.items() if plan["settings"].get(k) != v}
    assert set(differ) == {"out_dir"}, differ  # where the run would write is the only difference
    assert (live["device"], live["dtype"], live["tf32"], live["compile"]) == ("cuda", "bf16", True, False)


def test_the_trainer_dry_run_is_the_one_the_live_host_printed(tmp_path):
    where = _trainer_dir(tmp_path)
    plan = _dry_in(where, TRAINER)
    live = json.loads((RESULTS / "dry_trainer.json").read_text())
    assert plan["launch"]["argv"][len(TRAINER):] == live["launch"]["argv"][len(TRAINER):] == ["--bf16", "--tf32", "true"]
    mine, theirs = _values(plan["decisions"]), _values(live["decisions"])
    assert mine == theirs
    assert plan["workload"]["params"] == live["workload"]["params"] == 1099956224


def _dry_in(where: Path, command: List[str]) -> Dict[str, Any]:
    proc = run_cli(["train", "--sysroot", SNAP, "--auto", "--dry-run", "--json", "--", *command], cwd=str(where))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))
