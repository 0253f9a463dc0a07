"""The recommendation engine: host facts + installed stack + workload (+ measurements) -> decisions.

Pure code. Every decision carries an id, a plain value, a reason and the evidence it used; every
decision can be overridden (`--set id=value`), and the result says which were.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

from packaging.version import Version

from cpuperf.decide.allocator import decide_allocator, install_hint
from cpuperf.decide.backend import cpu_backend, no_intel_build, several_ranks_evidence
from cpuperf.decide.judge import Verdict, paired
from cpuperf.decide.load import adjust_placement
from cpuperf.decide.memory import MemoryAsk, MemoryJob, MemoryLevers, MemoryPlan
from cpuperf.decide.placement import Placement, plan_placement
from cpuperf.decide.records import (
    Affinity,
    AllocatorName,
    Attention,
    Constraints,
    DdpBackend,
    Decision,
    Device,
    Dtype,
    LeverRule,
    Levers,
    MathMode,
    Measurements,
    Pin,
    Recommendation,
    T,
    as_backend,
    as_device,
    as_optimizer,
    as_sharding,
    constraints_of,
    pinned_as,
    pinned_value,
)
from cpuperf.decide.tune import not_judged, tuned_decisions, undecided_levers
from cpuperf.decide.workload import BatchSplit, Workload
from cpuperf.errors import FieldError, IncompatibleHostError, UsageError
from cpuperf.jsonable import JsonMapping, JsonObject
from cpuperf.knowledge.addons import addon_compatible, alternative, newer_than_last, retirement
from cpuperf.knowledge.bf16 import amx_bf16, bf16_native
from cpuperf.knowledge.gpu import visible_gpus
from cpuperf.knowledge.knobs import BY_ID, DECISION_IDS, RULED_IDS, KnobValue, coerce
from cpuperf.knowledge.tuning import Compile as CompileRule
from cpuperf.knowledge.tuning import Tuning, tuning
from cpuperf.probe.facts import Gpu, HostFacts
from cpuperf.probe.hf import SEQ_ARGS
from cpuperf.versions import int_pair, version_or_none
from cpuperf.worker_settings import COMPILE_MODES

SCHEMA = "cpuperf.recommend/1"

# The ids (and their types and allowed values) are the one vocabulary in cpuperf.knowledge.knobs.


# -- the stack -------------------------------------------------------------------------------------

def stack_versions(facts: HostFacts) -> Dict[str, Optional[str]]:
    if facts.software is None:
        return {}
    return {name: (info.version if info else None) for name, info in facts.software.packages.items()}


# -- helpers ---------------------------------------------------------------------------------------

def _cc(gpu: Gpu) -> Tuple[int, int]:
    return int_pair(gpu.compute_capability or "0.0") or (0, 0)


def _parse_cc(text: str) -> Tuple[int, int]:
    pair = int_pair(text)
    if pair is None:
        raise ValueError(f"compute capability {text!r} is not major.minor")
    return pair


# The bf16 evidence per architecture, in each one's own terms: x86 avx512_bf16/AMX; Arm's BF16 and
# I8MM extensions and SVE from cpuinfo 'Features' (arch/arm64/kernel/cpuinfo.c); POWER10's MMA.
_BF16_EVIDENCE = {"aarch64": ("bf16", "svebf16", "i8mm", "sve", "sve2", "sme"), "ppc64le": ("mma", "vsx")}


def _cpu_evidence(facts: HostFacts) -> JsonObject:
    cpu = facts.cpu
    if cpu.arch in _BF16_EVIDENCE:
        return {"microarchitecture": cpu.microarchitecture, **{f: f in cpu.isa for f in _BF16_EVIDENCE[cpu.arch]}}
    return {"microarchitecture": cpu.microarchitecture, "avx512_bf16": "avx512_bf16" in cpu.isa,
            "amx_bf16": "amx_bf16" in cpu.isa, "amx_usable": cpu.amx_usable}


def _non_x86_dtype(facts: HostFacts, ratio: Optional[float], threshold: float) -> Tuple[Dtype, str]:
    """fp32 or bf16 on Arm/POWER, and why: bf16 only with a hardware bf16 path and a measured win."""
    cpu = facts.cpu
    where = f"{cpu.arch} ({cpu.microarchitecture})"
    hw = bf16_native(facts)  # the owner's answer; the words below only name the unit
    if cpu.arch == "aarch64":
        extra = [f for f in ("svebf16", "i8mm", "sve2", "sve") if f in cpu.isa]
        has = f"Arm BF16 (bf16{', ' + ', '.join(extra) if extra else ''} in cpuinfo Features)"
        lacks = "no Arm BF16 extension ('bf16' is not in cpuinfo Features)"
    elif cpu.arch == "ppc64le":
        has, lacks = "POWER10 MMA (bf16 outer-product matrix unit)", "no MMA (it arrived with POWER10)"
    else:
        has, lacks = "", "no known bf16 unit"
    if not hw:
        return "fp32", f"{where} has {lacks}: bf16 would be emulated and slower than fp32"
    if ratio is not None and ratio >= threshold * 1.2:
        return "bf16", f"{where} has {has} and bf16 GEMM measured {ratio:.2f}x fp32 here: bf16 autocast"
    if ratio is not None:
        return "fp32", f"{where} has {has}, but bf16 GEMM measured only {ratio:.2f}x fp32 here: fp32 kept"
    return "fp32", (f"{where} has {has}; fp32 kept until a measurement shows bf16 faster on this host "
                    "(run `cpuperf bench`)")


def _non_x86_math_mode(facts: HostFacts) -> str:
    """Why fp32 matmuls stay fp32 on Arm / POWER, in the host's own terms."""
    cpu = facts.cpu
    where = f"{cpu.arch} ({cpu.microarchitecture})"
    if cpu.arch == "aarch64":  # the Arm levers own the answer: oneDNN's fast-math mode is this knob's variable
        from cpuperf.decide.arm_levers import arm_levers, knob_vars

        fast = next(lever for lever in arm_levers(facts) if lever.env in knob_vars("fp32_math_mode"))
        return f"{where}: {fast.line()}"
    if cpu.arch == "ppc64le":
        if bf16_native(facts):  # POWER10's MMA (knowledge/bf16.py)
            return (f"{where} has POWER10 MMA, but PyTorch's fp32-to-bf16 matmul mode is a oneDNN feature that does "
                    "not target POWER: fp32 matmuls stay fp32")
        return f"{where} has no MMA (it arrived with POWER10): fp32 matmuls have no reduced-precision path here"
    return f"{where}: no reduced-precision matmul path is known for this CPU"


# -- memory plan ------------------------------------------------------------------------------------

def memory_budget(facts: HostFacts, placement: Placement, device: str, gpu: Optional[Gpu]) -> Tuple[Optional[int], str]:
    """Bytes one rank may use and how (cpuperf.decide.memory owns the computation)."""
    from cpuperf.decide.memory import memory_budget as budget
    from cpuperf.decide.memory import memory_rule

    per_rank, how, _ = budget(facts, placement, device, gpu, memory_rule(tuning()))
    return per_rank, how


# -- the engine -------------------------------------------------------------------------------------

@dataclass
class _Context:
    """What every decision step reads: the host, the stack, the constraints (the user's and other owners' pins)."""

    facts: HostFacts
    workload: Workload
    meas: Measurements
    tuning: Tuning
    stack: Dict[str, Optional[str]]
    fixed: Constraints
    ranks_from: Optional[Tuple[int, str]] = None  # (count, where): ranks a user's own launcher starts
    ranks_unknown: bool = False  # that launcher's count is not known: it may start several
    notes: List[str] = field(default_factory=list)
    tuned: Constraints = field(default_factory=Constraints)  # measured on this plan: cpuperf.decide.tune

    @property
    def torch(self) -> Optional[str]:
        return self.stack.get("torch")

    @property
    def python(self) -> Optional[str]:
        return self.facts.software.python if self.facts.software else None

    def choose(self, pin: Optional[Pin[T]], id: str, value: T, reason: str, evidence: Optional[JsonObject] = None,
               needs_torch: bool = False, tuned: Optional[Pin[T]] = None) -> Decision[T]:
        """cpuperf's choice, unless the lever is pinned: the user's value with ours in the reason, or another owner's
        value with its reason (the plain baseline, the cluster's nodes); a `tuned` value measured on this plan beats
        the rule it started from."""
        if pin is not None and pin.reason is not None:
            return Decision(id, pin.value, pin.reason, pin.evidence if pin.evidence is not None else (evidence or {}))
        if pin is not None:
            mine = "none" if value is None else repr(value)
            return Decision(id, pin.value, f"set by you (cpuperf would choose {mine}: {reason})", evidence or {},
                            overridden=True)
        if tuned is not None:
            return Decision(id, tuned.value, tuned.reason or "", {**(evidence or {}), **(tuned.evidence or {})},
                            needs_torch=needs_torch)
        return Decision(id, value, reason, evidence or {}, needs_torch=needs_torch)

    def take(self, d: Decision[T], pin: Optional[Pin[T]], tuned: Optional[Pin[T]] = None) -> Decision[T]:
        """A decision made by a rule elsewhere, through choose()."""
        return self.choose(pin, d.id, d.value, d.reason, d.evidence, d.needs_torch, tuned)


