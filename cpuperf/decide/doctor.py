"""`cpuperf doctor`: facts -> findings (id, severity, message, the exact fix). Pure over HostFacts."""

from __future__ import annotations

from dataclasses import asdict
from datetime import date
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from cpuperf.decide.allocator import allocator_names, allocator_rule
from cpuperf.decide.findings import SEVERITIES, Finding
from cpuperf.decide.gpu_checks import check_gpus
from cpuperf.decide.load import check_load
from cpuperf.jsonable import JsonObject
from cpuperf.knowledge.bf16 import amx_usable, bf16_native
from cpuperf.knowledge.cpu_peaks import peak_data, peak_generations, unsourced
from cpuperf.knowledge.gpu import visible_gpus
from cpuperf.probe.cpu import x86_contradictions
from cpuperf.probe.facts import CpuFacts, HostFacts, PackageInfo, Software
from cpuperf.versions import base_or_none, major_minor

SCHEMA = "cpuperf.doctor/1"

# /dev/shm below this breaks gloo and DataLoader workers (Docker's default is 64 MiB).
# Source: pytorch/pytorch issues on "unable to write to file </torch_...>" and Docker's --shm-size docs.
SHM_MIN_BYTES = 1 << 30


CPU_TORCH_INSTALL = "cpuperf install --yes"


def _pkg(facts: HostFacts, name: str) -> Optional[PackageInfo]:
    if facts.software is None:
        return None
    return facts.software.packages.get(name)


def check_platform(facts: HostFacts) -> List[Finding]:
    if facts.platform.startswith("linux"):
        return []
    return [Finding("unsupported-platform", "error",
                    f"cpuperf serves Linux hosts; this is {facts.platform}", None)]


def _flags_overrule_model(cpu: CpuFacts) -> Finding:
    """The model number names one generation, the flags show a newer one's vector extensions: the flags win."""
    return Finding(
        "microarchitecture-from-flags", "info",
        f"the CPU reports family {cpu.family} model {cpu.model} ({cpu.model_microarchitecture} in the kernel's "
        f"table), but its flags show {', '.join(cpu.beyond_model)}, which {cpu.model_microarchitecture} does not "
        f"have: named {cpu.microarchitecture} by its flags (a hypervisor may report another model number), and "
        f"its peak and decisions are {cpu.microarchitecture}'s", None)


def _contradictions(cpu: CpuFacts) -> List[Finding]:
    """A cpuinfo that contradicts itself (AMX flags under AuthenticAMD; Intel's family 6 model 143 under AuthenticAMD):
    named, with what cpuperf made of it (the probe trusts no flag of another maker, and names no generation from a
    family/model of another vendor's numbering)."""
    if cpu.arch != "x86_64":
        return []
    said = x86_contradictions(cpu.vendor, cpu.family, cpu.model, cpu.stepping, cpu.flags)
    if not said.said:
        return []
    ignored = f"; cpuperf ignores {', '.join(said.foreign_flags)}" if said.foreign_flags else ""
    return [Finding("cpu-identity-contradicts", "warning",
                    f"this CPU's cpuinfo contradicts itself: {'; '.join(said.said)}{ignored} and plans it as "
                    f"{cpu.microarchitecture}",
                    "on a VM, give the guest the host's own CPU model (libvirt host-passthrough, QEMU -cpu host); "
                    "on a recorded tree, record the host again (cpuperf doctor --save-snapshot DIR)")]


