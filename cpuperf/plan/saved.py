"""A saved plan: the decisions, placement and runtime environment of one job, with the facts they were made
from, written by `cpuperf recommend --save FILE` and run or rendered as it stands by `train --plan FILE` and
`ccl-env --plan FILE` on every node.

Pure: JSON in, typed records out. What identifies a host here is what the decisions depend on (CPU,
ISA, cores the job may use, NUMA, quota, memory, GPUs) and never its name, so one plan serves every
node of a homogeneous cluster; a node that differs is refused with the first difference named.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict, Union

from cpuperf.decide.placement import MemoryPolicy, Placement, RankSlot
from cpuperf.decide.records import Decision, Levers, Measurements, Recommendation, levers_of
from cpuperf.decide.runtime_env import EnvVar
from cpuperf.decide.workload import BLOCKS, Workload
from cpuperf.errors import ExitCode, FieldError, UsageError, verbatim
from cpuperf.jsonable import JsonObject, JsonValue
from cpuperf.knowledge.variables import variables
from cpuperf.probe.facts import HostFacts
from cpuperf.versions import is_version, major_minor
from cpuperf.worker_settings import MAX_BATCH, MAX_SEQ_LEN, MAX_STEPS

SCHEMA = "cpuperf.plan/1"
# The packages whose versions the decisions depend on; another version is another plan.
STACK_PACKAGES = ("torch", "intel_extension_for_pytorch", "oneccl_bind_pt", "transformers", "accelerate")
MEMORY_TOLERANCE = 0.98  # nodes of one model differ by what firmware reserves
UNKNOWABLE = ("gpus", "amx_usable")  # None = not probed (a recorded host): not a difference
# Written for the plan's reader, never compared: the owner's answer (knowledge.bf16.bf16_native) from the arch, ISA
# and AMX permission, which are compared. A plan saved before wrote the probe's x86-only flag test here, so the value
# in an older file may differ from the owner's on the same host (Arm BF16; AMX the kernel refuses).
DERIVED = ("bf16_native",)


class HostIdentity(TypedDict):
    """What the decisions depend on, as a plan saves it (host_identity): equal on identical nodes."""

    arch: str
    vendor: Optional[str]
    model_name: Optional[str]
    microarchitecture: str
    isa: List[str]
    bf16_native: bool  # knowledge.bf16.bf16_native at save time (DERIVED: not compared)
    amx_usable: Optional[bool]  # None: not probed (a recorded host)
    sockets: int
    physical_cores: int
    threads_per_core: int
    numa_nodes: int
    usable_cpus: str  # a CPU list, '0-3,8'
    cpu_quota: Optional[float]
    memory_total_bytes: Optional[int]
    memory_limit_bytes: Optional[int]
    gpus: Optional[List[str]]  # None: not probed


@dataclass(frozen=True)
class SavedPlan:
    """A plan as saved: what was decided, for which host and stack, from which inputs."""

    cpuperf: str
    host: HostIdentity
    stack: Dict[str, Optional[str]]
    inputs: PlanInputs
    rec: Recommendation
    env: Tuple[EnvVar, ...]
    made_on: Optional[str] = None  # the host name it was made on (information, never compared)
    # Several nodes planned from each node's own facts (recommend --hostfile --node-facts): name -> its plan.
    nodes: Tuple[Tuple[str, SavedPlan], ...] = ()
    # The memory policy of its one process over several NUMA nodes (train --plan starts it so); None: first touch.
    memory: Optional[MemoryPolicy] = None

    def to_json(self) -> Dict[str, object]:
        data = self._own_json()
        if self.nodes:
            data["nodes"] = {name: sub._own_json() for name, sub in self.nodes}
        return data

    def _own_json(self) -> Dict[str, object]:
        # made_on: only a plan read from an older file has one; a plan carries no host name (docs/saved-plans.md)
        return {"schema": SCHEMA, "cpuperf": self.cpuperf, **({"made_on": self.made_on} if self.made_on else {}),
                "host": self.host,
                "stack": self.stack, "inputs": self.inputs,
                "decisions": [d.to_json() for d in self.rec.decisions],
                "placement": self.rec.placement.to_json(), "workload": self.rec.workload.to_json(),
                "notes": list(self.rec.notes), "oversubscribe": self.rec.oversubscribe,
                **({"memory": {"mode": self.memory.mode, "nodes": list(self.memory.nodes), "reason": self.memory.reason}}
                   if self.memory is not None else {}),
                "env": [{"name": e.name, "value": e.value, "reason": e.reason, "kind": e.kind} for e in self.env]}


def host_identity(facts: HostFacts) -> HostIdentity:
    """What the decisions depend on, never the host's name: equal on identical nodes."""
    from cpuperf.knowledge.bf16 import bf16_native
    from cpuperf.probe.parse import format_cpulist

    cpu, topo = facts.cpu, facts.topology
    return {"arch": cpu.arch, "vendor": cpu.vendor, "model_name": cpu.model_name,  # (in HostIdentity's order)
            "microarchitecture": cpu.microarchitecture, "isa": sorted(cpu.isa), "bf16_native": bf16_native(facts),
            "amx_usable": cpu.amx_usable, "sockets": topo.sockets, "physical_cores": topo.physical_cores,
            "threads_per_core": topo.threads_per_core, "numa_nodes": len(topo.numa_nodes),
            "usable_cpus": format_cpulist(facts.usable_cpus()), "cpu_quota": topo.cpu_quota,
            "memory_total_bytes": facts.memory.total_bytes, "memory_limit_bytes": facts.limits.memory_limit_bytes,
            "gpus": None if facts.gpus is None else [g.name for g in facts.gpus]}