def user_constraints(overrides: Optional[Mapping[str, object]]) -> Dict[str, KnobValue]:
    """--set / --config values for recommend: decisions and launch options, typed; anything else exits 2."""
    fixed: Dict[str, KnobValue] = {}
    for key, raw in (overrides or {}).items():
        knob = BY_ID.get(key)
        if knob is not None and not (knob.decided or knob.option):
            raise FieldError(key, raw, "{flag}: a setting of the built-in training loop, not a decision",
                             "cpuperf train {flag}=...; decisions: " + ", ".join(DECISION_IDS), setting=True)
        fixed[key] = coerce(key, raw)
    return fixed


@dataclass(frozen=True)
class _Layout:
    """The placement step's decisions."""

    placement: Placement
    nproc_per_node: Decision[int]
    nnodes: Decision[int]
    threads_per_rank: Decision[int]
    affinity: Decision[Optional[Affinity]]


@dataclass(frozen=True)
class _Precision:
    dtype: Decision[Dtype]
    tf32: Decision[bool]
    fp32_math_mode: Decision[Optional[MathMode]]


@dataclass(frozen=True)
class RecommendRequest:
    """What a caller asks of `recommend` besides the host and the workload (issue 54: one record, not 14 keywords).

    `overrides`: the user's values (--set / --config), constraints applied where each knob is decided, so placement,
    memory plan and backend are built around them. `baseline` fixes knobs the same way without calling them the
    user's (train without --auto). `ranks_from`: nproc_per_node is the count a user's own launcher starts (said where
    it came from). `tuned`: (a cached tuning result, where it was measured) that overrides the rules' levers; else,
    with `shape_tuning`, the one cached for this workload's shape (cpuperf bench --tune). `memory_levers`: the memory
    levers that keep the math which the job's path can apply (cpuperf.decide.memory.MemoryLevers); None: every one.
    `pins`: levers another owner fixed, each with its reason (a cluster's nodes agreeing), under the user's.
    `ranks_unknown`: the user's launcher starts a count cpuperf cannot tell: nothing unsafe with several ranks.
    `environ`: the environment the job's GPUs are seen through (CUDA_VISIBLE_DEVICES), read at the edge.
    `compile_modes`: the torch.compile modes the job's path can apply (a Trainer script: the whole model only)."""

    nproc_per_node: Optional[int] = None
    nnodes: int = 1
    unit: str = "socket"
    device: str = "auto"
    measurements: Optional[Measurements] = None
    overrides: Optional[Mapping[str, object]] = None  # --set / --config values, or a plan's: coerced by their knobs
    environ: Mapping[str, str] = field(default_factory=dict)
    baseline: Optional[Mapping[str, KnobValue]] = None
    ranks_from: Optional[str] = None
    tuned: Optional[Tuple[JsonMapping, str]] = None
    shape_tuning: bool = True
    pins: Optional[Constraints] = None
    memory_levers: Optional[MemoryLevers] = None
    ranks_unknown: bool = False
    compile_modes: Tuple[str, ...] = COMPILE_MODES  # the torch.compile modes the job's path can apply


def recommend(facts: HostFacts, workload: Workload, request: Optional[RecommendRequest] = None) -> Recommendation:
    """Decide every setting for this host and workload, as `request` asks (RecommendRequest)."""
    r = request or RecommendRequest()
    ctx = _context(facts, workload, r)
    device_d, gpus = _decide_device(ctx, r.device, r.environ)
    on_gpu = device_d.value == "cuda"
    gpu = gpus[0] if (on_gpu and gpus) else None
    layout = _decide_placement(ctx, gpus, r.unit, on_gpu)
    placement = layout.placement
    world = layout.nproc_per_node.value * layout.nnodes.value
    split = _batch_split(ctx, world, on_gpu)
    if split is not None:  # the ranks share the one process's global batch: the memory plan keeps it
        workload = replace(workload, per_device_batch=split.per_device, grad_accum=split.grad_accum)
    precision = _decide_precision(ctx, gpu)
    backend = _decide_backend(ctx, world, on_gpu)
    ipex = _decide_ipex(ctx, on_gpu)
    compile_d = ctx.take(_decide_compile(ctx, workload, on_gpu, ipex.value, placement, precision.dtype.value,
                                         r.compile_modes), ctx.fixed.compile, ctx.tuned.compile)
    allocator = _choose_allocator(ctx, on_gpu, world, precision.dtype.value)
    attention = ctx.take(_decide_attention(workload, precision.dtype.value, gpu), ctx.fixed.attention)
    # The levers decided so far; the memory plan decides the rest and returns the whole record.
    decided = functools.partial(
        Levers, device=device_d, dtype=precision.dtype, tf32=precision.tf32, fp32_math_mode=precision.fp32_math_mode,
        nproc_per_node=layout.nproc_per_node, nnodes=layout.nnodes, threads_per_rank=layout.threads_per_rank,
        affinity=layout.affinity, ddp_backend=backend, ipex=ipex, compile=compile_d, allocator=allocator,
        attention=attention)
    fused = gpu is not None and attention.value in ("flash", "mem_efficient")  # GPU SDPA kernels keep no scores
    memory = _memory_plan(ctx, MemoryJob(workload, placement, precision.dtype.value, gpu, world, fused),
                          r.memory_levers, decided)
    if split is not None:
        memory = replace(memory, batch_size=replace(memory.batch_size, reason=f"{split.per_device}: {split.describe()}"))
    if pinned_value(ctx.fixed.dtype) == "bf16" and not on_gpu and not bf16_native(facts):
        ctx.notes.append("dtype=bf16 was set on a CPU without native bf16: expect it to be several times slower than fp32")
    levers = replace(
        memory,
        batch_size=ctx.take(memory.batch_size, ctx.fixed.batch_size),
        grad_accum_steps=ctx.take(memory.grad_accum_steps, ctx.fixed.grad_accum_steps),
        grad_checkpointing=ctx.take(memory.grad_checkpointing, ctx.fixed.grad_checkpointing),
        optimizer=ctx.take(memory.optimizer, ctx.fixed.optimizer, ctx.tuned.optimizer),
        sharding=ctx.take(memory.sharding, ctx.fixed.sharding), offload=ctx.take(memory.offload, ctx.fixed.offload),
        dataloader_workers=ctx.take(memory.dataloader_workers, ctx.fixed.dataloader_workers),
        pin_memory=ctx.take(memory.pin_memory, ctx.fixed.pin_memory),
        zero=ctx.take(memory.zero, ctx.fixed.zero))
    levers = replace(levers, ruled=_ruled(ctx, levers))
    return Recommendation(levers, placement, ctx.workload, tuple(ctx.notes), ctx.stack,
                          oversubscribe=ctx.fixed.oversubscribe, split=split,
                          options={**ctx.tuned.options, **ctx.fixed.options})  # yours over a tuning's


def _ruled(ctx: _Context, levers: Levers) -> Tuple[Decision[KnobValue], ...]:
    """The levers of the generic path: each knob row that names its rule ('module:function' under cpuperf.decide)
    is decided by it from the host, the workload and the typed levers, then pinned as any lever is (take)."""
    import importlib

    out: List[Decision[KnobValue]] = []
    for lever in RULED_IDS:
        module, _, name = BY_ID[lever].rule.partition(":")
        rule = cast(LeverRule, getattr(importlib.import_module(f"cpuperf.decide.{module}"), name))
        d = rule(ctx.facts, ctx.workload, levers)
        if d.id != lever:
            raise ValueError(f"the rule {BY_ID[lever].rule} decides {d.id!r}, not {lever!r}")
        out.append(ctx.take(d, ctx.fixed.ruled.get(lever), ctx.tuned.ruled.get(lever)))
    return tuple(out)


