"""`cpuperf doctor --hostfile FILE` (or inside a Slurm allocation of several nodes): every node, one table."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Mapping, Optional, Sequence, Tuple

from cpuperf.errors import ExitCode, UsageError
from cpuperf.jsonable import JsonMapping, JsonObject, JsonValue
from cpuperf.output import Output

if TYPE_CHECKING:
    from cpuperf.decide.cluster import NodeFinding
    from cpuperf.probe.node import NodeResult
    from cpuperf.run.nodes import Reach

# Findings that mean "a node could not be reached" (exit 7); any other error breaks the job (exit 14).
UNREACHED_IDS = ("node-unresolvable", "node-unreachable", "node-timeout")


@dataclass(frozen=True)
class ClusterOptions:
    hostfile: Optional[str]
    launcher: Optional[str]
    python: Optional[str]
    timeout: float
    parallel: int
    save_facts: Optional[str]
    facts: Optional[str]
    collectives: bool = False
    bucket_mb: float = 25.0


def node_names(hostfile: Optional[str], environ: Mapping[str, str]) -> List[str]:
    """The hostfile's hosts, else the Slurm allocation's nodes."""
    if hostfile:
        from cpuperf.probe.hosts import read_hostfile

        return [h.name for h in read_hostfile(hostfile)]
    from cpuperf.probe.hosts import check_host
    from cpuperf.probe.slurm import slurm_facts

    return [check_host(n, "Slurm node") for n in slurm_facts(environ).nodes]


def wants_cluster(hostfile: Optional[str], facts: Optional[str], this_node: bool, environ: Mapping[str, str]) -> bool:
    """--hostfile or --facts, or a Slurm allocation of several nodes (unless --this-node)."""
    if hostfile or facts:
        return True
    if this_node:
        return False
    from cpuperf.probe.slurm import slurm_facts

    slurm = slurm_facts(environ)
    return (slurm.allocation or 1) > 1 and bool(slurm.nodes)


def _probe(out: Output, opts: ClusterOptions, names: Sequence[str],
           environ: Mapping[str, str]) -> Tuple[List[NodeResult], str, Optional[JsonObject]]:
    from cpuperf.run.nodes import choose_reach, probe_cluster, this_host_mpi

    mpi = this_host_mpi() if opts.launcher in (None, "mpirun") else None  # this host's, found once
    reach = choose_reach(opts.launcher, hostfile=opts.hostfile is not None, python=opts.python, environ=environ,
                         timeout=opts.timeout, mpi=mpi)
    out.info(f"probing {len(names)} node(s) through {reach.transport} ({reach.why}); "
             f"{min(opts.parallel, len(names))} at a time, {opts.timeout:g} s each; the job's interpreter: {reach.interpreter}")
    step = max(1, len(names) // 4)

    def progress(done: int, total: int) -> None:  # a 64-node run says where it is, four times
        if total >= 8 and (done % step == 0 or done == total):
            out.info(f"  {done}/{total} node(s) answered or gave up")

    results = probe_cluster(names, reach, timeout=opts.timeout, parallel=opts.parallel, progress=progress)
    collectives = _collectives(out, opts, results, reach) if opts.collectives else None
    return results, reach.transport, collectives


def _collectives(out: Output, opts: ClusterOptions, results: Sequence[NodeResult], reach: Reach) -> Optional[JsonObject]:
    """Allreduce across the nodes (all of them reached, each with torch), cached for the DDP choice."""
    from cpuperf.decide.cluster import choose_ddp, hosts_of
    from cpuperf.run.collectives import measure, worker_code

    hosts = hosts_of(results)

    def has_torch(name: str) -> bool:
        sw = hosts[name].software if name in hosts else None
        return sw is not None and sw.packages.get("torch") is not None

    missing = [r.name for r in results if not has_torch(r.name)]
    if missing:
        out.warn(f"allreduce not measured: {', '.join(missing[:5])} could not be probed or have no torch")
        return {"skipped": f"not every node can run torch ({', '.join(missing[:5])})"}
    code = worker_code()
    out.info(f"measuring allreduce of {opts.bucket_mb:g} MiB across {len(results)} node(s) with each backend they all have")
    measured = measure(results, lambda host, args: reach.argv(host, code, args), bucket_mb=opts.bucket_mb,
                       timeout=max(120.0, opts.timeout * 2))
    choice = choose_ddp(measured, opts.bucket_mb)
    measured["choice"] = choice.to_json() if choice else None
    return measured


def _save(out: Output, path: str, results: Sequence[NodeResult], transport: str) -> None:
    from cpuperf.errors import from_os_error
    from cpuperf.fsutil import atomic_write_bytes
    from cpuperf.probe.node import saved_json

    try:
        if path.endswith("/") or os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            for r in results:
                atomic_write_bytes(os.path.join(path, f"{r.name}.json"), json.dumps(r.to_json(), indent=1).encode())
            out.info(f"saved the facts of {len(results)} node(s) under {path} (reuse: --facts {path})")
        else:
            atomic_write_bytes(path, json.dumps(saved_json(results, transport), indent=1).encode())
            out.info(f"saved the facts of {len(results)} node(s) to {path} (reuse: --facts {path})")
    except OSError as exc:
        raise from_os_error(exc) from exc


def save_this_node(out: Output, path: str, python: Optional[str]) -> None:
    """`doctor --save-facts F` without nodes: this node's own facts, in the format --facts and --node-facts read."""
    import socket
    import sys
    import time

    from cpuperf.probe.hosts import valid_host
    from cpuperf.probe.node import OK, NodeResult, probe_node

    name = socket.gethostname().split(".")[0]
    if not valid_host(name):
        raise UsageError(f"this host's name {name[:60]!r} is not a host name a hostfile can hold",
                         hint="save the facts with --hostfile FILE naming this node")
    t0 = time.monotonic()
    facts = probe_node(name, None, python or sys.executable, True)
    if facts.host is None:
        raise UsageError(facts.error or "cpuperf's probe failed on this node", hint="cpuperf doctor shows why")
    _save(out, path, [NodeResult(name, None, OK, facts, None, round(time.monotonic() - t0, 3), "local")], "local")