def check_cpu(facts: HostFacts) -> List[Finding]:
    cpu = facts.cpu
    out: List[Finding] = []
    if cpu.arch == "x86_64" and not bf16_native(facts):
        torch = _pkg(facts, "torch")
        gpu_training = bool(facts.gpus) and (torch is None or torch.build != "cpu")
        if gpu_training:  # the advice follows the device: training runs on the GPUs, whose bf16 is their own
            bf16_gpus = [g.name for g in facts.gpus or () if g.bf16]
            gpu_side = (f"the GPUs ({', '.join(sorted(set(bf16_gpus)))}) have bf16 and train with it" if bf16_gpus
                        else "the GPUs here have no bf16 either (fp16 with a gradient scaler on Tensor Cores)")
            out.append(Finding(
                "bf16-not-native", "info",
                f"{cpu.microarchitecture}: no avx512_bf16 or AMX, so CPU training would emulate bf16; {gpu_side}",
                None))
        else:
            out.append(Finding(
                "bf16-not-native", "info",
                f"{cpu.microarchitecture}: no avx512_bf16 or AMX, so bf16 is emulated and slower than fp32 "
                "here; cpuperf keeps fp32 (do not pass --bf16 on this host)", None))
    if cpu.amx_supported and not amx_usable(facts):
        out.append(Finding(
            "amx-not-permitted", "error",
            "the CPU has AMX but the kernel refused tile state to this process (arch_prctl "
            "ARCH_REQ_XCOMP_PERM); AMX kernels will crash or be skipped",
            "boot a Linux kernel >= 5.16 (uname -r), or run outside the seccomp profile that blocks arch_prctl"))
    if cpu.model_microarchitecture:
        out.append(_flags_overrule_model(cpu))
    if "isa" not in facts.overrides:  # an overridden ISA speaks for itself: the host's vendor string is not its
        out.extend(_contradictions(cpu))
    named = cpu.model_name or cpu.vendor or "unknown"
    if cpu.microarchitecture in ("unknown", "x86_64", "x86_64_v2", "x86_64_v3", "x86_64_v4", "aarch64"):
        out.append(Finding("unknown-microarchitecture", "info",
                           f"this CPU ({named}) is not in cpuperf's table (newer than its data, or unlisted); "
                           "decisions use its ISA flags only, and training reports no MFU for it",
                           "report it with: cpuperf doctor --save-snapshot ./snapshot"))
    elif cpu.microarchitecture not in peak_generations():
        out.append(Finding("cpu-peak-not-in-data", "info",
                           f"{cpu.microarchitecture} ({named}) has no FLOPs-per-cycle row in cpuperf's data "
                           "(newer than the data, or no vendor guide gives its datapath): training reports no MFU "
                           "for it, only the measured GEMM rate ('% of achievable'); placement and dtype use its "
                           "ISA flags", None))
    gaps = unsourced(cpu.microarchitecture, cpu.model_name)
    if gaps:
        out.append(Finding("cpu-data-unsourced", "info",
                           "not in cpuperf's data for want of a primary source: "
                           + "; ".join(f"{g['what']} ({g['why']})" for g in gaps)
                           + ": left out rather than guessed (compat/cpu_peaks.toml [[unsourced]])", None))
    return out


def check_topology(facts: HostFacts) -> List[Finding]:
    topo = facts.topology
    out: List[Finding] = []
    usable = len(facts.usable_cpus())
    if topo.cpu_quota is not None and topo.cpu_quota < usable:
        out.append(Finding(
            "cpu-quota", "warning",
            f"the cgroup CPU quota is {topo.cpu_quota:g} CPUs but {usable} CPUs are visible: "
            "default thread counts oversubscribe and throttle",
            f"run with OMP_NUM_THREADS={max(1, int(topo.cpu_quota))} (cpuperf train/ccl-env set it)"))
    if topo.offline_cpus:
        out.append(Finding("offline-cpus", "info",
                           f"{len(topo.offline_cpus)} CPUs are offline and are not counted", None))
    if topo.hybrid:
        out.append(Finding("hybrid-cpu", "info",
                           "hybrid CPU: performance and efficient cores differ; cpuperf pins compute "
                           "threads to performance cores", None))
    if facts.limits.slurm_cpus_per_task and facts.limits.slurm_cpus_per_task < usable:
        out.append(Finding("slurm-cpus", "info",
                           f"Slurm allots {facts.limits.slurm_cpus_per_task} CPUs per task", None))
    if facts.software is not None and len(topo.numa_nodes) > 1 and not facts.software.numactl:
        out.append(Finding("no-numactl", "info",
                           f"{len(topo.numa_nodes)} NUMA nodes and no numactl: memory binding per rank is not possible",
                           "apt-get install -y numactl   # or: dnf install -y numactl"))
    shm = facts.limits.shm_bytes
    if shm is not None and shm < SHM_MIN_BYTES:
        out.append(Finding("small-shm", "warning",
                           f"/dev/shm is {shm // (1 << 20)} MiB: gloo and DataLoader workers fail with "
                           "'unable to write to file' errors",
                           "docker run --shm-size=8g ...   # or: mount -o remount,size=8G /dev/shm"))
    return out


def check_memory(facts: HostFacts) -> List[Finding]:
    limit = facts.limits.memory_limit_bytes
    total = facts.memory.total_bytes
    if limit and total and limit < total:
        return [Finding("memory-limit", "info",
                        f"a cgroup memory limit of {limit / 2**30:.1f} GiB applies (host has {total / 2**30:.1f} GiB); "
                        "memory plans use the limit", None)]
    return []


