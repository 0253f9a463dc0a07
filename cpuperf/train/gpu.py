"""The NVIDIA GPU path of the worker: mixed precision, attention kernel, batch fit, peak FLOP/s.

torch is imported inside the functions that need it, so the pure parts (peak table, batch
arithmetic) load without it. Every function that looks at a device also works on a CPU device,
so the tests exercise it with CPU tensors; the CUDA-only lines are few and marked.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

if TYPE_CHECKING:
    import torch

from cpuperf.knowledge.gpu import (  # noqa: F401  (the worker's names for the shared rules)
    _DEFAULT_ORDER,
    BF16_CC,
    DTYPES,
    FP16_TC_CC,
    KERNEL_NAMES,
    Peak,
    math_dtype,
    peak_rows,
    sdpa_constraints,
    table_peak,
)

Device = Union[str, "torch.device"]  # what torch.device() takes


def measure_peak(device: Device, dtype: str, tf32: bool = False, size: Optional[int] = None,
                 seconds: Optional[float] = None) -> Peak:
    """Peak GEMM TFLOP/s measured on `device`: a short torch.mm loop (cards not in the table, CPUs).

    Defaults: 4096x4096 for 1 s on CUDA; 512x512 for 0.3 s on CPU (with the process's threads), small
    enough that emulated bf16 (~1 GFLOP/s on CPUs without AVX512-BF16/AMX) still ends in a second.
    """
    import torch

    want = math_dtype(dtype, tf32)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(want, torch.float32)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    size = size or (4096 if cuda else 512)
    seconds = seconds if seconds is not None else (1.0 if cuda else 0.3)
    inner = 10 if cuda else 1  # CUDA: amortise the synchronisation; CPU: check the clock each time
    g = torch.Generator(device=dev).manual_seed(0)  # leave the training RNG streams alone
    a = torch.randn(size, size, device=dev, dtype=tdt, generator=g)
    b = torch.randn(size, size, device=dev, dtype=tdt, generator=g)

    def sync() -> None:
        if dev.type == "cuda":  # CUDA only: kernels are asynchronous
            torch.cuda.synchronize(dev)

    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = want == "tf32"
    try:
        for _ in range(3 if cuda else 1):  # warm-up: cuBLAS heuristics, clocks, oneDNN primitives
            torch.mm(a, b)
        sync()
        n, t0 = 0, time.perf_counter()
        while True:
            for _ in range(inner):
                torch.mm(a, b)
            n += inner
            sync()
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    tflops = 2.0 * size ** 3 * n / elapsed / 1e12
    return Peak(float(f"{tflops:.4g}"), want, f"measured: {n} x torch.mm {size}x{size} {want} in {elapsed:.2f}s")


# ------------------------------------------------------------------------------------ AMP

class AmpPlan(NamedTuple):
    """(autocast enabled, the torch dtype autocast uses, whether a GradScaler is needed)."""

    autocast: bool
    dtype: torch.dtype
    grad_scaler: bool

    @property
    def name(self) -> str:
        """'bf16' | 'fp16' | 'fp32'."""
        return {"bfloat16": "bf16", "float16": "fp16"}.get(str(self.dtype).replace("torch.", ""), "fp32")


def capability(device: Device) -> Optional[Tuple[int, int]]:
    """The CUDA compute capability of `device`; None for a CPU device."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(dev)  # CUDA only
    return int(major), int(minor)


def amp_plan(dtype: str, device: Device, cc: Optional[Tuple[int, int]] = None) -> AmpPlan:
    """Mixed precision for a device: bf16 autocast on cc >= 8.0, fp16 + GradScaler on 7.x, fp32 below.

    `dtype` is what was asked ('bf16', 'fp16', 'fp32', or 'auto'); on CUDA a half-precision ask gets
    the half precision the card is built for (never fp16 where bf16 is native: bf16 needs no loss
    scaling). On CPU: bf16 autocast for 'bf16'/'auto', fp32 otherwise (no fp16 autocast training).
    `cc` overrides the probed compute capability (tests, recorded cards).
    """
    import torch

    fp32 = AmpPlan(False, torch.float32, False)
    if dtype not in DTYPES + ("auto",):
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} or auto (got {dtype!r})")
    if dtype == "fp32":
        return fp32
    dev = torch.device(device)
    if dev.type != "cuda":
        return AmpPlan(True, torch.bfloat16, False) if dtype in ("bf16", "auto") else fp32
    cc = cc if cc is not None else capability(dev)
    if cc is not None and cc >= BF16_CC:
        return AmpPlan(True, torch.bfloat16, False)
    if cc is not None and cc >= FP16_TC_CC:
        return AmpPlan(True, torch.float16, True)
    return fp32