def _context(facts: HostFacts, workload: Workload, r: RecommendRequest) -> _Context:
    """The constraints, in order (the plain baseline under the user's values, other owners' pins under both), and a
    cached tuning where it applies: what every decision step reads."""
    nproc_per_node, nnodes, tuned = r.nproc_per_node, r.nnodes, r.tuned
    yours = user_constraints(r.overrides)
    mine = constraints_of(yours)
    if nproc_per_node is not None and r.ranks_from is None and mine.nproc_per_node is None:
        mine = replace(mine, nproc_per_node=Pin(nproc_per_node))  # --nproc-per-node: the user's count
    if nnodes and nnodes > 1 and mine.nnodes is None:
        mine = replace(mine, nnodes=Pin(nnodes))
    base = constraints_of(r.baseline or {}, "the plain baseline (no --auto)")
    constraints = base.under(mine)
    if r.pins is not None:
        constraints = r.pins.under(constraints)
    ctx = _Context(facts, workload, r.measurements or Measurements(), tuning(),
                   stack_versions(facts), constraints,
                   ranks_from=(int(nproc_per_node or 1), r.ranks_from) if r.ranks_from else None,
                   ranks_unknown=r.ranks_unknown)
    if tuned is None and r.shape_tuning and not [k for k in base.pinned() if k not in mine.pinned()]:
        entry = ctx.meas.tuned_by_shape.get(shape_key(workload))
        tuned = (entry, f"here for {shape_key(workload)}") if entry else None
    _use_tuning(ctx, tuned, r.device, nnodes)
    if facts.software is None:
        ctx.notes.append("the installed stack is unknown (snapshot): decisions that need torch assume a recent CPU torch")
    elif ctx.torch is None:
        ctx.notes.append("torch is not installed: decisions marked needs_torch assume the stack `cpuperf install --yes` "
                         "would install; run it first")
    return ctx


def _batch_is_yours(ctx: _Context) -> bool:
    """You set the per-device batch or accumulation: per rank, so yours to multiply, never cpuperf's."""
    return ctx.fixed.batch_size is not None or ctx.fixed.grad_accum_steps is not None


def _keeps_the_job(ctx: _Context, ranks: int, on_gpu: bool = False) -> bool:
    return ctx.workload.splits_into(ranks, batch_yours=_batch_is_yours(ctx), gpus=on_gpu)


def _why_not_split(ctx: _Context, ranks: int) -> str:
    w = ctx.workload
    if _batch_is_yours(ctx):
        return "you set the per-device batch or accumulation: each rank would train that many samples"
    if w.parallel.kind == "builtin":
        return f"the global batch {w.batch_size} does not split evenly into {ranks} ranks"
    return w.parallel.why_not_split(ranks)


def _batch_split(ctx: _Context, world: int, on_gpu: bool) -> Optional[BatchSplit]:
    """How the ranks share a user's Trainer's global batch (None: one process, cpuperf's loop, GPU ranks that keep
    the per-device batch, or a count of yours that cannot keep it, said in the notes)."""
    dp = ctx.workload.parallel
    if world <= 1 or on_gpu or ctx.ranks_from is not None or _batch_is_yours(ctx):
        return None
    shared = dp.split(world)  # None but for a Trainer whose batch cpuperf passes
    if shared is None or dp.per_device is None:
        return None
    split = BatchSplit(world, shared[0], shared[1], dp.per_device, dp.grad_accum, dp.where)
    ctx.notes.append(split.describe())
    return split


def _use_tuning(ctx: _Context, tuned: Optional[Tuple[JsonMapping, str]], device: str, nnodes: int) -> None:
    """A cached tuning's decided levers over the rules (never over the user's values); a lever it left undecided
    is the rule's, and the plan names it. Not on a GPU (the tuner measures CPU levers)."""
    why_not = not_judged(tuned[0]) if tuned is not None else None
    if tuned is not None and why_not:
        ctx.notes.append(f"the tuning {tuned[1]} is not used: {why_not}; the rules decide")
    elif tuned is not None and device != "cuda" and not ctx.facts.gpus:
        for line in undecided_levers(tuned[0]).values():
            ctx.notes.append(f"the tuning {tuned[1]}: {line}, so the rule decides it")
        measured = tuned_decisions(tuned[0], tuned[1])
        pins: Dict[str, Pin[KnobValue]] = {lever: Pin(value, why, None if BY_ID[lever].option else evidence)
                                           for lever, (value, why, evidence) in measured.items()}
        ctx.tuned = _applicable(pinned_as(pins), ctx.fixed, ctx.ranks_from is not None, nnodes)
        ranks = pinned_value(ctx.tuned.nproc_per_node)
        if ranks and not _keeps_the_job(ctx, ranks):  # a layout measured before cpuperf kept the batch
            ctx.tuned = replace(ctx.tuned, nproc_per_node=None, threads_per_rank=None)
            ctx.notes.append(f"the tuning {tuned[1]} chose {ranks} ranks, which would change the job "
                             f"({_why_not_split(ctx, ranks)}): its layout is not used")
        gone = pinned_value(ctx.tuned.allocator)
        software = ctx.facts.software
        if gone and software is not None and not software.allocators.get(gone):
            # tuned with an allocator this environment no longer has: the rule decides
            ctx.tuned = replace(ctx.tuned, allocator=None)


def shape_key(w: Workload) -> str:
    """What a tuning result is cached for: the model's shape and the global batch."""
    return f"{model_key(w)}-B{w.batch_size}"


def _applicable(tuned: Constraints, fixed: Constraints, launcher_ranks: bool, nnodes: int) -> Constraints:
    """The tuned levers the constraints left open: ranks and threads only on one node where cpuperf starts the ranks."""
    keep_layout = not launcher_ranks and (nnodes or 1) <= 1 and fixed.nproc_per_node is None \
        and fixed.threads_per_rank is None
    if not keep_layout:
        tuned = replace(tuned, nproc_per_node=None, threads_per_rank=None)
    return Constraints(ruled={k: p for k, p in tuned.ruled.items() if k not in fixed.ruled},
                       options={k: p for k, p in tuned.options.items() if k not in fixed.options},  # never over yours
                       **{lever: getattr(tuned, lever) for lever in tuned.pinned()
                          if lever not in fixed.pinned() and lever not in tuned.ruled})


def _decide_device(ctx: _Context, device: str, environ: Mapping[str, str]) -> Tuple[Decision[Device], Tuple[Gpu, ...]]:
    facts = ctx.facts
    gpus = visible_gpus(facts, environ)
    torch_info = facts.software.packages.get("torch") if facts.software else None
    torch_build = torch_info.build if torch_info else None
    if device not in ("auto", "cpu", "cuda"):
        raise FieldError("device", device, "{flag} {value!r}: use auto, cpu or cuda")
    if device != "auto" and ctx.fixed.device is None:
        ctx.fixed = replace(ctx.fixed, device=Pin(as_device(device)))
    chosen: Device = "cpu"
    reason = "no NVIDIA GPU visible"
    if gpus and torch_build in ("cuda", None):
        chosen, reason = "cuda", f"{len(gpus)} NVIDIA GPU(s) visible"
        if torch_build is None and facts.software is not None:
            reason += " (torch not installed yet: install the CUDA build)"
    elif gpus and torch_build == "cpu":
        reason = "the installed torch is a CPU-only build; GPUs are unused (cpuperf doctor has the fix)"
        ctx.notes.append(reason)
    if pinned_value(ctx.fixed.device) == "cuda" and chosen != "cuda":
        raise UsageError("device cuda asked for, but there is no usable NVIDIA GPU with a CUDA torch",
                         hint="run cpuperf doctor for the exact fix")
    decided = ctx.choose(ctx.fixed.device, "device", chosen, reason,
                         {"gpus": [g.name for g in gpus], "torch_build": torch_build, "gpus_known": facts.gpus is not None})
    return decided, gpus


def _decide_placement(ctx: _Context, gpus: Tuple[Gpu, ...], unit: str, on_gpu: bool) -> _Layout:
    """Ranks and threads: the user's counts are laid out first, everything after builds on them."""
    facts, fixed = ctx.facts, ctx.fixed
    nnodes = pinned_value(fixed.nnodes) or 1
    threads = pinned_value(fixed.threads_per_rank) or pinned_value(ctx.tuned.threads_per_rank)
    load_ev: JsonObject = {}
    if on_gpu:
        placement, nproc_d = _gpu_ranks(ctx, gpus, unit, threads)
    else:
        placement, nproc_d, load_ev = _cpu_ranks(ctx, unit, nnodes, threads)
    nnodes_d = ctx.choose(fixed.nnodes, "nnodes", nnodes, "one node" if nnodes == 1 else f"{nnodes} nodes", {})
    threads_d = ctx.choose(fixed.threads_per_rank, "threads_per_rank", placement.threads_per_rank,
                           placement.reasons[0] if placement.unit == "gpu-numa" else
                           "; ".join(r for r in placement.reasons[:-1] if "as asked" not in r) or "usable physical cores",
                           {"allowed_cpus": len(facts.usable_cpus()), "cpu_quota": facts.topology.cpu_quota,
                            "physical_cores": facts.topology.physical_cores, "ccl_workers": placement.ccl_workers,
                            **load_ev}, tuned=ctx.tuned.threads_per_rank)
    affinity = _decide_affinity(ctx, placement, gpus, on_gpu)
    return _Layout(placement, nproc_d, nnodes_d, threads_d, affinity)