def check_torch(facts: HostFacts) -> List[Finding]:
    if facts.software is None:
        return []
    out: List[Finding] = []
    torch = _pkg(facts, "torch")
    gpus = facts.gpus or ()
    if torch is None:
        out.append(Finding("no-torch", "warning", "PyTorch is not installed in this Python",
                           CPU_TORCH_INSTALL))
        return out
    out += _numpy_beside(facts.software)
    if torch.build == "cuda" and facts.gpus == ():
        public = torch.version.split("+")[0]
        out.append(Finding(
            "cuda-torch-on-cpu-host", "warning",
            f"torch {torch.version} is a CUDA build (several GB of nvidia packages) on a host without an NVIDIA GPU",
            f"python -m pip install --force-reinstall 'torch=={public}+cpu' --index-url https://download.pytorch.org/whl/cpu"))
    if torch.build == "cpu" and gpus:
        out.append(Finding(
            "cpu-torch-on-gpu-host", "warning",
            f"torch {torch.version} is a CPU-only build but this host has {len(gpus)} NVIDIA GPU(s): training would ignore them",
            "cpuperf install --yes   # picks the CUDA build the driver supports"))
    return out


def _numpy_beside(sw: Software) -> List[Finding]:
    """torch without numpy: torch imports numpy where it can, and warns in every process (each DDP rank) where it
    cannot ("Failed to initialize NumPy: No module named 'numpy'", torch/csrc/utils/tensor_numpy.cpp); its
    numpy bridges (`tensor.numpy()`, `torch.from_numpy`, DataLoader's default collate of numpy arrays) then fail.
    Read from the installed distributions (probe.pkgscan), never by importing torch. A stack described only by
    CPUPERF_OVERRIDE_PACKAGES (no interpreter, no recorded scan) says nothing about numpy: no finding.
    `cpuperf install` does not add numpy: it pins each package it installs to a build the index offers for this
    torch, and which numpy a torch build runs with (1.x or 2.x) is no row of compat/ yet; pip picks it here."""
    if sw.packages.get("numpy") is not None or not sw.executable:
        return []
    import shlex

    return [Finding("no-numpy", "warning",
                    f"numpy is not installed beside torch in {sw.executable}: every process that imports torch, each "
                    "DDP rank included, prints torch's \"Failed to initialize NumPy: No module named 'numpy'\" "
                    "warning, and tensor.numpy() / torch.from_numpy fail",
                    f"{shlex.quote(sw.executable)} -m pip install numpy")]


def check_libraries(facts: HostFacts, libccl: Optional[Sequence[str]] = None) -> List[Finding]:
    """Allocators and the oneCCL runtime's libraries. `libccl`: which of libccl.so.1 / libccl.so.2 the environment's
    lib directory holds (None: read there, by cpuperf.probe.libfiles)."""
    sw = facts.software
    if sw is None:
        return []
    out: List[Finding] = []
    if not any(sw.allocators.values()):
        out.append(Finding(
            "no-fast-allocator", "info",
            f"no {allocator_names()} is installed; cpuperf measures whether preloading one helps "
            f"(as root, system ones too: {allocator_rule().system_install})",
            "cpuperf install --yes   # adds the mimalloc wheel to this environment, no root needed"))
    oneccl_cpu = sw.packages.get("oneccl-cpu")
    if oneccl_cpu is not None and sw.packages.get("oneccl") is None:
        if libccl is None:
            from cpuperf.probe.libfiles import present_libraries

            libccl = present_libraries(sw.prefix, ("libccl.so.1", "libccl.so.2"))
        if "libccl.so.1" in libccl and "libccl.so.2" not in libccl:
            out.append(Finding(
                "oneccl-cpu-incomplete", "warning",
                "the oneccl-cpu wheel's libccl.so.1 needs libccl.so.2, which it does not ship: ranks fail at load time",
                "python -m pip install oneccl   # the full runtime, which has libccl.so.2"))
    return out


