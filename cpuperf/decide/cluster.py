"""Several nodes: the skews that break or slow a job, and what a plan over all nodes must respect. Pure.

Input: one NodeResult per node (probed live, or read back from `doctor --save-facts`). Output:
findings naming the nodes each concerns, and ClusterConstraints (a dtype every node runs natively,
threads per node from that node's own CPUs, a refusal naming the nodes when the stacks differ).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from cpuperf.decide.placement import cpu_budget, usable_cores
from cpuperf.errors import NodesDifferError
from cpuperf.jsonable import JsonObject, as_json
from cpuperf.knowledge.bf16 import amx_usable, bf16_native
from cpuperf.probe.facts import HostFacts
from cpuperf.probe.node import NO_PYTHON, PROBE_FAILED, TIMEOUT, UNREACHABLE, UNRESOLVABLE, NodeResult
from cpuperf.versions import major_minor

SCHEMA = "cpuperf.cluster-doctor/1"
V = TypeVar("V", bound=Hashable)  # a value nodes report, compared across them

# Packages whose versions must match on every node, and why (a mismatch breaks the job, not its speed).
# torch: DDP's collectives and the c10d store protocol are version-bound; a rank with another torch
# hangs or crashes at the first allreduce. oneCCL bindings: built against one exact torch; mixed
# bindings fail in init_process_group('ccl'). IPEX: its ops and optimizer fusions differ per release.
BREAKING_PACKAGES = ("torch", "oneccl_bind_pt", "torch_ccl", "intel_extension_for_pytorch")
# Mismatches here change results and flags (Trainer arguments, accelerate config), not the wire.
SLOWING_PACKAGES = ("transformers", "accelerate")


@dataclass(frozen=True)
class NodeFinding:
    id: str
    severity: str  # error (breaks the job) | warning (slows it) | info
    message: str
    fix: Optional[str]
    nodes: Tuple[str, ...]  # the nodes it concerns

    def to_json(self) -> JsonObject:
        return as_json(self)


@dataclass(frozen=True)
class ClusterConstraints:
    """What one plan across these nodes must respect."""

    bf16: bool  # True only when every node runs bf16 natively
    dtype_reason: str
    threads_per_node: Dict[str, int]  # each node's own CPU budget (cores, quota, Slurm)
    refusal: Optional[str]  # the stacks differ: one line naming the nodes; None = one stack
    refusal_hint: Optional[str]
    nodes: Tuple[str, ...] = field(default=())

    def require_one_stack(self) -> None:
        """Raise NodesDifferError (its own exit code) when the stacks differ."""
        if self.refusal is not None:
            raise NodesDifferError(self.refusal, hint=self.refusal_hint)

    def to_json(self) -> JsonObject:
        return as_json(self)


def _names(items: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def _split(values: Mapping[str, V]) -> Tuple[V, List[str]]:
    """(the majority value, the nodes that differ from it); a tie goes to the first node's value."""
    counts = Counter(values.values())
    order = list(values.values())
    best = max(counts.values())
    reference = next(v for v in order if counts[v] == best)
    return reference, [n for n, v in values.items() if v != reference]


def _describe(values: Mapping[str, V], show: Callable[[V], str] = str) -> str:
    groups: Dict[V, List[str]] = {}
    for name, value in values.items():
        groups.setdefault(value, []).append(name)
    return "; ".join(f"{show(v)} on {_names(ns, 4)}" for v, ns in groups.items())


def _version(facts: HostFacts, package: str) -> Optional[str]:
    sw = facts.software
    info = sw.packages.get(package) if sw is not None else None
    return info.version if info is not None else None


def _python_minor(facts: HostFacts) -> Optional[str]:
    sw = facts.software
    return major_minor(sw.python) if sw is not None else None


def stack_of(facts: HostFacts) -> Dict[str, Optional[str]]:
    """What must be the same everywhere: Python major.minor and the breaking packages' versions."""
    stack = {"python": _python_minor(facts)}
    stack.update({p: _version(facts, p) for p in BREAKING_PACKAGES})
    return stack


def install_hint(interpreter: str) -> str:
    """The one line for a node the probe cannot run on."""
    return (f"make {interpreter} exist on every node (one shared environment), or install there: "
            f"python3 -m pip install cpuperf && cpuperf install --yes")


