"""CUDA driver rules: which cuXYZ torch build a Linux NVIDIA driver runs (rows in compat/cuda.toml). Pure."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from packaging.version import Version

from cpuperf.knowledge.matrix import CudaVariant, TorchRelease
from cpuperf.versions import numeric_version, version_or_none


def cuda_tag_for_driver(driver: Optional[str], offered: Sequence[str],
                        variants: Sequence[CudaVariant]) -> Tuple[Optional[str], str]:
    """The newest cuXYZ build of `offered` that this Linux driver runs, and why.

    `variants` are matrix CudaVariant rows. pip's CUDA wheels ship their own CUDA runtime, so the
    floor is CUDA minor-version compatibility (min_driver_linux: 11.x >= 450.80.02, 12.x >= 525.60.13,
    13.x >= 580; NVIDIA CUDA Toolkit release notes, table 3, and the CUDA compatibility guide).
    Below the toolkit's own driver (toolkit_driver_linux) PTX JIT of newer code is unavailable: said
    in the reason. Returns (None, reason) when no offered build runs on this driver.
    """
    by_tag = {v.tag: v for v in variants}
    rows = [by_tag[t] for t in offered if t in by_tag]
    if not rows:
        return None, f"no CUDA build data for {', '.join(offered) or 'this torch'}"
    rows.sort(key=lambda v: numeric_version(v.cuda), reverse=True)
    if not driver:
        return None, "the NVIDIA driver version is unknown"
    have = version_or_none(driver)
    if have is None:
        return None, f"cannot read the NVIDIA driver version {driver!r}"
    for v in rows:
        if have >= Version(v.min_driver_linux):
            full = not v.toolkit_driver_linux or have >= Version(v.toolkit_driver_linux)
            why = f"driver {driver} >= {v.min_driver_linux} (CUDA {v.cuda} minor-version compatibility)"
            if not full:
                why += f"; PTX JIT of newer code needs {v.toolkit_driver_linux}"
            return v.tag, why
    oldest = rows[-1]
    return None, f"driver {driver} is older than CUDA {oldest.cuda} needs ({oldest.min_driver_linux})"


def newest_release_for_driver(releases: Sequence[TorchRelease], ceiling: Version, driver: Optional[str],
                              variants: Sequence[CudaVariant]) -> Tuple[Optional[TorchRelease], Optional[str], str]:
    """The newest torch release at or below `ceiling` with a CUDA build this driver runs: (release, tag, why).

    `releases` are matrix TorchRelease rows, oldest first. A newer release may build only for a CUDA the
    driver is too old for (torch 2.15 dropped CUDA 12.6, so drivers below 580 run none of its builds): the
    walk goes to older releases until one has a build. (None, None, why) when none has; `why` is the
    newest release's reason then, which names the driver it needs.
    """
    listed = [r for r in releases if r.cuda and r.version <= ceiling]
    first_why = ""
    for row in reversed(listed):
        tag, why = cuda_tag_for_driver(driver, row.cuda, variants)
        if tag is not None:
            return row, tag, why
        first_why = first_why or f"torch {row.version} builds {', '.join(row.cuda)}: {why}"
    return None, None, first_why or "no torch release in the data lists CUDA builds"
