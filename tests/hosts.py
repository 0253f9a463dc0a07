"""Build recorded-host trees (a /proc + /sys snapshot) for --sysroot tests.

Only the OS edge is synthetic: the trees follow the kernel's documented sysfs layout
(Documentation/ABI/stable/sysfs-devices-system-cpu, Documentation/ABI/stable/sysfs-devices-node,
Documentation/admin-guide/cgroup-v2.rst).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

FIXTURES = Path(__file__).parent / "fixtures"
CPUINFO = FIXTURES / "cpuinfo"


def fmt_list(cpus: Iterable[int]) -> str:
    from cpuperf.probe.parse import format_cpulist

    return format_cpulist(cpus)


def fmt_mask(cpus: Iterable[int]) -> str:
    value = 0
    for c in cpus:
        value |= 1 << c
    words = []
    for _ in range(max(1, (max(list(cpus) or [0]) // 32) + 1)):
        words.append(f"{value & 0xFFFFFFFF:08x}")
        value >>= 32
    return ",".join(reversed(words))


def x86_block(cpu: int, socket: int, core: int, *, vendor: str = "GenuineIntel", family: int = 6,
              model: int = 143, stepping: int = 8, flags: Sequence[str] = (), name: str = "Test CPU") -> str:
    return (f"processor\t: {cpu}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: {name}\nstepping\t: {stepping}\nphysical id\t: {socket}\ncore id\t\t: {core}\n"
            f"flags\t\t: {' '.join(flags)}\n\n")


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_host(root: Path, *, sockets: int = 1, cores_per_socket: int = 4, threads_per_core: int = 1,
              nodes_per_socket: int = 1, extra_cpuless_nodes: int = 0, offline: Sequence[int] = (),
              cpumap_only: bool = False, flags: Sequence[str] = ("avx2", "fma"), vendor: str = "GenuineIntel",
              family: int = 6, model: int = 143, stepping: int = 8, hybrid_efficient: Sequence[int] = (),
              cgroup: Optional[Dict[str, str]] = None, cgroup_version: int = 2,
              node_mem_bytes: int = 64 << 30, with_sys: bool = True, name: str = "Test CPU") -> Path:
    """A host with numbered CPUs: socket-major, SMT siblings offset by the core count (Linux's order)."""
    ncores = sockets * cores_per_socket
    cpus: List[Dict[str, int]] = []
    for t in range(threads_per_core):
        for s in range(sockets):
            for c in range(cores_per_socket):
                cpus.append({"id": t * ncores + s * cores_per_socket + c, "socket": s, "core": c})
    online = [c for c in cpus if c["id"] not in set(offline)]
    write(root, "/proc/cpuinfo", "".join(
        x86_block(c["id"], c["socket"], c["core"], vendor=vendor, family=family, model=model,
                  stepping=stepping, flags=flags, name=name) for c in online))
    write(root, "/proc/meminfo", f"MemTotal:       {node_mem_bytes * sockets // 1024} kB\n"
                                 f"MemAvailable:   {node_mem_bytes * sockets // 2048} kB\n")
    if not with_sys:
        return root
    _write_sys_cpus(root, cpus, online, offline, cpumap_only)
    _write_sys_nodes(root, cpus, sockets, cores_per_socket, nodes_per_socket, extra_cpuless_nodes, cpumap_only,
                     node_mem_bytes)
    if hybrid_efficient:
        eff = set(hybrid_efficient)
        write(root, "/sys/devices/cpu_core/cpus", fmt_list(c["id"] for c in online if c["id"] not in eff) + "\n")
        write(root, "/sys/devices/cpu_atom/cpus", fmt_list(c["id"] for c in online if c["id"] in eff) + "\n")
    if cgroup:
        _write_cgroup(root, cgroup, cgroup_version)
    return root


def _write_sys_cpus(root: Path, cpus: List[Dict[str, int]], online: List[Dict[str, int]], offline: Sequence[int],
                    cpumap_only: bool) -> None:
    total = len(cpus)
    write(root, "/sys/devices/system/cpu/present", f"0-{total - 1}\n")
    write(root, "/sys/devices/system/cpu/online", fmt_list(c["id"] for c in online) + "\n")
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c['id']}"
        if c["id"] in offline:
            write(root, f"{base}/online", "0\n")
            continue
        write(root, f"{base}/online", "1\n")
        write(root, f"{base}/topology/physical_package_id", f"{c['socket']}\n")
        write(root, f"{base}/topology/core_id", f"{c['core']}\n")
        siblings = [o["id"] for o in cpus if o["socket"] == c["socket"] and o["core"] == c["core"]]
        if cpumap_only:
            write(root, f"{base}/topology/thread_siblings", fmt_mask(siblings) + "\n")
        else:
            write(root, f"{base}/topology/thread_siblings_list", fmt_list(siblings) + "\n")
            write(root, f"{base}/topology/core_cpus_list", fmt_list(siblings) + "\n")