# -- failures to reach or probe -----------------------------------------------------------------

_UNREACHED = {
    UNRESOLVABLE: ("node-unresolvable", "does not resolve here", "fix the name in the hostfile, /etc/hosts or DNS"),
    UNREACHABLE: ("node-unreachable", "cannot be reached", "check that the node is up and that the launcher "
                  "reaches it without a password (ssh -o BatchMode=yes NODE true)"),
    TIMEOUT: ("node-timeout", "did not answer in time", "check the node (load, a hung mount), or raise --timeout"),
}


def check_reached(results: Sequence[NodeResult]) -> List[NodeFinding]:
    """One finding per kind of failure, naming every node it hit and its first reason."""
    out: List[NodeFinding] = []
    for status, (fid, what, fix) in _UNREACHED.items():
        hit = [r for r in results if r.status == status]
        if hit:
            first = hit[0]
            out.append(NodeFinding(fid, "error", f"{_names([r.name for r in hit])} {what} ({first.name}: {first.error})",
                                   fix, tuple(r.name for r in hit)))
    interp = results[0].facts.interpreter if results and results[0].facts else "the job's python"
    for status in (NO_PYTHON, PROBE_FAILED):
        hit = [r for r in results if r.status == status]
        if hit:
            first = hit[0]
            names = _names([r.name for r in hit])
            fix = (install_hint(interp) if status == NO_PYTHON else
                   "use Python >= 3.9 on those nodes" if "older than" in (first.error or "") else
                   f"run `cpuperf doctor` on {first.name} for the whole story")
            out.append(NodeFinding("node-probe-failed", "error",
                                   f"cpuperf's probe could not run on {names} ({first.name}: {first.error})",
                                   fix, tuple(r.name for r in hit)))
    missing = [r.facts for r in results if r.facts is not None and not r.facts.interpreter_found]
    if missing:
        out.append(NodeFinding("interpreter-missing", "error",
                               f"the job's interpreter {missing[0].interpreter} is missing on {_names([f.name for f in missing])}: "
                               "its ranks cannot start there (probed with python3 instead)",
                               install_hint(missing[0].interpreter), tuple(f.name for f in missing)))
    return out


# -- stacks ---------------------------------------------------------------------------------------

def check_stacks(hosts: Mapping[str, HostFacts]) -> List[NodeFinding]:
    """Python and package versions that differ between nodes."""
    out: List[NodeFinding] = []
    for key in ("python", *BREAKING_PACKAGES, *SLOWING_PACKAGES):
        if key == "python":
            values = {n: _python_minor(f) for n, f in hosts.items()}
        else:
            values = {n: _version(f, key) for n, f in hosts.items()}
        if len(set(values.values())) <= 1:
            continue
        reference, odd = _split(values)
        shown = _describe(values, lambda v: "not installed" if v is None else str(v))
        label = "Python" if key == "python" else key
        if key == "python":
            fix = f"use one Python {reference} environment on every node (a shared venv), then cpuperf install --yes"
        elif reference is None:
            fix = f"uninstall {key} on {_names(odd)}, or install it everywhere"
        else:
            fix = f"on {_names(odd)}: python -m pip install '{key}=={reference}' (or cpuperf install --yes there)"
        if key in SLOWING_PACKAGES:
            why = "the Trainer's flags and results differ by version"
            out.append(NodeFinding(f"{key}-differs", "warning", f"{label} differs: {shown}; {why}", fix, tuple(odd)))
            continue
        why = {"python": "wheels and pickled state differ by Python; the ranks may not even import the same torch",
               "torch": "DDP hangs or crashes at the first allreduce when torch differs"}.get(
                   key, "ccl/IPEX bindings are built for one torch; mixed ones fail in init_process_group or the first collective")
        out.append(NodeFinding(f"{key}-differs", "error", f"{label} differs: {shown}; {why}", fix, tuple(odd)))
    return out


# -- hardware and limits ----------------------------------------------------------------------

def threads_per_node(hosts: Mapping[str, HostFacts]) -> Dict[str, int]:
    """Each node's CPU budget: its usable physical cores, capped by its cgroup quota and Slurm."""
    return {n: cpu_budget(f, usable_cores(f))[0] for n, f in hosts.items()}