def stack_identity(facts: HostFacts) -> Dict[str, Optional[str]]:
    """Python (major.minor) and the versions of the packages the decisions depend on."""
    sw = facts.software
    if sw is None:
        return {"python": None}
    out: Dict[str, Optional[str]] = {"python": major_minor(sw.python)}
    for name in STACK_PACKAGES:
        info = sw.packages.get(name)
        out[name] = None if info is None else info.version + (f"+{info.local}" if info.local and "+" not in info.version else "")
    return out


def make(facts: HostFacts, rec: Recommendation, env: Sequence[EnvVar], inputs: Mapping[str, object], version: str,
         hostname: Optional[str] = None, memory: Optional[MemoryPolicy] = None) -> SavedPlan:
    """The plan to save: the rendezvous variables of this launch left out (each launch sets its own)."""
    launch = variables().names(launch=True)  # the rendezvous: this launch's hosts, port and interface
    kept = tuple(e for e in env if e.name not in launch)
    return SavedPlan(version, host_identity(facts), stack_identity(facts), plan_inputs(inputs), rec, kept, hostname,
                     memory=memory)


def dumps(plan: SavedPlan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=False, allow_nan=False) + "\n"


# -- reading: a plan is data from elsewhere, checked field by field against this schema ------------------

MAX_COUNT = 1 << 20  # cores, ranks, layers: far above any real value, far below overflow
MAX_BYTES_MEMORY = 1 << 60
_CHOICES = {"unit": ("socket", "numa"), "device": ("auto", "cpu", "cuda")}
_TEXT_MAX = 4096
class PlanInputs(TypedDict, total=False):
    """What a plan was asked for (recommend's options), as saved: each of INPUT_KEYS, None where not given."""

    model: Optional[str]
    params: Union[int, str, None]  # --params as given ('124M'); a whole number in a plan written by hand
    seq_len: Optional[int]
    batch_size: Optional[int]
    steps: Optional[int]
    nproc_per_node: Optional[int]
    nnodes: Optional[int]
    unit: Optional[str]
    device: Optional[str]
    sets: Optional[List[str]]
    config: Optional[str]
    adapt_to_load: Optional[bool]


_COUNTS: Tuple[Literal["seq_len", "batch_size", "steps", "nproc_per_node"], ...] = (
    "seq_len", "batch_size", "steps", "nproc_per_node")
