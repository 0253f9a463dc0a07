"""The memory plan: one computation from which batch, accumulation, checkpointing, sharding and offload follow.

Pure. Per rank: weights, gradients, optimizer state, activations per sample with and without activation
checkpointing, against the memory a rank may use (installed memory or the cgroup limit, split over the ranks of
each NUMA node; a GPU's memory on CUDA). Only levers that keep the training the same are cpuperf's to use
(checkpointing, sharding, offload), tried from the cheapest in compute to the cheapest in memory; the optimizer
family and the batch are the user's (their script's arguments, or --set). The global batch is kept exactly.

CPU training never offloads to the CPU (it already runs there: "offload" would only move bytes within the
same RAM). If no plan fits, `plan_memory` raises IncompatibleHostError with the figures and the options (each
the user's to take) that would fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from cpuperf.decide.placement import Placement
from cpuperf.decide.workload import Workload
from cpuperf.errors import IncompatibleHostError, UsageError
from cpuperf.jsonable import JsonMapping, JsonObject
from cpuperf.knowledge.tuning import Tuning
from cpuperf.probe.facts import Gpu, HostFacts

GIB = float(2**30)


# The levers a memory plan may use without changing what is trained (the training result stays the same):
# activation checkpointing (recomputes), sharding (FSDP full shard / ZeRO-3: each rank holds 1/N of the state),
# offload (a GPU parks the sharded state in host RAM). The optimizer family and the batch change the math:
# only the user changes them (--set, or their own script's arguments).
@dataclass(frozen=True)
class Reach:
    """Which of the levers that keep the math a path can apply: recompute (activation checkpointing), shard
    (FSDP / ZeRO-3), park (offload the sharded state to host RAM)."""

    recompute: bool = True
    shard: bool = True
    park: bool = True

    def within(self, other: Reach) -> Reach:
        return Reach(self.recompute and other.recompute, self.shard and other.shard, self.park and other.park)

    @property
    def everything(self) -> bool:
        return self.recompute and self.shard and self.park


KEEPS_THE_MATH = Reach()
NOTHING = Reach(False, False, False)


@dataclass(frozen=True)
class Candidate:
    """One way to train: optimizer, checkpointing, sharding (fsdp | zero3) and offload (GPU only)."""

    optimizer: str
    checkpointing: bool
    sharding: Optional[str] = None  # 'fsdp' (torch FSDP full shard) | 'zero3' (DeepSpeed ZeRO-3) | None
    offload: bool = False

    @property
    def zero_stage(self) -> Optional[int]:
        return 3 if self.sharding == "zero3" else None

    @property
    def name(self) -> str:
        parts = [self.optimizer, "checkpointing" if self.checkpointing else "no checkpointing"]
        if self.sharding:
            parts.append(("FSDP full shard" if self.sharding == "fsdp" else "ZeRO-3")
                         + (" + CPU offload" if self.offload else ""))
        return ", ".join(parts)


@dataclass(frozen=True)
class MemoryLevers:
    """The memory levers a job's path can apply (the built-in loop: checkpointing; a Trainer script: what its
    release takes), why not the others, and whether a job that does not fit is refused (exit 3) or only told
    (advisory: a script cpuperf adds nothing to may shard itself; a plain run is run as you gave it)."""

    can: Reach = KEEPS_THE_MATH
    why: str = ""
    advisory: bool = False
    cpu_can: Optional[Reach] = None  # on a CPU device, where the path can do less (None: the same)
    cpu_why: str = ""
    # cpuperf's own worker (the built-in loop, plain DDP: every rank holds the whole model): weights, grads and
    # optimizer state that fit no rank are refused (exit 3) before launch, even where the plan is advisory
    state_must_fit: bool = False

    def on(self, on_gpu: bool) -> Tuple[Reach, str]:
        """(the levers, why not the others) on this device."""
        if on_gpu or self.cpu_can is None:
            return self.can, self.why
        return self.can.within(self.cpu_can), self.cpu_why or self.why


@dataclass(frozen=True)
class MemoryAsk:
    """What a memory plan must honour: the user's batch and optimizer, and the levers the job's path can apply."""

    per_device: Optional[int] = None  # fixed per-rank batch (your script's, or --set batch_size); None: split the global batch
    grad_accum: Optional[int] = None  # fixed accumulation (your script's, or --set grad_accum_steps)
    optimizer: Optional[str] = None  # the optimizer family you chose (--set, or your script's --optim); None: AdamW
    can: Reach = KEEPS_THE_MATH  # the levers this path can apply (a user script without a Trainer: none)
    sharding: str = "fsdp"  # how sharding is applied: torch FSDP, or DeepSpeed ZeRO-3 where you chose it
    cannot_why: str = ""  # why a lever of KEEPS_THE_MATH is not in `can` (said in the plan and in exit 3)
    recompute: Optional[bool] = None  # levers you set: checkpointing, sharding (True: some, False: none), offload
    shard: Optional[bool] = None
    park: Optional[bool] = None
    script: bool = False  # the batch and optimizer are your script's arguments: options are said in its terms

    def allows(self, c: Candidate) -> bool:
        """A candidate agrees with every lever you set."""
        return ((self.recompute is None or c.checkpointing == self.recompute)
                and (self.shard is None or bool(c.sharding) == self.shard)
                and (self.park is None or c.offload == self.park))

    def pins(self) -> str:
        """The levers you set, in words."""
        said = [("grad_checkpointing", self.recompute), ("sharding", self.shard), ("offload", self.park)]
        return ", ".join(f"{name}={'yes' if v else 'none'}" for name, v in said if v is not None)


@dataclass(frozen=True)
class MemoryPlan:
    """The figures behind the memory decisions (bytes are per rank unless named per node)."""

    budget_bytes: Optional[int]  # what one rank may use, after headroom
    budget: str  # how the budget was reached, in words
    node_budget_bytes: Optional[int]  # what the ranks of one NUMA node may use together
    ranks_per_node: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes_per_sample: int  # of the chosen plan
    activation_bytes_per_sample_no_ckpt: int
    activation_bytes_per_sample_ckpt: int
    candidate: Candidate
    optimizer_reason: str
    per_rank_batch: int
    max_batch_that_fits: Optional[int]
    tried: Tuple[Tuple[str, int], ...] = field(default_factory=tuple)  # (plan, bytes for the per-rank batch)
    grad_accum: int = 1
    global_batch: int = 1
    batch_note: str = ""  # how the global batch is split, or why it could not be kept exactly
    tensor_core: str = ""  # the Tensor Core alignment of the batch's GEMMs (GPU), in words
    gathered_bytes: int = 0  # a sharded plan's working copy of the layer being computed
    autocast_copy_bytes: int = 0  # autocast's 16-bit copies of the weights, kept for the backward

    @property
    def state_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.gathered_bytes \
            + self.autocast_copy_bytes

    def per_rank_bytes(self) -> int:
        return self.state_bytes + self.per_rank_batch * self.activation_bytes_per_sample

    def evidence(self) -> JsonObject:
        return {"budget_bytes": self.budget_bytes, "budget": self.budget, "node_budget_bytes": self.node_budget_bytes,
                "ranks_per_numa_node": self.ranks_per_node, "weights_bytes": self.weights_bytes,
                "grads_bytes": self.grads_bytes, "optimizer_bytes": self.optimizer_bytes,
                "weights_grads_optimizer_bytes": self.state_bytes, "autocast_copy_bytes": self.autocast_copy_bytes,
                "activation_bytes_per_sample": self.activation_bytes_per_sample,
                "activation_bytes_per_sample_no_checkpointing": self.activation_bytes_per_sample_no_ckpt,
                "activation_bytes_per_sample_checkpointing": self.activation_bytes_per_sample_ckpt,
                "max_batch_that_fits": self.max_batch_that_fits, "per_rank_bytes": self.per_rank_bytes(),
                "per_node_bytes": self.per_rank_bytes() * self.ranks_per_node,
                "plan": {"optimizer": self.candidate.optimizer, "checkpointing": self.candidate.checkpointing,
                         "sharding": self.candidate.sharding, "offload": self.candidate.offload},
                "tried": [list(t) for t in self.tried], "global_batch": self.global_batch}


def activation_bytes_per_sample(w: Workload, dtype: str, checkpointing: bool, rule: MemoryRule,
                                fused_attention: bool = False) -> float:
    """Bytes the forward keeps for the backward, per sample: every layer's saved tensors, the final norm, the logits.

    A 16-bit dtype is autocast (fp32 weights, 16-bit matmuls); with checkpointing only each block's input is kept,
    plus one block recomputed at a time. fused_attention: a flash or memory-efficient SDPA kernel keeps no T x T
    scores (Dao et al. 2022, FlashAttention, sec. 3)."""
    t, d = w.seq_len, w.d_model
    a = 4 if dtype == "fp32" else 2  # bytes of what the matmuls read and write
    per_token = _layer_bytes_per_token(w, a, fused_attention, rule)
    norm_out = 4 * d * (2 if w.block == "llama" else 1) + a * d  # the final norm's saved input(s) and lm_head's input
    # The logits in the matmul dtype, their fp32 copy for the loss (autocast only) and the log-softmax the loss keeps.
    logits = t * w.vocab * (a + (4 if a < 4 else 0) + 4)
    if checkpointing:
        return w.n_layer * 4 * d * t + per_token * t + norm_out * t + logits  # fp32 block inputs + one block
    return w.n_layer * per_token * t + norm_out * t + logits


def _layer_bytes_per_token(w: Workload, a: int, fused_attention: bool, rule: MemoryRule) -> float:
    """What one block keeps for its backward, per token, in bytes (a: bytes of the matmul dtype, 2 under autocast).

    Counted from the ops autograd saves (their derivative formulas, tools/autograd/derivatives.yaml): the residual
    stream stays fp32 under autocast (the embedding and every residual add are fp32), so the block's input and the
    residual after attention are 4 bytes an element, each kept by the norm that reads it; Hugging Face's RMSNorm
    (Llama) runs in fp32 ops and keeps its normalised input too, where LayerNorm's kernel keeps only mean and rstd;
    autocast caches the 16-bit copies of weights only (leaf tensors), so every projection reading a norm's output
    casts and keeps its own copy (Llama: q, k, v and gate, up; the built-in block: one q/k/v and one MLP input), in
    fp32 one copy serves them; attention keeps q, k, v and its output; the MLP keeps its hidden activations (GELU:
    input and output; SwiGLU: gate, its SiLU, up and their product). Without a fused attention kernel the scores,
    softmax and dropout mask of Korthikanti et al. 2022 eq. 1 (5 h T bytes at 16-bit) come on top."""
    d = w.d_model
    f = w.d_ff or 4 * d
    kv = (w.kv_heads or w.n_head) * w.head_dim
    llama = w.block == "llama"
    residual = 2 * 4 * d
    norms = 2 * 4 * d if llama else 0
    readers = 5 if llama else 2
    normed = readers * a * d if a < 4 else 2 * 4 * d
    attention = a * (d + 2 * kv) + a * d
    scores = 0.0 if fused_attention else rule.activation_attn_coeff * max(1, w.n_head) * w.seq_len * a / 2
    mlp = (4 if llama else 2) * a * f
    return residual + norms + normed + attention + scores + mlp


def autocast_copy_bytes(w: Workload, dtype: str, sharded: bool) -> int:
    """The 16-bit copies autocast makes of the matmul weights (all but the input embedding) and the backward keeps
    until each layer's gradient is computed: 0 in fp32, and in a sharded plan (its gathered layer is in the compute
    dtype already)."""
    if dtype == "fp32" or sharded:
        return 0
    return 2 * max(0, w.params - w.vocab * w.d_model)


def _ranks_per_node(placement: Placement) -> int:
    counts: Dict[Optional[int], int] = {}
    for slot in placement.slots:
        counts[slot.node] = counts.get(slot.node, 0) + 1
    return max(counts.values()) if counts else 1


def memory_budget(facts: HostFacts, placement: Placement, device: str, gpu: Optional[Gpu],
                  rule: MemoryRule) -> Tuple[Optional[int], str, Optional[int]]:
    """(bytes one rank may use, how, bytes the ranks of one NUMA node may use); None = unknown."""
    if device == "cuda" and gpu is not None:
        if gpu.memory_bytes is None:
            return None, "GPU memory unknown", None
        if gpu.memory_free_bytes is not None and gpu.memory_free_bytes < gpu.memory_bytes * rule.gpu_headroom:
            # Another process holds part of the card: only what is free now can be planned for.
            b = int(gpu.memory_free_bytes * rule.gpu_headroom)
            return b, (f"{gpu.name}: {gpu.memory_free_bytes / GIB:.1f} GiB free of {gpu.memory_bytes / GIB:.0f} GiB "
                       f"x {rule.gpu_headroom}"), b
        b = int(gpu.memory_bytes * rule.gpu_headroom)
        return b, f"{gpu.name}: {gpu.memory_bytes / GIB:.0f} GiB x {rule.gpu_headroom}", b
    # Installed memory, not what is free this second: a plan is a function of stable facts (what other
    # processes hold now is a doctor finding, and differs from run to run).
    available = facts.memory.total_bytes or facts.memory.available_bytes
    limit = facts.limits.memory_limit_bytes
    usable: Optional[float] = float(available) if available else None
    words = f"{available / GIB:.1f} GiB installed" if available else ""
    if limit and (usable is None or limit < usable):
        usable, words = float(limit), f"cgroup memory limit {limit / GIB:.1f} GiB"
    if usable is None:
        return None, "memory unknown", None
    nproc = max(1, placement.nproc_per_node)
    per_node_ranks = _ranks_per_node(placement)
    per_rank = usable / nproc
    node_ids = {slot.node for slot in placement.slots}
    node_mem = [n.memory_bytes for n in facts.topology.numa_nodes if n.id in node_ids and n.memory_bytes]
    node_usable = usable
    if node_mem and nproc > 1:
        # Ranks bind memory to their own node: a rank gets its node's share, not the host's.
        node_usable = min(usable, float(min(node_mem)))
        per_rank = min(per_rank, node_usable / per_node_ranks)
        words += f", {node_usable / GIB:.1f} GiB per NUMA node over {per_node_ranks} rank(s)"
    how = f"{words}; {per_rank / GIB:.1f} GiB per rank x {rule.headroom}"
    return int(per_rank * rule.headroom), how, int(node_usable * rule.headroom)


# Optimizer state beyond fp32 weights (4) and grads (4), per parameter: compat/tuning.toml [memory].
@dataclass(frozen=True)
class MemoryRule:
    """compat/tuning.toml [memory], typed: bytes per parameter of each optimizer's training state (bytes_per_param_X),
    the attention scores' coefficient, the share of RAM (headroom) and of a card (gpu_headroom) a plan may fill."""

    bytes_per_param: Dict[str, float]  # optimizer row (adamw, adamw_8bit, adafactor) -> bytes per parameter
    activation_attn_coeff: float
    headroom: float
    gpu_headroom: float


