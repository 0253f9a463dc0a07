"""The environment of a plan, as `ccl-env` renders it: placement, backend and allocator from the decisions
`recommend` and `train` make (decide/), the runtime variables from decide/runtime_env, a saved plan's own
variables as they stand. Pure.

Light at import on purpose: ccl-env runs in every new shell, and its warm path (decisions remembered, or a saved
plan) reaches here without the decision engine; decide_here() loads the engine only when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from cpuperf.decide import runtime_env as envplan
from cpuperf.decide.allocator import keeps_the_default
from cpuperf.decide.placement import Placement, RankSlot
from cpuperf.jsonable import JsonObject, JsonValue
from cpuperf.knowledge.addons import Backend
from cpuperf.knowledge.variables import variables

if TYPE_CHECKING:
    from cpuperf.decide.records import Decision, Measurements, Recommendation
    from cpuperf.probe.facts import HostFacts
    from cpuperf.probe.hosts import Host


class EnvDecisions(NamedTuple):
    """What a shell's environment takes from the plan's decisions."""

    placement: Placement
    backend: Backend  # for one rank: the backend several ranks would use (the env serves either)
    allocator: Optional[str]
    threads: Optional[int]  # each rank's threads: cpuperf.decide.threads.rank_threads, as --auto applies them
    pin: bool = True  # the affinity decision: False leaves the ranks to the OS scheduler (an MPI must not pin either)
    levers: Tuple[JsonObject, ...] = ()  # every lever's decision as JSON (read into Levers only for the --json report)
    allocator_kept: bool = False  # the default allocator kept on purpose (cpuperf.decide.allocator.keeps_the_default)
    # (name, value, reason) of each variable that carries a lever whose knob row says `env` (lever_vars)
    lever_vars: Tuple[Tuple[str, str, str], ...] = ()


def decisions_of(facts: HostFacts, rec: Recommendation) -> EnvDecisions:
    """The environment's decisions from a recommendation (decided here, or a saved plan's)."""
    from cpuperf.decide.backend import cpu_backend, recorded_backend  # not on the path of a remembered decision
    from cpuperf.decide.threads import rank_threads

    decided = rec.levers.ddp_backend
    backend = recorded_backend(decided.value, decided.evidence, decided.reason)
    if backend is None:  # a GPU plan, or one saved before it recorded the CPU backend: the rule, once
        backend = cpu_backend(facts, rec.stack, facts.software.python if facts.software else None)
    return EnvDecisions(rec.placement, backend, rec.levers.allocator.value, rank_threads(rec.levers, True),
                        rec.levers.affinity.value == "auto", tuple(d.to_json() for d in rec.levers.all()),
                        keeps_the_default(rec.levers.allocator),
                        tuple((v.name, v.value, v.reason) for v in lever_vars(rec.decisions, True)))


def lever_vars(decisions: Sequence[Decision[object]], auto: bool) -> List[envplan.EnvVar]:
    """The variables of the levers carried by their variable (knob rows marked `env`): each set in the variables the
    table names for it (compat/variables.toml `lever`), as decided, under --auto or where you set it; none sets
    nothing. The one application of such a lever: train's job, recommend and ccl-env all take it from here."""
    from cpuperf.knowledge.knobs import BY_ID, env_text  # the knob table: not on the path of a remembered decision

    table = variables()
    return [envplan.EnvVar(name, env_text(d.value), "cpuperf", d.reason) for d in decisions
            if BY_ID[d.id].env and d.value is not None and (auto or d.overridden) for name in table.names(lever=d.id)]


def decide_here(facts: HostFacts, nproc_per_node: Optional[int], unit: str, nnodes: int,
                measurements: Optional[Measurements],
                environ: Mapping[str, str]) -> EnvDecisions:
    """The decisions `recommend` makes for this host's CPUs (the default workload): the engine runs here."""
    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.workload import resolve_workload

    rec = recommend(facts, resolve_workload(None, None, None, None, 400, host=facts), RecommendRequest(
        nproc_per_node=nproc_per_node, nnodes=nnodes, unit=unit, device="cpu", measurements=measurements, environ=environ))
    return decisions_of(facts, rec)


