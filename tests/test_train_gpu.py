"""The worker's GPU path on CPU: peak table, AMP plan, SDPA report, batch fit (CPU tensors only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cpuperf.data import load_builtin
from cpuperf.train.gpu import (
    BatchFitError,
    MemoryProbe,
    Peak,
    confirm_batch,
    fit_batch,
    math_dtype,
    peak_rows,
    sdpa_constraints,
    table_peak,
)
from cpuperf.train.worker import _peak_tflops
from cpuperf.worker_settings import TrainSettings

ROOT = Path(__file__).resolve().parent.parent
GiB = 1 << 30
MiB = 1 << 20


# ------------------------------------------------------------------------------- peaks

def test_every_peak_row_has_a_datasheet_source_and_sane_numbers() -> None:
    rows = load_builtin("gpu_peaks.toml")["gpu"]
    assert rows and rows == peak_rows()
    for row in rows:
        # the vendor's document by name, and where NVIDIA publishes it (or that it does not, for China-only parts)
        assert "datasheet" in row["source"] and ("nvidia.com" in row["source"] or "nvidia.cn" in row["source"]), row
        assert row["fp32"] > 0
        for half in ("bf16", "fp16", "tf32"):
            if half in row:  # Tensor Core rates are never below plain FP32
                assert row[half] >= row["fp32"] * 0.99, row


@pytest.mark.parametrize("name, dtype, tf32, want", [
    ("NVIDIA H100 80GB HBM3", "bf16", True, 989.4),
    ("NVIDIA H100 PCIe", "bf16", True, 756.5),
    ("NVIDIA H100 NVL", "fp16", False, 835.5),
    ("NVIDIA H200", "bf16", True, 989.4),
    ("NVIDIA A100-SXM4-80GB", "fp32", True, 156.0),
    ("NVIDIA A100-SXM4-80GB", "fp32", False, 19.5),
    ("NVIDIA A100 80GB PCIe", "bf16", False, 312.0),
    ("NVIDIA L40S", "bf16", True, 362.05),
    ("NVIDIA L4", "bf16", True, 121.0),
    ("NVIDIA A10", "bf16", True, 125.0),
    ("Tesla T4", "fp16", False, 65.0),
    ("Tesla V100-SXM2-16GB", "fp16", False, 125.0),
])
def test_table_peak_by_card_and_dtype(name: str, dtype: str, tf32: bool, want: float) -> None:
    peak = table_peak(f"cuda:0 ({name})", dtype, tf32)
    assert peak is not None and peak.tflops == want and peak.dtype == math_dtype(dtype, tf32)


def test_unknown_cards_and_missing_tensor_cores_have_no_table_peak() -> None:
    assert table_peak("NVIDIA A10G", "bf16") is None  # not the A10: measured instead
    assert table_peak("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "bf16") is None  # 300 W: measured
    assert table_peak("NVIDIA GB300-WS", "bf16") is None  # the DGX Station part: measured
    assert table_peak("Some Future GPU", "bf16") is None
    assert table_peak("Tesla T4", "bf16") is None  # Turing has no bf16 Tensor Cores
    assert table_peak("Tesla T4", "fp32", tf32=True) is None  # nor TF32


def test_worker_peak_uses_the_dtype_really_run() -> None:
    gpu = TrainSettings(device="cuda", dtype="bf16")
    assert _peak_tflops(gpu, "cuda:0 (NVIDIA H100 80GB HBM3)").tflops == 989.4
    # fp16 asked on a T4 and bf16 asked on a T4 both run fp16 autocast: the fp16 peak is the denominator
    assert _peak_tflops(gpu, "cuda:0 (Tesla T4)", "fp16").tflops == 65.0
    cpu = _peak_tflops(TrainSettings(), "cpu")  # the hardware peak (compat/cpu_peaks.toml), never a measured one
    assert cpu is None or (cpu.source.startswith("hardware:") and cpu.dtype == "fp32" and cpu.tflops > 0)
    own = _peak_tflops(TrainSettings(peak_tflops=2.5), "cpu")
    assert isinstance(own, Peak) and own.tflops == 2.5 and own.source == "settings.peak_tflops"


def test_measured_peak_on_cpu_is_positive_and_leaves_the_rng_alone() -> None:
    import torch

    from cpuperf.train.gpu import measure_peak

    torch.manual_seed(1)
    before = torch.get_rng_state()
    peak = measure_peak("cpu", "fp32", size=128, seconds=0.05)
    assert peak.tflops > 0 and peak.source.startswith("measured") and peak.dtype == "fp32"
    assert torch.equal(before, torch.get_rng_state())


# ------------------------------------------------------------------------------- AMP

@pytest.mark.parametrize("dtype, cc, want", [
    ("bf16", (9, 0), ("bf16", True, False)),
    ("fp16", (8, 0), ("bf16", True, False)),  # never fp16 where bf16 is native
    ("auto", (8, 6), ("bf16", True, False)),
    ("bf16", (7, 5), ("fp16", True, True)),  # Turing: fp16 autocast + GradScaler
    ("fp16", (7, 0), ("fp16", True, True)),
    ("bf16", (6, 1), ("fp32", False, False)),  # Pascal: no Tensor Cores
    ("fp32", (9, 0), ("fp32", False, False)),
])
def test_amp_plan_cuda(dtype: str, cc: tuple, want: tuple) -> None:
    import torch

    from cpuperf.train.gpu import amp_plan

    plan = amp_plan(dtype, torch.device("cuda", 0), cc=cc)
    assert (plan.name, plan.autocast, plan.grad_scaler) == want


def test_amp_plan_cpu() -> None:
    import torch

    from cpuperf.train.gpu import amp_plan

    assert amp_plan("bf16", "cpu") == (True, torch.bfloat16, False)
    assert amp_plan("fp32", "cpu") == (False, torch.float32, False)
    assert amp_plan("fp16", "cpu").autocast is False  # no fp16 autocast training on CPU
    with pytest.raises(ValueError):
        amp_plan("fp8", "cpu")


# ------------------------------------------------------------------------------- SDPA

def test_sdpa_report_on_cpu_runs_the_cpu_flash_kernel() -> None:
    from cpuperf.train.gpu import sdpa_report

    rep = sdpa_report(2, 4, 64, 32, "fp32", "cpu")
    assert rep["kernel"] == "flash" and rep["why_not"] == {} and rep["device"] == "cpu"
    rep = sdpa_report(1, 2, 32, 16, "bf16", "cpu")
    assert rep["kernel"] == "flash"


def test_sdpa_report_explains_the_fallback_with_torchs_words() -> None:
    import torch

    from cpuperf.train.gpu import sdpa_report

    # Attention dropout rules the CPU flash kernel out; the next in priority order is what runs.
    rep = sdpa_report(1, 2, 32, 16, torch.float32, "cpu", dropout_p=0.1)
    assert rep["kernel"] == "math"
    assert "do not support non-zero dropout" in rep["why_not"]["flash"]  # torch's own words
    assert "Triggered internally" not in rep["why_not"]["flash"]
    assert "CUDA-only" in rep["why_not"]["mem_efficient"]


def test_sdpa_report_leaves_the_rng_alone() -> None:
    import torch

    from cpuperf.train.gpu import sdpa_report

    torch.manual_seed(3)
    before = torch.get_rng_state()
    sdpa_report(1, 2, 16, 8, "fp32", "cpu")
    assert torch.equal(before, torch.get_rng_state())


def test_sdpa_constraints_for_recorded_cards() -> None:
    t4 = sdpa_constraints("flash", "fp16", 64, "cuda", (7, 5))
    assert t4 == ["flash needs compute capability >= 8.0 (this card: 7.5)"]
    a100_fp32 = sdpa_constraints("flash", "fp32", 64, "cuda", (8, 0))
    assert any("fp16 or bf16" in r for r in a100_fp32)
    assert sdpa_constraints("flash", "bf16", 64, "cuda", (9, 0)) == []
    assert any("head size" in r for r in sdpa_constraints("flash", "bf16", 257, "cuda", (9, 0)))
    assert sdpa_constraints("mem_efficient", "bf16", 64, "cuda", (7, 5))  # no bf16 before Ampere


# ------------------------------------------------------------------------------- batch fit

def test_fit_batch_keeps_a_batch_that_fits() -> None:
    # 8 GiB fixed + 64 x 0.5 GiB = 40 GiB peak on an 80 GiB card
    assert fit_batch(40 * GiB, 8 * GiB, 64, 80 * GiB, 8, 256, 2) == (64, 2)


def test_fit_batch_scales_by_bytes_per_sample_in_one_go() -> None:
    # 16 GiB T4: 2 GiB fixed + 64 x 0.5 GiB = 34 GiB peak; 16*0.9 = 14.4 GiB usable -> 24 samples fit
    batch, accum = fit_batch(34 * GiB, 2 * GiB, 64, 16 * GiB, 8, 64, 1)
    assert (batch, accum) == (24, 3)
    assert batch * accum >= 64  # the global batch is kept (rounded up)
    # fp16 prefers multiples of 64; when fewer fit, multiples of 8
    assert fit_batch(34 * GiB, 2 * GiB, 64, 16 * GiB, 64, 64, 1) == (24, 3)
    assert fit_batch(300 * GiB, 2 * GiB, 512, 80 * GiB, 64, 1024, 1) == (64, 16)


def test_fit_batch_from_a_small_trial_never_exceeds_the_plan() -> None:
    # trial at 8 samples after an OOM at 64: 1 GiB + 8 x 1 GiB; 40 GiB card -> 35 fit -> 32
    assert fit_batch(9 * GiB, 1 * GiB, 8, 40 * GiB, 8, 64, 1, planned=64) == (32, 2)
    # a huge card: the planned 64 is kept
    assert fit_batch(9 * GiB, 1 * GiB, 8, 400 * GiB, 8, 64, 1, planned=64) == (64, 1)


def test_fit_batch_below_eight_and_nothing_fits() -> None:
    assert fit_batch(20 * GiB, 2 * GiB, 6, 10 * GiB, 8, 6, 1) == (2, 3)
    with pytest.raises(BatchFitError):
        fit_batch(20 * GiB, 9 * GiB, 4, 10 * GiB, 8, 4, 1)


class FakeOOM(RuntimeError):
    pass


def recorded_card(total: int, fixed: int, per_sample: int):
    """A stand-in for torch.cuda's counters: a card of `total` bytes, a model of `fixed` bytes."""
    state = {"peak": fixed, "calls": []}

    def step(n: int) -> None:
        state["calls"].append(n)
        need = fixed + n * per_sample
        if need > total:
            raise FakeOOM("CUDA out of memory. Tried to allocate 2.00 GiB")
        state["peak"] = need

    mem = MemoryProbe(reset_peak=lambda: state.update(peak=fixed), allocated=lambda: fixed,
                      peak=lambda: state["peak"], usable=lambda: total, release=lambda: None)
    return step, mem, state


