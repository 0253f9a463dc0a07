"""GPU findings for `cpuperf doctor` and the one-line blockers `cpuperf train` prints before starting.

Pure over HostFacts and the compat matrix: the driver floor per CUDA version is compat/cuda.toml's
[[cuda]] rows (NVIDIA's minor-version compatibility: 11.x >= 450.80.02, 12.x >= 525.60.13,
13.x >= 580), the free-memory threshold is compat/tuning.toml [gpu_memory].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

from cpuperf.probe.facts import Gpu, HostFacts, PackageInfo
from cpuperf.versions import version_or_none

if TYPE_CHECKING:  # the matrix and the findings are imported where a check needs them: doctor stays light
    from cpuperf.decide.findings import Finding
    from cpuperf.knowledge.matrix import CudaVariant, Matrix

# `ubuntu-drivers install --gpgpu` installs the recommended server (compute) driver branch.
# Source: Ubuntu Server docs, "NVIDIA drivers installation" (ubuntu-drivers --gpgpu).
DRIVER_INSTALL = "sudo ubuntu-drivers install --gpgpu && sudo reboot"


def driver_tuple(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    """'550.54.15' -> (550, 54, 15); None for anything else."""
    if not text:
        return None
    try:
        return tuple(int(p) for p in text.strip().split("."))
    except ValueError:
        return None


def _cuda_key(cuda: str) -> Tuple[int, int]:
    major, _, minor = cuda.partition(".")
    return int(major), int(minor or 0)


def driver_floor(cuda: str, matrix: Optional[Matrix] = None) -> Optional[Tuple[str, str, str]]:
    """(minimum Linux driver, the cuXYZ row it came from, its source) for a CUDA major.minor.

    A CUDA version without its own row takes the newest row of the same major at or below it:
    minor-version compatibility gives every minor of a major the same floor.
    """
    from cpuperf.knowledge.matrix import default_matrix

    m = matrix if matrix is not None else default_matrix()
    try:
        want = _cuda_key(cuda)
    except ValueError:
        return None
    best = None
    for row in m.cuda:
        try:
            key = _cuda_key(row.cuda)
        except ValueError:
            continue
        if key == want:
            return row.min_driver_linux, row.tag, row.source
        if key[0] == want[0] and key <= want and (best is None or key > _cuda_key(best.cuda)):
            best = row
    if best is None:
        return None
    return best.min_driver_linux, best.tag, best.source


def variant_for_driver(torch_version: str, driver: str, matrix: Optional[Matrix] = None) -> Optional[CudaVariant]:
    """The newest CUDA variant of this torch release that `driver` can run, or None.

    The same rule `cpuperf install` picks builds by (install.cuda_tag_for_driver).
    """
    from cpuperf.knowledge.cuda import cuda_tag_for_driver
    from cpuperf.knowledge.matrix import default_matrix

    m = matrix if matrix is not None else default_matrix()
    version = version_or_none(torch_version)
    release = m.torch_release(version) if version is not None else None
    if release is None:
        return None
    tag, _why = cuda_tag_for_driver(driver, release.cuda, m.cuda)
    return m.cuda_variant(tag) if tag else None


def _older_torch_fix(torch_version: str, driver: str) -> Optional[str]:
    """`cpuperf install --torch X`: the newest older torch with a CUDA build this driver runs (the rule
    `cpuperf install` walks by), or None."""
    from cpuperf.knowledge.cuda import newest_release_for_driver
    from cpuperf.knowledge.matrix import default_matrix

    m = default_matrix()
    ceiling = version_or_none(torch_version)
    if ceiling is None:
        return None
    row, tag, _why = newest_release_for_driver(m.torch, ceiling, driver, m.cuda)
    if row is None:
        return None
    return f"cpuperf install --torch {row.version}   # the newest torch with a CUDA build ({tag}) driver {driver} runs"


def _torch(facts: HostFacts) -> Optional[PackageInfo]:
    return facts.software.packages.get("torch") if facts.software is not None else None


def check_driver(facts: HostFacts) -> List[Finding]:
    """Error when the NVIDIA driver is older than torch's CUDA build needs."""
    from cpuperf.decide.findings import Finding

    torch = _torch(facts)
    gpus = facts.gpus or ()
    if torch is None or torch.build != "cuda" or not torch.cuda or not gpus:
        return []
    drivers = sorted({g.driver_version for g in gpus if g.driver_version and driver_tuple(g.driver_version)},
                     key=lambda d: driver_tuple(d) or ())
    if not drivers:
        return []
    floor = driver_floor(torch.cuda)
    if floor is None:
        return []
    need, tag, _source = floor
    driver = drivers[0]
    have, need_t = driver_tuple(driver), driver_tuple(need)
    if have is None or need_t is None or have >= need_t:
        return []
    public = torch.version.split("+")[0]
    other = variant_for_driver(public, driver)
    if other is not None:
        fix = (f"python -m pip install --force-reinstall 'torch=={public}' --index-url {other.index_url}"
               f"   # CUDA {other.cuda} runs on driver {driver}; or upgrade the driver: {DRIVER_INSTALL}")
    else:
        fix = _older_torch_fix(public, driver) or f"{DRIVER_INSTALL}   # any driver >= {need}"
        if not fix.startswith(DRIVER_INSTALL):
            fix += f"; or upgrade the driver: {DRIVER_INSTALL}   # any driver >= {need}"
    return [Finding(
        "driver-too-old", "error",
        f"NVIDIA driver {driver} is older than {need}, the minimum for CUDA {torch.cuda} ({tag}) that "
        f"torch {torch.version} is built with: CUDA will not initialise (torch.cuda.is_available() is False)",
        fix)]


def min_free_fraction() -> float:
    from cpuperf.knowledge.tuning import tuning

    return float(tuning().gpu_memory.min_free_fraction)


def full_gpus(gpus: Tuple[Gpu, ...]) -> List[Gpu]:
    """GPUs whose free memory is below compat/tuning.toml [gpu_memory] min_free_fraction."""
    frac = min_free_fraction()
    return [g for g in gpus if g.memory_free_bytes is not None and g.memory_bytes
            and g.memory_free_bytes < g.memory_bytes * frac]


def check_memory(facts: HostFacts) -> List[Finding]:
    """Warning (error when every GPU is taken) for GPUs whose memory other processes hold."""
    from cpuperf.decide.findings import Finding

    gpus = facts.gpus or ()
    full = full_gpus(gpus)
    if not full:
        return []
    free_ones = [g.index for g in gpus if g not in full]
    names = ", ".join(f"GPU {g.index} ({g.name}: {(g.memory_free_bytes or 0) / 2**30:.1f} of "
                      f"{(g.memory_bytes or 0) / 2**30:.0f} GiB free)" for g in full)
    find = "nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv"
    if free_ones:
        fix = (f"export CUDA_VISIBLE_DEVICES={','.join(str(i) for i in free_ones)}   # the free GPUs; "
               f"or find and stop the holders: {find}")
        severity = "warning"
    else:
        fix = f"{find}   # then stop those processes (kill PID)"
        severity = "error"
    return [Finding("gpu-memory-full", severity,
                    f"{names}: other processes hold the memory, so training there runs out of memory "
                    "at the first step", fix)]


def check_gpus(facts: HostFacts) -> List[Finding]:
    """doctor's GPU findings (the CPU-only-torch finding stays in doctor.check_torch)."""
    return check_driver(facts) + check_memory(facts)