def _write_sys_nodes(root: Path, cpus: List[Dict[str, int]], sockets: int, cores_per_socket: int,
                     nodes_per_socket: int, extra_cpuless_nodes: int, cpumap_only: bool, node_mem_bytes: int) -> None:
    node_id = 0
    per_node = cores_per_socket // nodes_per_socket
    for s in range(sockets):
        for n in range(nodes_per_socket):
            cores = range(n * per_node, (n + 1) * per_node)
            members = [c["id"] for c in cpus if c["socket"] == s and c["core"] in cores]
            base = f"/sys/devices/system/node/node{node_id}"
            if cpumap_only:
                write(root, f"{base}/cpumap", fmt_mask(members) + "\n")
            else:
                write(root, f"{base}/cpulist", fmt_list(members) + "\n")
            write(root, f"{base}/meminfo", f"Node {node_id} MemTotal:       {node_mem_bytes // nodes_per_socket // 1024} kB\n")
            node_id += 1
    for _ in range(extra_cpuless_nodes):
        base = f"/sys/devices/system/node/node{node_id}"
        write(root, f"{base}/cpulist", "\n")
        write(root, f"{base}/meminfo", f"Node {node_id} MemTotal:       {16 << 20} kB\n")
        node_id += 1


def _write_cgroup(root: Path, cgroup: Dict[str, str], cgroup_version: int) -> None:
    if cgroup_version == 2:
        write(root, "/proc/self/cgroup", "0::/\n")
        write(root, "/sys/fs/cgroup/cgroup.controllers", "cpuset cpu memory\n")
        for name, value in cgroup.items():
            write(root, f"/sys/fs/cgroup/{name}", value + "\n")
    else:
        write(root, "/proc/self/cgroup", "4:cpu,cpuacct:/\n3:cpuset:/\n2:memory:/\n")
        for name, value in cgroup.items():
            controller = "cpuset" if name.startswith("cpuset") else ("memory" if name.startswith("memory") else "cpu,cpuacct")
            write(root, f"/sys/fs/cgroup/{controller}/{name}", value + "\n")


def fixture_host(root: Path, fixture: str) -> Path:
    """A sysroot holding only a recorded /proc/cpuinfo."""
    write(root, "/proc/cpuinfo", (CPUINFO / fixture).read_text())
    return root


# Arm Neoverse classes as recorded trees: the recorded AWS Graviton3 file (Neoverse V1), and Neoverse V2 and N1
# built from it with their own CPU part (Linux arch/arm64/include/asm/cputype.h: 0xd4f, 0xd0c) and Features (hwcap
# names of arch/arm64/kernel/cpuinfo.c for what each core implements: V2 is Armv9.0-A with SVE2 and BF16, as AWS
# Graviton4 and NVIDIA Grace report it; N1 is Armv8.2-A without SVE or BF16, as AWS Graviton2 and Ampere Altra do).
ARM_FEATURES = {
    "neoverse_v2": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
                   "dcpop sha3 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 "
                   "sveaes svepmull svebitperm svesha3 flagm2 frint svei8mm svebf16 i8mm bf16 dgh rng bti",
    "neoverse_n1": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs",
}
ARM_PARTS = {"neoverse_v1": "0xd40", "neoverse_v2": "0xd4f", "neoverse_n1": "0xd0c"}


def arm_cpuinfo(kind: str, n: int) -> str:
    """/proc/cpuinfo of an `n`-CPU Neoverse host of `kind` (neoverse_v1, neoverse_v2, neoverse_n1)."""
    block = (CPUINFO / "linux-amazon-neoverse_v1").read_text().split("\n\n")[0]
    lines = []
    for line in block.splitlines():
        if line.startswith("processor"):
            continue
        if line.startswith("Features") and kind in ARM_FEATURES:
            line = f"Features\t: {ARM_FEATURES[kind]}"
        elif line.startswith("CPU part"):
            line = f"CPU part\t: {ARM_PARTS[kind]}"
        lines.append(line)
    return "".join(f"processor\t: {c}\n" + "\n".join(lines) + "\n\n" for c in range(n))


def make_arm_host(root: Path, kind: str, cores: int = 2) -> Path:
    """A recorded Neoverse host of `kind`: `cores` CPUs on one socket and NUMA node (cgroup-free), its cpuinfo."""
    host = make_host(root, sockets=1, cores_per_socket=cores, name=f"{kind} (recorded)")
    write(host, "/proc/cpuinfo", arm_cpuinfo(kind, cores))
    return host
