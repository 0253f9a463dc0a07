"""Sockets, cores, NUMA nodes and the CPUs this process may use: from /sys, cpuinfo as fallback."""

from __future__ import annotations

import posixpath
import re
from typing import Dict, List, Optional, Set, Tuple

from cpuperf.probe import parse
from cpuperf.probe.facts import LogicalCpu, NumaNode, Topology
from cpuperf.probe.sources import Sources

SYS_CPU = "/sys/devices/system/cpu"
SYS_NODE = "/sys/devices/system/node"
CGROUP = "/sys/fs/cgroup"


def _numbered(names: Optional[List[str]], prefix: str) -> List[int]:
    out = []
    for name in names or []:
        match = re.fullmatch(prefix + r"(\d+)", name)
        if match:
            out.append(int(match.group(1)))
    return sorted(out)


def _read_list(src: Sources, path_list: str, path_mask: Optional[str] = None) -> Optional[Tuple[int, ...]]:
    """A cpulist file, or the older hex cpumap mask beside it."""
    value = parse.parse_cpulist(src.read(path_list), origin=src.path(path_list)) if src.exists(path_list) else None
    if value is None and path_mask is not None:
        value = parse.parse_cpumask(src.read(path_mask))
    return value


def online_cpus(src: Sources) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(online, offline) CPU ids from /sys; both empty when /sys says nothing."""
    present_dirs = _numbered(src.listdir(SYS_CPU), "cpu")
    online = parse.parse_cpulist(src.read(f"{SYS_CPU}/online"), origin=src.path(f"{SYS_CPU}/online"))
    if online is None:
        online = tuple(c for c in present_dirs
                       if (src.read_first_line(f"{SYS_CPU}/cpu{c}/online") or "1") != "0")
    present = set(present_dirs) | set(parse.parse_cpulist(src.read(f"{SYS_CPU}/present"),
                                                          origin=src.path(f"{SYS_CPU}/present")) or ())
    offline = tuple(sorted(present - set(online)))
    return tuple(online), offline


def numa_nodes(src: Sources) -> Tuple[NumaNode, ...]:
    """Every NUMA node, CPU-less ones (HBM, CXL memory) included."""
    nodes = []
    for node_id in _numbered(src.listdir(SYS_NODE), "node"):
        base = f"{SYS_NODE}/node{node_id}"
        cpus = _read_list(src, f"{base}/cpulist", f"{base}/cpumap") or ()
        mem = parse.parse_meminfo(src.read(f"{base}/meminfo"), src.path(f"{base}/meminfo")).get("MemTotal")
        nodes.append(NumaNode(id=node_id, cpus=tuple(cpus), memory_bytes=mem))
    return tuple(nodes)


def _core_types(src: Sources) -> Dict[int, str]:
    """Hybrid parts expose /sys/devices/cpu_core/cpus (P-cores) and cpu_atom/cpus (E-cores)."""
    types: Dict[int, str] = {}
    for pmu, kind in (("cpu_core", "performance"), ("cpu_atom", "efficient")):
        for cpu in parse.parse_cpulist(src.read(f"/sys/devices/{pmu}/cpus")) or ():
            types[cpu] = kind
    return types


def _from_sysfs(src: Sources, online: Tuple[int, ...], nodes: Tuple[NumaNode, ...],
                cpuinfo_blocks: List[Dict[str, str]]) -> Tuple[List[LogicalCpu], int]:
    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}
    types = _core_types(src)
    by_cpuinfo = {parse.int_auto(b.get("processor")): b for b in cpuinfo_blocks}
    cpus: List[LogicalCpu] = []
    core_groups: Set[Tuple[int, ...]] = set()
    for cpu in online:
        topo = f"{SYS_CPU}/cpu{cpu}/topology"
        # -1: the kernel's "unknown" on some arm hosts; text that is no number is garbage, said as such
        package = parse.checked_int(src.read_first_line(f"{topo}/physical_package_id"),
                                    src.path(f"{topo}/physical_package_id"), minimum=-1)
        core = parse.checked_int(src.read_first_line(f"{topo}/core_id"), src.path(f"{topo}/core_id"), minimum=-1)
        die = parse.checked_int(src.read_first_line(f"{topo}/die_id"), src.path(f"{topo}/die_id"), minimum=-1) or 0
        if package is None or core is None:  # no topology dir: ask cpuinfo about this CPU
            block = by_cpuinfo.get(cpu, {})
            package = parse.int_auto(block.get("physical id")) if package is None else package
            core = parse.int_auto(block.get("core id")) if core is None else core
        package = 0 if package is None or package < 0 else package
        core = cpu if core is None else core
        siblings = (_read_list(src, f"{topo}/core_cpus_list", f"{topo}/core_cpus")
                    or _read_list(src, f"{topo}/thread_siblings_list", f"{topo}/thread_siblings"))
        # Core ids repeat across sockets and dies: a physical core is its sibling set when known.
        core_groups.add(tuple(s for s in siblings if s in online) if siblings
                        else (-1, package, die, core))
        cpus.append(LogicalCpu(id=cpu, socket=package, core=core + die * 100000,
                               node=node_of.get(cpu), core_type=types.get(cpu)))
    return cpus, len(core_groups)


def _from_cpuinfo(blocks: List[Dict[str, str]]) -> Tuple[List[LogicalCpu], int]:
    cpus: List[LogicalCpu] = []
    cores: Set[Tuple[int, int]] = set()
    for index, block in enumerate(b for b in blocks if "processor" in b):
        cpu_id = parse.int_auto(block.get("processor"))
        cpu_id = index if cpu_id is None else cpu_id
        package = parse.int_auto(block.get("physical id"))
        core = parse.int_auto(block.get("core id"))
        package = 0 if package is None else package
        core = cpu_id if core is None else core
        cores.add((package, core))
        cpus.append(LogicalCpu(id=cpu_id, socket=package, core=core, node=None))
    return cpus, len(cores)


def cgroup_dirs(src: Sources, controller: str) -> Tuple[Optional[int], List[str]]:
    """(cgroup version, directories from this process's cgroup up to the root)."""
    membership = parse.parse_proc_self_cgroup(src.read("/proc/self/cgroup"))
    if src.exists(f"{CGROUP}/cgroup.controllers"):
        rel = membership.get("", "/")
        mounts = [CGROUP]
        version = 2
    else:
        rel = membership.get(controller, "/")
        mounts = [f"{CGROUP}/{name}" for name in (controller, f"{controller},cpuacct",
                                                  "cpu,cpuacct", "cpuacct,cpu")]
        mounts = [m for m in mounts if src.is_dir(m)]
        if not mounts:
            return None, []
        version = 1
    dirs: List[str] = []
    for mount in mounts[:1]:
        path = rel
        while True:
            candidate = posixpath.normpath(mount + "/" + path)
            if src.is_dir(candidate):
                dirs.append(candidate)
            if path in ("/", ""):
                break
            path = posixpath.dirname(path.rstrip("/")) or "/"
        if mount not in dirs and src.is_dir(mount):
            dirs.append(mount)
    return version, dirs


def cgroup_cpu_quota(src: Sources) -> Tuple[Optional[int], Optional[float]]:
    """(cgroup version, the tightest CPU quota along our cgroup's ancestry, in CPUs)."""
    if src.override("cpu_quota") is not None:
        return None, src.override_number("cpu_quota")
    version, dirs = cgroup_dirs(src, "cpu")
    quotas = []
    for d in dirs:
        if version == 2:
            quota = parse.parse_cgroup_v2_cpu_max(src.read(f"{d}/cpu.max"), src.path(f"{d}/cpu.max"))
        else:
            quota = parse.parse_cgroup_v1_quota(src.read(f"{d}/cpu.cfs_quota_us"),
                                                src.read(f"{d}/cpu.cfs_period_us"))
        if quota:
            quotas.append(quota)
    return version, (min(quotas) if quotas else None)


def cgroup_cpuset(src: Sources) -> Optional[Tuple[int, ...]]:
    version, dirs = cgroup_dirs(src, "cpuset")
    for d in dirs:  # the nearest cgroup that says anything wins
        for name in ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"):
            cpus = parse.parse_cpulist(src.read(f"{d}/{name}"), origin=src.path(f"{d}/{name}"))
            if cpus:
                return cpus
    return None


def cgroup_memory_limit(src: Sources) -> Optional[int]:
    version, dirs = cgroup_dirs(src, "memory")
    limits = []
    for d in dirs:
        raw = src.read_first_line(f"{d}/memory.max") if version == 2 else \
            src.read_first_line(f"{d}/memory.limit_in_bytes")
        where = src.path(f"{d}/memory.max" if version == 2 else f"{d}/memory.limit_in_bytes")
        value = parse.checked_int(raw, where, minimum=0) if raw and raw != "max" else None
        # cgroup v1 reports 'no limit' as a huge page-aligned number.
        if value and value < (1 << 60):
            limits.append(value)
    return min(limits) if limits else None


def probe_topology(src: Sources, cpuinfo_blocks: List[Dict[str, str]]) -> Topology:
    """Topology of the host, and which CPUs this process may really use."""
    online, offline = online_cpus(src)
    nodes = numa_nodes(src)
    if online:
        cpus, physical = _from_sysfs(src, online, nodes, cpuinfo_blocks)
        source = "sysfs"
    else:
        cpus, physical = _from_cpuinfo(cpuinfo_blocks)
        offline = ()
        source = "cpuinfo"
        if not nodes and cpus:
            # No /sys at all: one node holding every CPU, memory unknown.
            nodes = (NumaNode(id=0, cpus=tuple(c.id for c in cpus), memory_bytes=None),)
    logical = len(cpus)
    sockets = len({c.socket for c in cpus}) or 1
    physical = physical or logical
    threads_per_core = max(1, round(logical / physical)) if physical else 1

    cgroup_version, quota = cgroup_cpu_quota(src)
    cpuset = cgroup_cpuset(src)
    all_ids = {c.id for c in cpus}
    if cpuset is not None and all_ids and set(cpuset) >= all_ids:
        cpuset = None  # a cpuset that allows everything restricts nothing
    affinity = src.affinity()
    override = src.override("allowed_cpus")
    if override is not None:
        allowed: Optional[Tuple[int, ...]] = parse.parse_cpulist(override, origin="CPUPERF_OVERRIDE_ALLOWED_CPUS")
    elif affinity is not None:
        allowed = tuple(affinity) if cpuset is None else tuple(c for c in affinity if c in set(cpuset)) or tuple(affinity)
    else:
        allowed = cpuset  # a snapshot: its cpuset is all we can tell
    return Topology(sockets=sockets, physical_cores=physical, logical_cpus=logical,
                    threads_per_core=threads_per_core, numa_nodes=nodes, cpus=tuple(cpus),
                    offline_cpus=offline, allowed_cpus=allowed, cpu_quota=quota, cpuset=cpuset,
                    cgroup_version=cgroup_version, hybrid=any(c.core_type for c in cpus),
                    source=source)