def check_hardware(hosts: Mapping[str, HostFacts]) -> List[NodeFinding]:
    """bf16/AMX on some nodes only, fewer CPUs (cores, quota), less memory, other microarchitectures."""
    out: List[NodeFinding] = []
    native = {n: bf16_native(f) for n, f in hosts.items()}
    if len(set(native.values())) > 1:
        without = [n for n, v in native.items() if not v]
        out.append(NodeFinding("bf16-on-some-nodes", "warning",
                               f"bf16 is native on {_names([n for n, v in native.items() if v])} only: a bf16 job runs "
                               f"emulated, several times slower, on {_names(without)}",
                               "plan from every node (cpuperf keeps fp32), or leave those nodes out of the hostfile",
                               tuple(without)))
    amx = {n: amx_usable(f) for n, f in hosts.items()}
    if len(set(amx.values())) > 1:
        without = [n for n, v in amx.items() if not v]
        refused = [n for n in without if hosts[n].cpu.amx_supported]
        fix = ("on " + _names(refused) + ": boot a kernel >= 5.16 or lift the seccomp rule on arch_prctl"
               if refused else "plan from every node (oneDNN's AMX kernels and fp32_math_mode=bf16 only where all have AMX)")
        out.append(NodeFinding("amx-on-some-nodes", "warning",
                               f"AMX is usable on {_names([n for n, v in amx.items() if v])} only: "
                               f"{_names(without)} will be the stragglers", fix, tuple(without)))
    budget = threads_per_node(hosts)
    most = max(budget.values())
    fewer = [n for n, b in budget.items() if b < most]
    if fewer:
        quota = [n for n in fewer if hosts[n].topology.cpu_quota is not None]
        shown = _describe(budget, lambda b: f"{b} CPU(s)")
        fix = ("give " + _names(fewer) + " the same cores and cgroup quota as the others"
               + (f" (quota on {_names(quota)}: systemctl set-property / the scheduler's --cpus)" if quota else "")
               + ", or leave them out; cpuperf sizes threads per node from each node's own CPUs")
        out.append(NodeFinding("fewer-cpus", "warning",
                               f"CPUs to use differ: {shown}; DDP steps at the slowest rank, so {_names(fewer)} set the pace",
                               fix, tuple(fewer)))
    uarch = {n: f.cpu.microarchitecture for n, f in hosts.items()}
    if len(set(uarch.values())) > 1:
        _, odd = _split(uarch)
        out.append(NodeFinding("microarchitecture-differs", "info", f"CPUs differ: {_describe(uarch)}",
                               "expect the slower CPU to set the pace", tuple(odd)))
    mem = {n: f.memory.total_bytes for n, f in hosts.items() if f.memory.total_bytes}
    if mem and min(mem.values()) < 0.75 * max(mem.values()):
        small = [n for n, m in mem.items() if m < 0.75 * max(mem.values())]
        out.append(NodeFinding("less-memory", "warning",
                               f"memory differs: {_describe(mem, lambda b: f'{b / 2**30:.0f} GiB')}; the batch must fit the smallest",
                               "plan the batch from every node (the smallest memory decides)", tuple(small)))
    return out


def check_mpi(hosts: Mapping[str, HostFacts], transport: str) -> List[NodeFinding]:
    """mpirun needs the same MPI (flavour and version) on every node."""
    if transport != "mpirun":
        return []
    values = {}
    for n, f in hosts.items():
        launcher = next((m for m in (f.software.mpi if f.software else ()) if m.name in ("mpirun", "mpiexec")), None)
        values[n] = f"{launcher.flavour} {launcher.version}" if launcher else "none"
    if len(set(values.values())) <= 1:
        return []
    reference, odd = _split(values)
    return [NodeFinding("mpi-differs", "error", f"MPI differs: {_describe(values)}; mpirun's daemons must match",
                        f"install {reference} on {_names(odd)}", tuple(odd))]


# -- names and the rendezvous -----------------------------------------------------------------

