"""benchmarks/profile_step.py: one real profiled step of a reference workload, its time put in classes."""

from __future__ import annotations

import pytest

from benchmarks.profile_step import op_class, profile_workload, render


@pytest.mark.parametrize("name,cls", [("aten::addmm", "gemm"), ("aten::mm", "gemm"), ("aten::bmm", "gemm"),
                                      ("aten::add_", "elementwise"), ("aten::native_layer_norm", "norm/reduce"),
                                      ("aten::copy_", "copy/cast"), ("aten::gelu_backward", "elementwise"),
                                      ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
                                      ("aten::something_new", "other")])
def test_operators_are_put_in_their_class(name, cls):
    assert op_class(name) == cls


@pytest.mark.torch
def test_a_profiled_step_accounts_for_its_time():
    row = profile_workload("mlp", "small", "fp32", steps=1, warmup=1)
    shares = row["class_share"]
    assert isinstance(shares, dict) and shares["gemm"] > 0 and shares["optimizer"] > 0
    assert abs(sum(shares.values()) - 1.0) < 0.01  # every operator's own time counted once
    phases = row["phase_share"]
    assert isinstance(phases, dict) and set(phases) == {"forward", "backward", "optimizer"}
    assert all(v > 0 for v in phases.values())
    assert "mlp-small" in render([row])
