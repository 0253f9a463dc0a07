"""probe_host(): one typed, cached snapshot of a host (the live one, or a --sysroot tree)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Tuple

from cpuperf.probe import parse
from cpuperf.probe.cpu import probe_cpu
from cpuperf.probe.facts import HostFacts, Limits, Memory
from cpuperf.probe.gpus import probe_gpus
from cpuperf.probe.software import probe_software
from cpuperf.probe.sources import Sources, check_python, check_sysroot
from cpuperf.probe.topology import cgroup_memory_limit, probe_topology

if TYPE_CHECKING:  # datetime: not on ccl-env's path (every new shell)
    from datetime import date

# (sysroot, python, software, runtimes, gpus, the CPUPERF_OVERRIDE_* and SLURM_* variables) -> the facts
_Key = Tuple[Optional[str], Optional[str], bool, bool, bool, Tuple[Tuple[str, str], ...]]
_CACHE: Dict[_Key, HostFacts] = {}


def _int_env(src: Sources, name: str) -> Optional[int]:
    return src.env_count(name)


def probe_limits(src: Sources) -> Limits:
    return Limits(
        slurm_job_id=src.env("SLURM_JOB_ID"),
        slurm_cpus_per_task=_int_env(src, "SLURM_CPUS_PER_TASK"),
        slurm_cpus_on_node=parse.parse_slurm_cpus_per_node(src.env("SLURM_JOB_CPUS_PER_NODE")),
        slurm_ntasks=_int_env(src, "SLURM_NTASKS"),
        slurm_nnodes=_int_env(src, "SLURM_NNODES") or _int_env(src, "SLURM_JOB_NUM_NODES"),
        shm_bytes=src.statvfs_bytes("/dev/shm"),
        memory_limit_bytes=cgroup_memory_limit(src),
    )


def probe_memory(src: Sources) -> Memory:
    info = parse.parse_meminfo(src.read("/proc/meminfo"), src.path("/proc/meminfo"))
    total = info.get("MemTotal")
    override = src.override_number("memory_total", integer=True)
    if override is not None:
        total = int(override)
    return Memory(total_bytes=total, available_bytes=info.get("MemAvailable"))


def _platform(src: Sources) -> str:
    """sys.platform (linux, darwin, win32); CPUPERF_OVERRIDE_PLATFORM describes another; a snapshot is Linux."""
    override = src.override_name("platform")
    if override is not None:
        return override
    return sys.platform if src.live else "linux"


def probe_host(sysroot: Optional[str] = None, python: Optional[str] = None,
               environ: Optional[Mapping[str, str]] = None, software: bool = True,
               use_cache: bool = True, runtimes: bool = True, gpus: bool = True) -> HostFacts:
    """Probe a host once. `sysroot` reads a recorded tree; `python` inspects another interpreter; gpus=False
    leaves the GPUs unknown (None: their probe starts a child process)."""
    if sysroot is not None:
        check_sysroot(sysroot)
    if python is not None:
        check_python(python)
    src = Sources(sysroot=sysroot, environ=environ)
    src.check_overrides()
    overrides = tuple(sorted(k[len("CPUPERF_OVERRIDE_"):].lower() for k in src.environ
                             if k.startswith("CPUPERF_OVERRIDE_")))
    key: _Key = (src.sysroot, python, software, runtimes, gpus, tuple((k, src.environ[k]) for k in sorted(src.environ)
                                                if k.startswith(("CPUPERF_OVERRIDE_", "SLURM_"))))
    if use_cache and key in _CACHE:
        return _CACHE[key]
    blocks = parse.parse_cpuinfo(src.read("/proc/cpuinfo") or "")
    facts = HostFacts(
        cpu=probe_cpu(src, blocks),
        topology=probe_topology(src, blocks),
        memory=probe_memory(src),
        limits=probe_limits(src),
        gpus=probe_gpus(src) if gpus else None,
        software=probe_software(src, python, runtimes) if software else None,
        platform=_platform(src),
        sysroot=src.sysroot,
        overrides=overrides,
    )
    if use_cache:
        _CACHE[key] = facts
    return facts


def probe_today(environ: Optional[Mapping[str, str]] = None) -> date:
    """Today's date (CPUPERF_OVERRIDE_TODAY describes another day): what a date-dependent finding is judged on."""
    src = Sources(environ=environ)
    src.check_overrides()
    return src.today()


def with_load(facts: HostFacts, window_s: Optional[float] = None, default_s: Optional[float] = None) -> HostFacts:
    """`facts` with the load on its usable CPUs attached (sampled now when live; recorded for a snapshot).
    `default_s`: the window where neither `window_s` nor CPUPERF_LOAD_WINDOW gives one (compat/tuning.toml [load])."""
    import dataclasses

    from cpuperf.probe.load import DEFAULT_WINDOW_S, load_for

    default = DEFAULT_WINDOW_S if default_s is None else default_s
    return dataclasses.replace(facts, load=load_for(facts.sysroot, facts.usable_cpus(), window_s, default))


__all__ = ["probe_host", "probe_today", "with_load", "check_python", "HostFacts", "Sources"]