def exit_code(findings: Sequence[NodeFinding]) -> int:
    """7 when a node could not be reached, 14 when a skew breaks the job, else 0."""
    errors = [f for f in findings if f.severity == "error"]
    if any(f.id in UNREACHED_IDS for f in errors):
        return int(ExitCode.UNREACHABLE)
    return int(ExitCode.NODES_DIFFER) if errors else int(ExitCode.OK)


def run(out: Output, opts: ClusterOptions, environ: Optional[Mapping[str, str]] = None) -> int:
    from cpuperf.decide import cluster

    environ = dict(os.environ if environ is None else environ)
    if opts.facts:
        from cpuperf.probe.node import read_saved

        notes: List[str] = []
        results = read_saved(opts.facts, notes)
        for note in notes:  # a node whose saved record does not fit is shown as probe-failed, the others as saved
            out.warn(note)
        transport, collectives = (results[0].transport if results else "?"), None
        out.info(f"read the facts of {len(results)} node(s) from {opts.facts} (nothing probed)")
    else:
        names = node_names(opts.hostfile, environ)
        if not names:
            raise UsageError("no nodes to probe", hint="pass --hostfile FILE, or run inside a Slurm allocation")
        results, transport, collectives = _probe(out, opts, names, environ)
    if opts.save_facts:
        _save(out, opts.save_facts, results, transport)
    findings = cluster.diagnose(results, transport)
    rep = cluster.report(results, findings, transport)
    if collectives is not None:
        rep["collectives"] = collectives
    if out.json_mode:
        out.json(rep)
    elif not out.quiet:
        render(out, rep)
    return exit_code(findings)


def _gib(n: Optional[int]) -> str:
    return "-" if not n else f"{n / 2**30:.0f}G"


def _isa(row: JsonMapping) -> str:
    isa = set(_texts(row.get("isa")))
    tiers = []
    if "amx_bf16" in isa:
        tiers.append("AMX" if row.get("amx_usable") else "AMX(blocked)")
    if "avx512_bf16" in isa:
        tiers.append("avx512_bf16")
    elif "avx512f" in isa:
        tiers.append("avx512")
    elif "avx2" in isa:
        tiers.append("avx2")
    elif isa:
        tiers.append(sorted(isa)[-1])
    return " ".join(tiers) or "-"


def _texts(value: JsonValue) -> List[str]:
    """A list of text in a report row (decide.cluster's JSON); [] where there is none."""
    return [str(v) for v in value] if isinstance(value, list) else []


def _object(value: JsonValue) -> JsonObject:
    """An object in the report (decide.cluster's JSON); {} where there is none."""
    return value if isinstance(value, dict) else {}


def _or_dash(value: JsonValue) -> str:
    """A field as text, '-' where it is empty or null (as `value or '-'` shows it)."""
    return str(value) if value else "-"