def decisions_to_json(decided: EnvDecisions) -> JsonObject:
    """The JSON a remembered decision is kept as (decisions_from_json reads it back)."""
    return {"placement": decided.placement.to_json(), "backend": list(decided.backend[:2]),
            "allocator": decided.allocator, "threads": decided.threads, "pin": decided.pin,
            "levers": list(decided.levers), "allocator_kept": decided.allocator_kept,
            **({"lever_vars": [list(v) for v in decided.lever_vars]} if decided.lever_vars else {})}


def _not(value: JsonValue, kind: str) -> TypeError:
    return TypeError(f"{value!r} is not {kind}")


def _int(value: JsonValue) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _not(value, "int")
    return value


def _maybe_int(value: JsonValue) -> Optional[int]:
    return None if value is None else _int(value)


def _str(value: JsonValue) -> str:
    if not isinstance(value, str):
        raise _not(value, "str")
    return value


def _list(value: JsonValue) -> List[JsonValue]:
    if not isinstance(value, list):
        raise _not(value, "list")
    return value


def _object(value: JsonValue) -> JsonObject:
    if not isinstance(value, dict):
        raise _not(value, "dict")
    return value


def _ints(values: JsonValue) -> Tuple[int, ...]:
    return tuple(_int(v) for v in _list(values))


def decisions_from_json(value: JsonValue) -> EnvDecisions:
    """decisions_to_json's JSON -> EnvDecisions; TypeError/KeyError when it is not that."""
    raw = _object(value)
    p = _object(raw["placement"])
    slots = tuple(RankSlot(_int(s["local_rank"]), _maybe_int(s["socket"]), _maybe_int(s["node"]), _ints(s["cpus"]),
                           _ints(s["compute_cpus"]), _ints(s["ccl_worker_cpus"]), _int(s["threads"]))
                  for s in map(_object, _list(p["slots"])))
    placement = Placement(_int(p["nproc_per_node"]), _str(p["unit"]), slots, _int(p["ccl_workers"]),
                          _int(p["cpu_budget"]), tuple(_str(r) for r in _list(p["reasons"])))
    name, reason = (_str(v) for v in _list(raw["backend"]))
    pin = raw["pin"]
    if not isinstance(pin, bool):
        raise TypeError(f"pin {pin!r} is not true or false")
    allocator, kept = raw["allocator"], raw["allocator_kept"]
    if not isinstance(kept, bool):
        raise TypeError(f"allocator_kept {kept!r} is not true or false")
    return EnvDecisions(placement, Backend(name, reason, name == "ccl"), None if allocator is None else _str(allocator),
                        _maybe_int(raw["threads"]), pin, _levers(raw["levers"]), kept, _lever_vars(raw.get("lever_vars", [])))


def _lever_vars(raw: JsonValue) -> Tuple[Tuple[str, str, str], ...]:
    """The remembered (name, value, reason) of the levers' own variables; TypeError when one is not three strings."""
    out = []
    for item in _list(raw):
        name, value, reason = (_str(v) for v in _list(item))
        out.append((name, value, reason))
    return tuple(out)


