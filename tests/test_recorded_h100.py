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

import pytest
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
    assert [(f["id"], f["severity"]) for f in live["findings"]] == [("no-fast-allocator", "info")]
    # since the recording, doctor also names the CPU data it lacks a source for (Emerald Rapids' boost clock)
    assert ids == [("cpu-data-unsourced", "info"), ("no-fast-allocator", "info")], ids
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
    # where the run would write, and the built-in model: since the recording the first run follows the host's 16
    # cores (the small preset, decide/workload.builtin_default), where the recording ran tiny
    assert set(differ) == {"out_dir", "preset"} and differ["preset"] == ("small", "tiny"), differ
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


def _recorded_peak() -> Dict[str, float]:
    """The Trainer script's own report on the card: torch.cuda.max_memory_allocated / reserved, in GiB."""
    line = next(ln for ln in (RESULTS / "trainer_auto.stdout.txt").read_text().splitlines()
                if ln.startswith("TRAINER_RESULT "))
    result = json.loads(line.split(" ", 1)[1])
    assert "--per_device_train_batch_size" in result["argv"] and "--bf16" in result["argv"]
    return {"allocated": result["peak_alloc_gib"], "reserved": result["peak_reserved_gib"]}


def _recorded_plan(monkeypatch, batch: int = 8) -> Any:
    """The plan for the recorded run: 1.1B Llama shape, batch x 1024 tokens (the script's --seq_len), one H100."""
    from dataclasses import replace

    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import from_hf_config
    from cpuperf.probe import probe_host

    for name in ("CPUPERF_OVERRIDE_GPUS", "CPUPERF_OVERRIDE_PACKAGES"):
        monkeypatch.delenv(name, raising=False)
    facts = probe_host(sysroot=SNAP)
    w = replace(from_hf_config(str(HOST / "trainer" / "llama1b" / "config.json")), seq_len=1024, batch_size=batch)
    return recommend(facts, w)


def test_the_memory_plan_predicts_the_recorded_peak_within_15_percent(monkeypatch):
    rec = _recorded_plan(monkeypatch)
    assert (rec.levers.dtype.value, rec.levers.optimizer.value, rec.levers.batch_size.value) == ("bf16", "adamw_fused", 8)
    assert rec.levers.grad_checkpointing.value is False and rec.levers.grad_accum_steps.value == 1
    predicted = rec.levers.batch_size.evidence["per_rank_bytes"] / 2**30
    peak = _recorded_peak()  # 35.44 allocated, 37.22 reserved
    for what in ("allocated", "reserved"):
        assert abs(predicted - peak[what]) <= 0.15 * peak[what], (what, predicted, peak)
    # and the plan fits what it predicts within the card's budget
    assert rec.levers.batch_size.evidence["per_rank_bytes"] <= rec.levers.batch_size.evidence["budget_bytes"]


def test_a_sequence_length_the_plan_cannot_see_is_said(tmp_path):
    where = _trainer_dir(tmp_path)
    reason = next(d["reason"] for d in _dry_in(where, TRAINER)["decisions"] if d["id"] == "batch_size")
    assert "assumed 2048 tokens per sample" in reason and "--block_size" in reason
    # the script's own name for it (its ModelArgs.seq_len), in the spellings its HfArgumentParser reads
    for named in (["--seq_len", "1024"], ["--seq-len=1024"], ["--seq_l", "1024"]):
        told = _dry_in(where, [*TRAINER, *named])
        reason = next(d["reason"] for d in told["decisions"] if d["id"] == "batch_size")
        assert "assumed" not in reason and "8 x 1024 = 8192 tokens" in reason and "38.96 GiB" in reason, reason


def test_the_run_sets_its_real_peak_beside_the_plan(monkeypatch):
    from cpuperf.commands.train import _memory_line
    from cpuperf.decide.memory import planned_peak

    evidence = _recorded_plan(monkeypatch).levers.batch_size.evidence
    peak = _recorded_peak()
    # what rank 0 reports (cpuperf.train.loop gpu_memory), for the batch that ran
    measured = {"max_allocated_bytes": int(peak["allocated"] * 2**30), "max_reserved_bytes": int(peak["reserved"] * 2**30),
                "batch_size": 8}
    mem = planned_peak(evidence, 8, measured)
    assert mem["planned_bytes"] == evidence["per_rank_bytes"]
    assert 0.85 <= mem["planned_over_allocated"] <= 1.15 and 0.85 <= mem["planned_over_reserved"] <= 1.15
    line = _memory_line(mem)
    assert "peak 35.4 GiB allocated, 37.2 GiB reserved; planned 39.0 GiB (1.10x allocated)" in line, line
    # a batch the trial shrank: the plan's figure for the batch that ran, not for the one planned
    smaller = planned_peak(evidence, 4, {**measured, "batch_size": 4})
    assert smaller["planned_bytes"] == evidence["weights_grads_optimizer_bytes"] + 4 * evidence["activation_bytes_per_sample"]
    assert planned_peak({}, 8, measured) == measured  # no plan figure: the real peak alone


def test_a_saved_plan_keeps_the_blocks_shape(tmp_path):
    from cpuperf.plan.saved import loads

    path = tmp_path / "plan.json"
    proc = run_cli(["recommend", "--sysroot", SNAP, "--model", str(HOST / "trainer" / "llama1b" / "config.json"),
                    "--seq-len", "1024", "--batch-size", "8", "--save", str(path), "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    w = loads(path.read_text()).rec.workload
    assert (w.block, w.d_ff, w.kv_heads, w.seq_len) == ("llama", 5632, 4, 1024)
    # a plan written before the block's shape was saved reads as before: the defaults
    data = json.loads(path.read_text())
    for key in ("block", "d_ff", "kv_heads"):
        del data["workload"][key]
    old = loads(json.dumps(data)).rec.workload
    assert (old.block, old.d_ff, old.kv_heads, old.seq_len) == ("gpt2", 0, 0, 1024)
    data["workload"]["block"] = "mamba"  # a family the plan cannot count is refused, not planned as another
    with pytest.raises(Exception, match="workload.block"):
        loads(json.dumps(data))
