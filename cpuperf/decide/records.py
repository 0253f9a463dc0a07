"""The records of a recommendation: decisions, the measurements behind them, the whole recommendation.

Kept apart from the engine (cpuperf.decide.recommend) so that reading a saved plan needs none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

from cpuperf.decide.placement import Placement
from cpuperf.decide.workload import Workload
from cpuperf.jsonable import as_json


@dataclass(frozen=True)
class Decision:
    id: str
    value: Any
    reason: str
    evidence: Dict[str, Any] = field(default_factory=dict)
    overridden: bool = False
    needs_torch: bool = False

    def to_json(self) -> Dict[str, Any]:
        return as_json(self)


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
    allocator_speedup: Dict[str, Any] = field(default_factory=dict)
    # model_key(workload) -> {"compile_seconds", "speedup", "step_seconds", "batch"}: torch.compile
    # measured on this host for that model (cpuperf bench --compile --model NAME)
    compile_by_model: Dict[str, Dict[str, float]] = field(default_factory=dict)
    # Joint tuning (cpuperf.decide.tune): shape_key(workload) -> result, and a user command's key -> result
    tuned_by_shape: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    tuned_by_command: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # A ratio measured too noisy to decide (cpuperf.decide.ratios): what -> the line that says so; the rule decides
    undecided: Dict[str, str] = field(default_factory=dict)
    source: str = "none"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurements:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Recommendation:
    decisions: Tuple[Decision, ...]
    placement: Placement
    workload: Workload
    notes: Tuple[str, ...]
    stack: Dict[str, Optional[str]]
    oversubscribe: bool = False

    def get(self, decision_id: str) -> Any:
        for d in self.decisions:
            if d.id == decision_id:
                return d.value
        raise KeyError(decision_id)

    def decision(self, decision_id: str) -> Decision:
        for d in self.decisions:
            if d.id == decision_id:
                return d
        raise KeyError(decision_id)

    @property
    def chosen(self) -> Dict[str, Any]:
        """Each decision's value, by id."""
        return {d.id: d.value for d in self.decisions}

    @property
    def user_set(self) -> FrozenSet[str]:
        """The ids of the decisions the user fixed (--set/--config)."""
        return frozenset(d.id for d in self.decisions if d.overridden)


