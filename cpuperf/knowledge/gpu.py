"""GPU rules shared by the planner and the worker: datasheet peaks, Tensor Core dtypes, and when a
fused attention kernel cannot run. Pure (torch-free); the peaks are data in compat/gpu_peaks.toml.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from cpuperf.jsonable import JsonObject, as_json
from cpuperf.probe.facts import Gpu, HostFacts

# Ampere (compute capability 8.0) brought bf16 and TF32 Tensor Cores; Volta (7.0) fp16 ones.
# Source: CUDA C Programming Guide, "Compute Capabilities"; NVIDIA Ampere and Volta whitepapers.
BF16_CC = (8, 0)
FP16_TC_CC = (7, 0)

DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Peak:
    """The MFU denominator: dense TFLOP/s for the dtype used, and where the number came from."""

    tflops: float
    dtype: str  # bf16 | fp16 | tf32 | fp32: the math the run uses
    source: str  # the datasheet row, or 'measured: ...'
    card: Optional[str] = None  # the table row's pattern

    def to_json(self) -> JsonObject:
        return as_json(self)


def math_dtype(dtype: str, tf32: bool) -> str:
    """The Tensor Core math a run uses: bf16/fp16 autocast, else tf32 when allowed, else fp32."""
    if dtype in ("bf16", "fp16"):
        return dtype
    return "tf32" if tf32 else "fp32"


def peak_rows() -> List[Dict[str, Any]]:
    """compat/gpu_peaks.toml rows, in match order (torch-free)."""
    from cpuperf.data import load_builtin

    return list(load_builtin("gpu_peaks.toml").get("gpu", []))


def table_peak(device_name: str, dtype: str, tf32: bool = False) -> Optional[Peak]:
    """The datasheet peak for a card name and dtype; None for a card (or a dtype) not in the table."""
    want = math_dtype(dtype, tf32)
    for row in peak_rows():
        if re.search(row["match"], device_name):
            value = row.get(want)
            if value is None:
                return None  # e.g. bf16 on a T4: no such Tensor Cores, so no datasheet number
            return Peak(float(value), want, str(row.get("source", "")), str(row["match"]))
    return None


# The dispatcher's default priority (torch/nn/attention: _get_sdp_priority_order) when torch
# cannot tell us: flash, memory-efficient, math, cuDNN.
_DEFAULT_ORDER = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION")
KERNEL_NAMES = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "mem_efficient",
                "CUDNN_ATTENTION": "cudnn", "MATH": "math"}


def sdpa_constraints(kernel: str, dtype: str, head_dim: int, device_type: str,
                     cc: Optional[Tuple[int, int]], mask: bool = False, dropout_p: float = 0.0) -> List[str]:
    """Known reasons a fused SDPA kernel cannot run (pure; the actual try is sdpa_report's)."""
    out: List[str] = []
    if dropout_p and device_type != "cuda" and kernel == "flash":
        out.append("the CPU flash kernel takes no attention dropout")
    if kernel == "flash":
        if device_type == "cuda":
            out += _flash_cuda_constraints(dtype, head_dim, cc, mask)
    elif kernel == "mem_efficient":
        out += _mem_efficient_constraints(dtype, head_dim, device_type, cc)
    elif kernel == "cudnn":
        out += _cudnn_constraints(dtype, device_type, cc)
    return out


def _flash_cuda_constraints(dtype: str, head_dim: int, cc: Optional[Tuple[int, int]], mask: bool) -> List[str]:
    out: List[str] = []
    if dtype not in ("fp16", "bf16"):
        out.append(f"flash needs fp16 or bf16 inputs on CUDA (got {dtype})")
    if cc is not None and cc < BF16_CC:
        out.append(f"flash needs compute capability >= 8.0 (this card: {cc[0]}.{cc[1]})")
    if head_dim % 8 or head_dim > 256:
        out.append(f"flash needs a head size that is a multiple of 8 up to 256 (got {head_dim})")
    if mask:
        out.append("flash on CUDA takes no explicit attention mask (only is_causal)")
    return out


def _mem_efficient_constraints(dtype: str, head_dim: int, device_type: str, cc: Optional[Tuple[int, int]]) -> List[str]:
    if device_type != "cuda":
        return ["the memory-efficient kernel is CUDA-only"]
    if head_dim % 8 and dtype in ("fp16", "bf16"):
        return [f"mem_efficient needs a head size that is a multiple of 8 in half precision (got {head_dim})"]
    if dtype == "bf16" and cc is not None and cc < BF16_CC:
        return ["mem_efficient runs bf16 only on compute capability >= 8.0"]
    return []


def _cudnn_constraints(dtype: str, device_type: str, cc: Optional[Tuple[int, int]]) -> List[str]:
    if device_type != "cuda":
        return ["the cuDNN kernel is CUDA-only"]
    out: List[str] = []
    if cc is not None and cc < BF16_CC:
        out.append("cuDNN attention needs compute capability >= 8.0")
    if dtype not in ("fp16", "bf16"):
        out.append(f"cuDNN attention needs fp16 or bf16 (got {dtype})")
    return out


def visible_gpus(facts: HostFacts, environ: Mapping[str, str]) -> Tuple[Gpu, ...]:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES by index or UUID ('' = none)."""
    gpus = facts.gpus or ()
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(gpus)
    chosen = []
    for token in [t.strip() for t in visible.split(",") if t.strip()]:
        for g in gpus:
            if token == str(g.index) or (g.uuid and g.uuid.startswith(token)):
                chosen.append(g)
                break
        else:
            break  # CUDA stops at the first invalid entry
    return tuple(chosen)
