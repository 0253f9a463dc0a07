"""CPU identity and ISA: /proc/cpuinfo + the microarchitecture table in compat/microarch.toml."""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

from cpuperf.data import load_builtin
from cpuperf.probe import parse
from cpuperf.probe.facts import ARM_ISA, POWER_ISA, X86_ISA, CpuFacts
from cpuperf.probe.sources import Sources

# arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux >= 5.16 asks the kernel for AMX tile
# state; without it the first AMX instruction kills the process with SIGILL.
# Source: Linux Documentation/arch/x86/xstate.rst.
_AMX_PERMISSION_CHECK = (
    "import ctypes,sys\n"
    "libc=ctypes.CDLL(None, use_errno=True)\n"
    "SYS_arch_prctl=158; ARCH_REQ_XCOMP_PERM=0x1023; XFEATURE_XTILEDATA=18\n"
    "sys.exit(0 if libc.syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)==0 else 3)\n"
)


class X86Row(NamedTuple):
    """One [[x86]] row of compat/microarch.toml: a generation, the family/models that name it, its features."""

    name: str
    vendor: str
    family: int
    order: int  # newer generations have higher orders
    features: Tuple[str, ...]
    models: Optional[Tuple[int, ...]] = None
    steppings: Optional[Tuple[int, ...]] = None  # None: every stepping of its models
    model_ranges: Tuple[Tuple[int, int], ...] = ()


class ArmRow(NamedTuple):
    """One [[arm]] row: the implementer and part registers that name a core."""

    name: str
    implementer: int
    parts: Tuple[int, ...]
    vendor: str


class MicroarchTable(NamedTuple):
    x86: Tuple[X86Row, ...]
    arm: Tuple[ArmRow, ...]
    arm_vendors: Dict[int, str]  # implementer -> vendor


def _ints(value: object) -> Tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, list) else ()


@functools.lru_cache(maxsize=1)
def microarch_table() -> MicroarchTable:
    """compat/microarch.toml as typed rows (shipped data: tests/test_knowledge_rows.py holds its shape)."""
    data = load_builtin("microarch.toml")
    x86 = tuple(X86Row(name=str(e["name"]), vendor=str(e["vendor"]), family=int(e["family"]), order=int(e["order"]),
                       features=tuple(str(f) for f in e["features"]),
                       models=_ints(e["models"]) if "models" in e else None,
                       steppings=_ints(e["steppings"]) if "steppings" in e else None,
                       model_ranges=tuple((int(lo), int(hi)) for lo, hi in e.get("model_ranges", [])))
                for e in data["x86"])
    arm = tuple(ArmRow(name=str(e["name"]), implementer=int(e["implementer"]), parts=_ints(e["parts"]),
                       vendor=str(e["vendor"])) for e in data["arm"])
    vendors = {int(k, 16): str(v) for k, v in data.get("arm_vendors", {}).items()}
    return MicroarchTable(x86, arm, vendors)


def _model_matches(entry: X86Row, model: Optional[int], stepping: Optional[int]) -> bool:
    if model is None:
        return False
    if entry.models is not None and model in entry.models:
        steppings = entry.steppings
        return steppings is None or (stepping is not None and stepping in steppings)
    for lo, hi in entry.model_ranges:
        if lo <= model <= hi:
            return True
    return False


# x86-64 psABI levels (System V AMD64 psABI, "Micro-architecture levels"), in Linux flag spelling:
# the honest name for a CPU whose family/model the table does not know and no generation fits.
_PSABI_V4 = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_PSABI_V3 = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe")


# The vector extensions that set a CPU's peak and its native dtypes (AVX-512's family, AMX), in Linux flag spelling.
# A hypervisor may report any family/model to its guest but can expose only extensions the hardware has (the guest
# would fault on them otherwise), so flags are a lower bound and a model number is a claim: a model whose row does
# not list a vector extension that a newer generation the flags allow does list is overruled by the flags
# (archspec's rule: a host is the most specific microarchitecture whose features it has; archspec/archspec
# archspec/cpu/detect.py host(), compatible_microarchitectures()).
def _vector(feature: str) -> bool:
    return feature.startswith(("avx512", "amx_"))


class X86Name(NamedTuple):
    """The name of an x86 CPU, how it was named, and (where the flags overruled it) what the model number said."""

    name: str
    how: str  # model | features | none
    by_model: Optional[str] = None  # the family/model's name, when the flags overruled it
    beyond_model: Tuple[str, ...] = ()  # the vector extensions the flags show that the model's row does not list