def memory_rule(rules: Tuning) -> MemoryRule:
    """The [memory] record of compat/tuning.toml (cpuperf.knowledge.tuning) as a MemoryRule."""
    row = rules.memory
    return MemoryRule(dict(row.bytes_per_param), float(row.activation_attn_coeff), float(row.headroom),
                      float(row.gpu_headroom))


_STATE_ROW = {"adamw": "adamw", "adamw_fused": "adamw", "adamw_8bit": "adamw_8bit", "adafactor": "adafactor"}
# The optimizer families and the package each needs beyond torch (a family whose package is missing is refused).
OPTIMIZER_PACKAGE = {"adamw_8bit": "bitsandbytes"}


def optimizer_state_bytes(optimizer: str, rule: MemoryRule) -> float:
    """Bytes of optimizer state per parameter (beyond weights and grads) for an optimizer id."""
    return rule.bytes_per_param.get(_STATE_ROW.get(optimizer, "adamw"), rule.bytes_per_param["adamw"]) - 8.0


def default_optimizer(torch_ok_fused: bool) -> Tuple[str, str]:
    """(optimizer, why): AdamW in the fastest implementation the installed torch has: the same family, the same math."""
    # Fused on CUDA and, since the release compat/tuning.toml names, on CPU (one kernel over all parameters;
    # ~6x faster steps measured).
    if torch_ok_fused:
        return "adamw_fused", "fused AdamW kernel (one kernel for all parameters)"
    return "adamw", "AdamW (foreach implementation): this torch has no fused kernel for the device"