def check_stack(facts: HostFacts) -> List[Finding]:
    """The compat matrix's findings on the installed stack (IPEX/oneCCL vs torch, Python wheels, EOL)."""
    from cpuperf.knowledge.resolve import installed_findings

    sw = facts.software
    if sw is None or not facts.platform.startswith("linux"):
        return []
    plat = "linux_aarch64" if facts.cpu.arch == "aarch64" else "linux_x86_64"
    packages: Dict[str, Optional[str]] = {}
    for name, info in sw.packages.items():
        if info is None:
            packages[name] = None
        else:
            packages[name] = info.version + (f"+{info.local}" if info.local and "+" not in info.version else "")
    pyver = major_minor(str(sw.python)) + ("t" if str(getattr(sw, "python_abi", "")).endswith("t") else "")
    return [Finding(f["id"], f["severity"], f["message"], f["fix"] or None)
            for f in installed_findings(pyver, packages, platform=plat)]


def check_python_eol(facts: HostFacts, today: date) -> List[Finding]:
    """The running Python past its end of life on `today`, or within six months of it (compat/eol.toml), with the
    newest torch that still ships a wheel for it."""
    from cpuperf.knowledge.resolve import python_eol_finding

    sw = facts.software
    if sw is None or not facts.platform.startswith("linux"):
        return []
    plat = "linux_aarch64" if facts.cpu.arch == "aarch64" else "linux_x86_64"
    pyver = major_minor(str(sw.python)) + ("t" if str(getattr(sw, "python_abi", "")).endswith("t") else "")
    found = python_eol_finding(pyver, today, platform=plat)
    if found is None:
        return []
    return [Finding(found["id"], found["severity"], found["message"], found["fix"] or None)]


def check_ddp_backend(facts: HostFacts) -> List[Finding]:
    """Which backend several CPU ranks would use: the note ccl-env says once (not in every shell) is said here."""
    from cpuperf.decide.backend import cpu_backend

    sw = facts.software
    torch = sw.packages.get("torch") if sw is not None else None
    if sw is None or torch is None or facts.gpus or len(facts.usable_cpus()) < 2:
        return []
    bindings = sw.packages.get("oneccl_bind_pt")
    backend = cpu_backend(facts, {"torch": torch.version, "oneccl_bind_pt": bindings.version if bindings else None},
                          sw.python)
    if backend.name == "ccl":
        return []
    return [Finding("ddp-backend-gloo", "info", f"several CPU ranks use gloo, not ccl: "
                    f"{backend.reason.removeprefix('gloo: ')}", None)]


_REGEN = ("refresh the data from a cpuperf checkout (python -m tools.regen_compat --live), "
          "or extend it with CPUPERF_COMPAT_DIR")


def check_data_age(facts: HostFacts) -> List[Finding]:
    """Installed torch / transformers / accelerate newer than cpuperf's data, and what cpuperf does about it."""
    from cpuperf.knowledge.hf_flags import coverage
    from cpuperf.knowledge.matrix import default_matrix

    if facts.software is None:
        return []
    m = default_matrix()
    out: List[Finding] = []
    torch = _pkg(facts, "torch")
    if torch is not None and m.torch:
        newest = m.torch[-1].version
        v = base_or_none(torch.version)
        if v is not None and v > newest:
            out.append(Finding(
                "torch-newer-than-data", "info",
                f"torch {torch.version} is newer than cpuperf's data (data ends at torch {newest}): its wheels and the "
                "Intel add-ons' support for it are not checked; install plans pin only releases in the data",
                _REGEN))
    for name in ("transformers", "accelerate"):
        info = _pkg(facts, name)
        if info is None:
            continue
        cov = coverage(name, info.version)
        what = "Trainer flags" if name == "transformers" else "accelerate config keys and launch flags"
        if cov.kind == "patch":
            out.append(Finding(f"{name}-newer-than-data", "info",
                               f"{name} {info.version} is newer than cpuperf's data (data ends at {name} "
                               f"{cov.through}): a patch release, so the {cov.through} {what} are used as they are",
                               _REGEN))
        elif cov.kind == "minor":
            out.append(Finding(f"{name}-newer-than-data", "info",
                               f"{name} {info.version} is newer than cpuperf's data (data ends at {name} "
                               f"{cov.through}): the {cov.through} {what} are carried over, except those "
                               "recorded as deprecated or removed", _REGEN))
        elif cov.kind == "major":
            out.append(Finding(f"{name}-newer-than-data", "warning",
                               f"{name} {info.version} is newer than cpuperf's data (data ends at {name} "
                               f"{cov.through}): a new major release, so cpuperf renders no {what} for it",
                               _REGEN))
        elif cov.note:
            out.append(Finding(f"{name}-outside-data", "warning", cov.note, _REGEN))
    return out