def _loopback(ip: Optional[str]) -> bool:
    try:
        return ip is not None and ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_names(results: Sequence[NodeResult]) -> List[NodeFinding]:
    """A name that resolves (here, or on a node) to an address its node does not hold."""
    out: List[NodeFinding] = []
    probed = [r for r in results if r.facts is not None]
    for r in probed:
        assert r.facts is not None
        if _loopback(r.address) and any(_loopback(a) for a in r.facts.addresses):
            continue  # 127.0.0.0/8 is all this host's own (Linux answers on every address of it)
        if r.address and r.facts.addresses and r.address not in r.facts.addresses:
            out.append(NodeFinding("name-wrong-address", "error",
                                   f"{r.name} resolves to {r.address} here, but that node holds "
                                   f"{', '.join(a for a in r.facts.addresses if not _loopback(a)) or 'no such address'}",
                                   f"fix {r.name}'s entry in /etc/hosts or DNS (or write its address in the hostfile)", (r.name,)))
    if len(results) < 2 or not probed:
        return out
    master = next((r for r in results if r.name == results[0].name and r.facts is not None), None)
    held = set(master.facts.addresses) if master and master.facts else set()
    wrong: Dict[str, str] = {}
    for r in probed:
        assert r.facts is not None
        got = r.facts.master_address
        if r.facts.master is None:
            continue  # recorded without a rendezvous host
        if got is None:
            wrong[r.name] = "nothing"
        elif _loopback(got) or (held and got not in held):
            wrong[r.name] = got
    if wrong:
        where = _describe(wrong)
        out.append(NodeFinding("master-wrong-address", "error",
                               f"the rendezvous host {results[0].name} resolves to {where}, not an address other nodes reach; "
                               "the ranks would wait for it until the timeout",
                               f"map {results[0].name} to its cluster address in /etc/hosts on {_names(list(wrong))} "
                               "(Debian's 127.0.1.1 line is the usual cause)", tuple(wrong)))
    loop = [r.name for r in probed if r.facts and _loopback(r.facts.self_address) and r.name != r.facts.self_address]
    if loop:
        out.append(NodeFinding("own-name-loopback", "warning",
                               f"{_names(loop)} resolve(s) its own name to a loopback address: gloo without "
                               "GLOO_SOCKET_IFNAME binds there and peers cannot connect",
                               "cpuperf train sets GLOO_SOCKET_IFNAME per node; for other launchers set it, or fix /etc/hosts",
                               tuple(loop)))
    no_if = [r.name for r in probed if r.facts and r.facts.rendezvous_ifname is None and r.facts.master_address]
    if no_if:
        out.append(NodeFinding("no-rendezvous-interface", "warning",
                               f"could not tell which interface reaches {results[0].name} on {_names(no_if)}",
                               "set GLOO_SOCKET_IFNAME (and CCL's FI_TCP_IFACE) on those nodes", tuple(no_if)))
    return out


# -- everything ---------------------------------------------------------------------------------

def hosts_of(results: Sequence[NodeResult]) -> Dict[str, HostFacts]:
    """name -> HostFacts of every node that was probed."""
    return {r.name: r.facts.host for r in results if r.facts is not None and r.facts.host is not None}


def diagnose(results: Sequence[NodeResult], transport: str) -> List[NodeFinding]:
    """All cluster findings, errors first."""
    hosts = hosts_of(results)
    findings = check_reached(results) + check_names(results)
    if len(hosts) > 1:
        findings += check_stacks(hosts) + check_hardware(hosts) + check_mpi(hosts, transport)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order.get(f.severity, 9))


def constraints(hosts: Mapping[str, HostFacts]) -> ClusterConstraints:
    """What one plan over these nodes must respect (the lead's recommend/train --hostfile feed on it)."""
    native = {n: bf16_native(f) for n, f in hosts.items()}
    lacking = [n for n, v in native.items() if not v]
    if not lacking:
        bf16, why = True, f"bf16 is native on all {len(native)} node(s)"
    else:
        bf16, why = False, f"fp32: bf16 is not native on {_names(lacking)} (a dtype only if every node runs it natively)"
    refusal = hint = None
    stacks = {n: stack_of(f) for n, f in hosts.items()}
    if len({tuple(sorted(s.items())) for s in stacks.values()}) > 1:
        errors = [f for f in check_stacks(hosts) if f.severity == "error"]
        refusal = "the nodes' stacks differ: " + "; ".join(f.message.split("; ")[0] + f" (odd: {_names(list(f.nodes))})"
                                                          for f in errors)
        hint = errors[0].fix if errors else None
    return ClusterConstraints(bf16=bf16, dtype_reason=why, threads_per_node=threads_per_node(hosts),
                              refusal=refusal, refusal_hint=hint, nodes=tuple(hosts))


