"""A saved plan: the decisions, placement and runtime environment of one job, with the facts they were made
from, written by `cpuperf recommend --save FILE` and run or rendered as it stands by `train --plan FILE` and
`ccl-env --plan FILE` on every node.

Pure: JSON in, typed records out. What identifies a host here is what the decisions depend on (CPU,
ISA, cores the job may use, NUMA, quota, memory, GPUs) and never its name, so one plan serves every
node of a homogeneous cluster; a node that differs is refused with the first difference named.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from cpuperf.decide.placement import Placement, RankSlot
from cpuperf.decide.records import Decision, Levers, Recommendation, levers_of
from cpuperf.decide.runtime_env import EnvVar
from cpuperf.decide.workload import BLOCKS, Workload
from cpuperf.errors import UsageError
from cpuperf.knowledge.variables import variables
from cpuperf.probe.facts import HostFacts
from cpuperf.versions import is_version, major_minor

SCHEMA = "cpuperf.plan/1"
MAX_BYTES = 4 * 1024 * 1024  # a plan is a few kB; a bigger file is not one
# The packages whose versions the decisions depend on; another version is another plan.
STACK_PACKAGES = ("torch", "intel_extension_for_pytorch", "oneccl_bind_pt", "transformers", "accelerate")
MEMORY_TOLERANCE = 0.98  # nodes of one model differ by what firmware reserves
UNKNOWABLE = ("gpus", "amx_usable")  # None = not probed (a recorded host): not a difference


@dataclass(frozen=True)
class SavedPlan:
    """A plan as saved: what was decided, for which host and stack, from which inputs."""

    cpuperf: str
    host: Dict[str, Any]
    stack: Dict[str, Optional[str]]
    inputs: Dict[str, Any]
    rec: Recommendation
    env: Tuple[EnvVar, ...]
    made_on: Optional[str] = None  # the host name it was made on (information, never compared)
    # Several nodes planned from each node's own facts (recommend --hostfile --node-facts): name -> its plan.
    nodes: Tuple[Tuple[str, SavedPlan], ...] = ()

    def to_json(self) -> Dict[str, Any]:
        data = self._own_json()
        if self.nodes:
            data["nodes"] = {name: sub._own_json() for name, sub in self.nodes}
        return data

    def _own_json(self) -> Dict[str, Any]:
        # made_on: only a plan read from an older file has one; a plan carries no host name (docs/saved-plans.md)
        return {"schema": SCHEMA, "cpuperf": self.cpuperf, **({"made_on": self.made_on} if self.made_on else {}),
                "host": self.host,
                "stack": self.stack, "inputs": self.inputs,
                "decisions": [d.to_json() for d in self.rec.decisions],
                "placement": self.rec.placement.to_json(), "workload": self.rec.workload.to_json(),
                "notes": list(self.rec.notes), "oversubscribe": self.rec.oversubscribe,
                "env": [{"name": e.name, "value": e.value, "reason": e.reason, "kind": e.kind} for e in self.env]}


def host_identity(facts: HostFacts) -> Dict[str, Any]:
    """What the decisions depend on, never the host's name: equal on identical nodes."""
    from cpuperf.probe.parse import format_cpulist

    cpu, topo = facts.cpu, facts.topology
    return {"arch": cpu.arch, "vendor": cpu.vendor, "model_name": cpu.model_name,
            "microarchitecture": cpu.microarchitecture, "isa": sorted(cpu.isa), "bf16_native": cpu.bf16_native,
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


def make(facts: HostFacts, rec: Recommendation, env: Sequence[EnvVar], inputs: Mapping[str, Any], version: str,
         hostname: Optional[str] = None) -> SavedPlan:
    """The plan to save: the rendezvous variables of this launch left out (each launch sets its own)."""
    launch = variables().names(launch=True)  # the rendezvous: this launch's hosts, port and interface
    kept = tuple(e for e in env if e.name not in launch)
    return SavedPlan(version, host_identity(facts), stack_identity(facts), dict(inputs), rec, kept, hostname)


def dumps(plan: SavedPlan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=False, allow_nan=False) + "\n"


# -- reading: a plan is data from elsewhere, checked field by field against this schema ------------------

MAX_COUNT = 1 << 20  # cores, ranks, layers: far above any real value, far below overflow
MAX_BYTES_MEMORY = 1 << 60
_CHOICES = {"unit": ("socket", "numa"), "device": ("auto", "cpu", "cuda")}
_TEXT_MAX = 4096
INPUT_KEYS = ("model", "params", "seq_len", "batch_size", "steps", "nproc_per_node", "nnodes", "unit", "device", "sets",
              "config", "adapt_to_load")


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(kind: Any) -> str:
    return {bool: "true or false", int: "a whole number", str: "a string", list: "a list", dict: "an object",
            float: "a number"}.get(kind, getattr(kind, "__name__", str(kind)))


def _need(data: Mapping[str, Any], key: str, kind: type, where: str, optional: bool = False) -> Any:
    """data[key] of JSON type `kind` (bool is not an int here, an int is a float); ValueError naming the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'plan'} is not an object")
    if key not in data:
        raise ValueError(f"{_where(where, key)} is missing")
    value = data[key]
    if value is None and optional:
        return None
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise ValueError(f"{_where(where, key)} must be {_type_name(kind)}" + (" or null" if optional else ""))
    if kind is str and (len(value) > _TEXT_MAX or not value.isprintable()):
        raise ValueError(f"{_where(where, key)} holds a control character or is over {_TEXT_MAX} characters")
    return value


def _int(data: Mapping[str, Any], key: str, where: str, low: int, high: int, optional: bool = False) -> Any:
    value = _need(data, key, int, where, optional)
    if value is not None and not low <= value <= high:
        raise ValueError(f"{_where(where, key)} must be in {low}..{high}, not {value}")
    return value


def _strings(data: Mapping[str, Any], key: str, where: str, optional: bool = False) -> Any:
    values = _need(data, key, list, where, optional)
    if values is not None:
        for i, _ in enumerate(values):
            _need({f"{key}[{i}]": values[i]}, f"{key}[{i}]", str, where)
    return values


def _exact_keys(data: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    extra = sorted(str(k) for k in data if k not in keys)
    if extra:
        raise ValueError(f"{where}.{extra[0][:40]!r} is not a field of a cpuperf plan")


# Every field host_identity() writes: (JSON type, null allowed, range for numbers).
_HOST_SCHEMA: Dict[str, Tuple[type, bool, Optional[Tuple[int, int]]]] = {
    "arch": (str, False, None), "vendor": (str, True, None), "model_name": (str, True, None),
    "microarchitecture": (str, False, None), "isa": (list, False, None), "bf16_native": (bool, False, None),
    "amx_usable": (bool, True, None), "sockets": (int, False, (1, 4096)), "physical_cores": (int, False, (1, MAX_COUNT)),
    "threads_per_core": (int, False, (1, 64)), "numa_nodes": (int, False, (0, 4096)), "usable_cpus": (str, False, None),
    "cpu_quota": (float, True, (0, MAX_COUNT)), "memory_total_bytes": (int, True, (1, MAX_BYTES_MEMORY)),
    "memory_limit_bytes": (int, True, (1, MAX_BYTES_MEMORY)), "gpus": (list, True, None)}
_HOST_FIELDS = tuple(_HOST_SCHEMA)


def _host(raw: Any) -> Dict[str, Any]:
    """The host identity, complete: every field host_identity() writes, typed and in range."""
    from cpuperf.errors import UsageError
    from cpuperf.probe.parse import parse_cpulist

    _need({"host": raw}, "host", dict, "")
    _exact_keys(raw, _HOST_FIELDS, "host")
    for key, (kind, nullable, bounds) in _HOST_SCHEMA.items():
        if kind is list:
            _strings(raw, key, "host", nullable)
            continue
        value = _need(raw, key, kind, "host", nullable)
        if value is None or bounds is None:
            continue
        if kind is float and value <= 0:  # a CPU quota: a positive share of CPUs
            raise ValueError(f"host.{key} must be positive, not {value}")
        if not bounds[0] <= value <= bounds[1]:
            raise ValueError(f"host.{key} must be in {bounds[0]}..{bounds[1]}, not {value}")
    try:
        cpus = parse_cpulist(raw["usable_cpus"], "host.usable_cpus")
    except UsageError as exc:
        raise ValueError(exc.message) from None
    if not cpus:
        raise ValueError("host.usable_cpus names no CPU")
    return dict(raw)


def _stack(raw: Any) -> Dict[str, Optional[str]]:
    """Python major.minor and every package version the decisions depend on (null: not installed)."""
    _need({"stack": raw}, "stack", dict, "")
    if raw == {"python": None}:  # made from a recorded host without software facts
        return {"python": None}
    _exact_keys(raw, ("python", *STACK_PACKAGES), "stack")
    python = _need(raw, "python", str, "stack")
    if not re.fullmatch(r"3\.[0-9]{1,3}t?", python):  # 't': a free-threaded build
        raise ValueError(f"stack.python must be a Python version like 3.11, not {python[:20]!r}")
    out: Dict[str, Optional[str]] = {"python": python}
    for name in STACK_PACKAGES:
        version = _need(raw, name, str, "stack", True)
        if version is not None and not is_version(version):
            raise ValueError(f"stack.{name} is not a version: {version[:40]!r}")
        out[name] = version
    return out


def _inputs(raw: Any) -> Dict[str, Any]:
    """What the plan was asked for (replan_from decides again from these)."""
    w = "inputs"
    _need({"inputs": raw}, "inputs", dict, "")
    _exact_keys(raw, INPUT_KEYS, w)
    if "model" in raw:
        _need(raw, "model", str, w, True)
    for key in ("params", "seq_len", "batch_size", "steps", "nproc_per_node"):
        if key in raw:
            _int(raw, key, w, 1, 1 << 50, True)
    if "nnodes" in raw:
        _int(raw, "nnodes", w, 1, 65536, True)
    for key, allowed in _CHOICES.items():
        if raw.get(key) is not None and raw.get(key) not in allowed:
            raise ValueError(f"inputs.{key} must be one of {', '.join(allowed)}")
    if "sets" in raw:
        _strings(raw, "sets", w, True)
    if "config" in raw:
        _need(raw, "config", str, w, True)
    if "adapt_to_load" in raw:
        _need(raw, "adapt_to_load", bool, w, True)
    return dict(raw)


def _slot(raw: Any, index: int, usable: FrozenSet[int]) -> RankSlot:
    w = f"placement.slots[{index}]"

    def cpus(key: str, nonempty: bool) -> Tuple[int, ...]:
        values = _need(raw, key, list, w)
        for cpu in values:
            if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu not in usable:
                shown = cpu if isinstance(cpu, int) else repr(cpu)[:20]
                raise ValueError(f"{w}.{key}: CPU {shown} is not one of host.usable_cpus")
        if nonempty and not values:
            raise ValueError(f"{w}.{key} names no CPU")
        return tuple(values)

    if _int(raw, "local_rank", w, 0, MAX_COUNT) != index:
        raise ValueError(f"{w}.local_rank must be {index} (slots are in local-rank order)")
    socket, node = _int(raw, "socket", w, 0, 4096, True), _int(raw, "node", w, 0, 4096, True)
    all_cpus = cpus("cpus", True)
    threads = _int(raw, "threads", w, 1, len(usable))
    return RankSlot(index, socket, node, all_cpus, cpus("compute_cpus", False), cpus("ccl_worker_cpus", False), threads)


def _placement(raw: Any, host: Mapping[str, Any]) -> Placement:
    from cpuperf.probe.parse import parse_cpulist

    w = "placement"
    _need({"placement": raw}, "placement", dict, "")
    usable = frozenset(parse_cpulist(host["usable_cpus"]) or ())
    slots = tuple(_slot(s, i, usable) for i, s in enumerate(_need(raw, "slots", list, w)))
    if not slots:
        raise ValueError("placement has no rank slots")
    nproc = _int(raw, "nproc_per_node", w, 1, len(usable))
    if nproc != len(slots):
        raise ValueError(f"placement.nproc_per_node is {nproc} but placement.slots has {len(slots)}")
    unit = _need(raw, "unit", str, w) if "unit" in raw else "cores"
    reasons = _strings(raw, "reasons", w, True) or ()
    workers = _int(raw, "ccl_workers", w, 0, len(usable), True) if "ccl_workers" in raw else 0
    return Placement(nproc, unit, slots, workers or 0, _int(raw, "cpu_budget", w, 1, MAX_COUNT), tuple(reasons))


def _workload(raw: Any) -> Workload:
    _need({"workload": raw}, "workload", dict, "")
    # The fields a workload's JSON holds (a user script's own batch and optimizer are not in a saved plan).
    fields = [name for name, f in Workload.__dataclass_fields__.items() if f.metadata.get("json", name) is not None]
    # The block's shape came later: a plan written before has none of these keys, and takes the defaults.
    later = {"d_ff", "kv_heads", "block"}
    for key in fields:
        if key in later and key not in raw:
            continue
        if key == "block":
            if _need(raw, key, str, "workload") not in BLOCKS:
                raise ValueError(f"workload.block must be one of {', '.join(BLOCKS)}")
        elif key in ("name", "source"):
            _need(raw, key, str, "workload")
        else:
            _int(raw, key, "workload", 0 if key in later else 1, 1 << 50, key == "steps")
    # why the host chose its built-in model: absent where --model named it; one printable line where present
    why = _need(raw, "why", str, "workload") if "why" in raw else ""
    _exact_keys(raw, (*fields, "why"), "workload")
    return Workload(**{k: raw[k] for k in fields if k in raw}, why=why)


def _decision(raw: Any, index: int) -> Decision[Any]:
    from cpuperf.errors import UsageError
    from cpuperf.knowledge.knobs import BY_ID, coerce

    w = f"decisions[{index}]"
    did = _need(raw, "id", str, w)
    if did not in BY_ID:
        raise ValueError(f"{w}.id: unknown decision {did[:40]!r}")
    value = raw.get("value")
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
            raise ValueError(f"{w} ({did}).value: {exc.message.replace('--set ', '')}") from None
    evidence = _need(raw, "evidence", dict, w, True) if "evidence" in raw else None
    flags = [_need(raw, k, bool, w) if k in raw else False for k in ("overridden", "needs_torch")]
    reason = _need(raw, "reason", str, w) if "reason" in raw else ""
    return Decision(did, value, reason, dict(evidence or {}), flags[0], flags[1])


def _with_memory_levers(decisions: Tuple[Decision[Any], ...]) -> Tuple[Decision[Any], ...]:
    """A plan saved before sharding and offload were decided held neither: it ran without them, said as such."""
    have = {d.id for d in decisions}
    why = "a plan saved before cpuperf decided sharding and offload: it runs without them"
    added = [Decision(i, v, why, {}) for i, v in (("sharding", None), ("offload", False)) if i not in have]
    return decisions + tuple(added) if added else decisions


def levers_from_json(raw: Any) -> Levers:
    """Levers from their decisions' JSON (a saved plan's, a remembered ccl-env decision's): ValueError when not."""
    if not isinstance(raw, (list, tuple)):
        raise ValueError("decisions must be a list")
    decisions = _with_memory_levers(tuple(_decision(d, i) for i, d in enumerate(raw)))
    _check_decision_set(decisions)
    return levers_of(decisions)


def _check_decision_set(decisions: Sequence[Decision[Any]]) -> None:
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


def _env(raw: Any, index: int) -> EnvVar:
    w = f"env[{index}]"
    name = _need(raw, "name", str, w)
    problem = env_name_problem(name)
    if problem:
        raise ValueError(f"{w}.name {name[:40]!r}: {problem}")
    value = _need(raw, "value", str, w)
    problem = env_value_problem(name, value)
    if problem:
        raise ValueError(f"{w} ({name}).value: {problem}")
    kind = _need(raw, "kind", str, w) if "kind" in raw else "set"
    row = variables().row(name)
    prepends = row is not None and row.type == "preload"  # a preload may go before the user's own
    if kind not in ("set", "prepend", "append") or kind != "set" and not prepends:
        raise ValueError(f"{w} ({name}).kind must be 'set'" + (" or 'prepend'" if prepends else ""))
    return EnvVar(name, value, "plan", _need(raw, "reason", str, w) if "reason" in raw else "", kind)


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

    data = read_back(text)
    plan = _from_json(data)
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
    return SavedPlan(plan.cpuperf, plan.host, plan.stack, plan.inputs, plan.rec, plan.env, plan.made_on, tuple(subs))


_TOP = ("schema", "cpuperf", "made_on", "host", "stack", "inputs", "decisions", "placement", "workload", "notes",
        "oversubscribe", "env", "nodes")


def _from_json(data: Any) -> SavedPlan:
    from cpuperf.probe.parse import parse_cpulist

    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {str(data.get('schema'))[:40]!r}, expected {SCHEMA!r}")
    _exact_keys(data, _TOP, "plan")
    host = _host(data.get("host"))
    stack = _stack(data.get("stack"))
    decisions = _with_memory_levers(tuple(_decision(d, i) for i, d in enumerate(_need(data, "decisions", list, ""))))
    _check_decision_set(decisions)
    env = tuple(_env(item, i) for i, item in enumerate(_need(data, "env", list, "")))
    names = [e.name for e in env]
    if len(set(names)) != len(names):
        raise ValueError("env names a variable twice")
    notes = tuple(_strings(data, "notes", "", True) or ())
    oversubscribe = _need(data, "oversubscribe", bool, "") if "oversubscribe" in data else False
    made_on = _need(data, "made_on", str, "", True) if "made_on" in data else None
    rec = Recommendation(levers_of(decisions), _placement(data.get("placement"), host), _workload(data.get("workload")),
                         notes, stack, oversubscribe)
    threads = {slot.threads for slot in rec.placement.slots}
    if len(threads) == 1 and rec.levers.threads_per_rank.value not in threads:
        raise ValueError(f"decision threads_per_rank is {str(rec.levers.threads_per_rank.value)[:40]} but the placement runs "
                         f"{threads.pop()} thread(s) per rank (in 1..{len(parse_cpulist(host['usable_cpus']) or ())})")
    if rec.levers.nproc_per_node.value != rec.placement.nproc_per_node:
        raise ValueError(f"decision nproc_per_node is {rec.levers.nproc_per_node.value} but the placement has "
                         f"{rec.placement.nproc_per_node} rank slot(s)")
    return SavedPlan(_need(data, "cpuperf", str, ""), host, stack, _inputs(data.get("inputs")), rec, env, made_on)


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
        if key in UNKNOWABLE and (now is None or planned is None):
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


def _show(value: Any, none: str = "none") -> str:
    if value is None:
        return none
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(value)


def read_plan_file(path: str) -> SavedPlan:
    """A saved plan (cpuperf.plan.saved.SavedPlan) from FILE: a regular file of bounded size, or one line (exit 2)."""
    import os
    import stat

    from cpuperf.errors import UsageError, from_os_error

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block us
    except OSError as exc:
        if exc.errno in (2, 20):  # ENOENT, ENOTDIR
            raise UsageError(f"plan file {path} does not exist", hint="make one with: cpuperf recommend --save FILE") from None
        raise from_os_error(exc) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"plan file {path} is not a regular file", hint="give the JSON file cpuperf recommend --save wrote")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise UsageError(f"plan file {path} is over {MAX_BYTES // 2**20} MiB: not a cpuperf plan",
                         hint="make one with: cpuperf recommend --save FILE")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"plan file {path} is not UTF-8 text", hint="make one with: cpuperf recommend --save FILE") from None
    return read(path, text)


