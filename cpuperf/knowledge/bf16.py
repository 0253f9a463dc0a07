"""THE answer to "does this CPU run bf16 in hardware?": recommend's dtype, its note on a bf16 you set, doctor's
finding, the tuner's candidates and the cluster checks all ask here. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from cpuperf.probe.facts import HostFacts

# The unit that runs bf16 natively off x86: Arm's BF16 extension (arch/arm64/kernel/cpuinfo.c 'bf16'),
# POWER10's MMA (ISA 3.1).
_NON_X86_UNIT = {"aarch64": "bf16", "ppc64le": "mma"}


def amx_usable(facts: HostFacts) -> bool:
    """AMX cpuperf would use: the CPU has it and the kernel does not refuse it (None, not probed, counts as usable:
    a recorded host). THE answer: recommend's dtype and math mode, the cluster checks and this module ask here."""
    cpu = facts.cpu
    return cpu.arch == "x86_64" and cpu.amx_supported and cpu.amx_usable is not False


def amx_bf16(facts: HostFacts) -> bool:
    """AMX's bf16 tiles, usable: the engine behind bf16 autocast and oneDNN's bf16 math mode on x86."""
    return amx_usable(facts) and "amx_bf16" in facts.cpu.isa


def amx_bf16_in(evidence: Mapping[str, object]) -> bool:
    """The same answer as amx_bf16, from a plan's dtype evidence (its `amx_bf16` flag and the probe's `amx_usable`,
    None when not probed): what a saved plan's reader asks where the host's facts are not at hand."""
    return bool(evidence.get("amx_bf16")) and evidence.get("amx_usable") is not False


def bf16_native(facts: HostFacts) -> bool:
    """A hardware bf16 path cpuperf would use: x86 avx512_bf16 or usable AMX, Arm BF16, POWER10 MMA."""
    cpu = facts.cpu
    if cpu.arch == "x86_64":
        return "avx512_bf16" in cpu.isa or amx_bf16(facts)  # from the ISA: the probe reports facts, not this
    unit = _NON_X86_UNIT.get(cpu.arch)
    return unit is not None and unit in cpu.isa