def _row(r: NodeResult) -> JsonObject:
    """The per-node summary `doctor --json` and the table show (the full facts ride along)."""
    row: JsonObject = {"name": r.name, "address": r.address, "status": r.status, "error": r.error,
                           "seconds": r.seconds}
    f = r.facts
    h = f.host if f is not None else None
    if f is not None:
        row.update(hostname=f.hostname, python=f.python, interpreter=f.interpreter,
                   interpreter_found=f.interpreter_found, rendezvous_ifname=f.rendezvous_ifname)
    if h is not None:
        sw = h.software
        row.update(
            cpu=h.cpu.model_name, microarchitecture=h.cpu.microarchitecture, isa=list(h.cpu.isa),
            bf16_native=bf16_native(h), amx_usable=amx_usable(h),
            cores=h.topology.physical_cores, cpus=h.topology.logical_cpus, cpu_budget=threads_per_node({r.name: h})[r.name],
            numa_nodes=len(h.topology.numa_nodes), cpu_quota=h.topology.cpu_quota, memory_bytes=h.memory.total_bytes,
            packages={p: _version(h, p) for p in ("torch", "intel_extension_for_pytorch", "oneccl_bind_pt",
                                                  "transformers", "accelerate")},
            mpi=[f"{m.name} {m.flavour or '?'} {m.version or ''}".strip() for m in (sw.mpi if sw else ())
                 if m.name in ("mpirun", "srun")])
        if sw is not None:
            row["python"] = sw.python
    row["facts"] = f.to_json() if f is not None else None
    return row


def report(results: Sequence[NodeResult], findings: Sequence[NodeFinding], transport: str) -> JsonObject:
    """The `doctor --hostfile --json` object: one record per node, then the findings."""
    hosts = hosts_of(results)
    return {"schema": SCHEMA, "transport": transport, "nodes": [_row(r) for r in results],
            "constraints": constraints(hosts).to_json() if hosts else None,
            "findings": [f.to_json() for f in findings]}


# -- collectives -> DDP backend and bucket ---------------------------------------------------------

# A bucket's allreduce costs about latency + bytes / bandwidth; the fixed latency should be at most
# this share of it, else DDP spends its time in per-bucket overhead (fewer, larger buckets win).
LATENCY_SHARE = 0.1


@dataclass(frozen=True)
class DdpChoice:
    backend: str
    bucket_cap_mb: int
    reason: str
    evidence: JsonObject

    def to_json(self) -> JsonObject:
        return as_json(self)


def choose_ddp(measured: Mapping[str, Any], bucket_mb: float = 25.0) -> Optional[DdpChoice]:
    """From an allreduce measurement (run.collectives): the fastest backend at the bucket size, and a
    bucket_cap_mb large enough that per-bucket latency stays under LATENCY_SHARE. None: nothing measured."""
    import math

    rows = {b: m for b, m in (measured.get("backends") or {}).items() if isinstance(m, dict) and m.get("seconds")}
    if not rows:
        return None
    best = min(rows, key=lambda b: rows[b]["seconds"])
    m = rows[best]
    latency_s, rate = m["latency_us"] / 1e6, m["bucket_bytes"] / m["seconds"]
    need_mb = (1 - LATENCY_SHARE) / LATENCY_SHARE * latency_s * rate / 2**20
    bucket = max(int(round(bucket_mb)), int(math.ceil(need_mb)))
    others = ", ".join(f"{b} {rows[b]['algbw_gbps']:g} GB/s" for b in rows if b != best)
    why = (f"{best}: {m['algbw_gbps']:g} GB/s allreduce of {m['bucket_bytes'] / 2**20:g} MiB across "
           f"{measured.get('world', '?')} node(s), {m['latency_us']:g} us per call" + (f" (vs {others})" if others else ""))
    why += (f"; bucket_cap_mb {bucket} keeps that latency under {LATENCY_SHARE:.0%} of a bucket's time"
            if bucket > bucket_mb else f"; bucket_cap_mb {bucket} (DDP's default) already keeps latency under "
            f"{LATENCY_SHARE:.0%}")
    return DdpChoice(best, bucket, why, {"backends": dict(rows), "measured_at": measured.get("measured_at")})
