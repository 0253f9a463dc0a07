"""One node of a cluster: its HostFacts plus who it is on the network, and the outcome of probing it.

`main()` runs ON each node, inside the self-contained bundle cpuperf/run/probe_bundle.py builds from
these very modules (standard library only: the node may not have cpuperf, or any package, installed).
It prints one marked line of JSON that `NodeFacts.from_json` reads back on the launching host.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from cpuperf.jsonable import JsonMapping, JsonObject, JsonValue, as_json
from cpuperf.probe.facts import HostFacts
from cpuperf.probe.sources import Sources

SCHEMA = "cpuperf.node/1"
MARKER = "CPUPERF-NODE-JSON:"  # launchers may add lines of their own; the record is the marked one
ERROR_MARKER = "CPUPERF-NODE-ERROR:"

# How a probe of one node ended.
OK, UNRESOLVABLE, UNREACHABLE, TIMEOUT, NO_PYTHON, PROBE_FAILED = (
    "ok", "unresolvable", "unreachable", "timeout", "no-python", "probe-failed")


@dataclass(frozen=True)
class NodeFacts:
    """What a node's own probe saw."""

    name: str  # as the hostfile / Slurm node list names it
    hostname: Optional[str]  # gethostname() on the node
    interfaces: Dict[str, Tuple[str, ...]]  # interface -> the addresses it holds
    master: Optional[str]  # the rendezvous host (the first node)
    master_address: Optional[str]  # what the master's name resolves to ON this node
    self_address: Optional[str]  # what this node's own name resolves to ON this node
    rendezvous_ifname: Optional[str]  # the interface this node reaches the master through
    interpreter: str  # the interpreter the job's ranks will run
    interpreter_found: bool  # False: it is missing here, and another python3 ran the probe
    python: str  # the version of the interpreter that ran the probe
    host: Optional[HostFacts]  # None when cpuperf's probe could not run there (see error)
    error: Optional[str] = None

    @property
    def addresses(self) -> Tuple[str, ...]:
        return tuple(a for addrs in self.interfaces.values() for a in addrs)

    def to_json(self) -> JsonObject:
        return as_json(self)

    @classmethod
    def from_json(cls, data: JsonMapping) -> NodeFacts:
        """A node's record, checked against the schema first (facts_schema.check)."""
        host, interfaces = data.get("host"), data.get("interfaces")
        return cls(name=str(data["name"]), hostname=_opt_str(data.get("hostname")),
                   interfaces={str(k): tuple(str(a) for a in v) for k, v in interfaces.items() if isinstance(v, list)}
                   if isinstance(interfaces, dict) else {},
                   master=_opt_str(data.get("master")), master_address=_opt_str(data.get("master_address")),
                   self_address=_opt_str(data.get("self_address")),
                   rendezvous_ifname=_opt_str(data.get("rendezvous_ifname")),
                   interpreter=str(data.get("interpreter") or ""),
                   interpreter_found=bool(data.get("interpreter_found", True)),
                   python=str(data.get("python") or "?"),
                   host=HostFacts.from_json(host) if isinstance(host, dict) and host else None,
                   error=_opt_str(data.get("error")))


def _opt_str(value: JsonValue) -> Optional[str]:
    """A text field the schema checked (a string or null)."""
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class NodeResult:
    """The outcome of probing one node from the launching host."""

    name: str
    address: Optional[str]  # what the name resolves to on the launching host
    status: str  # ok | unresolvable | unreachable | timeout | no-python | probe-failed
    facts: Optional[NodeFacts]
    error: Optional[str]  # one line: why there are no facts (the launcher's or the probe's last words)
    seconds: float
    transport: str

    def to_json(self) -> JsonObject:
        return as_json(self)

    @classmethod
    def from_json(cls, data: JsonMapping) -> NodeResult:
        """A saved node result, checked against the schema first (check_result)."""
        facts, seconds = data.get("facts"), data.get("seconds")
        return cls(name=str(data["name"]), address=_opt_str(data.get("address")), status=str(data["status"]),
                   facts=NodeFacts.from_json(facts) if isinstance(facts, dict) and facts else None,
                   error=_opt_str(data.get("error")),
                   seconds=float(seconds) if isinstance(seconds, (int, float)) and seconds else 0.0,
                   transport=str(data.get("transport") or "?"))


