"""accelerate config-file keys valid for an accelerate release (data: compat/hf.toml, kind config-key).

accelerate's config loader rejects a file with any key its config dataclass lacks ("unknown keys"),
so a rendered config carries only keys verified for the installed release.
"""

from __future__ import annotations

from typing import FrozenSet, Optional

from cpuperf.knowledge.hf_flags import coverage, data_note, option_valid
from cpuperf.knowledge.matrix import Matrix

__all__ = ["config_keys", "data_note", "launch_flag_ok"]


def _matrix(matrix: Optional[Matrix]) -> Matrix:
    from cpuperf.knowledge.matrix import default_matrix

    return matrix if matrix is not None else default_matrix()


def config_keys(accelerate_version: Optional[str], matrix: Optional[Matrix] = None) -> FrozenSet[str]:
    """Config-file keys valid for that release (newest checked when None); empty outside the data."""
    m = _matrix(matrix)
    cov = coverage("accelerate", accelerate_version, m)
    return frozenset(r.name for r in m.hf
                     if r.package == "accelerate" and r.kind == "config-key" and option_valid(r, cov))


def launch_flag_ok(flag: str, accelerate_version: Optional[str], matrix: Optional[Matrix] = None) -> bool:
    """True when `accelerate launch` of that release accepts `flag` (e.g. --num_cpu_threads_per_process)."""
    m = _matrix(matrix)
    cov = coverage("accelerate", accelerate_version, m)
    return any(r.package == "accelerate" and r.kind == "launch-flag" and r.name == flag and option_valid(r, cov)
               for r in m.hf)