def _gpu_ranks(ctx: _Context, gpus: Tuple[Gpu, ...], unit: str,
               threads: Optional[int]) -> Tuple[Placement, Decision[int]]:
    """GPU ranks: one per visible GPU (or the count asked, never more than the GPUs without oversubscribe), each
    near its GPU's NUMA node where that is known."""
    facts, fixed = ctx.facts, ctx.fixed
    oversubscribe = fixed.oversubscribe
    # A user's launcher starts its own count (torchrun --nproc-per-node 1 on a host with 2 GPUs is one rank).
    nproc = pinned_value(fixed.nproc_per_node) or (ctx.ranks_from[0] if ctx.ranks_from else None) or max(1, len(gpus))
    kept = _fewer_ranks(ctx, nproc, on_gpu=True)
    nproc = kept.ranks if kept is not None else nproc
    if nproc > max(1, len(gpus)) and not oversubscribe:
        whose = (f"{nproc} rank(s) from {ctx.ranks_from[1]}" if ctx.ranks_from and fixed.nproc_per_node is None
                 else f"nproc_per_node {nproc}")
        raise UsageError(f"{whose} but {len(gpus)} GPU(s) are visible to the job (CUDA_VISIBLE_DEVICES included)",
                         hint=f"use at most {len(gpus)} (one rank per GPU)")
    cpus = max(1, len(facts.topology.cpus)) if facts.topology.cpus else None
    from cpuperf.decide.placement import gpu_placement

    near = gpu_placement(facts, [g.numa_node for g in gpus[:nproc]], ctx.tuning.dataloader.gpu_workers_per_gpu,
                         threads) if nproc <= len(gpus) else None
    placement = near or plan_placement(facts, min(nproc, cpus) if cpus else None, unit, threads_per_rank=threads,
                                       oversubscribe=oversubscribe)
    nproc_d = ctx.choose(fixed.nproc_per_node, "nproc_per_node", nproc,
                         f"{nproc} rank(s) from {ctx.ranks_from[1]}" if ctx.ranks_from else
                         kept.reason if kept is not None else "one rank per visible GPU",
                         {"visible_gpus": len(gpus), **(kept.evidence() if kept is not None else {})})
    return placement, nproc_d


def _cpu_ranks(ctx: _Context, unit: str, nnodes: int,
               threads: Optional[int]) -> Tuple[Placement, Decision[int], JsonObject]:
    """CPU ranks: the host's layout (or the count asked), cut to what keeps the job, fewer threads under load;
    with the load's evidence."""
    facts, fixed = ctx.facts, ctx.fixed
    oversubscribe = fixed.oversubscribe
    backend = pinned_value(fixed.ddp_backend)
    want_ccl = backend == "ccl" or (fixed.ddp_backend is None and facts.software is not None
                                    and cpu_backend(facts, ctx.stack, ctx.python).ccl_available)
    asked = pinned_value(fixed.nproc_per_node) or (ctx.ranks_from[0] if ctx.ranks_from else None) or \
        pinned_value(ctx.tuned.nproc_per_node)
    placement = plan_placement(facts, asked, unit, ccl=want_ccl, nnodes=nnodes,
                               threads_per_rank=threads, oversubscribe=oversubscribe)
    kept = _fewer_ranks(ctx, placement.nproc_per_node)
    if kept is not None:  # one process (or fewer ranks) with all the cores: the same job, not N copies
        placement = plan_placement(facts, kept.ranks, unit, ccl=want_ccl, nnodes=nnodes,
                                   threads_per_rank=threads, oversubscribe=oversubscribe)
    # Other work keeping some of these CPUs busy: fewer threads, with the measured figure (not when the
    # user set threads or affinity: theirs stands, with a note).
    placement, load_ev, load_note = adjust_placement(
        placement, facts.load, yours=fixed.threads_per_rank is not None or fixed.affinity is not None)
    ctx.notes.extend([load_note] if load_note else [])
    nproc_d = ctx.choose(fixed.nproc_per_node, "nproc_per_node", placement.nproc_per_node,
                         f"{placement.nproc_per_node} rank(s) from {ctx.ranks_from[1]}" if ctx.ranks_from
                         else kept.reason if kept is not None else "; ".join(placement.reasons[-1:]),
                         {"sockets": facts.topology.sockets, "numa_nodes": len(facts.topology.numa_nodes),
                          "usable_physical_cores": placement.cpu_budget,
                          **(kept.evidence() if kept is not None else {})}, tuned=ctx.tuned.nproc_per_node)
    return placement, nproc_d, load_ev


def _decide_affinity(ctx: _Context, placement: Placement, gpus: Tuple[Gpu, ...],
                     on_gpu: bool) -> Decision[Optional[Affinity]]:
    """Pinning: each rank to its own cores (its GPU's NUMA node on a GPU), not ranks sharing a VM's NUMA node."""
    fixed = ctx.fixed
    from cpuperf.probe.parse import format_cpulist

    pinned = ";".join(format_cpulist(s.compute_cpus) for s in placement.slots if s.compute_cpus) or None
    evidence: JsonObject = {"slots": [list(s.cpus) for s in placement.slots], "cpus": pinned}
    if on_gpu:
        gpu_evidence: JsonObject = {**evidence, "gpu_numa_nodes": [g.numa_node for g in gpus]}
        bound: Optional[Affinity] = "auto" if placement.unit == "gpu-numa" else None
        return ctx.choose(fixed.affinity, "affinity", bound,
                          f"each rank pinned to the cores of its GPU's NUMA node: {pinned}" if bound else
                          "the GPUs' NUMA nodes are unknown (no PCI locality in the GPU facts): ranks are not pinned "
                          "to CPUs that may sit across the interconnect from their GPU", gpu_evidence)
    if pinned and _ranks_share_a_vm_numa_node(ctx, placement):
        evidence["hypervisor"] = True
        return ctx.choose(fixed.affinity, "affinity", None,
                          f"{placement.nproc_per_node} ranks on one NUMA node of a virtual machine (`hypervisor` flag): "
                          f"left to the OS scheduler, each with its thread count ({ctx.tuning.placement.reason}; "
                          "--set affinity=auto pins them)", evidence, tuned=ctx.tuned.affinity)
    auto: Optional[Affinity] = "auto" if pinned else None
    return ctx.choose(fixed.affinity, "affinity", auto,
                      f"each rank pinned to its own physical cores: {pinned}" if pinned else "no CPUs to pin to",
                      evidence, tuned=ctx.tuned.affinity)


@dataclass(frozen=True)
class _FewerRanks:
    """cpuperf's rank count cut to what keeps the job: `ranks` instead of the `better` one the host would take."""

    ranks: int
    better: int
    why: str

    @property
    def reason(self) -> str:
        run = "one process with all the usable cores" if self.ranks == 1 else f"{self.ranks} ranks"
        return (f"{run}, the same job as yours: this host's layout is {self.better} ranks, but {self.why} (opt in: "
                f"--set nproc_per_node={self.better})")

    def evidence(self) -> JsonObject:
        return {"not_split": {"ranks": self.better, "why": f"{self.why}; the job runs {self.ranks} rank(s). Opt in "
                              f"with --set nproc_per_node={self.better} (the plan then says what it changes)"}}


def _fewer_ranks(ctx: _Context, ranks: int, on_gpu: bool = False) -> Optional[_FewerRanks]:
    """Where cpuperf itself chose `ranks` (no count of yours, of your launcher's, or a tuning's that kept the batch)
    and they would change the job: the most ranks that keep it. A count you set stands, its consequence said."""
    if ranks <= 1 or ctx.ranks_from is not None:
        return None
    if ctx.fixed.nproc_per_node is not None:
        if not _keeps_the_job(ctx, ranks, on_gpu):
            ctx.notes.append(f"warning: nproc_per_node={ranks} is yours: {_why_not_split(ctx, ranks)}")
        return None
    if _keeps_the_job(ctx, ranks, on_gpu):
        return None
    fewer = max(k for k in range(1, ranks + 1) if _keeps_the_job(ctx, k, on_gpu))
    kept = _FewerRanks(fewer, ranks, _why_not_split(ctx, ranks))
    ctx.notes.append(kept.reason)
    return kept


def _ranks_share_a_vm_numa_node(ctx: _Context, placement: Placement) -> bool:
    """Several ranks of this node, all on one NUMA node, on a virtual machine: pinning them is measured to lose."""
    if ctx.tuning.placement.pin_ranks_sharing_a_vm_numa_node or placement.nproc_per_node < 2:
        return False
    if "hypervisor" not in ctx.facts.cpu.flags:
        return False
    nodes = {cpu.node for cpu in ctx.facts.topology.cpus
             if any(cpu.id in slot.cpus for slot in placement.slots)}
    return len(nodes) <= 1