INPUT_KEYS = ("model", "params", "seq_len", "batch_size", "steps", "nproc_per_node", "nnodes", "unit", "device", "sets",
              "config", "adapt_to_load")


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _value(data: JsonValue, key: str, where: str) -> JsonValue:
    """data[key], present (null included); ValueError naming the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'plan'} is not an object")
    if key not in data:
        raise ValueError(f"{_where(where, key)} is missing")
    return data[key]


def _wrong(where: str, key: str, kind: str, optional: bool) -> ValueError:
    return ValueError(f"{_where(where, key)} must be {kind}" + (" or null" if optional else ""))


# Each JSON type read as its Python type (bool is not an int here, an int is a float); `optional`: null was allowed.
def _as_text(value: JsonValue, where: str, key: str, optional: bool = False) -> str:
    if not isinstance(value, str):
        raise _wrong(where, key, "a string", optional)
    if len(value) > _TEXT_MAX or not value.isprintable():
        raise ValueError(f"{_where(where, key)} holds a control character or is over {_TEXT_MAX} characters")
    return value


def _as_whole(value: JsonValue, where: str, key: str, optional: bool = False) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _wrong(where, key, "a whole number", optional)
    return value


def _as_flag(value: JsonValue, where: str, key: str, optional: bool = False) -> bool:
    if not isinstance(value, bool):
        raise _wrong(where, key, "true or false", optional)
    return value


def _as_number(value: JsonValue, where: str, key: str, optional: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise _wrong(where, key, "a number", optional)
    return value


def _as_list(value: JsonValue, where: str, key: str, optional: bool = False) -> List[JsonValue]:
    if not isinstance(value, list):
        raise _wrong(where, key, "a list", optional)
    return value


def _as_object(value: JsonValue, where: str, key: str, optional: bool = False) -> JsonObject:
    if not isinstance(value, dict):
        raise _wrong(where, key, "an object", optional)
    return value


def _text(data: JsonValue, key: str, where: str) -> str:
    return _as_text(_value(data, key, where), where, key)


def _opt_text(data: JsonValue, key: str, where: str) -> Optional[str]:
    value = _value(data, key, where)
    return None if value is None else _as_text(value, where, key, True)


def _flag(data: JsonValue, key: str, where: str) -> bool:
    return _as_flag(_value(data, key, where), where, key)


def _opt_flag(data: JsonValue, key: str, where: str) -> Optional[bool]:
    value = _value(data, key, where)
    return None if value is None else _as_flag(value, where, key, True)


def _list(data: JsonValue, key: str, where: str) -> List[JsonValue]:
    return _as_list(_value(data, key, where), where, key)


def _in_range(value: float, where: str, key: str, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{_where(where, key)} must be in {low}..{high}, not {value}")


def _int(data: JsonValue, key: str, where: str, low: int, high: int) -> int:
    value = _as_whole(_value(data, key, where), where, key)
    _in_range(value, where, key, low, high)
    return value


def _opt_int(data: JsonValue, key: str, where: str, low: int, high: int) -> Optional[int]:
    value = _value(data, key, where)
    if value is None:
        return None
    whole = _as_whole(value, where, key, True)
    _in_range(whole, where, key, low, high)
    return whole


def _as_strings(value: JsonValue, where: str, key: str, optional: bool = False) -> List[str]:
    return [_as_text(item, where, f"{key}[{i}]") for i, item in enumerate(_as_list(value, where, key, optional))]


def _opt_strings(data: JsonValue, key: str, where: str) -> Optional[List[str]]:
    value = _value(data, key, where)
    return None if value is None else _as_strings(value, where, key, True)


def _exact_keys(data: JsonObject, keys: Sequence[str], where: str) -> None:
    extra = sorted(str(k) for k in data if k not in keys)
    if extra:
        raise ValueError(f"{where}.{extra[0][:40]!r} is not a field of a cpuperf plan")


_HOST_FIELDS = tuple(HostIdentity.__annotations__)


def _host(raw: JsonValue) -> HostIdentity:
    """The host identity, complete: every field host_identity() writes, typed and in range (in the order written)."""
    from cpuperf.errors import UsageError
    from cpuperf.probe.parse import parse_cpulist

    w = "host"
    data = _as_object(raw, "", w)
    _exact_keys(data, _HOST_FIELDS, w)
    host = HostIdentity(
        arch=_text(data, "arch", w), vendor=_opt_text(data, "vendor", w), model_name=_opt_text(data, "model_name", w),
        microarchitecture=_text(data, "microarchitecture", w), isa=_as_strings(_value(data, "isa", w), w, "isa"),
        bf16_native=_flag(data, "bf16_native", w), amx_usable=_opt_flag(data, "amx_usable", w),
        sockets=_int(data, "sockets", w, 1, 4096), physical_cores=_int(data, "physical_cores", w, 1, MAX_COUNT),
        threads_per_core=_int(data, "threads_per_core", w, 1, 64), numa_nodes=_int(data, "numa_nodes", w, 0, 4096),
        usable_cpus=_text(data, "usable_cpus", w),
        cpu_quota=_quota(data),
        memory_total_bytes=_opt_int(data, "memory_total_bytes", w, 1, MAX_BYTES_MEMORY),
        memory_limit_bytes=_opt_int(data, "memory_limit_bytes", w, 1, MAX_BYTES_MEMORY),
        gpus=_opt_strings(data, "gpus", w))
    try:
        cpus = parse_cpulist(host["usable_cpus"], "host.usable_cpus")
    except UsageError as exc:
        raise ValueError(exc.message) from None
    if not cpus:
        raise ValueError("host.usable_cpus names no CPU")
    return host


def _quota(data: JsonValue) -> Optional[float]:
    """A CPU quota: a positive share of CPUs, or null."""
    value = _value(data, "cpu_quota", "host")
    if value is None:
        return None
    quota = _as_number(value, "host", "cpu_quota", True)
    if quota <= 0:
        raise ValueError(f"host.cpu_quota must be positive, not {quota}")
    _in_range(quota, "host", "cpu_quota", 0, MAX_COUNT)
    return quota


def _stack(raw: JsonValue) -> Dict[str, Optional[str]]:
    """Python major.minor and every package version the decisions depend on (null: not installed)."""
    data = _as_object(raw, "", "stack")
    if data == {"python": None}:  # made from a recorded host without software facts
        return {"python": None}
    _exact_keys(data, ("python", *STACK_PACKAGES), "stack")
    python = _text(data, "python", "stack")
    if not re.fullmatch(r"3\.[0-9]{1,3}t?", python):  # 't': a free-threaded build
        raise ValueError(f"stack.python must be a Python version like 3.11, not {python[:20]!r}")
    out: Dict[str, Optional[str]] = {"python": python}
    for name in STACK_PACKAGES:
        version = _opt_text(data, name, "stack")
        if version is not None and not is_version(version):
            raise ValueError(f"stack.{name} is not a version: {version[:40]!r}")
        out[name] = version
    return out


def _inputs(raw: JsonValue) -> PlanInputs:
    """What the plan was asked for (replan_from decides again from these), in INPUT_KEYS' order (the order a plan
    is written in), each checked in that order."""
    w = "inputs"
    data = _as_object(raw, "", w)
    _exact_keys(data, INPUT_KEYS, w)
    out = PlanInputs()
    if "model" in data:
        out["model"] = _opt_text(data, "model", w)
    if "params" in data:
        out["params"] = _params(data, w)
    for key in _COUNTS:
        if key in data:
            out[key] = _opt_int(data, key, w, 1, 1 << 50)
    if "nnodes" in data:
        out["nnodes"] = _opt_int(data, "nnodes", w, 1, 65536)
    if "unit" in data:
        out["unit"] = _choice(data, "unit")
    if "device" in data:
        out["device"] = _choice(data, "device")
    if "sets" in data:
        out["sets"] = _opt_strings(data, "sets", w)
    if "config" in data:
        out["config"] = _opt_text(data, "config", w)
    if "adapt_to_load" in data:
        out["adapt_to_load"] = _opt_flag(data, "adapt_to_load", w)
    return out


def _params(data: JsonObject, w: str) -> Union[int, str, None]:
    """A parameter count: as --params takes it ('124M', what recommend --save writes), or a whole number."""
    from cpuperf.decide.workload import parse_count

    value = _value(data, "params", w)
    if not isinstance(value, str):
        return _opt_int(data, "params", w, 1, 1 << 50)
    text = _as_text(value, w, "params")
    try:
        parse_count(text)
    except UsageError:
        raise ValueError(f"inputs.params {text[:40]!r} is not a parameter count like 124M") from None
    return text


def _choice(data: JsonObject, key: str) -> Optional[str]:
    value = data.get(key)
    if value is not None and value not in _CHOICES[key]:
        raise ValueError(f"inputs.{key} must be one of {', '.join(_CHOICES[key])}")
    return value if isinstance(value, str) else None


def plan_inputs(given: Mapping[str, object]) -> PlanInputs:
    """What the command was asked, as a plan keeps it: each of INPUT_KEYS, typed (the command's own values)."""
    def text(key: str) -> Optional[str]:
        value = given.get(key)
        return value if isinstance(value, str) else None

    def count(key: str) -> Optional[int]:
        value = given.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    sets, adapt, params = given.get("sets"), given.get("adapt_to_load"), given.get("params")
    out = PlanInputs(model=text("model"), params=params if isinstance(params, str) else count("params"))
    for key in _COUNTS:
        out[key] = count(key)
    out["nnodes"], out["unit"], out["device"] = count("nnodes"), text("unit"), text("device")
    out["sets"] = [str(x) for x in sets] if isinstance(sets, (list, tuple)) else None
    out["config"], out["adapt_to_load"] = text("config"), adapt if isinstance(adapt, bool) else None
    return out


def _slot(raw: JsonValue, index: int, usable: FrozenSet[int]) -> RankSlot:
    w = f"placement.slots[{index}]"

    def cpus(key: str, nonempty: bool) -> Tuple[int, ...]:
        values = _list(raw, key, w)
        out: List[int] = []
        for cpu in values:
            if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu not in usable:
                shown = cpu if isinstance(cpu, int) else repr(cpu)[:20]
                raise ValueError(f"{w}.{key}: CPU {shown} is not one of host.usable_cpus")
            out.append(cpu)
        if nonempty and not out:
            raise ValueError(f"{w}.{key} names no CPU")
        return tuple(out)

    if _int(raw, "local_rank", w, 0, MAX_COUNT) != index:
        raise ValueError(f"{w}.local_rank must be {index} (slots are in local-rank order)")
    socket, node = _opt_int(raw, "socket", w, 0, 4096), _opt_int(raw, "node", w, 0, 4096)
    all_cpus = cpus("cpus", True)
    threads = _int(raw, "threads", w, 1, len(usable))
    return RankSlot(index, socket, node, all_cpus, cpus("compute_cpus", False), cpus("ccl_worker_cpus", False), threads)


def _placement(raw: JsonValue, host: HostIdentity) -> Placement:
    from cpuperf.probe.parse import parse_cpulist

    w = "placement"
    data = _as_object(raw, "", w)
    usable = frozenset(parse_cpulist(host["usable_cpus"]) or ())
    slots = tuple(_slot(s, i, usable) for i, s in enumerate(_list(data, "slots", w)))
    if not slots:
        raise ValueError("placement has no rank slots")
    nproc = _int(data, "nproc_per_node", w, 1, len(usable))
    if nproc != len(slots):
        raise ValueError(f"placement.nproc_per_node is {nproc} but placement.slots has {len(slots)}")
    unit = _text(data, "unit", w) if "unit" in data else "cores"
    reasons = _opt_strings(data, "reasons", w) or ()
    workers = _opt_int(data, "ccl_workers", w, 0, len(usable)) if "ccl_workers" in data else 0
    return Placement(nproc, unit, slots, workers or 0, _int(data, "cpu_budget", w, 1, MAX_COUNT), tuple(reasons))


def _workload(raw: JsonValue) -> Workload:
    w = "workload"
    data = _as_object(raw, "", w)
    # The block's shape came later: a plan written before has none of these keys, and takes the defaults.
    d_ff, kv_heads, block = 0, 0, "gpt2"
    # (in the order of Workload's fields, the order a bad one is named in; a user script's own batch and optimizer
    # are not in a saved plan)
    workload = Workload(
        name=_text(data, "name", w), n_layer=_int(data, "n_layer", w, 1, 1 << 50),
        d_model=_int(data, "d_model", w, 1, 1 << 50), n_head=_int(data, "n_head", w, 1, 1 << 50),
        seq_len=_int(data, "seq_len", w, 1, MAX_SEQ_LEN), vocab=_int(data, "vocab", w, 1, 1 << 50),
        batch_size=_int(data, "batch_size", w, 1, MAX_BATCH),
        steps=_opt_int(data, "steps", w, 1, MAX_STEPS),  # sizes: the one table of bounds (worker_settings), as every door
        params=_int(data, "params", w, 1, 1 << 50), source=_text(data, "source", w),
        d_ff=_int(data, "d_ff", w, 0, 1 << 50) if "d_ff" in data else d_ff,
        kv_heads=_int(data, "kv_heads", w, 0, 1 << 50) if "kv_heads" in data else kv_heads,
        block=_text(data, "block", w) if "block" in data else block)
    if workload.block not in BLOCKS:
        raise ValueError(f"workload.block must be one of {', '.join(BLOCKS)}")
    # why the host chose its built-in model: absent where --model named it; one printable line where present
    why = _text(data, "why", w) if "why" in data else ""
    _exact_keys(data, (*_WORKLOAD_KEYS, "why"), w)
    return dataclasses.replace(workload, why=why)


# The fields a workload's JSON holds.
_WORKLOAD_KEYS = tuple(name for name, f in Workload.__dataclass_fields__.items() if f.metadata.get("json", name) is not None)


def _decision(raw: JsonValue, index: int) -> Decision[object]:
    from cpuperf.errors import UsageError
    from cpuperf.knowledge.knobs import BY_ID, coerce

    w = f"decisions[{index}]"
    did = _text(raw, "id", w)
    data = _as_object(raw, "", w)
    if did not in BY_ID:
        raise ValueError(f"{w}.id: unknown decision {did[:40]!r}")
    value: object = data.get("value")
    if value is not None:
        if not isinstance(value, (str, int, float, bool)) or isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{w} ({did}).value must be a string, number or true/false")
        kind = BY_ID[did].kind  # typed as the docs say: true/false is no string, a count no text
        if kind == "bool" and not isinstance(value, bool) or kind == "int" and (
                not isinstance(value, int) or isinstance(value, bool)) or kind == "choice" and not isinstance(value, str):
            need = {"bool": "true or false", "int": "a whole number"}.get(kind, "one of its choices as a string")
            raise ValueError(f"{w} ({did}).value must be {need}, not {json.dumps(value)[:40]}")
        try:
            value = coerce(did, "true" if value is True else "false" if value is False else str(value))
        except UsageError as exc:
            raise ValueError(f"{w} ({did}).value: {exc.message}") from None
    given = _value(data, "evidence", w) if "evidence" in data else None
    evidence = None if given is None else _as_object(given, w, "evidence", True)
    flags = [_flag(data, k, w) if k in data else False for k in ("overridden", "needs_torch")]
    reason = _text(data, "reason", w) if "reason" in data else ""
    return Decision(did, value, reason, dict(evidence or {}), flags[0], flags[1])


def _with_memory_levers(decisions: Tuple[Decision[object], ...]) -> Tuple[Decision[object], ...]:
    """A plan saved before sharding and offload were decided held neither: it ran without them, said as such."""
    have = {d.id for d in decisions}
    why = "a plan saved before cpuperf decided sharding and offload: it runs without them"
    added: List[Decision[object]] = [Decision(i, v, why, {}) for i, v in (("sharding", None), ("offload", False))
                                      if i not in have]
    from cpuperf.knowledge.knobs import RULED_IDS  # a lever of the generic path added since: the plan ran without it

    added += [Decision(i, None, f"a plan saved before cpuperf decided {i}: it runs without it", {})
              for i in RULED_IDS if i not in have]
    return decisions + tuple(added) if added else decisions


def levers_from_json(raw: object) -> Levers:
    """Levers from their decisions' JSON (a saved plan's, a remembered ccl-env decision's): ValueError when not."""
    if not isinstance(raw, (list, tuple)):
        raise ValueError("decisions must be a list")
    decisions = _with_memory_levers(tuple(_decision(d, i) for i, d in enumerate(raw)))
    _check_decision_set(decisions)
    return levers_of(decisions)


def _check_decision_set(decisions: Sequence[Decision[object]]) -> None:
    """Every decision recommend makes, once each, and nothing else (a run reads each one)."""
    from cpuperf.knowledge.knobs import BY_ID

    ids = [d.id for d in decisions]
    if len(set(ids)) != len(ids):
        raise ValueError("a decision appears twice")
    decided = [k for k, knob in BY_ID.items() if getattr(knob, "decided", False)]
    extra = next((i for i in ids if i not in decided), None)
    if extra is not None:
        raise ValueError(f"decisions: {extra!r} is a setting, not a decision a plan holds")
    missing = [k for k in decided if k not in ids]
    if missing:
        raise ValueError(f"decisions lack {', '.join(missing)}")


def _env(raw: JsonValue, index: int) -> EnvVar:
    w = f"env[{index}]"
    name = _text(raw, "name", w)
    problem = env_name_problem(name)
    if problem:
        raise ValueError(f"{w}.name {name[:40]!r}: {problem}")
    value = _text(raw, "value", w)
    data = _as_object(raw, "", w)
    problem = env_value_problem(name, value)
    if problem:
        raise ValueError(f"{w} ({name}).value: {problem}")
    kind = _text(data, "kind", w) if "kind" in data else "set"
    row = variables().row(name)
    prepends = row is not None and row.type == "preload"  # a preload may go before the user's own
    if kind not in ("set", "prepend", "append") or kind != "set" and not prepends:
        raise ValueError(f"{w} ({name}).kind must be 'set'" + (" or 'prepend'" if prepends else ""))
    return EnvVar(name, value, "plan", _text(data, "reason", w) if "reason" in data else "", kind)


def env_name_problem(name: str) -> Optional[str]:
    """Why a plan may not carry variable `name` (None: it may): a row of the one table of variables a plan may set,
    or a name of a family it may set that names no file (compat/variables.toml), matched whole."""
    from cpuperf.decide import runtime_env as envplan

    if not envplan.NAME_RE.fullmatch(name):
        return "not a variable name"
    table = variables()
    row = table.row(name)
    if row is not None and row.launch:
        return "belongs to each launch (its hosts and port), never to a plan"
    if row is not None and not row.plan:
        if row.writes_files or row.loads_code:
            return f"{'names or writes a file' if row.writes_files else 'loads code'} ({row.reason}); a plan never sets it"
        return f"not a variable cpuperf plans ({row.reason})"
    if row is not None:
        return None
    family = table.family(name)
    if family is None or not family.plan or not envplan.valid_name(name):
        return "not a variable cpuperf plans (a plan carries only " + ", ".join(p + "*" for p in table.prefixes(plan=True)) \
            + " and " + ", ".join(table.names(plan=True, launch=False, type=("preload", "malloc_conf"))) + ")"
    if any(part in name for part in table.refused_parts):
        return "names or writes a file, or loads code; a plan never sets it"
    return None


_PRELOAD_ENTRY = re.compile(r"/[A-Za-z0-9_.+/-]{1,4095}\.so(\.[0-9]+)*")
_FAMILY_VALUE = re.compile(r"[A-Za-z0-9_.,:+=@%\[\]-]{0,1024}")  # tuning text: no '/', so no file is named


def env_value_problem(name: str, value: str) -> Optional[str]:
    """Why a plan's `value` for `name` cannot be used (None: it can): typed per variable (compat/variables.toml)."""
    from cpuperf.decide import runtime_env as envplan
    from cpuperf.knowledge.variables import file_option

    row = variables().row(name)
    if row is not None and row.type == "preload":
        bad = next((e for e in value.split(":") if not _PRELOAD_ENTRY.fullmatch(e) or "/../" in e), None)
        return None if bad is None else f"{bad[:60]!r} is not an absolute path of a shared library"
    option = file_option(row, value) if row is not None else None
    if row is not None and option is not None:
        return f"its option {option[:40]} makes {row.runtime} write files; a plan never sets it"
    unsafe = envplan.shell_safe(value)
    if unsafe is not None:
        return unsafe
    typed = envplan.user_value_problem(name, value)
    if typed is not None:
        return typed
    if not _FAMILY_VALUE.fullmatch(value):
        return "not a value this setting takes (letters, digits and _.,:+=@%[]- only)"
    return None


def loads(text: str) -> SavedPlan:
    """A saved plan from its JSON; ValueError naming what is wrong (a key given twice included: which one counts
    would be a parser's guess)."""
    from cpuperf.readback import loads as read_back

    data: JsonValue = read_back(text)
    plan = _from_json(data)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")  # (_from_json said so)
    nodes = data.get("nodes", {})
    if not isinstance(nodes, dict) or "nodes" in data and not nodes:
        raise ValueError("nodes must map node names to their plans (absent for a plan of one node)")
    if nodes:
        from cpuperf.probe.hosts import valid_host  # (imports the resolver: only for plans over several nodes)

        bad = next((name for name in nodes if not valid_host(name)), None)
    else:
        bad = None
    if bad is not None:
        raise ValueError(f"nodes: {bad[:60]!r} is not a host name or IP address")
    subs = []
    for name, sub in nodes.items():
        try:
            subs.append((name, _from_json(sub)))
        except ValueError as exc:
            raise ValueError(f"nodes.{name}: {exc}") from None
    return SavedPlan(plan.cpuperf, plan.host, plan.stack, plan.inputs, plan.rec, plan.env, plan.made_on, tuple(subs),
                     plan.memory)


_TOP = ("schema", "cpuperf", "made_on", "host", "stack", "inputs", "decisions", "placement", "workload", "notes",
        "oversubscribe", "memory", "env", "nodes")


def _memory(data: JsonObject, placement: Placement) -> Optional[MemoryPolicy]:
    """The memory policy of the plan's one process over several NUMA nodes (absent: first touch, and in a plan
    saved before cpuperf planned one): a mode of --set numa_memory, two or more distinct nodes, one rank."""
    from cpuperf.knowledge.knobs import BY_ID

    if "memory" not in data:
        return None
    w = "memory"
    raw = _as_object(data["memory"], "", w)
    _exact_keys(raw, ("mode", "nodes", "reason"), w)
    modes = [str(c) for c in BY_ID["numa_memory"].choices if c is not None]
    mode = _text(raw, "mode", w)
    if mode not in modes:
        raise ValueError(f"memory.mode must be {' or '.join(modes)}")
    nodes = [_as_whole(n, w, f"nodes[{i}]") for i, n in enumerate(_list(raw, "nodes", w))]
    if len(set(nodes)) != len(nodes) or len(nodes) < 2 or not all(0 <= n <= 4095 for n in nodes):
        raise ValueError("memory.nodes must name two or more distinct NUMA nodes (0..4095)")
    if placement.nproc_per_node != 1:
        raise ValueError(f"memory is the policy of one process over several NUMA nodes, but the placement has "
                         f"{placement.nproc_per_node} ranks per node")
    return MemoryPolicy(mode, tuple(sorted(nodes)), _text(raw, "reason", w) if "reason" in raw else "")


def _from_json(data: JsonValue) -> SavedPlan:
    from cpuperf.probe.parse import parse_cpulist

    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {str(data.get('schema'))[:40]!r}, expected {SCHEMA!r}")
    _exact_keys(data, _TOP, "plan")
    host = _host(data.get("host"))
    stack = _stack(data.get("stack"))
    decisions = _with_memory_levers(tuple(_decision(d, i) for i, d in enumerate(_list(data, "decisions", ""))))
    _check_decision_set(decisions)
    env = tuple(_env(item, i) for i, item in enumerate(_list(data, "env", "")))
    names = [e.name for e in env]
    if len(set(names)) != len(names):
        raise ValueError("env names a variable twice")
    notes = tuple(_opt_strings(data, "notes", "") or ())
    oversubscribe = _flag(data, "oversubscribe", "") if "oversubscribe" in data else False
    made_on = _opt_text(data, "made_on", "") if "made_on" in data else None
    rec = Recommendation(levers_of(decisions), _placement(data.get("placement"), host), _workload(data.get("workload")),
                         notes, stack, oversubscribe)
    threads = {slot.threads for slot in rec.placement.slots}
    if len(threads) == 1 and rec.levers.threads_per_rank.value not in threads:
        raise ValueError(f"decision threads_per_rank is {str(rec.levers.threads_per_rank.value)[:40]} but the placement runs "
                         f"{threads.pop()} thread(s) per rank (in 1..{len(parse_cpulist(host['usable_cpus']) or ())})")
    if rec.levers.nproc_per_node.value != rec.placement.nproc_per_node:
        raise ValueError(f"decision nproc_per_node is {rec.levers.nproc_per_node.value} but the placement has "
                         f"{rec.placement.nproc_per_node} rank slot(s)")
    return SavedPlan(_text(data, "cpuperf", ""), host, stack, _inputs(data.get("inputs")), rec, env, made_on,
                     memory=_memory(data, rec.placement))


def read(path: str, text: str) -> SavedPlan:
    """loads() with the one-line error a user sees (exit 2: the file is bad input)."""
    try:
        return loads(text)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise UsageError(f"plan file {path} is not a cpuperf plan: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                         hint="make one with: cpuperf recommend --save FILE") from None


def foreign_preloads(plan: SavedPlan, facts: HostFacts) -> List[str]:
    """The plan's LD_PRELOAD entries that are not an allocator or OpenMP runtime the probe found here (all of
    them where the software was not probed): a plan preloads only what cpuperf itself would."""
    import os

    sw = facts.software
    found = set() if sw is None else {p for paths in (*sw.allocators.values(), *sw.openmp.values()) for p in paths}
    found |= {os.path.realpath(p) for p in found}
    entries = [e for v in plan.env if v.name == "LD_PRELOAD" for e in v.value.split(":") if e]
    return [e for e in entries if e not in found]


def without_missing_allocator(plan: SavedPlan, facts: HostFacts) -> SavedPlan:
    """The plan without its allocator preload where this host has no library of the allocator it decided (a plan
    from a node with libjemalloc2 on one without): the job runs with the default allocator, never another one, and
    the lever report says why and how to add it (cpuperf.decide.allocator.missing_here). Any other entry stays, for
    foreign_preloads to judge."""
    from cpuperf.decide.allocator import is_library_of, preloadable

    name = plan.rec.levers.allocator.value
    sw = facts.software
    if not name or sw is None or preloadable(sw.allocators.get(name, ())):
        return plan
    env: List[EnvVar] = []
    for var in plan.env:
        if var.name == "LD_PRELOAD":
            kept = [e for e in var.value.split(":") if e and not is_library_of(name, e)]
            if kept:
                env.append(var._replace(value=":".join(kept)))
        elif not (var.name == "MALLOC_CONF" and name == "jemalloc"):
            env.append(var)
    return dataclasses.replace(plan, env=tuple(env))


# -- does it fit this host? --------------------------------------------------------------------------

def for_this_node(plan: SavedPlan, facts: HostFacts, names: Sequence[str]) -> Tuple[SavedPlan, Optional[str]]:
    """(the plan of this node, its name): a plan over several nodes holds one per node, found by this host's
    names (its hostname, the hostfile entry it is), else the node whose facts this host has."""
    if not plan.nodes:
        return plan, None
    by_name = dict(plan.nodes)
    for name in names:
        if name in by_name:
            return by_name[name], name
    for name, sub in plan.nodes:
        if not differences(sub, facts):
            return sub, name
    return plan.nodes[0][1], plan.nodes[0][0]  # then its differences are named against the first node's

def differences(plan: SavedPlan, facts: HostFacts) -> List[str]:
    """Each way this host or its stack differs from the one the plan was made for ('' when none)."""
    out: List[str] = []
    here_host = host_identity(facts)
    for key, planned in plan.host.items():
        now = here_host.get(key)
        if key == "memory_total_bytes" and isinstance(planned, int) and isinstance(now, int):
            if now < planned * MEMORY_TOLERANCE:
                out.append(f"memory: planned for {planned / 2**30:.1f} GiB, this host has {now / 2**30:.1f} GiB")
            continue
        if key in DERIVED or (key in UNKNOWABLE and (now is None or planned is None)):
            continue
        if now != planned:
            out.append(f"{key.replace('_', ' ')}: planned for {_show(planned)}, this host has {_show(now)}")
    here_stack = stack_identity(facts)
    for key, planned in plan.stack.items():
        now = here_stack.get(key)
        if now != planned:
            out.append(f"{key}: planned for {_show(planned, 'not installed')}, this host has {_show(now, 'not installed')}")
    return out


def decision_differences(plan: SavedPlan, fresh: Recommendation, fresh_env: Sequence[EnvVar]) -> List[str]:
    """Each way the plan's decisions, placement and variables differ from what cpuperf decides here from the same
    facts and inputs ([] when none): a hand-edited or stale plan says so before it runs."""
    out: List[str] = []
    for d, now in zip(plan.rec.decisions, fresh.decisions):
        if now.value != d.value:
            out.append(f"{d.id}: the plan says {_show(d.value)}, cpuperf decides {_show(now.value)} here")
    mine = [(s.cpus, s.threads) for s in plan.rec.placement.slots]
    theirs = [(s.cpus, s.threads) for s in fresh.placement.slots]
    if mine != theirs:
        out.append(f"placement: the plan pins {_slots(mine)}, cpuperf would pin {_slots(theirs)}")
    if plan.rec.oversubscribe != fresh.oversubscribe:
        out.append(f"oversubscribe: the plan says {plan.rec.oversubscribe}, cpuperf decides {fresh.oversubscribe}")
    planned = {e.name: e.value for e in plan.env}
    launch = variables().names(launch=True)
    wanted = {e.name: e.value for e in fresh_env if e.name not in launch}
    for name in sorted(set(planned) | set(wanted)):
        if planned.get(name) != wanted.get(name):
            out.append(f"env {name}: the plan sets {_show(planned.get(name), 'nothing')}, "
                       f"cpuperf would set {_show(wanted.get(name), 'nothing')}")
    return out


def _slots(slots: Sequence[Tuple[Tuple[int, ...], int]]) -> str:
    from cpuperf.probe.parse import format_cpulist

    return "; ".join(f"rank {i}: CPUs {format_cpulist(cpus)} x {threads} thread(s)" for i, (cpus, threads) in enumerate(slots))


def _show(value: object, none: str = "none") -> str:
    if value is None:
        return none
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(value)


def read_plan_file(path: str) -> SavedPlan:
    """A saved plan (cpuperf.plan.saved.SavedPlan) from FILE: its text read by the probe (bounded, a regular
    file, or one line, exit 2), parsed here."""
    from cpuperf.probe.plan_file import plan_text

    return read(path, plan_text(path))


_DIFFERENCES_SHOWN = 4


def plan_fits(path: str, plan: SavedPlan, facts: HostFacts, replan: bool,
              names: Sequence[str] = ()) -> Tuple[SavedPlan, List[str]]:
    """(the plan for this node, the ways this host differs from it); refused (exit 13) unless `replan` asks to
    plan again. A plan over several nodes gives this node's own part (by its names, else its facts)."""
    names = list(names)
    if not names and plan.nodes:  # a plan over several nodes (a one-node plan: no resolver imported, no socket)
        from cpuperf.probe.hosts import this_node_names

        names = this_node_names()
    plan, node = for_this_node(plan, facts, names)
    diffs = differences(plan, facts)
    if diffs and node:
        diffs = [f"node {node}: {d}" for d in diffs]
    if not diffs:
        plan = without_missing_allocator(plan, facts)
    foreign = foreign_preloads(plan, facts) if not diffs else []
    if foreign:  # never a library the probe does not know as an allocator or OpenMP runtime here
        raise UsageError(f"plan {path}: env LD_PRELOAD names {foreign[0]}, which is not an allocator or OpenMP runtime "
                         "found in this environment", hint=f"make a new plan here: cpuperf recommend --save {path}")
    refused = host_refusal(plan, facts) if not diffs else None
    if refused:  # run as saved, a value this host cannot honour is refused, as the same --set would be
        raise UsageError(f"plan {path}: {refused}", hint=f"make a new plan here: cpuperf recommend --save {path}")
    if diffs and not replan:
        # Every difference is named (up to a few): "and 1 more" sent users to --replan just to learn what it was.
        shown = "; ".join(diffs[:_DIFFERENCES_SHOWN])
        more = f" (and {len(diffs) - _DIFFERENCES_SHOWN} more)" if len(diffs) > _DIFFERENCES_SHOWN else ""
        raise FieldError("plan", path, f"plan {verbatim(path)} was made for another host or stack: {verbatim(shown + more)}",
                         f"make a new plan here (cpuperf recommend --save {verbatim(path)}), or pass {{opt.replan}} to plan "
                         "again from this host's facts", code=ExitCode.PLAN_MISMATCH)
    return plan, diffs


def host_refusal(plan: SavedPlan, facts: HostFacts) -> Optional[str]:
    """Why a plan that names this host and stack still cannot run here as saved (None: it can): a GPU plan on a
    host without one, IPEX where it is not installed, more dataloader workers (processes) than usable CPUs.
    Ranks, threads and CPUs are held to the host where the placement is read (_slot); batch and accumulation to
    the vocabulary's bounds (knowledge.knobs)."""
    lv = plan.rec.levers
    sw = facts.software
    if lv.device.value == "cuda" and not facts.gpus:
        return "device cuda, and this host has no NVIDIA GPU"
    if lv.ipex.value is True and (sw is None or sw.packages.get("intel_extension_for_pytorch") is None):
        return "ipex true, and IPEX (intel_extension_for_pytorch) is not installed here"
    usable = max(1, len(facts.usable_cpus()))
    workers = lv.dataloader_workers.value
    if isinstance(workers, int) and workers > usable:
        return f"dataloader_workers {workers}: more worker processes than this host's {usable} usable CPU(s)"
    return _memory_refusal(plan, facts)


def _memory_refusal(plan: SavedPlan, facts: HostFacts) -> Optional[str]:
    """Why the plan's memory policy cannot run here as saved: a NUMA node this host lacks, or nodes other than
    those its process's CPUs are on here (interleaved over them, the pages would sit away from its threads)."""
    policy = plan.memory
    if policy is None:
        return None
    here = {n.id for n in facts.topology.numa_nodes}
    lacks = [n for n in policy.nodes if n not in here]
    if lacks:
        return (f"numa_memory {policy.describe()}, and this host has no NUMA node {','.join(map(str, lacks))} "
                f"(it has {','.join(map(str, sorted(here))) or 'none'})")
    node_of = {c.id: c.node for c in facts.topology.cpus}
    theirs = tuple(sorted({n for c in plan.rec.placement.slots[0].cpus if (n := node_of.get(c)) is not None}))
    if theirs != policy.nodes:
        return (f"numa_memory {policy.describe()}, and the plan's CPUs are on NUMA node(s) "
                f"{','.join(map(str, theirs)) or 'unknown'} here")
    return None


def fresh_differences(plan: SavedPlan, facts: HostFacts, measurements: Optional[Measurements]) -> List[str]:
    """How a saved plan (that fits this host) differs from what cpuperf decides here from the same inputs, with the
    measurements planning reads (never measures): every decision, the placement and the variables."""
    from cpuperf.decide.placement import memory_policy
    from cpuperf.plan.job import JobRequest, memory_pins, runtime_vars

    fresh = replan_from(plan, facts, measurements, environ={})
    nnodes = max(1, fresh.levers.nnodes.value)  # the rendezvous is this launch's: a placeholder, not compared
    request = JobRequest(auto=True, nnodes=nnodes, master_addr="127.0.0.1" if nnodes > 1 else None)
    env, _ = runtime_vars(facts, fresh, request, environ={})
    policy, _ = memory_policy(facts, fresh.placement, fresh.levers.on_gpu, True, *memory_pins(fresh, "auto"))
    mine, now = (p.describe() if p is not None else "first touch" for p in (plan.memory, policy))
    memory = [f"numa_memory: the plan says {mine}, cpuperf decides {now} here"] if mine != now else []
    return decision_differences(plan, fresh, env) + memory


def replan_from(plan: SavedPlan, facts: HostFacts, measurements: Optional[Measurements], environ: Mapping[str, str]) -> Recommendation:
    """The plan's own inputs decided again on this host's facts (--replan), from the measurements planning reads
    (the caller's: a plan never measures) and the environment the caller hands in (none for a recorded host)."""
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.knobs import parse_assignments

    i = plan.inputs
    params = i.get("params")
    workload = resolve_workload(i.get("model"), None if params is None else str(params), i.get("seq_len"),
                                i.get("batch_size"), i.get("steps"), host=facts)
    overrides = {d.id: d.value for d in plan.rec.decisions if d.overridden}
    overrides.update(parse_assignments([str(s) for s in i.get("sets") or []]))
    return recommend(facts, workload, RecommendRequest(
        nproc_per_node=i.get("nproc_per_node"), nnodes=int(i.get("nnodes") or 1),
        unit=str(i.get("unit") or "socket"), device=str(i.get("device") or "auto"),
        measurements=measurements, overrides=overrides, environ=environ))
