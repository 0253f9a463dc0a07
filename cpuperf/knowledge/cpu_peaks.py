"""The edge of compat/cpu_peaks.toml: which CPU generations have a FLOPs-per-cycle row. Pure."""

from __future__ import annotations

from typing import FrozenSet

from cpuperf.data import load_builtin


def peak_generations() -> FrozenSet[str]:
    """Microarchitectures with a FLOPs-per-cycle row (any variant) in compat/cpu_peaks.toml."""
    return frozenset(name for row in load_builtin("cpu_peaks.toml").get("cpu", []) for name in row["match"])