def _decide_precision(ctx: _Context, gpu: Optional[Gpu]) -> _Precision:
    """dtype, TF32 and the fp32 math mode: the card's rules on a GPU, the CPU's otherwise."""
    return _decide_dtype_gpu(ctx, gpu) if gpu is not None else _decide_dtype_cpu(ctx)


def _decide_dtype_gpu(ctx: _Context, gpu: Gpu) -> _Precision:
    rules = ctx.tuning
    cc = _cc(gpu)
    dtype: Dtype
    if cc >= _parse_cc(rules.dtype.fp16_gpu_below_cc):
        dtype, why = "bf16", f"{gpu.name} (compute capability {gpu.compute_capability}) has native bf16"
    elif cc >= _parse_cc(rules.dtype.fp32_gpu_below_cc):
        dtype, why = "fp16", f"{gpu.name} (cc {gpu.compute_capability}) has fp16 Tensor Cores but no bf16: fp16 autocast with a gradient scaler"
    else:
        dtype, why = "fp32", f"{gpu.name} (cc {gpu.compute_capability}) predates Tensor Cores"
    dtype_d = ctx.choose(ctx.fixed.dtype, "dtype", dtype, why, {"compute_capability": gpu.compute_capability})
    tf32 = cc >= (8, 0)
    tf32_d = ctx.choose(ctx.fixed.tf32, "tf32", tf32,
                        "TF32 Tensor Cores for fp32 matmul and cuDNN" if tf32 else "no TF32 before Ampere",
                        {"compute_capability": gpu.compute_capability})
    if pinned_value(ctx.fixed.fp32_math_mode):
        raise UsageError("fp32_math_mode is a CPU (oneDNN) setting", hint="on a GPU, tf32 plays that part")
    mode = ctx.choose(ctx.fixed.fp32_math_mode, "fp32_math_mode", None, "CPU-only setting", {})
    return _Precision(dtype_d, tf32_d, mode)


def _cpu_dtype(ctx: _Context, evidence: JsonObject) -> Tuple[Dtype, str]:
    """bf16 or fp32 on this CPU, and why."""
    facts, meas = ctx.facts, ctx.meas
    ratio = None
    if meas.gemm_bf16_gflops and meas.gemm_fp32_gflops:
        ratio = meas.gemm_bf16_gflops / meas.gemm_fp32_gflops
        evidence.update(gemm_fp32_gflops=meas.gemm_fp32_gflops, gemm_bf16_gflops=meas.gemm_bf16_gflops,
                        measured=meas.source)
    native = bf16_native(facts)
    floor = ctx.tuning.dtype.min_bf16_over_fp32_gemm
    dtype: Dtype
    if facts.cpu.arch != "x86_64":
        dtype, why = _non_x86_dtype(facts, ratio, floor)
    elif not native:
        dtype = "fp32"
        why = (f"{facts.cpu.microarchitecture} has no avx512_bf16 or usable AMX: bf16 would be emulated and "
               "slower than fp32")
        if ratio is not None:
            why += f" (measured bf16/fp32 GEMM {ratio:.2f}x)"
    elif ratio is not None and ratio < floor:
        dtype, why = "fp32", f"bf16 is native but measured slower than fp32 here ({ratio:.2f}x GEMM)"
    else:
        engine = "AMX" if amx_bf16(facts) else "avx512_bf16"
        dtype, why = "bf16", f"native bf16 ({engine}): bf16 autocast"
        if ratio is not None:
            why += f", measured {ratio:.2f}x fp32 GEMM"
        elif meas.undecided.get("bf16_over_fp32"):
            why += f" (rule for {engine}: measured here, but {meas.undecided['bf16_over_fp32']})"
        else:
            why += f" (rule for {engine}, not measured on this host: `cpuperf bench` measures it)"
    return dtype, why


def _decide_dtype_cpu(ctx: _Context) -> _Precision:
    facts = ctx.facts
    evidence = _cpu_evidence(facts)
    dtype, why = _cpu_dtype(ctx, evidence)
    dtype_d = ctx.choose(ctx.fixed.dtype, "dtype", dtype, why, evidence, tuned=ctx.tuned.dtype)
    if pinned_value(ctx.fixed.tf32):
        raise UsageError("tf32 is an NVIDIA GPU mode",
                         hint="on a CPU, fp32_math_mode=bf16 plays that part (AMX hosts)" if facts.cpu.arch == "x86_64"
                         else "on this CPU, dtype=bf16 is the reduced-precision route where it measures faster")
    tf32_d = ctx.choose(ctx.fixed.tf32, "tf32", False, "TF32 is an NVIDIA GPU mode", {})
    tv = version_or_none(ctx.torch)
    mm = ctx.tuning.fp32_math_mode
    pin = ctx.fixed.fp32_math_mode
    if facts.cpu.arch != "x86_64":
        if pinned_value(pin) == "bf16" and facts.cpu.arch == "aarch64" and not bf16_native(facts):
            raise UsageError(f"fp32_math_mode=bf16 cannot run here: {facts.cpu.microarchitecture} has no Arm BF16 "
                             "extension ('bf16' is not in cpuinfo Features), so oneDNN has no bf16 kernels to use",
                             hint="leave fp32_math_mode unset: fp32 matmuls stay fp32")
        mode = ctx.choose(pin, "fp32_math_mode", None, _non_x86_math_mode(facts), {"torch": ctx.torch, **_cpu_evidence(facts)})
    elif amx_bf16(facts) and tv is not None and tv >= Version(mm.min_torch):
        # Like Arm's fast-math mode: it changes fp32 results, so it is the user's lever (do no harm), not a default.
        mode = ctx.choose(pin, "fp32_math_mode", None, "AMX host with torch >= " + mm.min_torch + ": oneDNN can run "
                          "the remaining fp32 matmuls in bf16 (torch.backends.mkldnn.matmul.fp32_precision); it changes "
                          f"fp32 results, so it is yours to choose, never cpuperf's: --set fp32_math_mode={mm.value} "
                          "applies it", {"torch": ctx.torch, "would_be": _math_mode(mm.value)}, needs_torch=True)
    else:
        mode = ctx.choose(pin, "fp32_math_mode", None, "needs an AMX host and torch >= " + mm.min_torch,
                          {"torch": ctx.torch})
    return _Precision(dtype_d, tf32_d, mode)


def _math_mode(value: object) -> Optional[MathMode]:
    """compat/tuning.toml's fp32 math mode, checked against the lever's values."""
    if value is None or value == "bf16":
        return None if value is None else "bf16"
    raise ValueError(f"tuning.toml fp32_math_mode.value {value!r} is not bf16")


def _decide_backend(ctx: _Context, world: int, on_gpu: bool) -> Decision[Optional[DdpBackend]]:
    pin = ctx.fixed.ddp_backend
    asked = None if pin is None or pin.reason is not None else pin.value  # the user's, not another owner's
    if world <= 1:
        if asked:
            ctx.notes.append(f"ddp_backend={asked} has no effect with one rank")
        several = cpu_backend(ctx.facts, ctx.stack, ctx.python) if not on_gpu else None  # what ccl-env reads
        return ctx.choose(pin, "ddp_backend", None, "one rank: no process group", dict(several_ranks_evidence(several)))
    if on_gpu:
        if asked in ("ccl", "gloo", "mpi"):
            ctx.notes.append(f"ddp_backend={asked} on GPUs: NCCL is many times faster for GPU tensors")
        return ctx.choose(pin, "ddp_backend", "nccl", "NCCL for NVIDIA GPUs", {})
    if asked == "nccl":
        raise UsageError("ddp_backend=nccl needs NVIDIA GPUs", hint="use gloo (or ccl with oneccl_bind_pt) on CPUs")
    backend = cpu_backend(ctx.facts, ctx.stack, ctx.python)
    if asked == "ccl" and ctx.facts.cpu.arch != "x86_64":
        raise UsageError(f"ddp_backend=ccl cannot run here: {no_intel_build('the oneCCL bindings (oneccl_bind_pt)', ctx.facts)}",
                         hint="use ddp_backend=gloo")
    if asked == "ccl" and not backend.ccl_available:
        raise UsageError(f"ddp_backend=ccl cannot run here: {backend.reason.removeprefix('gloo: ')}",
                         hint="cpuperf install --torch 2.7 --with oneccl, or use ddp_backend=gloo")
    return ctx.choose(pin, "ddp_backend", as_backend(backend.name), backend.reason,
                      {"oneccl_bind_pt": ctx.stack.get("oneccl_bind_pt"), "torch": ctx.torch})


