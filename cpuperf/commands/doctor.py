"""`cpuperf doctor`: probe, diagnose, render."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from cpuperf.errors import ExitCode
from cpuperf.jsonable import JsonObject, JsonValue
from cpuperf.output import Output

if TYPE_CHECKING:  # rich is imported where a table is drawn (fast start-up)
    from rich.table import Table

    from cpuperf.decide.findings import Finding
    from cpuperf.probe.facts import Gpu, HostFacts, Software


def _gib(n: Optional[int]) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def run(out: Output, sysroot: Optional[str], python: Optional[str], save_snapshot: Optional[str]) -> int:
    from cpuperf.decide import doctor
    from cpuperf.probe import probe_host, probe_today, with_load

    if save_snapshot:
        from cpuperf.probe.snapshot import save_snapshot as save

        count = save(save_snapshot, sysroot=sysroot, python=python)
        if sysroot is None:
            from cpuperf.run.measure import record_in_snapshot

            count += record_in_snapshot(save_snapshot, probe_host(python=python))
        out.info(f"saved {count} probe files under {save_snapshot} (use: cpuperf doctor --sysroot {save_snapshot})")
    from cpuperf.knowledge.tuning import tuning

    facts = with_load(probe_host(sysroot=sysroot, python=python), default_s=tuning().load.window_s)
    if not facts.platform.startswith("linux"):
        out.info(f"cpuperf serves Linux hosts; this is {facts.platform}: nothing to diagnose here")
        if out.json_mode:
            out.json({"schema": doctor.SCHEMA, "host": {"platform": facts.platform}, "software": None,
                      "findings": [f.to_json() for f in doctor.check_platform(facts)]})
        return int(ExitCode.OK)
    findings = doctor.diagnose(facts, today=probe_today())
    rep = doctor.report(facts, findings)
    if out.json_mode:
        out.json(rep)
    elif not out.quiet:
        render(out, facts, findings)
    return int(ExitCode.FOUND_ERROR) if any(f.severity == "error" for f in findings) else int(ExitCode.OK)


def render(out: Output, facts: HostFacts, findings: Sequence[Finding]) -> None:
    """The report as tables, read from the facts and findings the --json report is made of (decide.doctor.report)."""
    out.table(_cpu_section(facts))
    out.table(_topology_section(facts))
    out.table(_gpu_section(facts.gpus))
    out.table(_software_section(facts.software))
    _render_findings(out, findings)


def _section(title: str) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    return table


def _cpu_section(facts: HostFacts) -> Table:
    from cpuperf.knowledge.bf16 import bf16_native
    from cpuperf.knowledge.cpu_peaks import peak_data

    cpu = facts.cpu
    t = _section("CPU")
    t.add_row("model", f"{cpu.model_name or '?'} ({cpu.vendor or '?'}, {cpu.arch})")
    by_model = cpu.model_microarchitecture
    t.add_row("microarchitecture", f"{cpu.microarchitecture} (by {cpu.microarchitecture_source}"
              + (f"; family {cpu.family} model {cpu.model} says {by_model})" if by_model else ")"))
    t.add_row("ISA", " ".join(cpu.isa) or "-")
    t.add_row("bf16 native", "yes" if bf16_native(facts) else "no")
    data = peak_data(cpu.microarchitecture, cpu.model_name)
    unsourced = data.get("unsourced")
    gaps = {str(g["kind"]): g for g in unsourced if isinstance(g, dict)} if isinstance(unsourced, list) else {}
    t.add_row("FLOPs/cycle/core", _flops_line(_object(data.get("flops_per_cycle")), gaps.get("flops_per_cycle")))
    boost = _object(data.get("boost_clock"))
    t.add_row("highest rated clock", f"{boost['ghz']:.2f} GHz ({boost['part']})" if boost
              else _gap_line(gaps.get("boost_clock"), "no row"))
    usable = {True: "usable", False: "not usable", None: "unknown"}[cpu.amx_usable]
    t.add_row("AMX", f"supported, {usable}" if cpu.amx_supported else "no")
    return t


def _object(value: JsonValue) -> Optional[JsonObject]:
    """A row of the peak data (knowledge.cpu_peaks.peak_data); None where it has none."""
    return value if isinstance(value, dict) else None


def _gap_line(gap: Optional[Mapping[str, object]], otherwise: str) -> str:
    return f"unsourced: {gap['what']} ({gap['why']})" if gap else otherwise


def _flops_line(flops: Optional[Mapping[str, object]], gap: Optional[Mapping[str, object]]) -> str:
    """'32 fp32, 64 bf16 (variant)' from compat/cpu_peaks.toml, or why the data has no figure."""
    if not flops:
        return _gap_line(gap, "no row (MFU not reported)")
    rates = f"{flops['fp32']} fp32" + (f", {flops['bf16']} bf16" if flops.get("bf16") else "")
    line = f"{rates} ({flops['variant']})"
    return f"{line}; {_gap_line(gap, '')}" if gap else line


def _topology_section(facts: HostFacts) -> Table:
    from cpuperf.probe.parse import format_cpulist

    topo = facts.topology
    t = _section("Topology")
    t.add_row("sockets / cores / CPUs", f"{topo.sockets} / {topo.physical_cores} / {topo.logical_cpus}"
              f" ({topo.threads_per_core} threads per core)")
    for node in topo.numa_nodes:
        t.add_row(f"NUMA node {node.id}", f"CPUs {format_cpulist(node.cpus) or '-'}, {_gib(node.memory_bytes)}")
    allowed = topo.allowed_cpus
    if allowed is not None:
        t.add_row("allowed CPUs", format_cpulist(allowed))
    t.add_row("CPU quota", "none" if topo.cpu_quota is None else f"{topo.cpu_quota:g} CPUs")
    if topo.hybrid:  # (as the --json report has them)
        t.add_row("core types", str({k: [c.id for c in topo.cpus if c.core_type == k] for k in ("performance", "efficient")}))
    t.add_row("memory", f"{_gib(facts.memory.total_bytes)} total, {_gib(facts.memory.available_bytes)} available")
    limits = facts.limits
    if limits.shm_bytes is not None:
        t.add_row("/dev/shm", _gib(limits.shm_bytes))
    if limits.slurm_job_id:
        t.add_row("Slurm job", f"{limits.slurm_job_id} ({limits.slurm_cpus_per_task or '?'} CPUs per task)")
    return t


def _gpu_section(gpus: Optional[Sequence[Gpu]]) -> Table:
    t = _section("GPUs")
    if gpus is None:
        t.add_row("NVIDIA", "unknown (snapshot)")
    elif not gpus:
        t.add_row("NVIDIA", "none")
    for g in gpus or []:
        free = f" ({_gib(g.memory_free_bytes)} free)" if g.memory_free_bytes is not None else ""
        t.add_row(f"GPU {g.index}", f"{g.name}, cc {g.compute_capability or '?'}, {_gib(g.memory_bytes)}{free}, "
                  f"bf16 {'yes' if g.bf16 else 'no'}, tf32 {'yes' if g.tf32 else 'no'}, driver {g.driver_version or '?'}")
    return t


def _software_section(sw: Optional[Software]) -> Table:
    t = _section("Software")
    if sw is None:
        t.add_row("packages", "unknown (snapshot)")
        return t
    t.add_row("python", f"{sw.python} ({sw.executable})")
    for name, info in sw.packages.items():
        if info is not None:
            extra = f" (CUDA {info.cuda})" if info.cuda else ""
            t.add_row(name, info.version + extra)
    missing = [n for n, i in sw.packages.items() if i is None]
    t.add_row("not installed", ", ".join(missing) or "-")
    t.add_row("launchers", ", ".join(f"{m.name} ({m.flavour or '?'} {m.version or ''})".replace(" )", ")")
                                     for m in sw.mpi) or "none")
    t.add_row("numactl", sw.numactl or "not found")
    t.add_row("OpenMP", ", ".join(k for k, v in sw.openmp.items() if v) or "none found")
    t.add_row("allocators", ", ".join(k for k, v in sw.allocators.items() if v) or "none found")
    return t


def _render_findings(out: Output, findings: Sequence[Finding]) -> None:
    from rich.table import Table

    if not findings:
        out.product("No findings: this host is ready.")
        return
    t = Table(title="Findings", title_justify="left")
    t.add_column("severity")
    t.add_column("id")
    t.add_column("message", overflow="fold")
    t.add_column("fix", overflow="fold")
    for f in findings:
        t.add_row(f.severity, f.id, f.message, f.fix or "")
    out.table(t)
