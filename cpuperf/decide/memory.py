"""The memory plan: one computation from which batch, grad_accum, checkpointing, optimizer and ZeRO follow.

Pure. Per rank: weights, gradients, optimizer state (per optimizer), activations per sample with and
without gradient checkpointing, against the memory a rank may use (available memory or the cgroup
limit, split over the ranks of each NUMA node; a GPU's memory on CUDA). Plans are tried from the
cheapest in compute to the cheapest in memory; the first that fits one sample per rank wins.

CPU training never offloads to the CPU (it already runs there: "offload" would only move bytes
within the same RAM). If no plan fits, `plan_memory` raises IncompatibleHostError with the figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from cpuperf.decide.placement import Placement
from cpuperf.decide.workload import Workload
from cpuperf.errors import IncompatibleHostError
from cpuperf.probe.facts import Gpu, HostFacts

GIB = float(2**30)


@dataclass(frozen=True)
class Candidate:
    """One way to train: optimizer, checkpointing, ZeRO stage (and GPU-only offload)."""

    optimizer: str
    checkpointing: bool
    zero_stage: Optional[int] = None
    offload: bool = False

    @property
    def name(self) -> str:
        parts = [self.optimizer, "checkpointing" if self.checkpointing else "no checkpointing"]
        if self.zero_stage:
            parts.append(f"ZeRO-{self.zero_stage}" + (" + CPU offload" if self.offload else ""))
        return ", ".join(parts)


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
    tried: Tuple[Tuple[str, int], ...] = field(default_factory=tuple)  # (plan, bytes for one sample)

    @property
    def state_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    def per_rank_bytes(self) -> int:
        return self.state_bytes + self.per_rank_batch * self.activation_bytes_per_sample

    def evidence(self) -> Dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "budget": self.budget, "node_budget_bytes": self.node_budget_bytes,
                "ranks_per_numa_node": self.ranks_per_node, "weights_bytes": self.weights_bytes,
                "grads_bytes": self.grads_bytes, "optimizer_bytes": self.optimizer_bytes,
                "weights_grads_optimizer_bytes": self.state_bytes,
                "activation_bytes_per_sample": self.activation_bytes_per_sample,
                "activation_bytes_per_sample_no_checkpointing": self.activation_bytes_per_sample_no_ckpt,
                "activation_bytes_per_sample_checkpointing": self.activation_bytes_per_sample_ckpt,
                "max_batch_that_fits": self.max_batch_that_fits, "per_rank_bytes": self.per_rank_bytes(),
                "per_node_bytes": self.per_rank_bytes() * self.ranks_per_node,
                "plan": asdict(self.candidate), "tried": [list(t) for t in self.tried]}


def activation_bytes_per_sample(w: Workload, dtype: str, checkpointing: bool, rule: Mapping[str, Any]) -> float:
    """Korthikanti et al. 2022 eq. 1 per layer (16-bit; doubled in fp32) plus logits and their grad."""
    t, d, h, layers = w.seq_len, w.d_model, max(1, w.n_head), w.n_layer
    per_layer_16bit: float = t * d * (rule["activation_coeff"] + rule["activation_attn_coeff"] * h * t / d)
    scale = 2.0 if dtype == "fp32" else 1.0
    if checkpointing:
        # Only block inputs are kept, plus one block recomputed at a time.
        return (layers * 2 * t * d * 2 + per_layer_16bit) * scale + t * w.vocab * 4
    return layers * per_layer_16bit * scale + t * w.vocab * 4 * 2  # logits + their grad in fp32


def _ranks_per_node(placement: Placement) -> int:
    counts: Dict[Optional[int], int] = {}
    for slot in placement.slots:
        counts[slot.node] = counts.get(slot.node, 0) + 1
    return max(counts.values()) if counts else 1


def memory_budget(facts: HostFacts, placement: Placement, device: str, gpu: Optional[Gpu],
                  rule: Mapping[str, Any]) -> Tuple[Optional[int], str, Optional[int]]:
    """(bytes one rank may use, how, bytes the ranks of one NUMA node may use); None = unknown."""
    if device == "cuda" and gpu is not None:
        if gpu.memory_bytes is None:
            return None, "GPU memory unknown", None
        if gpu.memory_free_bytes is not None and gpu.memory_free_bytes < gpu.memory_bytes * rule["gpu_headroom"]:
            # Another process holds part of the card: only what is free now can be planned for.
            b = int(gpu.memory_free_bytes * rule["gpu_headroom"])
            return b, (f"{gpu.name}: {gpu.memory_free_bytes / GIB:.1f} GiB free of {gpu.memory_bytes / GIB:.0f} GiB "
                       f"x {rule['gpu_headroom']}"), b
        b = int(gpu.memory_bytes * rule["gpu_headroom"])
        return b, f"{gpu.name}: {gpu.memory_bytes / GIB:.0f} GiB x {rule['gpu_headroom']}", b
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
    how = f"{words}; {per_rank / GIB:.1f} GiB per rank x {rule['headroom']}"
    return int(per_rank * rule["headroom"]), how, int(node_usable * rule["headroom"])


def _optimizers(facts: HostFacts, on_gpu: bool, torch_ok_fused: bool, rule: Mapping[str, Any]
                ) -> List[Tuple[str, float, str]]:
    """(optimizer, bytes of state per parameter beyond weights and grads, reason), preferred first."""
    # Same family (AdamW), fastest implementation the installed torch has: fused on CUDA and, since the
    # release compat/tuning.toml names, on CPU (one kernel over all parameters; ~6x faster steps measured).
    first = ("adamw_fused", "fused AdamW kernel (one kernel for all parameters)") if torch_ok_fused \
        else ("adamw", "AdamW (foreach implementation): this torch has no fused kernel for the device")
    out = [(first[0], rule["bytes_per_param_adamw"] - 8.0, first[1])]
    if facts.software is not None and facts.software.packages.get("bitsandbytes"):
        out.append(("adamw_8bit", rule["bytes_per_param_adamw_8bit"] - 8.0,
                    "AdamW state does not fit: 8-bit AdamW (bitsandbytes installed)"))
    else:
        out.append(("adafactor", rule["bytes_per_param_adafactor"] - 8.0,
                    "AdamW state does not fit: factored Adafactor (bitsandbytes is not installed for 8-bit AdamW)"))
    return out


def _candidates(optimizers: List[Tuple[str, float, str]], world: int, on_gpu: bool) -> List[Candidate]:
    out = [Candidate(opt, ck) for opt, _, _ in optimizers for ck in (False, True)]
    if world > 1:  # ZeRO-3 shards weights, grads and optimizer state over the ranks (no offload)
        out += [Candidate(opt, True, 3) for opt, _, _ in optimizers]
    if on_gpu:  # a GPU may park state in host RAM; a CPU has nowhere else to put it
        out += [Candidate(opt, True, 3, offload=True) for opt, _, _ in optimizers]
    return out


def plan_memory(facts: HostFacts, w: Workload, placement: Placement, dtype: str, gpu: Optional[Gpu], world: int,
                torch_ok_fused: bool, tuning: Mapping[str, Any]) -> MemoryPlan:
    """The memory plan; IncompatibleHostError (exit 3) when no plan fits one sample per CPU rank."""
    rule = tuning["memory"]
    on_gpu = gpu is not None
    budget, how, node_budget = memory_budget(facts, placement, "cuda" if on_gpu else "cpu", gpu, rule)
    optimizers = _optimizers(facts, on_gpu, torch_ok_fused, rule)
    reasons = {name: why for name, _, why in optimizers}
    opt_bytes = {name: b for name, b, _ in optimizers}
    act = {ck: int(activation_bytes_per_sample(w, dtype, ck, rule)) for ck in (False, True)}
    per_device = max(1, math.ceil(w.batch_size / max(1, world)))
    shards = max(1, world)

    def state(c: Candidate) -> Tuple[int, int, int]:
        share = shards if c.zero_stage == 3 else 1
        if c.offload:
            share = 10**9  # parameters and optimizer state live in host RAM
        return (int(w.params * 4 / share), int(w.params * 4 / share), int(w.params * opt_bytes[c.optimizer] / share))

    def make(c: Candidate, batch: int, fit: Optional[int], tried: List[Tuple[str, int]]) -> MemoryPlan:
        weights, grads, opt = state(c)
        return MemoryPlan(budget, how, node_budget, _ranks_per_node(placement), weights, grads, opt,
                          act[c.checkpointing], act[False], act[True], c, reasons[c.optimizer], batch, fit,
                          tuple(tried))

    first = _candidates(optimizers, world, on_gpu)[0]
    if budget is None:
        return make(first, per_device, None, [])
    tried: List[Tuple[str, int]] = []
    host_room = _host_room(facts, placement, rule) if on_gpu else None
    for c in _candidates(optimizers, world, on_gpu):
        need_state = sum(state(c))
        need_one = need_state + act[c.checkpointing]
        tried.append((c.name, need_one))
        offloaded = w.params * (8.0 + opt_bytes[c.optimizer]) * placement.nproc_per_node / shards if c.offload else 0.0
        if need_one <= budget and (not offloaded or (host_room is not None and offloaded <= host_room)):
            fit = int((budget - need_state) // act[c.checkpointing])
            return make(c, _batch(per_device, fit, on_gpu, dtype, tuning), fit, tried)
    raise IncompatibleHostError(_too_big(w, budget, how, tried, act, opt_bytes), hint=_hint(w, budget, opt_bytes, act))


def _host_room(facts: HostFacts, placement: Placement, rule: Mapping[str, Any]) -> Optional[float]:
    """Host RAM (after headroom) that GPU ranks may offload state to, on one node."""
    per_rank, _, _ = memory_budget(facts, placement, "cpu", None, rule)
    return None if per_rank is None else float(per_rank) * max(1, placement.nproc_per_node)


def _batch(per_device: int, fit: int, on_gpu: bool, dtype: str, tuning: Mapping[str, Any]) -> int:
    cap = fit
    if on_gpu:
        multiple = tuning["gpu_batch"]["fp16_tensor_core_multiple"] if dtype == "fp16" else tuning["gpu_batch"]["multiple"]
        # Largest Tensor-Core-friendly size that fits; fall back to multiples of 8, then to what fits.
        cap = (fit // multiple) * multiple if fit >= multiple else (fit // 8) * 8 if fit >= 8 else fit
    # Equal micro-batches: 16 over a cap of 15 is 2 x 8, not 15 + 1 (which would be 2 x 15 = 30).
    steps_needed = max(1, math.ceil(per_device / cap))
    return min(cap, math.ceil(per_device / steps_needed))


def _too_big(w: Workload, budget: int, how: str, tried: List[Tuple[str, int]], act: Mapping[bool, int],
             opt_bytes: Mapping[str, float]) -> str:
    smallest = min(tried, key=lambda t: t[1])
    opt = smallest[0].split(",")[0]
    return (f"{w.params / 1e9:.2f}B parameters do not fit this host in any plan cpuperf knows: the smallest "
            f"({smallest[0]}) needs {smallest[1] / GIB:.1f} GiB per rank = weights {w.params * 4 / GIB:.1f} GiB + "
            f"grads {w.params * 4 / GIB:.1f} GiB + {opt} state {w.params * opt_bytes.get(opt, 0) / GIB:.1f} GiB + "
            f"activations {act[True] / 2**20:.0f} MiB per sample (checkpointed; {act[False] / 2**20:.0f} MiB without), "
            f"against {budget / GIB:.1f} GiB usable per rank ({how}); CPU offload does not apply to CPU training")


def _hint(w: Workload, budget: int, opt_bytes: Mapping[str, float], act: Mapping[bool, int]) -> str:
    per_param = 8.0 + min(opt_bytes.values())
    room = budget - act[True]
    fits = int(room / per_param) if room > 0 else 0
    # ZeRO-3 over N nodes divides the state by N ranks (one rank per node here).
    nodes = math.ceil(w.params * per_param / room) if room > 0 else None
    more = f", or shard it with ZeRO-3 over at least {nodes} such nodes (--nnodes {nodes})" if nodes else ""
    return f"train a model of at most ~{fits / 1e9:.2f}B parameters here{more}, or use a GPU host"


def zero_config(plan: MemoryPlan, w: Workload, dtype: str) -> Optional[Dict[str, Any]]:
    """The DeepSpeed config for a ZeRO plan (None when the plan needs none); offload only on GPUs."""
    c = plan.candidate
    if not c.zero_stage:
        return None
    zero: Dict[str, Any] = {"stage": c.zero_stage}
    if c.offload:
        zero.update(offload_optimizer={"device": "cpu", "pin_memory": True},
                    offload_param={"device": "cpu", "pin_memory": True})
    return {"zero_optimization": zero, "train_micro_batch_size_per_gpu": plan.per_rank_batch,
            "gradient_accumulation_steps": max(1, math.ceil(w.batch_size / plan.per_rank_batch)),
            "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"}}