def read_output(text: str) -> Tuple[Optional[NodeFacts], Optional[str]]:
    """(facts, error) from what a node printed: the marked JSON line, checked field by field as a facts file is
    (another host's output is data), else its marked or last error line."""
    error = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(MARKER):
            from cpuperf.probe.facts_schema import check
            from cpuperf.readback import loads

            try:
                data = loads(line[len(MARKER):])
                check(NodeFacts, data, "node")
                facts = NodeFacts.from_json(data)
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # FactsError, Unreadable
                why = str(exc) if isinstance(exc, ValueError) else type(exc).__name__
                return None, f"unreadable probe output: {why[:200]}"
            return facts, facts.error
        if line.startswith(ERROR_MARKER):
            error = line[len(ERROR_MARKER):].strip()
    return None, error


def _interface_holding(interfaces: Dict[str, Tuple[str, ...]], ip: Optional[str]) -> Optional[str]:
    for name, addrs in interfaces.items():
        if ip is not None and ip in addrs:
            return name
    return None


def probe_node(name: str, master: Optional[str], interpreter: str, interpreter_found: bool,
               src: Optional[Sources] = None, load_window_s: Optional[float] = None) -> NodeFacts:
    """Probe THIS node (run on the node itself)."""
    import platform

    from cpuperf.probe.hosts import resolve_all

    src = src or Sources()
    interfaces = {k: tuple(v) for k, v in (src.interface_addresses() or {}).items()}
    wanted = [n for n in (master, name) if n]
    resolved = resolve_all(wanted) if wanted else {}
    master_address = resolved.get(master) if master else None
    source = src.source_address_for(master_address) if master_address else None
    host, error = None, None
    try:
        from cpuperf.probe import probe_host, with_load

        python = None if not interpreter_found else interpreter
        host = with_load(probe_host(python=python, use_cache=False), load_window_s)
    except Exception as exc:  # the node's facts are partial, never a traceback in doctor's table
        error = f"cpuperf's probe failed on {name}: {type(exc).__name__}: {exc}"
    return NodeFacts(name=name, hostname=src.hostname(), interfaces=interfaces, master=master,
                     master_address=master_address, self_address=resolved.get(name),
                     rendezvous_ifname=_interface_holding(interfaces, source), interpreter=interpreter,
                     interpreter_found=interpreter_found, python=platform.python_version(), host=host,
                     error=error)


def main(argv: Sequence[str]) -> int:
    """`--name N --master M --interpreter P [--interpreter-missing]`: print the marked record."""
    args: Dict[str, str] = {}
    missing = False
    rest: List[str] = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag == "--interpreter-missing":
            missing = True
        elif flag in ("--name", "--master", "--interpreter", "--load-window") and rest:
            args[flag[2:]] = rest.pop(0)
    t0 = time.monotonic()
    window = float(args["load-window"]) if "load-window" in args else None
    facts = probe_node(args.get("name") or "", args.get("master"), args.get("interpreter") or "",
                       not missing, load_window_s=window)
    record = facts.to_json()
    record["seconds"] = round(time.monotonic() - t0, 3)
    print(MARKER + json.dumps(record), flush=True)
    return 0


SAVED_SCHEMA = "cpuperf.cluster-facts/1"


def saved_json(results: Sequence[NodeResult], transport: str) -> JsonObject:
    """The `doctor --save-facts` document: every node's outcome and facts, to plan from later."""
    return {"schema": SAVED_SCHEMA, "transport": transport, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "nodes": [r.to_json() for r in results]}


STATUSES = (OK, UNRESOLVABLE, UNREACHABLE, TIMEOUT, NO_PYTHON, PROBE_FAILED)
MAX_FACTS_BYTES = 16 * 1024 * 1024  # the documented bound on a facts file (docs/commands.md)


def check_result(data: JsonValue, where: str) -> JsonObject:
    """A saved node result against the schema (facts_schema.FactsError naming the field); the record, checked."""
    from cpuperf.probe.facts_schema import FactsError, check
    from cpuperf.probe.hosts import valid_host

    check(NodeResult, data, where)
    if not isinstance(data, dict) or not isinstance(data["name"], str):
        raise FactsError(f"{where} must be an object")  # (check said so)
    facts = data.get("facts")
    if not valid_host(data["name"]):
        raise FactsError(f"{where}.name {data['name'][:60]!r} is not a host name or IP address")
    if data["status"] not in STATUSES:
        raise FactsError(f"{where}.status must be one of {', '.join(STATUSES)}")
    seconds = data.get("seconds", 0)
    if not isinstance(seconds, (int, float)) or not 0 <= seconds <= 1e6:
        raise FactsError(f"{where}.seconds must be in 0..1000000")
    if data["status"] == OK and (not isinstance(facts, dict) or not facts.get("host")):
        raise FactsError(f"{where}: status ok but no host facts")
    return data