def _cells(row: JsonMapping) -> List[str]:
    if "microarchitecture" not in row:
        return [str(row["name"]), str(row["status"])] + ["-"] * 5 + [_or_dash(row.get("python"))]
    pk = _object(row["packages"])
    quota = row["cpu_quota"]
    shown_quota = "" if quota is None else f" q{quota:g}"
    python = _or_dash(row["python"]) + ("" if row.get("interpreter_found", True) else " (job's missing)")
    mpi = ", ".join(m.replace("mpirun ", "").replace("srun slurm", "srun") for m in _texts(row["mpi"])) or "-"
    memory = row["memory_bytes"]
    return [str(row["name"]), str(row["status"]), str(row["microarchitecture"]), _isa(row),
            f"{row['cores']}/{row['cpus']} use {row['cpu_budget']}{shown_quota}", str(row["numa_nodes"]),
            _gib(memory if isinstance(memory, int) else None), python, _or_dash(pk.get("torch")),
            "/".join(_or_dash(pk.get(p)) for p in ("intel_extension_for_pytorch", "oneccl_bind_pt")),
            " ".join(_or_dash(pk.get(p)) for p in ("transformers", "accelerate")), mpi,
            _or_dash(row.get("rendezvous_ifname"))]


# cores/CPUs: physical cores / logical CPUs; use: the CPU budget (usable cores, cgroup quota qN, Slurm).
HEADERS = ["node", "status", "CPU", "ISA", "cores/CPUs", "NUMA", "mem", "Python", "torch", "IPEX/oneCCL",
           "transformers accelerate", "MPI", "iface"]


# Columns below which the nodes table is drawn one node per block (its 13 columns need about this many).
WIDE = 150


def render(out: Output, rep: JsonMapping) -> None:
    from rich import box
    from rich.table import Table

    from cpuperf.output import stdout_console

    title = f"Nodes (reached through {rep['transport']})"
    nodes = [_object(row) for row in rep["nodes"]] if isinstance(rep["nodes"], list) else []
    rows = [_cells(row) for row in nodes]
    rows = [cells + ["-"] * (len(HEADERS) - len(cells)) for cells in rows]
    if stdout_console().width >= WIDE:
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for h in HEADERS:
            t.add_column(h, overflow="fold", no_wrap=h in ("node", "status", "torch"))
        for cells in rows:
            t.add_row(*cells)
        out.table(t)
    else:  # 13 columns in 80 broke every cell into one letter per line: one block per node, a field per line
        out.product(title)
        for cells in rows:
            out.product("")
            t = Table(box=None, pad_edge=False, show_header=False)
            t.add_column("field", no_wrap=True, style="bold")
            t.add_column("value", overflow="fold")
            for h, cell in zip(HEADERS, cells):
                t.add_row(h, cell)
            out.table(t)
    if rep.get("collectives"):
        _render_collectives(out, _object(rep["collectives"]))
    findings = [_object(f) for f in rep["findings"]] if isinstance(rep["findings"], list) else []
    if not findings:
        out.product(f"The {len(nodes)} nodes agree: nothing would break or slow the job.")
        return
    f = Table(title="Skews", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for h in ("severity", "id", "nodes", "what", "fix"):
        f.add_column(h, overflow="fold")
    for item in findings:
        f.add_row(str(item["severity"]), str(item["id"]), ", ".join(_texts(item["nodes"])), str(item["message"]),
                  str(item["fix"] or ""))
    out.table(f)


def _render_collectives(out: Output, col: JsonMapping) -> None:
    from rich import box
    from rich.table import Table

    if "backends" not in col:
        failed = _object(col.get("failed", {}))
        out.product(f"allreduce: {col.get('skipped') or 'failed: ' + '; '.join(f'{n}: {w}' for n, w in failed.items())}")
        return
    t = Table(title=f"Allreduce across {col['world']} node(s), {col['bucket_mb']:g} MiB (torch {col['torch']})",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for h in ("backend", "time", "algbw GB/s", "busbw GB/s", "latency"):
        t.add_column(h)
    for name, entry in _object(col["backends"]).items():
        m = _object(entry)
        if "skipped" in m:
            t.add_row(name, "-", "-", "-", f"not measured: {m['skipped']}")
        else:
            busbw = "-" if m["busbw_gbps"] is None else f"{m['busbw_gbps']:g}"
            seconds = m["seconds"]
            ms = seconds * 1e3 if isinstance(seconds, (int, float)) else float("nan")
            t.add_row(name, f"{ms:.1f} ms", f"{m['algbw_gbps']:g}", busbw, f"{m['latency_us']:g} us")
    out.table(t)
    if col.get("choice"):
        c = _object(col["choice"])
        out.product(f"DDP: backend {c['backend']}, bucket_cap_mb {c['bucket_cap_mb']} ({c['reason']})")
