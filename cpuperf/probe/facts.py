"""Frozen, typed facts about a host, dumpable to and loadable from JSON.

`None` always means "unknown" (for example a fact a --sysroot snapshot cannot tell);
an empty tuple means "known to be none".
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from cpuperf.jsonable import JsonMapping, JsonObject, JsonValue, as_json

# ISA flags cpuperf reasons about, as Linux prints them in /proc/cpuinfo (x86: the quoted names in
# arch/x86/include/asm/cpufeatures.h; AMX-FP16 and AVX-VNNI-INT8 have none, so they never appear) and in
# the Arm 'Features' line (arch/arm64/kernel/cpuinfo.c hwcap_str).
X86_ISA = (
    "sse4_2", "avx", "f16c", "fma", "avx2", "avx512f", "avx512cd", "avx512dq", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512vbmi", "avx512_vbmi2", "avx512_vpopcntdq", "avx_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
)
ARM_ISA = ("asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "svebf16", "i8mm", "svei8mm", "sme", "sme2")
POWER_ISA = ("altivec", "vsx", "mma")


@dataclass(frozen=True)
class LoadFacts:
    """Load by others while cpuperf itself sleeps; None = unknown."""

    window_s: float  # 0 = no window (snapshot, or skipped)
    loadavg_1m: Optional[float]
    runnable_others: Optional[float]  # mean runnable tasks besides this process over the window
    cpu_busy: Optional[Tuple[Tuple[int, float], ...]]  # (cpu, busy fraction 0..1) over the window
    psi_some_avg10: Optional[float]  # % of the last 10 s some task waited for a CPU
    psi_source: Optional[str]  # the pressure file read
    source: str  # 'live' | 'snapshot'

    def busy(self) -> Dict[int, float]:
        return dict(self.cpu_busy or ())


@dataclass(frozen=True)
class CpuFacts:
    arch: str  # x86_64, aarch64, ppc64le, riscv64, s390x, unknown
    vendor: Optional[str]
    model_name: Optional[str]
    family: Optional[int]
    model: Optional[int]
    stepping: Optional[int]
    microarchitecture: str  # 'unknown' when nothing matches
    isa: Tuple[str, ...]  # the subset of known ISA flags the OS exposes
    flags: Tuple[str, ...]  # everything the OS exposes
    # Facts only: whether cpuperf has a native bf16 path is knowledge/bf16.py's answer (bf16_native), from `isa`.
    amx_supported: bool
    amx_usable: Optional[bool]  # the kernel granted tile state to a process; None = not checked
    implementer: Optional[int] = None  # Arm
    part: Optional[int] = None  # Arm
    microarchitecture_source: str = "model"  # model | features | override | none
    # x86: where the flags overruled the family/model (a hypervisor's model number), the name the model gives and
    # the vector extensions (AVX-512, AMX) the flags show beyond that generation's; None and () otherwise.
    model_microarchitecture: Optional[str] = None
    beyond_model: Tuple[str, ...] = ()


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: Tuple[int, ...]
    memory_bytes: Optional[int]


@dataclass(frozen=True)
class LogicalCpu:
    id: int
    socket: int
    core: int  # core id, unique only within its socket
    node: Optional[int]
    core_type: Optional[str] = None  # 'performance' | 'efficient' on hybrid parts


@dataclass(frozen=True)
class Topology:
    sockets: int
    physical_cores: int
    logical_cpus: int
    threads_per_core: int
    numa_nodes: Tuple[NumaNode, ...]
    cpus: Tuple[LogicalCpu, ...]  # online CPUs
    offline_cpus: Tuple[int, ...]
    allowed_cpus: Optional[Tuple[int, ...]]  # this process's affinity ∩ cpuset; None = unknown
    cpu_quota: Optional[float]  # cgroup CPU quota in CPUs; None = none or unknown
    cpuset: Optional[Tuple[int, ...]]  # cgroup cpuset, when one restricts us
    cgroup_version: Optional[int]
    hybrid: bool
    source: str  # 'sysfs' | 'cpuinfo'

    @property
    def smt(self) -> bool:
        return self.threads_per_core > 1


@dataclass(frozen=True)
class Limits:
    slurm_job_id: Optional[str]
    slurm_cpus_per_task: Optional[int]
    slurm_cpus_on_node: Optional[int]
    slurm_ntasks: Optional[int]
    slurm_nnodes: Optional[int]
    shm_bytes: Optional[int]  # size of /dev/shm
    memory_limit_bytes: Optional[int]  # cgroup memory.max / limit_in_bytes


@dataclass(frozen=True)
class Memory:
    total_bytes: Optional[int]
    available_bytes: Optional[int]


@dataclass(frozen=True)
class Gpu:
    vendor: str
    name: str
    compute_capability: Optional[str]  # '8.0'
    memory_bytes: Optional[int]
    bf16: bool
    tf32: bool
    index: int = 0
    driver_version: Optional[str] = None
    uuid: Optional[str] = None
    memory_free_bytes: Optional[int] = None  # NVML / nvidia-smi memory.free; None = not reported
    numa_node: Optional[int] = None  # the NUMA node of the GPU's PCI device (sysfs numa_node); None = unknown


@dataclass(frozen=True)
class PackageInfo:
    version: str
    local: Optional[str] = None  # '+cpu', '+cu121' label without '+'
    build: Optional[str] = None  # 'cpu' | 'cuda' | 'rocm' | 'xpu' (torch only)
    cuda: Optional[str] = None  # torch's CUDA version, from torch/version.py
    location: Optional[str] = None


@dataclass(frozen=True)
class MpiLauncher:
    name: str  # mpirun, mpiexec, mpiexec.hydra, srun, torchrun
    path: str
    flavour: Optional[str]  # openmpi | intelmpi | mpich | slurm | torchrun
    version: Optional[str]


# THE allocators cpuperf finds, measures and preloads, in the order `ccl-env --preload` falls back to without a
# decision, with the library files each ships (Debian libgoogle-perftools4 / libtcmalloc-minimal4, libjemalloc2, the
# cmeel-mimalloc wheel); every list of allocator names derives from it.
ALLOCATOR_LIBS: Dict[str, List[str]] = {
    "tcmalloc": ["libtcmalloc.so*", "libtcmalloc_minimal.so*"],
    "jemalloc": ["libjemalloc.so*"],
    "mimalloc": ["libmimalloc.so*"],
}


@dataclass(frozen=True)
class Software:
    python: str  # '3.11.7'
    python_abi: str  # 'cp311'
    executable: str
    prefix: str
    packages: Dict[str, Optional[PackageInfo]]
    mpi: Tuple[MpiLauncher, ...]
    numactl: Optional[str]
    openmp: Dict[str, Tuple[str, ...]]  # runtime name -> library paths found
    allocators: Dict[str, Tuple[str, ...]]  # allocator name -> library paths found


@dataclass(frozen=True)
class HostFacts:
    cpu: CpuFacts
    topology: Topology
    memory: Memory
    limits: Limits
    gpus: Optional[Tuple[Gpu, ...]]  # None = unknown (a snapshot), () = none
    software: Optional[Software]  # None = unknown (a snapshot)
    platform: str  # 'linux', 'darwin', 'win32'
    sysroot: Optional[str]
    overrides: Tuple[str, ...] = ()  # the CPUPERF_OVERRIDE_* facts in force
    load: Optional[LoadFacts] = None  # other work right now; None = not probed (see probe.with_load)

    @property
    def live(self) -> bool:
        return self.sysroot is None

    def usable_cpus(self) -> Tuple[int, ...]:
        """CPUs this process may run on (all online CPUs when unknown)."""
        online = tuple(c.id for c in self.topology.cpus)
        if self.topology.allowed_cpus is not None:
            allowed = set(self.topology.allowed_cpus)
            return tuple(c for c in online if c in allowed) or tuple(sorted(allowed))
        return online

    def to_json(self) -> JsonObject:
        return as_json(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    @classmethod
    def from_json(cls, data: JsonMapping) -> HostFacts:
        built = _build(cls, dict(data))  # _build rebuilds cls itself from its type hints
        if not isinstance(built, HostFacts):
            raise TypeError("host facts must be an object")
        return built

    @classmethod
    def loads(cls, text: str) -> HostFacts:
        return cls.from_json(json.loads(text))


def _build(tp: object, value: JsonValue) -> object:
    """Rebuild nested frozen dataclasses from asdict() output (`tp`: a field's type, as its dataclass declares it)."""
    import typing

    if value is None:
        return None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise TypeError(f"{tp.__name__} must be an object")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _build(hints[f.name], value[f.name])
        built: object = tp(**kwargs)
        return built
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value) if inner else value
    if origin in (tuple, Tuple) and isinstance(value, list):
        return tuple(_build(args[0], v) if args else v for v in value)
    if origin in (dict, Dict) and isinstance(value, dict):
        return {k: _build(args[1], v) if len(args) > 1 else v for k, v in value.items()}
    return value