CHECKS: List[Callable[[HostFacts], List[Finding]]] = [
    check_platform, check_cpu, check_topology, check_memory, check_torch, check_libraries, check_stack, check_gpus,
    check_load, check_data_age, check_ddp_backend,
]


def gpu_blockers(facts: HostFacts, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """One line per problem that stops training on this host's GPUs, each ending with its fix.

    For `cpuperf train` to print before it starts: a driver too old for torch's CUDA, GPUs whose
    memory other processes hold, a CPU-only torch on a GPU host. Empty = nothing in the way.
    `environ` (the launch environment) limits the GPUs to CUDA_VISIBLE_DEVICES.
    """
    import dataclasses

    if environ is not None and facts.gpus:
        facts = dataclasses.replace(facts, gpus=visible_gpus(facts, environ))
    findings = [f for f in check_torch(facts) if f.id == "cpu-torch-on-gpu-host"] + check_gpus(facts)
    return [f"{f.message} (fix: {f.fix})" if f.fix else f.message for f in findings]


def diagnose(facts: HostFacts, today: Optional[date] = None) -> List[Finding]:
    """All findings, errors first; `today` (probe_today()) adds the ones that depend on the date."""
    findings: List[Finding] = []
    for check in CHECKS:
        findings.extend(check(facts))
    if today is not None:
        findings.extend(check_python_eol(facts, today))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order.get(f.severity, 9))


def report(facts: HostFacts, findings: List[Finding]) -> JsonObject:
    """The `doctor --json` object."""
    cpu, topo, sw = facts.cpu, facts.topology, facts.software
    software: Optional[JsonObject] = None
    if sw is not None:
        software = {
            "python": sw.python,
            "python_abi": sw.python_abi,
            "executable": sw.executable,
            "packages": {name: (asdict(info) if info else None) for name, info in sw.packages.items()},
            "mpi": [asdict(m) for m in sw.mpi],
            "numactl": sw.numactl,
            "openmp": {k: list(v) for k, v in sw.openmp.items()},
            "allocators": {k: list(v) for k, v in sw.allocators.items()},
        }
    return {
        "schema": SCHEMA,
        "host": {
            "platform": facts.platform,
            "sysroot": facts.sysroot,
            "overrides": list(facts.overrides),
            "cpu": {
                "arch": cpu.arch, "vendor": cpu.vendor, "model_name": cpu.model_name,
                "family": cpu.family, "model": cpu.model, "stepping": cpu.stepping,
                "microarchitecture": cpu.microarchitecture,
                "microarchitecture_source": cpu.microarchitecture_source,
                "microarchitecture_by_model": cpu.model_microarchitecture,
                "isa": list(cpu.isa), "bf16_native": bf16_native(facts),
                "peak_data": peak_data(cpu.microarchitecture, cpu.model_name),
                "amx": {"supported": cpu.amx_supported, "usable": cpu.amx_usable},
                "implementer": cpu.implementer, "part": cpu.part,
            },
            "topology": {
                "sockets": topo.sockets, "physical_cores": topo.physical_cores,
                "logical_cpus": topo.logical_cpus, "threads_per_core": topo.threads_per_core,
                "smt": topo.smt,
                "numa_nodes": [{"id": n.id, "cpus": list(n.cpus), "memory_bytes": n.memory_bytes}
                               for n in topo.numa_nodes],
                "allowed_cpus": list(topo.allowed_cpus) if topo.allowed_cpus is not None else None,
                "cpu_quota": topo.cpu_quota,
                "cpuset": list(topo.cpuset) if topo.cpuset is not None else None,
                "cgroup_version": topo.cgroup_version,
                "offline_cpus": list(topo.offline_cpus),
                "hybrid": topo.hybrid,
                "core_types": ({t: [c.id for c in topo.cpus if c.core_type == t]
                                for t in ("performance", "efficient")} if topo.hybrid else None),
                "source": topo.source,
            },
            "limits": asdict(facts.limits),
            "memory": {"total_bytes": facts.memory.total_bytes,
                       "available_bytes": facts.memory.available_bytes},
            "gpus": [asdict(g) for g in facts.gpus] if facts.gpus is not None else None,
            "load": asdict(facts.load) if facts.load is not None else None,
        },
        "software": software,
        "findings": [f.to_json() for f in findings],
    }