def name_x86(vendor: Optional[str], family: Optional[int], model: Optional[int],
             stepping: Optional[int], flags: Tuple[str, ...]) -> Tuple[str, str]:
    """(microarchitecture, how it was named): by family/model first, else by features."""
    named = identify_x86(vendor, family, model, stepping, flags)
    return named.name, named.how


# Extensions one maker's CPUs alone have, in Linux flag spelling: a cpuinfo showing one under another maker's vendor
# string contradicts itself (a hypervisor's CPU model, a hand-made tree), and the flag names no generation or
# capability there. AMX is Intel's alone (Intel SDM vol. 1 ch. 18, "Intel Advanced Matrix Extensions"; AMD's APM
# vol. 3 CPUID lists no AMX leaf, Zen 5 included). SSE4a, XOP, FMA4 and TBM are AMD's (AMD APM vol. 3, CPUID
# Fn8000_0001_ECX; Intel's SDM defines none of them); Hygon's parts are AMD's Zen under licence.
_INTEL, _AMD = frozenset({"GenuineIntel"}), frozenset({"AuthenticAMD", "HygonGenuine"})
MAKER_FLAGS: Dict[str, frozenset[str]] = {
    **{flag: _INTEL for flag in ("amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "amx_complex")},
    **{flag: _AMD for flag in ("sse4a", "xop", "fma4", "tbm")},
}


class Contradictions(NamedTuple):
    """What an x86 cpuinfo says against itself: one sentence each, and the flags its vendor cannot have."""

    said: Tuple[str, ...]
    foreign_flags: Tuple[str, ...]


def x86_contradictions(vendor: Optional[str], family: Optional[int], model: Optional[int],
                       stepping: Optional[int], flags: Tuple[str, ...]) -> Contradictions:
    """Flags of another maker than the vendor string says (AMX under AuthenticAMD), and a family/model that is another
    vendor's generation where the vendor has no such family (AuthenticAMD family 6 model 143: Intel's numbering)."""
    if not vendor:
        return Contradictions((), ())
    said: List[str] = []
    foreign = tuple(sorted(f for f in set(flags) if f in MAKER_FLAGS and vendor not in MAKER_FLAGS[f]))
    if foreign:
        makers = sorted(set().union(*(MAKER_FLAGS[f] for f in foreign)))
        said.append(f"its flags {', '.join(foreign)} are {' or '.join(makers)} extensions, and it says it is {vendor}")
    rows = microarch_table().x86
    own = [e for e in rows if e.vendor == vendor]
    if own and family is not None and not any(e.family == family for e in own):
        other = next((e for e in rows if e.vendor != vendor and e.family == family
                      and _model_matches(e, model, stepping)), None)
        if other is not None:
            said.append(f"family {family} model {model} is {other.vendor}'s {other.name}, and it says it is {vendor} "
                        f"(whose families are {', '.join(str(f) for f in sorted({e.family for e in own}))})")
    return Contradictions(tuple(said), foreign)


def identify_x86(vendor: Optional[str], family: Optional[int], model: Optional[int],
                 stepping: Optional[int], flags: Tuple[str, ...]) -> X86Name:
    """The family/model's name where the flags allow nothing newer with more vector extensions, else the flags'.
    Where the cpuinfo contradicts itself (x86_contradictions) flags of another maker count for nothing, and a
    family/model of another vendor's numbering names no generation: only the psABI level the flags show."""
    contradicts = x86_contradictions(vendor, family, model, stepping, flags)
    flags = tuple(f for f in flags if f not in contradicts.foreign_flags)
    entries = [e for e in microarch_table().x86 if e.vendor == vendor]
    if contradicts.said and not any(e.family == family for e in entries):
        return X86Name(*_by_features([], family, flags)[1:])  # whose generation it is, the host does not agree
    by_model = next((e for e in entries if e.family == family and _model_matches(e, model, stepping)), None)
    by_flags = _by_features(entries, family, flags)
    if by_model is None:
        return X86Name(by_flags[1], by_flags[2])
    row = by_flags[0]
    beyond = tuple(f for f in (row.features if row else ()) if _vector(f) and f not in by_model.features)
    if row is not None and row.order > by_model.order and beyond and by_model.features:
        return X86Name(row.name, "features", by_model.name, beyond)
    return X86Name(by_model.name, "model")


def _by_features(entries: List[X86Row], family: Optional[int],
                 flags: Tuple[str, ...]) -> Tuple[Optional[X86Row], str, str]:
    """(the table's row, or None; the name; how): the newest generation whose features are all present."""
    present = set(flags)
    # A family newer than every family the table knows for this vendor (Intel's 18 and 19 followed 6) is a
    # newer CPU than any row: naming it after an older part by its flags would understate it.
    newer_family = bool(entries) and family is not None and family > max(e.family for e in entries)
    fits = [] if newer_family else [e for e in entries if e.features and set(e.features) <= present]
    if fits:
        newest = max(fits, key=lambda e: e.order)
        # Generations with the same flags cannot be told apart: claim only the oldest of them.
        same = [e for e in fits if set(e.features) == set(newest.features)]
        best = min(same, key=lambda e: e.order)
        # Never give an AVX-512 part the name of a generation without it (e.g. 'zen' for a Zen 4).
        if "avx512f" in best.features or "avx512f" not in present:
            return best, best.name, "features"
    if set(_PSABI_V4) <= present:
        return None, "x86_64_v4", "features"
    if fits:
        return best, best.name, "features"
    if set(_PSABI_V3) <= present:
        return None, "x86_64_v3", "features"
    return None, ("x86_64" if "lm" in present else "unknown"), "none"


def name_arm(implementer: Optional[int], part: Optional[int]) -> Tuple[str, Optional[str], str]:
    """(microarchitecture, vendor, how) from the Arm implementer/part registers."""
    table = microarch_table()
    for entry in table.arm:
        if entry.implementer == implementer and part in entry.parts:
            return entry.name, entry.vendor, "model"
    return "aarch64" if implementer is not None else "unknown", table.arm_vendors.get(implementer or -1), "none"


def _with_hypervisor(flags: Tuple[str, ...], guest: Optional[bool]) -> Tuple[str, ...]:
    """CPUPERF_OVERRIDE_HYPERVISOR: this host as a virtual machine (1) or bare metal (0), whatever its flags say.
    The x86 `hypervisor` flag is CPUID.1:ECX[31], set by hypervisors for their guests."""
    if guest is None:
        return flags
    bare = tuple(f for f in flags if f != "hypervisor")
    return (*bare, "hypervisor") if guest else bare


def probe_cpu(src: Sources, blocks: Optional[List[Dict[str, str]]] = None) -> CpuFacts:
    """Identify the CPU from cpuinfo; the ISA list is always what the OS exposes."""
    if blocks is None:
        blocks = parse.parse_cpuinfo(src.read("/proc/cpuinfo") or "")
    arch = parse.cpuinfo_arch(blocks)
    if arch == "unknown" and src.live and not blocks:
        import platform

        arch = platform.machine() or "unknown"
    first = blocks[0] if blocks else {}
    override_isa = src.override_words("isa")

    if arch == "x86_64":
        facts = _x86_facts(src, first, override_isa)
    elif arch == "aarch64":
        facts = _arm_facts(first, override_isa)
    elif arch == "ppc64le":
        facts = _power_facts(blocks)
    else:
        facts = CpuFacts(arch=arch, vendor=first.get("vendor_id"), model_name=first.get("model name"),
                     family=None, model=None, stepping=None, microarchitecture="unknown", isa=(),
                     flags=(), amx_supported=False, amx_usable=False,
                     microarchitecture_source="none")

    override_uarch = src.override_name("microarch")
    if override_uarch:
        facts = replace(facts, microarchitecture=override_uarch, microarchitecture_source="override")
    amx_override = src.override_bool("amx_usable")
    if amx_override is not None and facts.amx_supported:
        facts = replace(facts, amx_usable=amx_override)
    return facts


def _x86_facts(src: Sources, first: Mapping[str, str], override_isa: Optional[Tuple[str, ...]]) -> CpuFacts:
    flags = tuple(first.get("flags", "").split())
    if override_isa is not None:
        flags = override_isa
    flags = _with_hypervisor(flags, src.override_bool("hypervisor"))
    vendor = first.get("vendor_id")
    family = _cpuid_number(first, "cpu family", 1)
    model = _cpuid_number(first, "model", 0)
    stepping = parse.int_auto(first.get("stepping"))
    # An overridden ISA is the statement of what the CPU can do (a container's, a test's host class): the vendor
    # string of the machine it runs on neither names it nor takes flags from it.
    said_vendor = None if override_isa is not None else vendor
    named = identify_x86(said_vendor, family, model, stepping, flags) if said_vendor else \
        identify_x86(_vendor_of(flags, vendor), family, model, stepping, flags)
    # What the CPU can do, from the flags its vendor can have: AMX under AuthenticAMD is no AMX (doctor says why).
    foreign = x86_contradictions(said_vendor, family, model, stepping, flags).foreign_flags if said_vendor else ()
    able = tuple(f for f in flags if f not in foreign)
    isa = tuple(f for f in X86_ISA if f in able)
    amx_supported = "amx_tile" in able
    return CpuFacts(arch="x86_64", vendor=vendor, model_name=first.get("model name"), family=family,
                model=model, stepping=stepping, microarchitecture=named.name, isa=isa, flags=flags,
                amx_supported=amx_supported,
                amx_usable=_amx_usable(src) if amx_supported else False,
                microarchitecture_source=named.how, model_microarchitecture=named.by_model,
                beyond_model=named.beyond_model)


def _cpuid_number(first: Mapping[str, str], key: str, least: int) -> Optional[int]:
    """cpuinfo's `cpu family` (CPUID gives 1 or more; x86-64 parts 6 or more) or `model` (0 or more): a value below
    is refused as input (exit 2, named), never matched against the table (family 0 was named sapphirerapids). Model 0
    stays: it is a real CPUID model (the kernel's table of AMD family 0x1a parts starts at model 0x00)."""
    value = parse.int_auto(first.get(key))
    if value is not None and value < least:
        from cpuperf.errors import UsageError

        raise UsageError(f"proc/cpuinfo: {key} {value} is not a CPUID {key.rsplit(maxsplit=1)[-1]} (at least {least})",
                         hint="record the host again (cpuperf doctor --save-snapshot DIR), or fix that file")
    return value


def _arm_facts(first: Mapping[str, str], override_isa: Optional[Tuple[str, ...]]) -> CpuFacts:
    flags = tuple(first.get("features", "").split())
    if override_isa is not None:
        flags = override_isa
    implementer = parse.int_auto(first.get("cpu implementer"))
    part = parse.int_auto(first.get("cpu part"))
    uarch, vendor, how = name_arm(implementer, part)
    return CpuFacts(arch="aarch64", vendor=vendor, model_name=first.get("model name"), family=None,
                model=part, stepping=parse.int_auto(first.get("cpu variant")),
                microarchitecture=uarch, isa=tuple(f for f in ARM_ISA if f in flags),
                flags=flags, amx_supported=False, amx_usable=False,
                implementer=implementer, part=part, microarchitecture_source=how)


def _power_facts(blocks: List[Dict[str, str]]) -> CpuFacts:
    cpu_line = next((b["cpu"] for b in blocks if "cpu" in b), "")
    generation = cpu_line.split()[0].lower() if cpu_line else "unknown"  # 'POWER9' -> 'power9'
    flags = tuple(w.strip(",").lower() for w in cpu_line.split()[1:])
    gen = parse.int_auto(generation[5:]) if generation.startswith("power") else None
    # cpuinfo names only the generation: VSX is ISA 2.06 (POWER7+), MMA is ISA 3.1 (POWER10+).
    implied = {"vsx": gen is not None and gen >= 7, "mma": gen is not None and gen >= 10}
    return CpuFacts(arch="ppc64le", vendor="IBM", model_name=cpu_line or None, family=None, model=None,
                stepping=None, microarchitecture=generation if generation.startswith("power") else "unknown",
                isa=tuple(f for f in POWER_ISA if f in flags or implied.get(f, False)),
                flags=flags, amx_supported=False, amx_usable=False,
                microarchitecture_source="model" if generation.startswith("power") else "none")


def _amx_usable(src: Sources) -> Optional[bool]:
    """Ask the kernel for AMX tile state in a child process (a refusal must not hurt us)."""
    if not src.live or not sys.platform.startswith("linux"):
        return None
    result = src.run([sys.executable, "-I", "-c", _AMX_PERMISSION_CHECK], timeout=5.0)
    if result is None:
        return None
    if result.returncode == 0:
        return True
    if result.returncode == 3:
        return False
    return None


__all__ = ["probe_cpu", "name_x86", "identify_x86", "X86Name", "name_arm"]


def _vendor_of(flags: Tuple[str, ...], vendor: Optional[str]) -> Optional[str]:
    """The vendor an overridden ISA speaks for: the maker whose own flags it holds (AMX: Intel's), else the host's."""
    makers = [MAKER_FLAGS[f] for f in flags if f in MAKER_FLAGS]
    if not makers or all(vendor in m for m in makers):
        return vendor
    return sorted(makers[0])[0]