_DIFFERENCES_SHOWN = 4


def plan_fits(path: str, plan: SavedPlan, facts: HostFacts, replan: bool,
              names: Sequence[str] = ()) -> Tuple[SavedPlan, List[str]]:
    """(the plan for this node, the ways this host differs from it); refused (exit 13) unless `replan` asks to
    plan again. A plan over several nodes gives this node's own part (by its names, else its facts)."""
    from cpuperf.errors import PlanMismatchError
    from cpuperf.probe.hosts import this_node_names

    plan, node = for_this_node(plan, facts, list(names) or (this_node_names() if plan.nodes else []))
    diffs = differences(plan, facts)
    if diffs and node:
        diffs = [f"node {node}: {d}" for d in diffs]
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
        raise PlanMismatchError(f"plan {path} was made for another host or stack: {shown}{more}",
                                hint=f"make a new plan here (cpuperf recommend --save {path}), or pass --replan to plan again "
                                     "from this host's facts")
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
    return None


def fresh_differences(plan: SavedPlan, facts: HostFacts, measurements: Any) -> List[str]:
    """How a saved plan (that fits this host) differs from what cpuperf decides here from the same inputs, with the
    measurements planning reads (never measures): every decision, the placement and the variables."""
    from cpuperf.plan.job import JobRequest, runtime_vars

    fresh = replan_from(plan, facts, measurements, environ={})
    nnodes = max(1, fresh.levers.nnodes.value)  # the rendezvous is this launch's: a placeholder, not compared
    request = JobRequest(auto=True, nnodes=nnodes, master_addr="127.0.0.1" if nnodes > 1 else None)
    env, _ = runtime_vars(facts, fresh, request, environ={})
    return decision_differences(plan, fresh, env)


def replan_from(plan: SavedPlan, facts: HostFacts, measurements: Any, environ: Mapping[str, str]) -> Recommendation:
    """The plan's own inputs decided again on this host's facts (--replan), from the measurements planning reads
    (the caller's: a plan never measures) and the environment the caller hands in (none for a recorded host)."""
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.knowledge.knobs import parse_assignments

    i = plan.inputs
    workload = resolve_workload(i.get("model"), i.get("params"), i.get("seq_len"), i.get("batch_size"), i.get("steps"),
                                host=facts)
    overrides = {d.id: d.value for d in plan.rec.decisions if d.overridden}
    overrides.update(parse_assignments([str(s) for s in i.get("sets") or []]))
    return recommend(facts, workload, RecommendRequest(
        nproc_per_node=i.get("nproc_per_node"), nnodes=int(i.get("nnodes") or 1),
        unit=str(i.get("unit") or "socket"), device=str(i.get("device") or "auto"),
        measurements=measurements, overrides=overrides, environ=environ))