# ------------------------------------------------------------------------------- attention

def _torch_dtype(dtype: Union[str, torch.dtype]) -> Tuple[torch.dtype, str]:
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if isinstance(dtype, str):
        return table[dtype], dtype
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
    return dtype, name


def _priority() -> List[Any]:
    import torch
    from torch.nn.attention import SDPBackend

    try:
        order = [int(x) for x in torch._C._get_sdp_priority_order()]
        by_value = {int(getattr(SDPBackend, n)): getattr(SDPBackend, n) for n in KERNEL_NAMES}
        backends = [by_value[v] for v in order if v in by_value]
        if backends:
            return backends
    except (AttributeError, RuntimeError, TypeError):  # older torch: no priority API
        pass
    return [getattr(SDPBackend, n) for n in _DEFAULT_ORDER if hasattr(SDPBackend, n)]


def _warning_text(message: object) -> str:
    """torch's warning without its '(Triggered internally at file:line.)' tail."""
    text = re.sub(r"\s*\(Triggered internally at [^)]*\)\s*$", "", str(message)).strip()
    return "" if text.endswith("not used because:") else text


def sdpa_report(batch: int, heads: int, seq: int, head_dim: int, dtype: Union[str, torch.dtype], device: Device,
                causal: bool = True, mask: bool = False, dropout_p: float = 0.0) -> Dict[str, Any]:
    """Which SDPA kernel really runs for this shape, and why each faster one did not.

    Tries the backends in the dispatcher's priority order, each alone under sdpa_kernel([b]); the
    first that runs is the one the default dispatcher picks. A refused backend's reason is the
    warning text torch gives, plus cpuperf's own explanation (sdpa_constraints).
    Returns {"kernel": "flash"|"mem_efficient"|"cudnn"|"math"|None, "why_not": {name: reason}, ...}.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    tdt, dname = _torch_dtype(dtype)
    dev = torch.device(device)
    cc = capability(dev)
    shape = (batch, heads, seq, head_dim)
    g = torch.Generator(device=dev).manual_seed(0)  # leave the training RNG streams alone
    q, k, v = (torch.randn(shape, device=dev, dtype=tdt, generator=g).requires_grad_()
               for _ in range(3))
    attn_mask = None
    if mask:
        attn_mask = torch.ones(seq, seq, device=dev, dtype=torch.bool).tril()
        causal = False
    why_not: Dict[str, str] = {}
    kernel: Optional[str] = None
    for backend in _priority():
        name = KERNEL_NAMES[backend.name]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,
                                                   dropout_p=dropout_p)
            except RuntimeError as exc:  # 'No available kernel' / 'No viable backend' (CPU)
                said = [_warning_text(w.message) for w in caught]
                ours = sdpa_constraints(name, dname, head_dim, dev.type, cc, mask, dropout_p)
                why_not[name] = "; ".join(dict.fromkeys(r for r in ours + said if r)) \
                    or str(exc).splitlines()[0]
                continue
        kernel = name
        break
    return {"kernel": kernel, "why_not": why_not, "device": dev.type,
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "dtype": dname, "head_dim": head_dim, "causal": causal, "mask": mask}


# ------------------------------------------------------------------------------ batch fit

class BatchFitError(ValueError):
    """Not even one sample fits in the memory left."""


def fit_batch(measured_peak_bytes: int, base_bytes: int, batch: int, free_bytes: int, multiple: int,
              global_batch: int, world: int, headroom: float = 0.9,
              planned: Optional[int] = None) -> Tuple[int, int]:
    """(per-device batch, grad_accum_steps) that fit, from one measured trial step.

    The trial ran `batch` samples and peaked at `measured_peak_bytes`, of which `base_bytes` do not
    grow with the batch (weights, grads, optimizer state). The per-sample cost scales the batch to
    `free_bytes * headroom` in one go (no repeated halving), rounded down to `multiple` (Tensor
    Cores), else to 8, else to what fits; never above `planned` (default: `batch`). Accumulation
    keeps the global batch: ceil(global_batch / (batch * world)).
    """
    if batch < 1 or world < 1 or global_batch < 1:
        raise ValueError("batch, world and global_batch must be >= 1")
    planned = planned or batch
    budget = free_bytes * headroom
    per_sample = max(1.0, (measured_peak_bytes - base_bytes) / batch)
    if batch >= planned and measured_peak_bytes <= budget:
        new = planned
    else:
        fits = int((budget - base_bytes) // per_sample)
        if fits < 1:
            raise BatchFitError(
                f"one sample needs {per_sample / 2**20:.0f} MiB on top of {base_bytes / 2**30:.2f} GiB of "
                f"weights and optimizer state, but only {budget / 2**30:.2f} GiB are usable")
        fits = min(fits, planned)
        if fits >= multiple:
            new = fits // multiple * multiple
        elif fits >= 8:
            new = fits // 8 * 8
        else:
            new = fits
    accum = max(1, math.ceil(global_batch / (new * world)))
    return new, accum


def is_oom(exc: BaseException) -> bool:
    """torch.OutOfMemoryError, or an allocator RuntimeError saying so (older torch)."""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


@dataclass
class MemoryProbe:
    """How a trial reads device memory; CudaMemory() for real, a recorded stand-in in tests."""

    reset_peak: Callable[[], None]
    allocated: Callable[[], int]
    peak: Callable[[], int]
    usable: Callable[[], int]  # free device memory plus what this process's allocator holds
    release: Callable[[], None]


def cuda_memory(device: Device) -> MemoryProbe:
    """MemoryProbe over torch.cuda for `device` (CUDA only)."""
    import torch

    def usable() -> int:
        free, _total = torch.cuda.mem_get_info(device)
        return int(free) + int(torch.cuda.memory_reserved(device))

    return MemoryProbe(reset_peak=lambda: torch.cuda.reset_peak_memory_stats(device),
                       allocated=lambda: int(torch.cuda.memory_allocated(device)),
                       peak=lambda: int(torch.cuda.max_memory_allocated(device)),
                       usable=usable, release=lambda: torch.cuda.empty_cache())


def confirm_batch(step: Callable[[int], None], planned: int, global_batch: int, world: int,
                  multiple: int, mem: MemoryProbe, fixed_bytes: int = 0, grad_bytes: int = 0,
                  headroom: float = 0.9) -> Dict[str, Any]:
    """Run one forward+backward at `planned` samples (`step(n)`), measure, and fit the batch.

    `fixed_bytes` is memory the trial does not allocate but training will (AdamW's moments, which
    exist only after the first optimizer step); `grad_bytes` is memory the trial allocates that does not
    grow with the batch (the gradients), kept out of the per-sample cost. On OOM the trial is repeated once at a small batch
    to measure the per-sample cost, then scaled (fit_batch). Returns the `batch_trial` report.
    """
    base = 0
    oom = False
    trial = planned
    peak = None
    for attempt in (planned, min(planned, max(1, multiple if multiple < planned else 1))):
        trial = attempt
        mem.release()
        mem.reset_peak()
        before = mem.allocated()
        try:
            step(attempt)
            peak = mem.peak() + fixed_bytes
            base = before + grad_bytes + fixed_bytes
            break
        except Exception as exc:
            if not is_oom(exc):
                raise
            if oom or planned == 1:  # the small batch ran out of memory too
                raise BatchFitError(f"one trial step of {attempt} sample(s) does not fit in device "
                                    "memory") from exc
            oom = True
        finally:
            mem.release()
    assert peak is not None  # the loop either measured a peak or raised
    usable = mem.usable()
    batch, accum = fit_batch(peak, base, trial, usable, multiple, global_batch, world,
                             headroom=headroom, planned=planned)
    return {"planned_batch": planned, "trial_batch": trial, "oom": oom,
            "peak_bytes": int(peak), "base_bytes": int(base),
            "bytes_per_sample": int(max(1.0, (peak - base) / trial)),
            "usable_bytes": int(usable), "headroom": headroom,
            "batch": batch, "grad_accum_steps": accum, "adjusted": batch != planned}