def _decide_ipex(ctx: _Context, on_gpu: bool) -> Decision[bool]:
    facts = ctx.facts
    ok, why = addon_compatible("ipex", ctx.torch, ctx.stack.get("intel_extension_for_pytorch"), ctx.python)
    asked = pinned_value(ctx.fixed.ipex) is True
    pin = ctx.fixed.ipex
    if asked and not on_gpu and facts.cpu.arch != "x86_64":
        raise UsageError(f"ipex=true cannot run here: {no_intel_build('IPEX', facts)}",
                         hint="use compile=true: torch.compile is the portable way to fuse CPU kernels")
    if asked and (on_gpu or not ok):
        raise UsageError(f"ipex=true cannot run here: {'IPEX is for CPU training' if on_gpu else why}",
                         hint="cpuperf compat --with ipex shows the matching wheels, or use compile=true")
    evidence: JsonObject = {"torch": ctx.torch, "ipex": ctx.stack.get("intel_extension_for_pytorch")}
    if on_gpu:
        return ctx.choose(pin, "ipex", False, "IPEX's CPU optimisations do not apply to CUDA training", {})
    if facts.cpu.arch != "x86_64":
        return ctx.choose(pin, "ipex", False, no_intel_build("IPEX (intel_extension_for_pytorch)", facts) +
                          "; torch.compile (compile=true) is the portable way to fuse CPU kernels", evidence)
    if not ok:
        if newer_than_last("ipex", ctx.torch):  # the retirement is said once: the why names it where not installed
            retired = retirement("ipex")
            why += f"; instead: {alternative('ipex')}" if retired in why else f" (IPEX is {retired}: {alternative('ipex')})"
        return ctx.choose(pin, "ipex", False, why, evidence)
    if "avx512f" not in facts.cpu.isa:
        return ctx.choose(pin, "ipex", False, f"{why}, but this CPU has no AVX-512: IPEX brings little here",
                          {"isa": list(facts.cpu.isa)})
    return ctx.choose(pin, "ipex", True, f"{why} on an AVX-512 host: ipex.optimize(model, optimizer)", evidence,
                      needs_torch=True)


def _choose_allocator(ctx: _Context, on_gpu: bool, world: int = 1,
                      dtype: str = "fp32") -> Decision[Optional[AllocatorName]]:
    d = decide_allocator(ctx.facts, ctx.meas, on_gpu, reference_workload(ctx.workload), world, dtype,
                         ranks_unknown=ctx.ranks_unknown)
    asked = pinned_value(ctx.fixed.allocator)
    if asked:
        available = ctx.facts.software.allocators if ctx.facts.software else {}
        if ctx.facts.software is not None and not available.get(asked):
            raise UsageError(f"allocator={asked} is not installed on this host", hint=install_hint())
    return ctx.take(d, ctx.fixed.allocator, ctx.tuned.allocator)


def model_key(w: Workload) -> str:
    """The shape torch.compile's cost and gain are measured for: layers, width, heads, sequence, vocabulary."""
    return f"L{w.n_layer}-d{w.d_model}-h{w.n_head}-T{w.seq_len}-V{w.vocab}"


def compile_crossover(compile_s: float, step_s: float, speedup: float) -> Optional[int]:
    """Steps after which torch.compile has paid for its compilation (None: it never does)."""
    saved_per_step = step_s * (1 - 1 / speedup) if speedup > 0 else 0.0
    return math.ceil(round(compile_s / saved_per_step, 6)) if saved_per_step > 0 else None  # 400.0000001 is 400


def estimated_step_seconds(w: Workload, meas: Measurements, rule: CompileRule, threads: int,
                           per_rank_batch: int, on_gpu: bool = False) -> float:
    """A step's time from its FLOPs at half the measured (or assumed) GEMM rate: for unmeasured models."""
    flops = w.flops_per_token() * w.seq_len * per_rank_batch
    rate = (meas.gemm_fp32_gflops or (rule.assumed_gflops_per_thread * max(1, threads))) * 1e9 * 0.5
    return flops / (100e12 * 0.3 if on_gpu else rate)


def compile_worth_measuring(w: Workload, meas: Measurements, threads: int, rules: Tuning, dtype: str) -> bool:
    """A CPU run long enough that measuring torch.compile for its model at `dtype` (minutes) is a small part of it."""
    rule = rules.compile
    if w.steps is None or compile_measured(w, meas.compile_by_model, dtype):
        return False
    run_s = w.steps * estimated_step_seconds(w, meas, rule, threads, max(1, w.batch_size))
    threshold: float = rule.measure_when_run_exceeds_s
    return run_s >= threshold


def compile_measured(w: Workload, entries: Mapping[str, object], dtype: str) -> bool:
    """Whether torch.compile was measured for `w`'s model at `dtype` in any mode (cpuperf bench --compile measures
    all modes at once)."""
    return any(compile_figures(w, mode, dtype, entries) is not None for mode in COMPILE_MODES)


# The dtype of a cached torch.compile record that names none: it was cached before the measurement took the plan's
# dtype, when the bench worker ran its own default, fp32 (what its reason has always said).
UNNAMED_COMPILE_DTYPE = "fp32"


def compile_dtype(entry: Mapping[str, object]) -> str:
    """The dtype a cached torch.compile record was measured at: its own `dtype`, else UNNAMED_COMPILE_DTYPE."""
    dtype = entry.get("dtype")
    return dtype if isinstance(dtype, str) and dtype else UNNAMED_COMPILE_DTYPE


def compile_key(w: Workload, mode: str = "default", dtype: Optional[str] = None) -> str:
    """Where torch.compile's figures for `w`'s model in `mode` at `dtype` are cached (Measurements.compile_by_model):
    the model's key for the default mode, the key and the mode else, then the dtype. Without `dtype`, the key a cache
    written before the dtype was part of it has (its records say their dtype, or none: compile_dtype)."""
    key = model_key(w) if mode == "default" else f"{model_key(w)} {mode}"
    return key if dtype is None else f"{key} {dtype}"


def compile_figures(w: Workload, mode: str, dtype: str, entries: Mapping[str, object]) -> Optional[Mapping[str, Any]]:
    """`w`'s figures in `mode` measured at `dtype` (under its own key, else an older cache's key), None where none
    were: figures of another dtype are not this plan's."""
    for key in (compile_key(w, mode, dtype), compile_key(w, mode)):
        own = entries.get(key)
        if isinstance(own, Mapping) and own.get("mode", "default") == mode and compile_dtype(own) == dtype:
            return own
    return None


def compile_dtypes_measured(w: Workload, entries: Mapping[str, object], modes: Sequence[str]) -> List[str]:
    """The dtypes torch.compile was measured at for `w`'s model in any of `modes`."""
    found = set()
    for mode in modes:
        for dtype in BY_ID["dtype"].choices:
            if isinstance(dtype, str) and compile_figures(w, mode, dtype, entries) is not None:
                found.add(dtype)
    return sorted(found)


@dataclass(frozen=True)
class _Compiled:
    """One mode's figures for the plan's model: the cold compile, eager's step at the rank's batch, the steady
    speed-up and, where rounds were measured side by side, its verdict against eager (cpuperf.decide.judge)."""

    mode: str
    compile_s: float
    step_s: float
    speedup: float
    verdict: Optional[Verdict]
    dtype: str

    @property
    def crossover(self) -> Optional[int]:
        """Steps to pay back; None where the gain is none, or not above its own noise."""
        if self.verdict is not None and not self.verdict.above:
            return None
        return compile_crossover(self.compile_s, self.step_s, self.speedup)

    def net_s(self, steps: int) -> float:
        """Seconds a run of `steps` saves in this mode, its compile paid."""
        return steps * self.step_s * (1 - 1 / self.speedup) - self.compile_s

    def gain(self) -> str:
        v = self.verdict
        return (f"{self.speedup:.2f}x" if v is None else
                f"{self.speedup:.2f}x ({v.low:.2f}-{v.high:.2f} over {v.n} rounds, {v.outcome})")

    def said(self) -> str:
        if self.crossover is None:
            why = "not above its noise" if self.verdict is not None and self.speedup > 1 else "no steady-state gain"
            return f"{self.mode} {self.gain()}: {why}"
        return (f"{self.mode}: compile ~{self.compile_s:.0f} s, {self.gain()} per step of {self.step_s:.2f} s: pays "
                f"back after {self.crossover} steps")

    def to_json(self) -> JsonObject:
        v = self.verdict
        return {"compile_seconds": round(self.compile_s, 1), "speedup": round(self.speedup, 3),
                "step_seconds": round(self.step_s, 4), "crossover_steps": self.crossover, "dtype": self.dtype,
                **({"verdict": v.to_json()} if v is not None else {})}


def _measured_modes(w: Workload, meas: Measurements, modes: Tuple[str, ...], per_rank_batch: int,
                    rules: Tuning, dtype: str) -> List[_Compiled]:
    """The modes measured for this model at the plan's `dtype` (cpuperf bench --compile), each step time scaled to
    the rank's batch."""
    judge_rule = rules.judge
    out: List[_Compiled] = []
    for mode in modes:
        own = compile_figures(w, mode, dtype, meas.compile_by_model)
        if own is None:
            continue
        rounds = [float(r) for r in own.get("rounds") or []]
        verdict = paired(rounds, bar=1.0, confidence=judge_rule.confidence) if len(rounds) >= 2 else None
        step_s = float(own["step_seconds"]) * per_rank_batch / max(1.0, float(own.get("batch") or per_rank_batch))
        out.append(_Compiled(mode, float(own["compile_seconds"]), step_s,
                             verdict.ratio if verdict is not None else float(own["speedup"]), verdict,
                             compile_dtype(own)))
    return out