def test_confirm_batch_keeps_what_fits_with_one_trial() -> None:
    step, mem, state = recorded_card(80 * GiB, 4 * GiB, 256 * MiB)
    rep = confirm_batch(step, 64, 128, 2, 8, mem)
    assert state["calls"] == [64] and rep["batch"] == 64 and rep["grad_accum_steps"] == 1
    assert rep["adjusted"] is False and rep["oom"] is False


def test_confirm_batch_after_oom_measures_a_small_batch_then_scales() -> None:
    step, mem, state = recorded_card(16 * GiB, 2 * GiB, 512 * MiB)
    rep = confirm_batch(step, 64, 64, 1, 8, mem)
    assert state["calls"] == [64, 8]  # one OOM, one measurement: no repeated halving
    assert rep["oom"] and rep["adjusted"] and rep["bytes_per_sample"] == 512 * MiB
    assert (rep["batch"], rep["grad_accum_steps"]) == (24, 3)


def test_confirm_batch_peak_over_headroom_without_oom() -> None:
    step, mem, state = recorded_card(16 * GiB, 2 * GiB, 200 * MiB)  # 64 samples: 14.5 GiB > 14.4
    rep = confirm_batch(step, 64, 64, 1, 8, mem)
    assert state["calls"] == [64] and not rep["oom"] and rep["batch"] == 56 and rep["grad_accum_steps"] == 2