def _candidates(optimizer: str, world: int, on_gpu: bool, ask: MemoryAsk) -> List[Candidate]:
    """The plans that keep the math, cheapest in compute first: on GPUs sharding (fast links) before
    recomputation, on CPUs recomputation before sharding (gloo moves every shard through host memory)."""
    recompute = ask.can.recompute or bool(ask.recompute)
    plain, ckpt = Candidate(optimizer, False), Candidate(optimizer, True)
    shard = [Candidate(optimizer, False, ask.sharding), Candidate(optimizer, True, ask.sharding)] \
        if world > 1 and (ask.can.shard or ask.shard) else []
    out = [plain]
    if on_gpu:
        out += shard[:1] + ([ckpt] if recompute else []) + shard[1:]
    else:
        out += ([ckpt] if recompute else []) + shard
    if on_gpu and ask.can.shard and ask.can.park:  # a GPU may park state in host RAM; a CPU has nowhere else
        out.append(Candidate(optimizer, recompute, ask.sharding, offload=True))
    return [c for c in out if ask.allows(c) and (not c.checkpointing or recompute)]


@dataclass(frozen=True)
class _Figures:
    """What every candidate is measured with: parameters, dtype, ranks and the activations per sample."""

    w: Workload
    dtype: str
    world: int
    nproc: int
    act: Mapping[bool, int]
    rule: MemoryRule

    def state(self, c: Candidate) -> Tuple[int, int, int, int, int]:
        """(weights, grads, optimizer state, gathered working copy, autocast's 16-bit copies) on the device of one
        rank. Gradients are counted as held at the activations' peak: a job that accumulates holds them through the
        next forward (one that frees them each step, as the Trainer does, peaks up to 4 bytes a parameter lower)."""
        if c.offload:  # parameters, grads and optimizer state live in host RAM
            share = float("inf")
        else:
            share = float(self.world) if c.sharding else 1.0
        opt = optimizer_state_bytes(c.optimizer, self.rule)
        # A sharded rank gathers one layer's weights at a time (and prefetches the next), in the compute dtype.
        gathered = int(2 * self.w.params / max(1, self.w.n_layer) * (4 if self.dtype == "fp32" else 2)) \
            if c.sharding else 0
        return (int(self.w.params * 4 / share), int(self.w.params * 4 / share), int(self.w.params * opt / share),
                gathered, autocast_copy_bytes(self.w, self.dtype, bool(c.sharding)))

    def need(self, c: Candidate, batch: int) -> int:
        return sum(self.state(c)) + batch * self.act[c.checkpointing]

    def host_bytes(self, c: Candidate) -> float:
        """Host RAM the offloaded state of this node's ranks needs."""
        opt = optimizer_state_bytes(c.optimizer, self.rule)
        return self.w.params * (8.0 + opt) * self.nproc / max(1, self.world) if c.offload else 0.0