def _decide_compile(ctx: _Context, w: Workload, on_gpu: bool, ipex: bool, placement: Placement, dtype: str,
                    modes: Tuple[str, ...] = COMPILE_MODES) -> Decision[bool]:
    """From this model's figures measured at the plan's `dtype` (figures of another dtype are not this run's), else
    from the rule's assumption, said as not measured."""
    meas, rules, torch_v = ctx.meas, ctx.tuning, ctx.torch
    tv = version_or_none(torch_v)
    if tv is not None and tv < Version("2.0"):
        return Decision("compile", False, f"torch {torch_v} has no torch.compile", {"torch": torch_v})
    if ipex:
        return Decision("compile", False, "IPEX optimize is used instead", {})
    per_rank_batch = max(1, w.batch_size // max(1, placement.nproc_per_node))
    measured = _measured_modes(w, meas, modes, per_rank_batch, rules, dtype) if not on_gpu else []
    if measured:
        return _compile_from_modes(w, meas, measured)
    rule = rules.compile
    evidence: JsonObject = {"model": model_key(w)}
    model = w.name if w.source == "preset" else "CONFIG"
    how = f"assumed: not measured for this model here (`cpuperf bench --compile --model {model}` measures it)"
    others = [d for d in compile_dtypes_measured(w, meas.compile_by_model, modes) if d != dtype] if not on_gpu else []
    if others:  # figures of another dtype: not this run's (bf16 autocast and fp32 compile and gain differently)
        evidence["measured_dtypes"] = list(others)
        how = (f"assumed: not measured for {dtype}, only for {'/'.join(others)} (`cpuperf bench --compile --model "
               f"{model} --set dtype={dtype}` measures it)")
    compile_s = rule.assumed_compile_seconds_per_layer * max(1, w.n_layer)
    speedup = rule.assumed_speedup_gpu if on_gpu else rule.assumed_speedup_cpu
    step_s = estimated_step_seconds(w, meas, rule, placement.threads_per_rank, per_rank_batch, on_gpu)
    evidence.update(compile_seconds=round(compile_s, 1), speedup=speedup, step_seconds_estimate=round(step_s, 4),
                    measured="assumed")
    crossover = compile_crossover(compile_s, step_s, speedup)
    evidence["crossover_steps"] = crossover
    steps = w.steps
    evidence["steps"] = steps
    if crossover is None:
        return Decision("compile", False, f"no steady-state gain from torch.compile ({speedup:.2f}x, {how}): its "
                        "compile time never pays back", evidence)
    figure = (f"compile ~{compile_s:.0f} s, {speedup:.2f}x per step of {step_s:.2f} s ({how}): pays back after "
              f"{crossover} steps")
    if steps is None:
        return Decision("compile", False, f"{figure}; the run length is unknown", evidence)
    if steps > crossover:
        return Decision("compile", True, f"{figure}; this run has {steps}", evidence, needs_torch=True)
    return Decision("compile", False, f"{figure}; this run has only {steps}", evidence)


def _compile_from_modes(w: Workload, meas: Measurements, measured: List[_Compiled]) -> Decision[bool]:
    """On, in the mode that saves the run the most time with its compile paid, where one pays back within the run's
    steps; off otherwise, with every mode's figures. `mode`: that mode, or the best gain above its noise (the mode a
    compile you set runs in)."""
    steps = w.steps
    paying = [m for m in measured if m.crossover is not None]
    within = [m for m in paying if steps is not None and steps > (m.crossover or 0)]
    chosen = max(within, key=lambda m: m.net_s(steps or 0)) if within else None
    best = max(paying, key=lambda m: m.speedup) if paying else None
    shown = chosen or best or max(measured, key=lambda m: m.speedup)
    named = chosen or best
    evidence: JsonObject = {"model": model_key(w), "mode": named.mode if named is not None else "default",
                            "compile_seconds": round(shown.compile_s, 1), "speedup": round(shown.speedup, 3),
                            "step_seconds": round(shown.step_s, 4), "measured": meas.source,
                            "modes": {m.mode: m.to_json() for m in measured},
                            "crossover_steps": shown.crossover, "steps": steps}
    dtypes = sorted({m.dtype for m in measured})
    how = f"measured here for this model, {'/'.join(dtypes)}"
    if chosen is not None:
        return Decision("compile", True, f"torch.compile {chosen.said()} ({how}); this run has {steps}", evidence,
                        needs_torch=True)
    figures = "; ".join(m.said() for m in measured)
    if not paying:
        return Decision("compile", False, f"no steady-state gain from torch.compile above its noise ({figures}; "
                        f"{how}): its compile time never pays back", evidence)
    tail = "the run length is unknown" if steps is None else f"this run has only {steps}"
    return Decision("compile", False, f"torch.compile {figures} ({how}); {tail}", evidence)


def reference_workload(w: Optional[Workload]) -> str:
    """The reference workload whose allocator measurement stands for `w` (cpuperf bench measures 'lm' and
    'mlp'): every Workload cpuperf plans is a transformer LM; the MLP stands for dense non-LM models."""
    return "lm" if w is None or w.n_layer > 0 else "mlp"


def _decide_attention(w: Workload, dtype: str, gpu: Optional[Gpu]) -> Decision[Attention]:
    if gpu is None:
        return Decision("attention", "sdpa", "scaled_dot_product_attention (PyTorch picks its CPU flash kernel)",
                        {"head_dim": w.head_dim})
    from cpuperf.knowledge.gpu import sdpa_constraints  # the worker's sdpa_report explains with the same rules

    why_not = sdpa_constraints("flash", dtype, w.head_dim, "cuda", _cc(gpu))
    if not why_not:
        return Decision("attention", "flash", "SDPA flash kernel: half precision, cc >= 8.0, head size "
                        f"{w.head_dim}", {"head_dim": w.head_dim})
    return Decision("attention", "mem_efficient", "SDPA memory-efficient kernel; not flash: " + "; ".join(why_not),
                    {"head_dim": w.head_dim})


def _memory_ask(w: Workload, fixed: Constraints, levers: Optional[MemoryLevers], facts: HostFacts,
                on_gpu: bool) -> MemoryAsk:
    """What the memory plan must honour: your batch, accumulation and optimizer (--set, else your script's own),
    the levers the path can apply, and the levers you set."""
    from cpuperf.decide.memory import KEEPS_THE_MATH, OPTIMIZER_PACKAGE

    optimizer = pinned_value(fixed.optimizer) or w.optimizer
    needs = OPTIMIZER_PACKAGE.get(optimizer or "")
    if needs and facts.software is not None and not facts.software.packages.get(needs):
        raise FieldError("optimizer", optimizer, f"optimizer={optimizer} needs {needs}, which is not installed here",
                         f"pip install {needs}, or {{flag}}=adamw", setting=True)
    sharding = pinned_value(fixed.sharding) or "fsdp"
    if sharding == "zero3" and facts.software is not None and not facts.software.packages.get("deepspeed"):
        raise FieldError("sharding", sharding, "sharding=zero3 needs DeepSpeed, which is not installed here",
                         "pip install deepspeed, or {flag}=fsdp (torch's own)", setting=True)
    can, why = levers.on(on_gpu) if levers is not None else (KEEPS_THE_MATH, "")
    set_batch, set_accum = pinned_value(fixed.batch_size), pinned_value(fixed.grad_accum_steps)
    per_device = set_batch or w.per_device_batch
    if per_device is None and w.of_script:
        per_device = 8  # TrainingArguments' default per_device_train_batch_size
    accum = set_accum or (w.grad_accum if set_batch is None else None)
    if set_batch is not None and w.of_script and set_accum is None:
        # a per-device batch you set keeps your script's global batch: the accumulation follows it
        total = (w.per_device_batch or 8) * (w.grad_accum or 1)
        accum = max(1, math.ceil(total / int(set_batch)))
    return MemoryAsk(per_device=per_device, grad_accum=accum, optimizer=optimizer, can=can, sharding=sharding,
                     cannot_why=why, script=w.of_script,
                     recompute=None if fixed.grad_checkpointing is None else fixed.grad_checkpointing.value,
                     shard=None if fixed.sharding is None else fixed.sharding.value is not None,
                     park=None if fixed.offload is None else fixed.offload.value)


def _memory_plan(ctx: _Context, job: MemoryJob, levers: Optional[MemoryLevers],
                 decided: Callable[..., Levers]) -> Levers:
    """Batch, accumulation, checkpointing, optimizer, sharding and offload from one MemoryPlan (cpuperf.decide.memory),
    with the levers `decided` before them: the whole record.

    The user's values (ctx.fixed): the accumulation follows a set batch, never patched afterwards. `levers`: (the
    memory levers this job's path can apply, why not the others); None: all of them.
    """
    facts, fixed, tuning, torch_v = ctx.facts, ctx.fixed, ctx.tuning, ctx.torch
    w, placement, gpu = job.workload, job.placement, job.gpu
    from cpuperf.decide.memory import check_state_fits, default_optimizer, plan_memory

    on_gpu = gpu is not None
    tv = version_or_none(torch_v)
    fused_min = tuning.optimizer.fused_cuda_min_torch if on_gpu else tuning.optimizer.fused_cpu_min_torch
    fused_ok = (tv is None and on_gpu) or (tv is not None and tv >= Version(fused_min))
    ask = _memory_ask(w, fixed, levers, facts, on_gpu)
    if not w.known:
        return _unknown_model(w, ask, fused_ok, torch_v, _loading(facts, placement, tuning, on_gpu), decided)
    try:
        plan = plan_memory(facts, job, fused_ok, tuning, ask)
    except IncompatibleHostError as exc:
        if levers is None or not levers.advisory:
            raise
        if levers.state_must_fit:  # cpuperf's own worker would die allocating its model: refused before launch
            check_state_fits(facts, job, ask.optimizer or default_optimizer(fused_ok)[0], tuning)
        # Not cpuperf's to refuse: your script runs as you wrote it, with the estimate said.
        told = replace(w, found=f"{w.found}; by cpuperf's estimate it does not fit: {exc.message}; {exc.hint}")
        return _unknown_model(told, ask, fused_ok, torch_v, _loading(facts, placement, tuning, on_gpu), decided,
                              known=True)
    return _planned_levers(ctx, job, plan, decided)


def _planned_levers(ctx: _Context, job: MemoryJob, plan: MemoryPlan, decided: Callable[..., Levers]) -> Levers:
    """A known model's memory plan as decisions, each with why: the batch against the budget, the accumulation
    that keeps the global batch, recomputation, the optimizer, sharding, offload, data loading and ZeRO-3's config."""
    from cpuperf.decide.memory import zero_config

    facts, fixed, tuning, torch_v = ctx.facts, ctx.fixed, ctx.tuning, ctx.torch
    w, placement, dtype, world, on_gpu = job.workload, job.placement, job.dtype, job.world, job.gpu is not None
    evidence = {"params": w.params, **plan.evidence()}
    per_device, c, accum = int(plan.per_rank_batch), plan.candidate, plan.grad_accum
    yours = fixed.batch_size is not None
    whose = (f"your script's --per_device_train_batch_size {per_device}" if w.per_device_batch and not yours
             else "the Trainer's default per-device batch" if w.of_script and not yours
             else f"{per_device} sample(s) per rank per step")
    why_batch = (f"{whose}: {plan.per_rank_bytes() / 2**30:.2f} GiB of {plan.budget_bytes / 2**30:.2f} GiB "
                 f"({plan.budget})" if plan.budget_bytes is not None else f"{whose} (memory unknown)")
    if plan.tensor_core:
        why_batch += f"; {plan.tensor_core}"
    if w.seq_assumed:  # the script's own sequence length is not one cpuperf reads
        why_batch += (f"; assumed {w.seq_len} tokens per sample, the model config's length: your command has none of "
                      f"--{', --'.join(SEQ_ARGS)} (the activations scale with it)")
    act_no, act_ck = plan.activation_bytes_per_sample_no_ckpt, plan.activation_bytes_per_sample_ckpt
    ck_why = (f"without it one sample needs {act_no / 2**20:.0f} MiB of activations, {act_ck / 2**20:.0f} MiB with it: "
              + ("the plan fits only with recomputation" if c.checkpointing else "the plan fits without recomputation"))
    global_why = (f"keeps the global batch {plan.global_batch} = {per_device} x {accum} x {world} rank(s)"
                  + (f" ({plan.batch_note})" if plan.batch_note else ""))
    zero = zero_config(plan, w, dtype)
    where = f" ({w.found})" if w.of_script else ""
    shard_why = (f"{c.name}: weights, grads and optimizer state of {w.params / 1e9:.2f}B parameters{where} do not fit "
                 f"one rank unsharded; sharded over {world} rank(s): {plan.state_bytes / 2**30:.1f} GiB per rank"
                 if c.sharding else "not needed: the model's state fits each rank whole"
                 if plan.budget_bytes is not None else "memory unknown: not applied")
    off_why = ("the sharded state does not fit the GPUs: parked in host RAM (slower steps, the same training)"
               if c.offload else "not needed" if on_gpu else "CPU training: nothing to offload to")
    workers_d, pin_d = _loading(facts, placement, tuning, on_gpu)
    return decided(
        batch_size=Decision("batch_size", per_device, why_batch, evidence),
        grad_accum_steps=Decision("grad_accum_steps", accum, global_why,
                                  {"global_batch": plan.global_batch, "world_size": world}),
        grad_checkpointing=Decision("grad_checkpointing", c.checkpointing, ck_why,
                                    {"activation_bytes_per_sample_no_checkpointing": act_no,
                                     "activation_bytes_per_sample_checkpointing": act_ck}),
        optimizer=Decision("optimizer", as_optimizer(c.optimizer), plan.optimizer_reason,
                           {"torch": torch_v, "optimizer_bytes": plan.optimizer_bytes}),
        sharding=Decision("sharding", as_sharding(c.sharding), shard_why, {"plan": c.name, "world_size": world}),
        offload=Decision("offload", c.offload, off_why, {"plan": c.name}),
        dataloader_workers=workers_d, pin_memory=pin_d,
        zero=Decision("zero", zero, f"{c.name}: the DeepSpeed config of the ZeRO-3 plan" if zero
                      else "no DeepSpeed ZeRO plan", {"plan": c.name}))


def _unknown_model(w: Workload, ask: MemoryAsk, fused_ok: bool, torch_v: Optional[str],
                   loading: Tuple[Decision[int], Decision[bool]], decided: Callable[..., Levers],
                   known: bool = False) -> Levers:
    """Your script's model could not be told (or cpuperf applies nothing to it): its own batch and no memory lever,
    each said why."""
    from cpuperf.decide.memory import default_optimizer

    why = f"no memory lever applied ({w.found})" if known else f"cannot tell your script's model ({w.found}): no memory plan"
    optimizer, opt_why = (ask.optimizer, "set by you") if ask.optimizer else default_optimizer(fused_ok)
    return decided(
        batch_size=Decision("batch_size", int(ask.per_device or 8), f"your script's own; {why}", {}),
        grad_accum_steps=Decision("grad_accum_steps", int(ask.grad_accum or 1), "your script's own", {}),
        grad_checkpointing=Decision("grad_checkpointing", False, why, {}),
        optimizer=Decision("optimizer", as_optimizer(optimizer), opt_why, {"torch": torch_v}),
        sharding=Decision("sharding", None, why, {}), offload=Decision("offload", False, why, {}),
        dataloader_workers=loading[0], pin_memory=loading[1], zero=Decision("zero", None, why, {}))


def _loading(facts: HostFacts, placement: Placement, tuning: Tuning,
             on_gpu: bool) -> Tuple[Decision[int], Decision[bool]]:
    """Data loading: workers on CPUs the ranks do not compute on; pinned host buffers for GPU copies."""
    # The built-in corpus is in memory; workers would steal compute cores on CPU.
    spare = max(0, len(facts.usable_cpus()) - placement.threads_per_rank * placement.nproc_per_node)
    if on_gpu:
        per_gpu = tuning.dataloader.gpu_workers_per_gpu
        if placement.unit == "gpu-numa":  # the cores each rank keeps beyond its compute threads
            workers = min(per_gpu, *(len(s.cpus) - s.threads for s in placement.slots))
            why = (f"{workers} worker(s) per GPU on the cores of its NUMA node its {placement.threads_per_rank} compute "
                   "thread(s) leave free")
        else:
            workers = min(per_gpu, max(0, len(facts.usable_cpus()) // max(1, placement.nproc_per_node) - 1))
            why = f"{workers} worker(s) per GPU from the cores the process may use"
        return (Decision("dataloader_workers", workers, why, {"usable_cpus": len(facts.usable_cpus())}),
                Decision("pin_memory", True, "page-locked host buffers allow non-blocking copies to the GPU", {}))
    workers = min(2, spare)
    return (Decision("dataloader_workers", workers, "no spare cores: load data in the training process"
                     if workers == 0 else f"{spare} cores are not used for compute", {"spare_cpus": spare}),
            Decision("pin_memory", False, "no device copies on CPU training", {}))
