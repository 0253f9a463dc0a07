"""A saved plan: the decisions, placement and runtime environment of one job, with the facts they were made
from, written by `cpuperf recommend --save FILE` and run or rendered as it stands by `train --plan FILE` and
`ccl-env --plan FILE` on every node.

Pure: JSON in, typed records out. What identifies a host here is what the decisions depend on (CPU,
ISA, cores the job may use, NUMA, quota, memory, GPUs) and never its name, so one plan serves every
node of a homogeneous cluster; a node that differs is refused with the first difference named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.decide.placement import Placement, RankSlot
from cpuperf.decide.records import Decision, Recommendation
from cpuperf.decide.runtime_env import EnvVar
from cpuperf.decide.workload import Workload
from cpuperf.errors import UsageError
from cpuperf.probe.facts import HostFacts

SCHEMA = "cpuperf.plan/1"
MAX_BYTES = 4 * 1024 * 1024  # a plan is a few kB; a bigger file is not one
# Rendezvous variables belong to one launch (its hosts, port, this node's interface), not to the plan.
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")
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
        return {"schema": SCHEMA, "cpuperf": self.cpuperf, "made_on": self.made_on, "host": self.host,
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
    out: Dict[str, Optional[str]] = {"python": ".".join(sw.python.split(".")[:2])}
    for name in STACK_PACKAGES:
        info = sw.packages.get(name)
        out[name] = None if info is None else info.version + (f"+{info.local}" if info.local and "+" not in info.version else "")
    return out


def make(facts: HostFacts, rec: Recommendation, env: Sequence[EnvVar], inputs: Mapping[str, Any], version: str,
         hostname: Optional[str] = None) -> SavedPlan:
    """The plan to save: the rendezvous variables of this launch left out (each launch sets its own)."""
    kept = tuple(e for e in env if e.name not in LAUNCH_VARS)
    return SavedPlan(version, host_identity(facts), stack_identity(facts), dict(inputs), rec, kept, hostname)


def dumps(plan: SavedPlan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=False, allow_nan=False) + "\n"


# -- reading -----------------------------------------------------------------------------------------

def _need(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{where}{key} is missing or not a {kind.__name__}")
    return value


def _slot(raw: Mapping[str, Any]) -> RankSlot:
    def ints(key: str) -> Tuple[int, ...]:
        values = _need(raw, key, list, "placement slot ")
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 20 for v in values):
            raise ValueError(f"placement slot {key} must list CPU numbers")
        return tuple(values)

    threads = _need(raw, "threads", int, "placement slot ")
    if threads < 1:
        raise ValueError("placement slot threads must be at least 1")
    return RankSlot(_need(raw, "local_rank", int, "placement slot "), raw.get("socket"), raw.get("node"),
                    ints("cpus"), ints("compute_cpus"), ints("ccl_worker_cpus"), threads)


def _placement(raw: Mapping[str, Any]) -> Placement:
    slots = tuple(_slot(s) for s in _need(raw, "slots", list, "placement "))
    if not slots:
        raise ValueError("placement has no rank slots")
    return Placement(_need(raw, "nproc_per_node", int, "placement "), str(raw.get("unit", "cores")), slots,
                     int(raw.get("ccl_workers") or 0), _need(raw, "cpu_budget", int, "placement "),
                     tuple(str(r) for r in raw.get("reasons") or ()))


def _workload(raw: Mapping[str, Any]) -> Workload:
    fields = Workload.__dataclass_fields__
    missing = [k for k in fields if k not in raw]
    if missing:
        raise ValueError(f"workload lacks {', '.join(missing)}")
    return Workload(**{k: raw[k] for k in fields})


def _decision(raw: Mapping[str, Any]) -> Decision:
    from cpuperf.knowledge.knobs import BY_ID, coerce

    did = _need(raw, "id", str, "decision ")
    if did not in BY_ID:
        raise ValueError(f"unknown decision {did!r}")
    value = raw.get("value")
    if value is not None:
        value = coerce(did, "true" if value is True else "false" if value is False else str(value))
    return Decision(did, value, str(raw.get("reason", "")), dict(raw.get("evidence") or {}),
                    bool(raw.get("overridden")), bool(raw.get("needs_torch")))


def loads(text: str) -> SavedPlan:
    """A saved plan from its JSON; ValueError naming what is wrong."""
    data = json.loads(text)
    plan = _from_json(data)
    nodes = data.get("nodes") or {}
    if not isinstance(nodes, dict):
        raise ValueError("nodes must map node names to plans")
    subs = tuple((str(name), _from_json(sub)) for name, sub in nodes.items())
    return SavedPlan(plan.cpuperf, plan.host, plan.stack, plan.inputs, plan.rec, plan.env, plan.made_on, subs)


def _from_json(data: Any) -> SavedPlan:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA!r}")
    decisions = tuple(_decision(d) for d in _need(data, "decisions", list, ""))
    ids = [d.id for d in decisions]
    if len(set(ids)) != len(ids):
        raise ValueError("a decision appears twice")
    env = []
    for item in _need(data, "env", list, ""):
        name, value = _need(item, "name", str, "env "), _need(item, "value", str, "env ")
        kind = str(item.get("kind", "set"))
        if kind not in ("set", "prepend", "append"):
            raise ValueError(f"env {name}: kind {kind!r}")
        env.append(EnvVar(name, value, "plan", str(item.get("reason", "")), kind))
    stack = {str(k): (None if v is None else str(v)) for k, v in _need(data, "stack", dict, "").items()}
    rec = Recommendation(decisions, _placement(_need(data, "placement", dict, "")),
                         _workload(_need(data, "workload", dict, "")),
                         tuple(str(n) for n in data.get("notes") or ()), stack, bool(data.get("oversubscribe")))
    return SavedPlan(str(data.get("cpuperf", "?")), _need(data, "host", dict, ""), stack,
                     _need(data, "inputs", dict, ""), rec, tuple(env), data.get("made_on"))


def read(path: str, text: str) -> SavedPlan:
    """loads() with the one-line error a user sees (exit 2: the file is bad input)."""
    try:
        return loads(text)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise UsageError(f"plan file {path} is not a cpuperf plan: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                         hint="make one with: cpuperf recommend --save FILE") from None


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


def _show(value: Any, none: str = "none") -> str:
    if value is None:
        return none
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(value)
