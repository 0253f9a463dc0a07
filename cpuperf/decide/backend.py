"""The CPU DDP backend: THE rule (recommend decides with it), and how a recorded decision reads back.

Light on purpose: ccl-env's start-up path reads a remembered or saved decision through recorded_backend()
without loading the compat matrix; only cpu_backend() reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from cpuperf.jsonable import JsonMapping, JsonObject
from cpuperf.knowledge.addons import Backend

if TYPE_CHECKING:
    from cpuperf.probe.facts import HostFacts


def no_intel_build(what: str, facts: HostFacts) -> str:
    """Why an Intel CPU add-on does not apply to an Arm or POWER host, naming what the host is."""
    cpu = facts.cpu
    return f"{what} has no {cpu.arch} build: it does not apply to this {cpu.arch} ({cpu.microarchitecture}) host"


def cpu_backend(facts: HostFacts, stack: Mapping[str, Optional[str]], python: Optional[str]) -> Backend:
    """The backend several CPU ranks use here: gloo off x86 (no oneCCL bindings build), else the compat matrix's answer."""
    if facts.cpu.arch != "x86_64":
        why = no_intel_build("the oneCCL bindings (oneccl_bind_pt)", facts)
        return Backend("gloo", f"gloo, PyTorch's built-in CPU backend: {why}", False)
    from cpuperf.knowledge.addons import cpu_ddp_backend  # ccl where bindings that fit this torch are installed

    return cpu_ddp_backend(stack.get("torch"), stack.get("oneccl_bind_pt"), python)


def several_ranks_evidence(backend: Optional[Backend]) -> JsonObject:
    """What a one-rank decision records: the backend several ranks would use, so no reader looks at the matrix again."""
    return {"several_ranks": backend.name, "several_ranks_reason": backend.reason} if backend else {}


def recorded_backend(value: object, evidence: JsonMapping, reason: str) -> Optional[Backend]:
    """The CPU backend a recorded ddp_backend decision names: its value, else (one rank) the one several ranks would
    use; None when it names neither (a GPU plan, or a plan saved before the evidence was recorded)."""
    if isinstance(value, str) and value in ("ccl", "gloo"):
        return Backend(value, reason, value == "ccl")
    several = evidence.get("several_ranks")
    if isinstance(several, str) and several in ("ccl", "gloo"):
        return Backend(several, str(evidence.get("several_ranks_reason", "")), several == "ccl")
    return None


def process_group_backend(value: object) -> str:
    """The backend the job's runtime variables are tuned for: the decided CPU backend, gloo for anything else."""
    return value if isinstance(value, str) and value in ("ccl", "gloo") else "gloo"