@dataclass(frozen=True)
class MemoryJob:
    """What a memory plan sizes: the model, where its ranks run, the math dtype, the card (None: CPU training), the
    ranks in all, and whether attention keeps no scores (an SDPA flash or memory-efficient kernel on GPUs)."""

    workload: Workload
    placement: Placement
    dtype: str
    gpu: Optional[Gpu]
    world: int
    fused_attention: bool = False


def plan_memory(facts: HostFacts, job: MemoryJob, torch_ok_fused: bool, tuning: Tuning,
                ask: MemoryAsk = MemoryAsk()) -> MemoryPlan:
    """The memory plan: the user's batch and optimizer as given, the levers that keep the math tried cheapest first.
    IncompatibleHostError (exit 3) when none fits, with the figures and the options that would."""
    w, placement, dtype, gpu, world = job.workload, job.placement, job.dtype, job.gpu, job.world
    fused_attention = job.fused_attention
    rule = memory_rule(tuning)
    on_gpu = gpu is not None
    budget, how, node_budget = memory_budget(facts, placement, "cuda" if on_gpu else "cpu", gpu, rule)
    if ask.optimizer is not None:
        optimizer, why_opt = ask.optimizer, "set by you"
    else:
        optimizer, why_opt = default_optimizer(torch_ok_fused)
    act = {ck: int(activation_bytes_per_sample(w, dtype, ck, rule, fused_attention)) for ck in (False, True)}
    fig = _Figures(w, dtype, max(1, world), max(1, placement.nproc_per_node), act, rule)
    split = _split(w, fig.world, ask)
    align = tensor_core_alignment(gpu, dtype, w.seq_len, tuning) if on_gpu else None

    def make(c: Candidate, batch: int, fit: Optional[int], tried: List[Tuple[str, int]], accum: int,
             note: str) -> MemoryPlan:
        weights, grads, opt, gathered, copies = fig.state(c)
        tc = align.describe(batch) if align is not None else ""
        return MemoryPlan(budget, how, node_budget, _ranks_per_node(placement), weights, grads, opt,
                          act[c.checkpointing], act[False], act[True], c, why_opt, batch, fit, tuple(tried),
                          accum, batch * accum * fig.world, note, tc, gathered, copies)

    candidates = _candidates(optimizer, fig.world, on_gpu, ask)
    if not candidates:  # the levers you set leave no plan this job can run
        raise UsageError(f"{ask.pins()}: no plan of this job can apply it ("
                         + ("CPU training has nothing to offload to" if not on_gpu and ask.park
                            else "sharding needs several ranks" if fig.world <= 1 and ask.shard
                            else ask.cannot_why or "not on this path") + ")",
                         hint="drop it: cpuperf applies sharding, offload and checkpointing where a job needs them")
    if budget is None:
        batch, accum, note = split.choose(None, align)
        return make(candidates[0], batch, None, [], accum, note)
    tried: List[Tuple[str, int]] = []
    host_room = _host_room(facts, placement, rule) if on_gpu else None
    for c in candidates:
        smallest = split.smallest()
        need = fig.need(c, smallest)
        tried.append((c.name, need))
        host = fig.host_bytes(c)
        if need <= budget and (not host or (host_room is not None and host <= host_room)):
            fit = int((budget - sum(fig.state(c))) // act[c.checkpointing])
            batch, accum, note = split.choose(fit, align)
            return make(c, batch, fit, tried, accum, note)
    raise IncompatibleHostError(_too_big(fig, split, budget, how, tried, on_gpu, candidates, host_room),
                                hint=_would_fit(facts, fig, split, budget, ask, optimizer, on_gpu, host_room))


def check_state_fits(facts: HostFacts, job: MemoryJob, optimizer: str, tuning: Tuning) -> None:
    """IncompatibleHostError (exit 3) when the model's weights, grads and optimizer state alone, held whole by each
    rank, exceed what a rank may use (memory_budget): such a job dies allocating before its first step, whatever its
    batch. The figures are plan_memory's own (_Figures.state)."""
    rule = memory_rule(tuning)
    budget, how, _ = memory_budget(facts, job.placement, "cpu" if job.gpu is None else "cuda", job.gpu, rule)
    if budget is None:
        return
    fig = _Figures(job.workload, job.dtype, max(1, job.world), max(1, job.placement.nproc_per_node),
                   {False: 0, True: 0}, rule)
    weights, grads, opt, _, _ = fig.state(Candidate(optimizer, False))  # autocast's copies come with the activations
    need = weights + grads + opt
    if need <= budget:
        return
    w = job.workload
    raise IncompatibleHostError(
        f"the model ({w.n_layer} layers x d_model {w.d_model}, {w.params / 1e9:.2f}B parameters) needs {need / GIB:.1f} "
        f"GiB per rank before any activations (weights {weights / GIB:.1f} GiB + grads {grads / GIB:.1f} GiB + "
        f"{optimizer} state {opt / GIB:.1f} GiB), against {budget / GIB:.1f} GiB usable per rank ({how})",
        hint="a smaller model (model.d_model, model.n_layer or model.vocab_size), or a host with more "
             + ("GPU memory" if job.gpu is not None else "memory"))


@dataclass(frozen=True)
class _Split:
    """How the global batch reaches the ranks: the user's per-rank batch and accumulation as given, or cpuperf's
    micro-batches of exactly the global batch (never one sample more or less)."""

    global_batch: int
    world: int
    per_device: Optional[int]
    grad_accum: Optional[int]

    def smallest(self) -> int:
        return self.per_device or 1

    def choose(self, fit: Optional[int], align: Optional[TensorCoreAlignment]) -> Tuple[int, int, str]:
        """(per-rank batch, accumulation, how) within `fit` samples (None: unknown memory)."""
        if self.per_device is not None:
            accum = self.grad_accum or max(1, math.ceil(self.global_batch / (self.per_device * self.world)))
            return self.per_device, accum, ""
        per_rank, note = divmod(self.global_batch, self.world)[0], ""
        if self.global_batch % self.world:
            per_rank = math.ceil(self.global_batch / self.world)
            note = (f"the global batch {self.global_batch} is not a multiple of {self.world} ranks: "
                    f"{per_rank * self.world} samples per step (the nearest split into equal ranks)")
        per_rank = max(1, per_rank)
        if self.grad_accum is not None:
            return max(1, math.ceil(per_rank / self.grad_accum)), self.grad_accum, note
        cap = per_rank if fit is None else max(1, min(fit, per_rank))
        # Equal micro-batches that add up to the rank's share exactly: the largest divisor within the cap,
        # a Tensor-Core-aligned one where one exists at the same or a smaller step count.
        divisors = [d for d in range(cap, 0, -1) if per_rank % d == 0]
        batch = divisors[0]
        if align is not None:
            aligned = [d for d in divisors if align.aligned(d)]
            if aligned and aligned[0] * 2 > batch:
                batch = aligned[0]
        return batch, per_rank // batch, note


def _split(w: Workload, world: int, ask: MemoryAsk) -> _Split:
    return _Split(max(1, w.batch_size), world, ask.per_device, ask.grad_accum)


@dataclass(frozen=True)
class TensorCoreAlignment:
    """The Tensor Core multiple for this card and dtype (compat/tuning.toml [[tensor_core]]): a training GEMM's
    rows are batch x sequence tokens, so a batch is aligned when batch x seq_len is a multiple of it."""

    multiple: int
    seq_len: int
    why: str

    def aligned(self, batch: int) -> bool:
        return self.multiple <= 1 or (batch * self.seq_len) % self.multiple == 0

    def describe(self, batch: int) -> str:
        if self.multiple <= 1:
            return self.why
        tokens = batch * self.seq_len
        if self.aligned(batch):
            return f"{batch} x {self.seq_len} = {tokens} tokens per GEMM, a multiple of {self.multiple} ({self.why})"
        return f"{batch} x {self.seq_len} = {tokens} tokens per GEMM is not a multiple of {self.multiple} ({self.why})"


def tensor_core_alignment(gpu: Optional[Gpu], dtype: str, seq_len: int,
                          rules: Tuning) -> Optional[TensorCoreAlignment]:
    """The multiple NVIDIA's performance guide gives for this card's Tensor Cores in this dtype (None off a GPU)."""
    if gpu is None:
        return None
    math_dtype = "tf32" if dtype == "fp32" and gpu.tf32 else dtype
    cc = tuple(int(x) for x in (gpu.compute_capability or "0.0").split(".")[:2] if x.isdigit())
    for row in rules.tensor_core:
        if row.math != math_dtype or cc < tuple(int(x) for x in row.min_cc.split(".")):
            continue
        if row.card and row.card not in gpu.name:
            continue
        card = f"{row.card} " if row.card else ""
        return TensorCoreAlignment(row.multiple, max(1, seq_len),
                                   f"{card}{math_dtype} Tensor Cores: NVIDIA's guide, multiples of {row.multiple}")
    return TensorCoreAlignment(1, max(1, seq_len), f"no {math_dtype} Tensor Cores on {gpu.name}: no alignment rule")


def _host_room(facts: HostFacts, placement: Placement, rule: MemoryRule) -> Optional[float]:
    """Host RAM (after headroom) that GPU ranks may offload state to, on one node."""
    per_rank, _, _ = memory_budget(facts, placement, "cpu", None, rule)
    return None if per_rank is None else float(per_rank) * max(1, placement.nproc_per_node)


def _too_big(fig: _Figures, split: _Split, budget: int, how: str, tried: List[Tuple[str, int]], on_gpu: bool,
             candidates: List[Candidate], host_room: Optional[float]) -> str:
    offloaded = [c for c in candidates if c.offload and fig.need(c, split.smallest()) <= budget]
    if offloaded:  # the GPUs would hold it; the host RAM its state is parked in would not
        c = offloaded[0]
        room = f"{host_room / GIB:.1f} GiB" if host_room is not None else "an unknown amount"
        return (f"{fig.w.params / 1e9:.2f}B parameters do not fit this host in any plan that keeps your training the "
                f"same: {c.name} fits the GPUs ({fig.need(c, split.smallest()) / GIB:.1f} GiB of {budget / GIB:.1f} GiB "
                f"per rank, {how}) but parks {fig.host_bytes(c) / GIB:.1f} GiB of weights, grads and optimizer state in "
                f"host RAM, which has {room} usable; without offload the smallest plan needs "
                f"{min(fig.need(x, split.smallest()) for x in candidates if not x.offload) / GIB:.1f} GiB per rank")
    smallest = min(tried, key=lambda t: t[1])
    opt = smallest[0].split(",")[0]
    batch = split.smallest()
    per_sample = f"{fig.act[True] / 2**20:.0f} MiB per sample checkpointed, {fig.act[False] / 2**20:.0f} MiB without"
    where = "" if on_gpu else "; CPU offload does not apply to CPU training"
    return (f"{fig.w.params / 1e9:.2f}B parameters do not fit this host in any plan that keeps your training the "
            f"same: the smallest ({smallest[0]}) needs {smallest[1] / GIB:.1f} GiB per rank = weights "
            f"{fig.w.params * 4 / GIB:.1f} GiB + grads {fig.w.params * 4 / GIB:.1f} GiB + {opt} state "
            f"{fig.w.params * optimizer_state_bytes(opt, fig.rule) / GIB:.1f} GiB (before sharding) + activations for "
            f"{batch} sample(s) ({per_sample}), against {budget / GIB:.1f} GiB usable per rank ({how}){where}")


def _would_fit(facts: HostFacts, fig: _Figures, split: _Split, budget: int, ask: MemoryAsk, optimizer: str,
               on_gpu: bool, host_room: Optional[float]) -> str:
    """The options that would fit, each one the user's to take (they change the batch, the optimizer or the host)."""
    options: List[str] = []
    keep = _candidates(optimizer, fig.world, on_gpu, ask)

    def fits(c: Candidate, batch: int) -> bool:
        host = fig.host_bytes(c)
        return fig.need(c, batch) <= budget and (not host or (host_room is not None and host <= host_room))

    if split.per_device and split.per_device > 1:
        total = split.per_device * (split.grad_accum or 1)
        best: Optional[Tuple[int, Candidate]] = None
        for c in keep:  # the largest per-rank batch any such plan fits that divides your per-rank share
            if c.offload and not fits(c, 1):
                continue
            room = (budget - sum(fig.state(c))) // fig.act[c.checkpointing]
            per = next((d for d in range(int(min(room, split.per_device - 1)), 0, -1) if total % d == 0), 0)
            if per >= 1 and (best is None or per > best[0]):
                best = (per, c)
        if best is not None:
            per, c = best
            same = f"the same global batch; {c.name}"
            options.append(f"--per_device_train_batch_size {per} --gradient_accumulation_steps {total // per} in "
                           f"your command ({same})" if ask.script else
                           f"--set batch_size={per} (with {total // per} accumulation steps: {same})")
    for other in ("adamw_8bit", "adafactor"):
        if other == optimizer:
            continue
        missing = OPTIMIZER_PACKAGE.get(other)
        installed = missing is None or (facts.software is not None and bool(facts.software.packages.get(missing)))
        fitting = next((c for c in _candidates(other, fig.world, on_gpu, ask) if fits(c, split.smallest())), None)
        if fitting is not None:
            trainer_name = {"adamw_8bit": "adamw_bnb_8bit"}.get(other, other)
            how = f"--optim {trainer_name} in your command" if ask.script else f"--set optimizer={other}"
            options.append(f"{how} ({fitting.name}; another optimizer: another training)"
                           + ("" if installed else f" after pip install {missing}"))
    per_param = 8.0 + optimizer_state_bytes(optimizer, fig.rule)
    room = budget - split.smallest() * fig.act[True] - fig.state(Candidate(optimizer, True, "fsdp"))[3]
    if ask.can.shard and room > 0:
        ranks = math.ceil(fig.w.params * per_param / room)
        nodes = math.ceil(ranks / fig.nproc)
        if nodes > max(1, fig.world // fig.nproc):
            options.append(f"shard it over at least {nodes} such nodes (--nnodes {nodes}, {ranks} ranks)")
    if not ask.can.everything and ask.cannot_why:
        options.append(ask.cannot_why)
    options.append("or a host with more " + ("GPU memory" if on_gpu else "memory") + " per rank")
    return "; ".join(options)


def planned_peak(evidence: JsonMapping, batch: int, measured: JsonMapping) -> JsonObject:
    """The real peak a run reports (rank 0: torch.cuda.max_memory_allocated / max_memory_reserved) beside the plan's
    figure for the batch that ran (its state plus that many samples' activations); the measured figures alone where
    the plan has none."""
    out: JsonObject = {k: measured[k] for k in ("max_allocated_bytes", "max_reserved_bytes", "batch_size") if k in measured}
    state, per = evidence.get("weights_grads_optimizer_bytes"), evidence.get("activation_bytes_per_sample")
    if isinstance(state, int) and isinstance(per, int) and batch >= 1:
        planned = state + batch * per
        out["planned_bytes"] = planned
        for key in ("max_allocated_bytes", "max_reserved_bytes"):
            real = measured.get(key)
            if isinstance(real, int) and real > 0:
                out["planned_over_" + key[4:-6]] = round(planned / real, 4)
    return out


def zero_config(plan: MemoryPlan, w: Workload, dtype: str) -> Optional[JsonObject]:
    """The DeepSpeed config for a ZeRO plan (None when the plan needs none); offload only on GPUs."""
    c = plan.candidate
    if not c.zero_stage:
        return None
    zero: JsonObject = {"stage": c.zero_stage}
    if c.offload:
        zero.update(offload_optimizer={"device": "cpu", "pin_memory": True},
                    offload_param={"device": "cpu", "pin_memory": True})
    return {"zero_optimization": zero, "train_micro_batch_size_per_gpu": plan.per_rank_batch,
            "gradient_accumulation_steps": plan.grad_accum,
            "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"}}
