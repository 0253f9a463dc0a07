"""The records of a recommendation: decisions, the measurements behind them, the whole recommendation.

Kept apart from the engine (cpuperf.decide.recommend) so that reading a saved plan needs none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, Generic, Literal, Mapping, Optional, Sequence, Tuple, TypeVar, Union, cast, get_args

from cpuperf.decide.placement import Placement
from cpuperf.decide.workload import BatchSplit, Workload
from cpuperf.jsonable import JsonMapping, JsonObject, JsonValue, as_json
from cpuperf.knowledge.knobs import BY_ID, DECISION_IDS, RULED_IDS, KnobValue
from cpuperf.probe.facts import HostFacts

T = TypeVar("T")
V_co = TypeVar("V_co", covariant=True)  # a decision's value: a Decision[int] is a Decision[object]

# The closed sets a lever's value is one of: the same values as its knob's choices (cpuperf.knowledge.knobs;
# tests/test_levers.py keeps the two equal). A lever's value is typed once, where it is decided or read back.
Device = Literal["cpu", "cuda"]
Dtype = Literal["fp32", "bf16", "fp16"]
MathMode = Literal["bf16"]
Affinity = Literal["auto"]
DdpBackend = Literal["gloo", "ccl", "mpi", "nccl"]
AllocatorName = Literal["tcmalloc", "jemalloc", "mimalloc"]
Attention = Literal["sdpa", "flash", "mem_efficient", "math"]
Optimizer = Literal["adamw", "adamw_fused", "adafactor", "adamw_8bit"]
Sharding = Literal["fsdp", "zero3"]
CompileMode = Literal["default", "max-autotune", "regional", "regional-max-autotune"]  # worker_settings.COMPILE_MODES
ZeroConfig = Dict[str, JsonValue]  # a DeepSpeed ZeRO config, as DeepSpeed reads it (JSON)


def _member(kind: object, value: object, what: str) -> object:
    if value not in get_args(kind):
        raise ValueError(f"{what} {value!r} is not one of {', '.join(map(str, get_args(kind)))}")
    return value


def as_device(value: object) -> Device:
    return cast(Device, _member(Device, value, "device"))


def as_backend(value: object) -> Optional[DdpBackend]:
    return None if value is None else cast(DdpBackend, _member(DdpBackend, value, "ddp_backend"))


def as_allocator(value: object) -> Optional[AllocatorName]:
    return None if value is None else cast(AllocatorName, _member(AllocatorName, value, "allocator"))


def as_optimizer(value: object) -> Optimizer:
    return cast(Optimizer, _member(Optimizer, value, "optimizer"))


def as_sharding(value: object) -> Optional[Sharding]:
    return None if value is None else cast(Sharding, _member(Sharding, value, "sharding"))


@dataclass(frozen=True)
class Decision(Generic[V_co]):
    """One lever's value, why, and what it was decided from; `overridden`: the user's (--set/--config)."""

    id: str
    value: V_co
    reason: str
    evidence: JsonObject = field(default_factory=dict)
    overridden: bool = False
    needs_torch: bool = False

    def to_json(self) -> JsonObject:
        return as_json(self)


@dataclass(frozen=True)
class Levers:
    """Every lever of a plan, one typed attribute each, in the vocabulary's order (knowledge/knobs.py
    DECISION_IDS); each is decided by one owner (docs/architecture.md, "One owner per fact"). Sharding (FSDP, or
    DeepSpeed ZeRO-3 whose config `zero` holds) and offload are the memory plan's (cpuperf.decide.memory)."""

    device: Decision[Device]
    dtype: Decision[Dtype]
    tf32: Decision[bool]
    fp32_math_mode: Decision[Optional[MathMode]]
    nproc_per_node: Decision[int]
    nnodes: Decision[int]
    threads_per_rank: Decision[int]
    affinity: Decision[Optional[Affinity]]
    ddp_backend: Decision[Optional[DdpBackend]]
    ipex: Decision[bool]
    compile: Decision[bool]
    allocator: Decision[Optional[AllocatorName]]
    attention: Decision[Attention]
    batch_size: Decision[int]
    grad_accum_steps: Decision[int]
    grad_checkpointing: Decision[bool]
    optimizer: Decision[Optimizer]
    sharding: Decision[Optional[Sharding]]
    offload: Decision[bool]
    dataloader_workers: Decision[int]
    pin_memory: Decision[bool]
    zero: Decision[Optional[ZeroConfig]]
    # the levers of the generic path (knob rows that name their `rule`), in the vocabulary's order, each valued as its
    # knob row says (knowledge/knobs.py RULED_IDS); a new lever of a known carrier needs no field here
    ruled: Tuple[Decision[KnobValue], ...] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "ruled" and getattr(self, f.name).id != f.name:
                raise ValueError(f"the {f.name} lever holds the decision {getattr(self, f.name).id!r}")
        ids = [d.id for d in self.ruled]
        if ids != [i for i in RULED_IDS if i in ids]:
            raise ValueError(f"the generic levers hold {', '.join(ids)}: not the ruled knobs in their order")

    def all(self) -> Tuple[Decision[object], ...]:
        """Every lever's decision, in the vocabulary's order (how reports and JSON list them)."""
        typed: Tuple[Decision[object], ...] = tuple(getattr(self, f.name) for f in fields(self) if f.name != "ruled")
        if not self.ruled:
            return typed
        order = {lever: i for i, lever in enumerate(DECISION_IDS)}
        return tuple(sorted(typed + self.ruled, key=lambda d: order[d.id]))

    @property
    def world(self) -> int:
        """Ranks over all nodes."""
        return self.nproc_per_node.value * self.nnodes.value

    @property
    def on_gpu(self) -> bool:
        return self.device.value == "cuda"



