"""The GPU path on recorded NVML answers (tests/fixtures/gpus): probe, doctor findings, blockers,
and `cpuperf recommend --json` decisions and HF flags for T4, A100 and H100 hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_util import run_json
from hosts import FIXTURES, make_host

from cpuperf.decide.doctor import CHECKS, diagnose, gpu_blockers
from cpuperf.decide.gpu_checks import check_gpus, driver_floor, driver_tuple, variant_for_driver
from cpuperf.probe import probe_host
from cpuperf.probe.facts import HostFacts
from cpuperf.probe.gpus import gpus_from_json

GPUS = FIXTURES / "gpus"
SPR = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"]


def recorded(name: str) -> str:
    return (GPUS / name).read_text()


def facts_with(tmp_path: Path, monkeypatch, card: str, packages: dict) -> HostFacts:
    monkeypatch.setenv("CPUPERF_OVERRIDE_GPUS", recorded(card))
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps(packages))
    return probe_host(sysroot=str(make_host(tmp_path, cores_per_socket=16, flags=SPR)))


# --------------------------------------------------------------------------------- probe

def test_recorded_nvml_answer_loads_with_free_memory() -> None:
    h100 = gpus_from_json(recorded("h100-80gb-hbm3.json"))
    assert len(h100) == 2
    g = h100[0]
    assert (g.name, g.compute_capability, g.memory_bytes) == ("NVIDIA H100 80GB HBM3", "9.0", 85520809984)
    assert g.bf16 and g.tf32 and g.driver_version == "580.159.04"
    assert g.memory_free_bytes is not None and 0.99 < g.memory_free_bytes / g.memory_bytes < 1
    (t4, _) = gpus_from_json(recorded("t4.json"))
    assert not t4.bf16 and not t4.tf32 and t4.compute_capability == "7.5"


def test_recorded_facts_without_free_memory_still_load() -> None:
    gpus = gpus_from_json(json.dumps([{"name": "Tesla T4", "compute_capability": "7.5",
                                       "memory_bytes": 16106127360}]))
    assert gpus[0].memory_free_bytes is None
    # a doctor JSON written before the field existed
    from cpuperf.probe.facts import Gpu, _build

    row = {"vendor": "nvidia", "name": "Tesla T4", "compute_capability": "7.5", "memory_bytes": 1,
           "bf16": False, "tf32": False, "index": 0, "driver_version": None, "uuid": None}
    assert _build(Gpu, row).memory_free_bytes is None


def test_nvidia_smi_fallback_reads_memory_free() -> None:
    from cpuperf.probe.parse import parse_nvidia_smi_csv

    rows = parse_nvidia_smi_csv("0, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 9.0, GPU-5b4f, 81023\n")
    assert rows[0]["memory_free_mib"] == "81023" and rows[0]["memory_mib"] == "81559"


# ------------------------------------------------------------------------- driver rules

def test_driver_floor_from_the_compat_matrix() -> None:
    assert driver_floor("12.1")[:2] == ("525.60.13", "cu121")
    assert driver_floor("12.7")[0] == "525.60.13"  # minor-version compatibility: same floor as 12.x
    assert driver_floor("11.8")[0] == "450.80.02"
    assert driver_floor("13.0")[0] == "580"
    assert driver_floor("9.2") is None
    assert driver_tuple("550.54.15") == (550, 54, 15) and driver_tuple("n/a") is None


def test_variant_for_an_old_driver() -> None:
    row = variant_for_driver("2.5.1", "470.256.02")
    assert row is not None and row.tag == "cu118"
    assert variant_for_driver("2.9.0", "470.256.02") is None  # cu126/cu128/cu130 only: need >= 525
    assert variant_for_driver("2.5.1", "550.54.15").tag == "cu124"


def test_driver_too_old_for_torchs_cuda(tmp_path, monkeypatch) -> None:
    facts = facts_with(tmp_path, monkeypatch, "t4-driver-470.json", {"torch": "2.5.1+cu121"})
    (f,) = check_gpus(facts)
    assert f.id == "driver-too-old" and f.severity == "error"
    assert "470.256.02" in f.message and "525.60.13" in f.message and "12.1" in f.message
    assert f.fix.startswith("python -m pip install --force-reinstall 'torch==2.5.1' "
                            "--index-url https://download.pytorch.org/whl/cu118")
    facts = facts_with(tmp_path / "new", monkeypatch, "t4-driver-470.json", {"torch": "2.9.0+cu128"})
    (f,) = check_gpus(facts)
    assert "ubuntu-drivers install --gpgpu" in f.fix and ">= 525.60.13" in f.fix
    # 2.9 builds nothing for 470: the newest torch that does, as `cpuperf install` walks to it
    assert f.fix.startswith("cpuperf install --torch 2.7.1 ") and "(cu118)" in f.fix


def test_torch_2_15_on_a_driver_below_580_is_told_the_newest_torch_it_runs(tmp_path, monkeypatch) -> None:
    """torch 2.15 builds only CUDA 13 (cu130/cu132, driver >= 580): the A100's 535 driver runs 2.14.1's cu126."""
    facts = facts_with(tmp_path, monkeypatch, "a100-sxm4-80gb.json", {"torch": "2.15.0+cu132"})
    (f,) = check_gpus(facts)
    assert f.id == "driver-too-old" and "535.183.01" in f.message and "580" in f.message
    assert f.fix.startswith("cpuperf install --torch 2.14.1 ") and "(cu126)" in f.fix and ">= 580" in f.fix


@pytest.mark.parametrize("card", ["h100-80gb-hbm3.json", "a100-sxm4-80gb.json", "t4.json"])
def test_healthy_recorded_hosts_have_no_gpu_findings(tmp_path, monkeypatch, card) -> None:
    facts = facts_with(tmp_path, monkeypatch, card, {"torch": "2.5.1+cu121"})
    assert check_gpus(facts) == [] and gpu_blockers(facts) == []


# ------------------------------------------------------------------------- free memory

def test_a_gpu_held_by_another_process(tmp_path, monkeypatch) -> None:
    facts = facts_with(tmp_path, monkeypatch, "a100-gpu0-full.json", {"torch": "2.5.1+cu121"})
    (f,) = check_gpus(facts)
    assert f.id == "gpu-memory-full" and f.severity == "warning" and "GPU 0" in f.message
    assert f.fix.startswith("export CUDA_VISIBLE_DEVICES=1 ")
    (line,) = gpu_blockers(facts)
    assert "\n" not in line and "CUDA_VISIBLE_DEVICES=1" in line
    assert gpu_blockers(facts, {"CUDA_VISIBLE_DEVICES": "1"}) == []  # already steered away


def test_every_gpu_full_is_an_error(tmp_path, monkeypatch) -> None:
    rows = json.loads(recorded("t4.json"))
    for r in rows:
        r["free_bytes"] = 200 << 20
    monkeypatch.setenv("CPUPERF_OVERRIDE_GPUS", json.dumps(rows))
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.5.1+cu121"}))
    facts = probe_host(sysroot=str(make_host(tmp_path)))
    (f,) = check_gpus(facts)
    assert f.severity == "error" and f.fix.startswith("nvidia-smi --query-compute-apps=")


# ------------------------------------------------------------------------- doctor wiring

def test_cpu_torch_on_gpu_host_is_a_blocker_and_doctor_has_all(tmp_path, monkeypatch) -> None:
    facts = facts_with(tmp_path, monkeypatch, "h100-80gb-hbm3.json", {"torch": "2.5.1+cpu"})
    (line,) = gpu_blockers(facts)
    assert "CPU-only build" in line and "fix: cpuperf install --yes" in line
    assert check_gpus in CHECKS
    ids = {f.id for f in diagnose(facts)}
    assert "cpu-torch-on-gpu-host" in ids


def test_doctor_cli_reports_the_driver_error(tmp_path) -> None:
    env = {"CPUPERF_OVERRIDE_GPUS": recorded("t4-driver-470.json"),
           "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.5.1+cu121"})}
    rep, _ = run_json(["doctor", "--sysroot", str(make_host(tmp_path))], env, expect_rc=None)
    found = {f["id"]: f for f in rep["findings"]}
    assert found["driver-too-old"]["severity"] == "error"
    assert rep["host"]["gpus"][0]["memory_free_bytes"] == 15996026880


# ------------------------------------------------------------------------- recommend

def _recommend(tmp_path: Path, card: str, transformers: str = "4.46.0"):
    env = {"CPUPERF_OVERRIDE_GPUS": recorded(card),
           "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.5.1+cu121", "transformers": transformers})}
    root = make_host(tmp_path, sockets=2, cores_per_socket=32, flags=SPR)
    rep, _ = run_json(["recommend", "--sysroot", str(root), "--model", "gpt2-small"], env)
    return rep, {d["id"]: d for d in rep["decisions"]}


@pytest.mark.parametrize("card, dtype, tf32, flag, memory", [
    ("t4.json", "fp16", False, "--fp16", 16106127360),
    ("a100-sxm4-80gb.json", "bf16", True, "--bf16", 85899345920),
    ("h100-80gb-hbm3.json", "bf16", True, "--bf16", 85520809984),
])
def test_recommend_json_on_recorded_cards(tmp_path, card, dtype, tf32, flag, memory) -> None:
    rep, d = _recommend(tmp_path, card)
    assert d["device"]["value"] == "cuda"
    assert d["dtype"]["value"] == dtype and d["tf32"]["value"] is tf32
    assert d["nproc_per_node"]["value"] == 2 and d["ddp_backend"]["value"] == "nccl"
    assert d["optimizer"]["value"] == "adamw_fused" and d["pin_memory"]["value"] is True
    batch, accum = d["batch_size"]["value"], d["grad_accum_steps"]["value"]
    ev = d["batch_size"]["evidence"]
    assert batch % 8 == 0 and ev["budget_bytes"] <= memory
    assert ev["weights_grads_optimizer_bytes"] + batch * ev["activation_bytes_per_sample"] <= ev["budget_bytes"]
    assert batch * accum * 2 >= rep["workload"]["batch_size"]  # the global batch is kept
    args = rep["hf_args"]
    assert flag in args and ("--tf32" in args) is tf32
    # Speed flags only: the batch plan is a decision to read, never a flag pasted over the script's own.
    assert "--per_device_train_batch_size" not in args and "--gradient_accumulation_steps" not in args
    assert args[args.index("--optim") + 1] == "adamw_torch_fused"
    assert "--dataloader_pin_memory" not in args  # true is the Trainer's default
    assert "--use_cpu" not in args and "--no_cuda" not in args


def test_hf_flags_follow_the_installed_transformers(tmp_path) -> None:
    rep, _ = _recommend(tmp_path, "a100-sxm4-80gb.json", transformers="4.20.0")
    args = rep["hf_args"]
    assert "--bf16" in args and "--tf32" in args  # 4.10 / 4.15
    assert "adamw_torch_fused" not in args  # optim=adamw_torch_fused arrived in 4.27


def test_recommend_plans_for_the_memory_left_on_a_shared_gpu(tmp_path, monkeypatch) -> None:
    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import PRESETS

    rows = json.loads(recorded("a100-sxm4-80gb.json"))[:1]
    rows[0]["free_bytes"] = 20 << 30  # another job holds 60 GiB
    monkeypatch.setenv("CPUPERF_OVERRIDE_GPUS", json.dumps(rows))
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.5.1+cu121"}))
    facts = probe_host(sysroot=str(make_host(tmp_path)))
    rec = recommend(facts, PRESETS["gpt2-small"])
    ev = rec.levers.batch_size.evidence
    assert ev["budget_bytes"] == int((20 << 30) * 0.9) and "free of" in ev["budget"]