def _levers(raw: JsonValue) -> Tuple[JsonObject, ...]:
    """The levers' decisions as JSON, held to what the --json report reads (cpuperf.plan.saved.levers_from_json,
    not imported on this path): every decided knob once by its id, a value its knob takes, a printable reason.
    A remembered entry with a lever twice, without an id, an escape in one or an object as a value was an internal
    error of `ccl-env --json` in every shell, while plain ccl-env kept the entry (ValueError: decided again)."""
    from cpuperf.errors import UsageError
    from cpuperf.knowledge.knobs import BY_ID, coerce

    levers = tuple(_object(d) for d in _list(raw))
    ids = [d.get("id") for d in levers]
    decided = {k for k, knob in BY_ID.items() if knob.decided}
    if len(set(map(str, ids))) != len(ids) or set(ids) != decided:
        raise ValueError("levers: not every decision once by its id")
    for d in levers:
        value, reason, key = d.get("value"), d.get("reason", ""), str(d["id"])
        if value is not None:  # typed as levers_from_json types it: the knob's own coercion, the same type back
            if not isinstance(value, (str, int, float, bool)) or value != value:
                raise ValueError(f"lever {d['id']}: its value is not a string, number or true/false")
            try:
                same = coerce(key, "true" if value is True else "false" if value is False else str(value))
            except UsageError:
                raise ValueError(f"lever {d['id']}: a value its knob does not take") from None
            if same != value or type(same) is not type(value):
                raise ValueError(f"lever {d['id']}: a value its knob does not take")
        if not isinstance(reason, str) or not reason.isprintable() or len(reason) > 4096 or \
                not isinstance(d.get("evidence", {}), dict) or \
                any(not isinstance(d.get(k, False), bool) for k in ("overridden", "needs_torch")):
            raise ValueError(f"lever {d['id']}: its reason, evidence or flags are not a decision's")
    return levers


def with_lever_vars(tuned: Sequence[envplan.EnvVar], levers: Sequence[envplan.EnvVar]) -> List[envplan.EnvVar]:
    """The runtime variables with the levers' own (lever_vars) before this launch's rendezvous variables, where a saved
    plan's variables put them too (with_launch_vars adds those last): the same environment in the same order."""
    launch = variables().names(launch=True)
    at = next((i for i, e in enumerate(tuned) if e.name in launch), len(tuned))
    return [*tuned[:at], *levers, *tuned[at:]]


def with_launch_vars(planned: Sequence[envplan.EnvVar], tuned: Sequence[envplan.EnvVar]) -> List[envplan.EnvVar]:
    """A saved plan's variables as they stand (cpuperf's), plus this launch's rendezvous variables it leaves out."""
    launch = variables().names(launch=True)
    names = {e.name for e in planned}
    return [envplan.EnvVar(e.name, e.value, "cpuperf", e.reason, e.kind) for e in planned] + \
        [e for e in tuned if e.name in launch and e.name not in names]


class EnvRequest(NamedTuple):
    """What ccl-env's options and the probes add to the decisions: the job's nodes and this shell's launch."""

    hosts: Optional[Sequence[Host]]
    nnodes: int
    master_addr: Optional[str]
    master_port: Optional[int]
    preload: bool
    mpi: Optional[str]
    libraries: envplan.Libraries
    socket_ifname: Optional[str]
    slurm_first: Optional[str] = None  # the Slurm allocation's first node: the rendezvous where nothing else names one


def plan_env(facts: HostFacts, decided: EnvDecisions, request: EnvRequest, environ: Mapping[str, str],
             planned: Optional[Sequence[envplan.EnvVar]] = None) -> Tuple[List[envplan.EnvVar], List[str]]:
    """(variables, notes) of the plan's environment: decide/runtime_env's for these decisions, or a saved plan's
    own variables (its preloads only with --preload: they affect every later command of the shell)."""
    tuned = envplan.runtime_env(facts, decided.placement, envplan.RuntimeEnvRequest(
        backend=decided.backend.name, hosts=request.hosts,
        master_addr=request.master_addr, master_port=request.master_port,
        preload=request.preload, allocator=decided.allocator, threads=decided.threads,
        nnodes=request.nnodes,
        mpi=request.mpi, libraries=request.libraries, socket_ifname=request.socket_ifname,
        environ=environ, slurm_first=request.slurm_first, pin=decided.pin, allocator_kept=decided.allocator_kept))
    notes = list(tuned.notes)
    if planned is None:
        return with_lever_vars(tuned.vars, [envplan.EnvVar(n, v, "cpuperf", r) for n, v, r in decided.lever_vars]), notes
    preloads = variables().names(lever="allocator")  # they affect every later command of the shell
    kept = [v for v in planned if request.preload or v.name not in preloads]
    if not request.preload and any(v.name in preloads for v in planned):
        notes.append("the plan preloads an allocator; ccl-env prints LD_PRELOAD only with --preload (it affects "
                     "every later command of the shell)")
    return with_launch_vars(kept, tuned.vars), notes