def test_confirm_batch_counts_optimizer_state_and_keeps_grads_out_of_per_sample() -> None:
    step, mem, _ = recorded_card(80 * GiB, 4 * GiB, 256 * MiB)
    rep = confirm_batch(step, 64, 64, 1, 8, mem, fixed_bytes=8 * GiB, grad_bytes=2 * GiB)
    assert rep["base_bytes"] == 14 * GiB and rep["peak_bytes"] == 28 * GiB


def test_confirm_batch_nothing_fits_and_other_errors_pass_through() -> None:
    step, mem, _ = recorded_card(4 * GiB, 2 * GiB, 1 * GiB)
    with pytest.raises(BatchFitError):
        confirm_batch(step, 64, 64, 1, 8, mem)

    def broken(n: int) -> None:
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError):
        confirm_batch(broken, 8, 8, 1, 8, mem)


def test_gpu_module_imports_without_torch() -> None:
    code = "import sys, cpuperf.train.gpu, cpuperf.decide.gpu_checks; assert 'torch' not in sys.modules"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_worker_trial_step_runs_the_real_model_on_cpu(tmp_path) -> None:
    """Run.trial_batch with the micro model on CPU tensors and a recorded 16 GiB card's counters."""
    from cpuperf.train.worker import Run, _Stop

    s = TrainSettings(preset="micro", batch_size=64, grad_accum_steps=1, out_dir=str(tmp_path), bpe_merges=32,
                      progress="off", max_steps=1)
    run = Run(s, _Stop())
    run.setup_dist()
    run.setup_data()
    run.setup_model()
    calls = []
    per_sample = 512 * MiB

    def peak() -> int:
        return 2 * GiB + calls[-1] * per_sample

    real_step_ran = []
    run.memory_probe = MemoryProbe(reset_peak=lambda: None, allocated=lambda: 2 * GiB, peak=peak,
                                   usable=lambda: 16 * GiB, release=lambda: None)
    model = run.raw_model
    original_forward = model.forward

    def forward(x, y=None):  # record the batch each trial step really ran
        calls.append(x.shape[0])
        out = original_forward(x, y)
        real_step_ran.append(out[1].requires_grad)
        return out

    model.forward = forward
    rep = run.trial_batch(model)
    assert calls == [64] and real_step_ran == [True]
    assert all(p.grad is None for p in model.parameters())  # the trial leaves no gradients behind
    assert rep["adjusted"] and (rep["batch"], rep["grad_accum_steps"]) == (24, 3)
    assert rep["planned_grad_accum_steps"] == 1
