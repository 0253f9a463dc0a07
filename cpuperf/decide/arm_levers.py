"""The Arm server levers (compat/tuning.toml [[arm_lever]]: oneDNN's fast-math mode, transparent huge pages for
tensors, ideep's primitive cache): which ones a job on an aarch64 host gets, and why not the others. Pure.

Each is decided like any lever: applied where the rule holds and the job's results stay the plain job's; a lever
that changes the math (fast math runs fp32 GEMMs in bf16) is the user's, applied only where they set its knob
(`--set fp32_math_mode=bf16`), and otherwise named with what it would bring. decide/runtime_env turns the applied
ones into the job's variables and the others into notes, so recommend, ccl-env and train say the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Tuple

from cpuperf.knowledge.knobs import KnobValue
from cpuperf.probe.facts import HostFacts
from cpuperf.versions import version_or_none

if TYPE_CHECKING:
    from cpuperf.knowledge.tuning import ArmLever as ArmLeverRow


class ArmLever(NamedTuple):
    """One lever as decided for this job: its variable, value, whether the job gets it, and why."""

    env: str
    value: str
    applied: bool
    why: str
    source: str

    @property
    def reason(self) -> str:
        """Why, with the source (a variable's reason in the plan)."""
        return f"{self.why} ({self.source})"

    def line(self) -> str:
        """'not applied: NAME=VALUE: why' for a plan's notes."""
        return f"not applied: {self.env}={self.value}: {self.why}"


def lever_rows() -> Tuple[ArmLeverRow, ...]:
    """The [[arm_lever]] rows of compat/tuning.toml, typed (cpuperf.knowledge.tuning)."""
    from cpuperf.knowledge.tuning import tuning  # aarch64 only on ccl-env's path

    return tuning().arm_lever


def knob_vars(knob: str) -> Tuple[str, ...]:
    """The variables a decision carries on Arm hosts (fp32_math_mode -> DNNL_DEFAULT_FPMATH_MODE)."""
    return tuple(row.env for row in lever_rows() if row.knob == knob)


def arm_levers(facts: HostFacts, knobs: Optional[Mapping[str, KnobValue]] = None) -> Tuple[ArmLever, ...]:
    """Every Arm lever decided for this host and the plan's knob values (none off aarch64)."""
    if facts.cpu.arch != "aarch64":
        return ()
    torch = facts.software.packages.get("torch") if facts.software else None
    return tuple(_decide(row, facts, torch.version if torch else None, knobs or {}) for row in lever_rows())


def _decide(row: ArmLeverRow, facts: HostFacts, torch: Optional[str], knobs: Mapping[str, KnobValue]) -> ArmLever:
    cpu = facts.cpu
    where = f"{cpu.arch} ({cpu.microarchitecture})"

    def lever(applied: bool, why: str) -> ArmLever:
        return ArmLever(row.env, row.value, applied, why, row.source)

    need = row.needs_isa
    if need and need not in cpu.isa:
        return lever(False, f"{row.what}: {where} has no Arm BF16 extension ('{need}' is not in cpuinfo "
                            "Features), so it has no bf16 kernels to switch to")
    if not row.training:
        return lever(False, f"{row.what}: {row.why_not_training}")
    from packaging.version import Version  # aarch64 only: not on x86's path (ccl-env in every new shell)

    minimum = row.min_torch
    tv = version_or_none(torch)
    if minimum and tv is not None and tv < Version(minimum):
        return lever(False, f"{row.what}: torch {torch} reads it from {minimum} on")
    knob = row.knob
    if row.changes_math and knob and knobs.get(knob) != row.when:
        has = f": the CPU has Arm BF16 ('{need}' in cpuinfo Features)" if need else ""
        return lever(False, f"{row.what}{has}; it changes fp32 results, so it is yours to choose, never cpuperf's: "
                            f"--set {knob}={row.when} applies it")
    if knob:
        return lever(True, f"{row.what}: {knob}={knobs.get(knob)} was set by you")
    return lever(True, f"{row.what}; the results are the plain job's" + (f" (torch {torch})" if torch else ""))