def parse_saved(text: Union[str, bytes], origin: str, notes: Optional[List[str]] = None) -> List[NodeResult]:
    """Node results from a saved cluster document or one saved node record. A node whose record does not fit the
    schema (a field of the wrong type or an impossible value) is dropped alone: kept as a probe-failed node where
    its name is readable, with one line in `notes` naming the field; the others are read. A file that is no
    facts file at all (not JSON, a key twice, neither shape) is a UsageError (exit 2)."""
    from cpuperf.errors import UsageError
    from cpuperf.probe.facts_schema import FactsError
    from cpuperf.readback import Unreadable, loads

    hint = "save one with: cpuperf doctor --save-facts PATH (this node) or --hostfile FILE --save-facts DIR/"
    try:
        data: JsonValue = loads(text)
    except Unreadable as exc:
        raise UsageError(f"{origin} is not a cpuperf facts file: it {exc}", hint=hint) from None
    said = notes if notes is not None else []
    if isinstance(data, dict) and data.get("schema") == SAVED_SCHEMA:
        nodes = data.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise UsageError(f"{origin}: nodes must be a non-empty list", hint=hint)
        transport = data.get("transport") if isinstance(data.get("transport"), str) else "?"
        kept = [_one_saved(node, f"nodes[{i}]", origin, str(transport)[:40], said) for i, node in enumerate(nodes)]
        if not any(kept):
            raise UsageError(said[0] if said else f"{origin} holds no readable node", hint=hint)
        return [k for k in kept if k is not None]
    if isinstance(data, dict) and "status" in data and "name" in data:
        try:
            check_result(data, "node")
            return [NodeResult.from_json(data)]
        except (FactsError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise UsageError(f"{origin}: {str(exc)[:300] if isinstance(exc, ValueError) else type(exc).__name__}",
                             hint=hint) from None
    raise UsageError(f"{origin} is not a cpuperf facts file (no {SAVED_SCHEMA} schema)", hint=hint)


def _one_saved(node: JsonValue, where: str, origin: str, transport: str, notes: List[str]) -> Optional[NodeResult]:
    """One node of a saved document; a record that does not fit: a probe-failed node (its name readable) or None,
    and a note."""
    try:
        return NodeResult.from_json(check_result(node, where))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # FactsError is a ValueError
        why = str(exc)[:300] if isinstance(exc, ValueError) else f"{where} {type(exc).__name__}"
    name = node.get("name") if isinstance(node, dict) else None
    from cpuperf.probe.hosts import valid_host

    if isinstance(name, str) and valid_host(name):
        notes.append(f"{origin}: {why}: the saved facts of node {name} are not used (the other nodes' are)")
        return NodeResult(name, None, PROBE_FAILED, None, f"its saved facts do not fit the schema: {why}", 0.0,
                          transport)
    notes.append(f"{origin}: {why}: that record is dropped (the other nodes' are used)")
    return None


def read_saved(path: str, notes: Optional[List[str]] = None) -> List[NodeResult]:
    """Saved node facts from a file (one document or one node) or a directory of per-node files; each read bounded
    and without blocking (a FIFO, a device or a file over 16 MiB is refused, never waited on). In a directory, a
    per-node file that cannot be read or does not fit is dropped alone (`notes` says which and why); a single file
    that cannot be read is a UsageError (exit 2)."""
    import os

    from cpuperf.errors import UsageError
    from cpuperf.fsutil import InputRefused, read_capped

    hint = "give the file or directory cpuperf doctor --save-facts wrote"
    said = notes if notes is not None else []
    try:
        is_dir = os.path.isdir(path)
        files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".json")] if is_dir else [path]
    except OSError as exc:
        raise UsageError(f"cannot read facts directory {path}: {exc.strerror or exc}", hint=hint) from None
    if not files:
        raise UsageError(f"{path} holds no .json facts files", hint="cpuperf doctor --hostfile FILE --save-facts DIR/")
    results: List[NodeResult] = []
    for name in files:
        try:
            data = read_capped(name, MAX_FACTS_BYTES)
            results += parse_saved(data, name, said)
        except (OSError, InputRefused, UsageError) as exc:
            why = (f"cannot read facts file {name}: {exc.strerror or exc}" if isinstance(exc, OSError) else
                   f"facts file {exc}" if isinstance(exc, InputRefused) else exc.message)
            if not is_dir:
                raise UsageError(why, hint=getattr(exc, "hint", None) or hint) from None
            said.append(f"{why}: skipped (the other nodes' files are read)")
            node = os.path.basename(name)[:-len(".json")]
            from cpuperf.probe.hosts import valid_host

            if valid_host(node):
                results.append(NodeResult(node, None, PROBE_FAILED, None, f"its saved facts are unreadable: {why}",
                                          0.0, "?"))
    if not results:
        raise UsageError(said[0] if said else f"{path} holds no readable facts", hint=hint)
    return results