# How a lever of the generic path is decided (its knob row names the function): from the host, the workload and the
# typed levers; its Decision's id is the knob's.
LeverRule = Callable[[HostFacts, Workload, Levers], Decision[KnobValue]]


def compile_mode_of(d: Decision[bool]) -> CompileMode:
    """The torch.compile mode the compile decision names (its evidence's `mode`: the one measured to pay back, or
    the best measured where you set compile); "default" (the whole model) where it names none."""
    mode = d.evidence.get("mode")
    return cast(CompileMode, mode) if mode in get_args(CompileMode) else "default"


def measured_gemm(evidence: JsonMapping) -> Optional[Tuple[float, float]]:
    """(fp32, bf16) GEMM GFLOP/s the dtype decision was measured from (its evidence), None where it was not."""
    fp32, bf16 = evidence.get("gemm_fp32_gflops"), evidence.get("gemm_bf16_gflops")
    if isinstance(fp32, (int, float)) and isinstance(bf16, (int, float)) and fp32 and bf16:
        return float(fp32), float(bf16)
    return None


def levers_of(decisions: Sequence[Decision[Any]]) -> Levers:
    """Levers from a complete set of decisions (a saved plan's, read back and checked): ValueError otherwise."""
    by_id = {d.id: d for d in decisions}
    names = [f.name for f in fields(Levers) if f.name != "ruled"]
    missing = [n for n in [*names, *RULED_IDS] if n not in by_id]
    if missing:
        raise ValueError(f"decisions lack {', '.join(missing)}")
    return Levers(**{n: by_id[n] for n in names}, ruled=tuple(by_id[n] for n in RULED_IDS))


@dataclass(frozen=True)
class Measurements:
    """Micro-benchmark results for this host (cpuperf bench), or recorded ones in tests."""

    gemm_fp32_gflops: Optional[float] = None
    gemm_bf16_gflops: Optional[float] = None
    gemm_fp16_gflops: Optional[float] = None
    compile_seconds: Optional[float] = None
    step_seconds: Optional[float] = None  # eager fp32 step of the workload, if measured
    compile_speedup: Optional[float] = None
    # name -> throughput ratio vs default (geometric mean); name_by_workload -> {workload: ratio}
    allocator_speedup: Dict[str, Union[float, Dict[str, float]]] = field(default_factory=dict)
    # compile_key(workload, mode, dtype) -> {"compile_seconds", "speedup", "step_seconds", "batch", "mode", "dtype",
    # "rounds"}: torch.compile measured on this host for that model in that mode at that dtype (cpuperf bench
    # --compile --model NAME; decide/measurement_schema.COMPILED); an older cache's key lacks the dtype, its record
    # says it (none: fp32, decide.recommend.compile_dtype). A plan reads only its own dtype's (compile_figures).
    compile_by_model: Dict[str, JsonObject] = field(default_factory=dict)
    # Joint tuning (cpuperf.decide.tune): shape_key(workload) -> result, and a user command's key -> result
    tuned_by_shape: Dict[str, JsonObject] = field(default_factory=dict)
    tuned_by_command: Dict[str, JsonObject] = field(default_factory=dict)
    # A ratio measured too noisy to decide (cpuperf.decide.ratios): what -> the line that says so; the rule decides
    undecided: Dict[str, str] = field(default_factory=dict)
    source: str = "none"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurements:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Recommendation:
    levers: Levers
    placement: Placement
    workload: Workload
    notes: Tuple[str, ...]
    stack: Dict[str, Optional[str]]
    oversubscribe: bool = False
    split: Optional[BatchSplit] = None  # how cpuperf's ranks share a user's Trainer's global batch
    # the launch options fixed for this plan (the knob rows marked `option`), by id: yours (--set, reason None) or a
    # cached tuning's verdict (its reason), never decisions; each is applied by its owner (numa_memory:
    # cpuperf.decide.placement memory_policy), which reports whether the job carries it.
    options: Dict[str, Pin[KnobValue]] = field(default_factory=dict)

    @property
    def decisions(self) -> Tuple[Decision[object], ...]:
        """Every decision in the vocabulary's order (reports, JSON)."""
        return self.levers.all()


@dataclass(frozen=True)
class Pin(Generic[T]):
    """A lever fixed before it is decided: the user's value (`reason` None: --set/--config), or one that another
    owner fixed with its reason (the plain baseline; every node of a cluster agreeing), never rewritten after."""

    value: T
    reason: Optional[str] = None
    evidence: Optional[JsonObject] = None


@dataclass(frozen=True)
class Constraints:
    """What is fixed before the engine decides (cpuperf.decide.recommend): one optional pin per lever."""

    device: Optional[Pin[Device]] = None
    dtype: Optional[Pin[Dtype]] = None
    tf32: Optional[Pin[bool]] = None
    fp32_math_mode: Optional[Pin[Optional[MathMode]]] = None
    nproc_per_node: Optional[Pin[int]] = None
    nnodes: Optional[Pin[int]] = None
    threads_per_rank: Optional[Pin[int]] = None
    affinity: Optional[Pin[Optional[Affinity]]] = None
    ddp_backend: Optional[Pin[Optional[DdpBackend]]] = None
    ipex: Optional[Pin[bool]] = None
    compile: Optional[Pin[bool]] = None
    allocator: Optional[Pin[Optional[AllocatorName]]] = None
    attention: Optional[Pin[Attention]] = None
    batch_size: Optional[Pin[int]] = None
    grad_accum_steps: Optional[Pin[int]] = None
    grad_checkpointing: Optional[Pin[bool]] = None
    optimizer: Optional[Pin[Optimizer]] = None
    sharding: Optional[Pin[Optional[Sharding]]] = None
    offload: Optional[Pin[bool]] = None
    dataloader_workers: Optional[Pin[int]] = None
    pin_memory: Optional[Pin[bool]] = None
    zero: Optional[Pin[Optional[ZeroConfig]]] = None
    ruled: Dict[str, Pin[KnobValue]] = field(default_factory=dict)  # the generic path's levers (Levers.ruled), by id
    # the launch options fixed (knob rows marked `option`: oversubscribe, numa_memory), by id; never decisions
    options: Dict[str, Pin[KnobValue]] = field(default_factory=dict)

    @property
    def oversubscribe(self) -> bool:
        """More ranks x threads than usable cores, allowed (the placement's option)."""
        pin = self.options.get("oversubscribe")
        return bool(pin is not None and pin.value)

    def pinned(self) -> Tuple[str, ...]:
        """The ids of the levers fixed here."""
        typed = tuple(f.name for f in fields(self) if f.name not in ("ruled", "options") and getattr(self, f.name) is not None)
        return typed + tuple(self.ruled)

    def under(self, other: Constraints) -> Constraints:
        """These pins where `other` has none (the user's pins over a baseline's or a cluster's)."""
        mine = {n: getattr(self, n) for n in self.pinned() if n not in self.ruled and getattr(other, n) is None}
        return replace(other, ruled={**self.ruled, **other.ruled}, options={**self.options, **other.options}, **mine)


def constraints_of(values: Mapping[str, KnobValue], reason: Optional[str] = None) -> Constraints:
    """Typed values by knob id (knowledge/knobs.py has checked each) -> Constraints; `reason` None: the user's."""
    return pinned_as({k: Pin(v, reason) for k, v in values.items()})


def pinned_as(pins: Mapping[str, Pin[KnobValue]]) -> Constraints:
    """Pins by knob id -> Constraints, each where its knob row puts it: a decided knob's is its lever's pin (the
    generic path's with the ruled ones), a launch option's (its row says `option`) goes with the options."""
    typed: Dict[str, Any] = {k: p for k, p in pins.items() if BY_ID[k].decided and not BY_ID[k].rule}
    return Constraints(ruled={k: p for k, p in pins.items() if BY_ID[k].decided and BY_ID[k].rule},
                       options={k: p for k, p in pins.items() if BY_ID[k].option}, **typed)


def pinned_value(pin: Optional[Pin[T]]) -> Optional[T]:
    """A pin's value, None when the lever is not pinned (or pinned to none)."""
    return None if pin is None else pin.value
