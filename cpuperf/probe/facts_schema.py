"""The schema of facts read back from a file (doctor --save-facts, recommend --node-facts): every field of
HostFacts typed as its dataclass declares it, and ranged where a value outside the range would be
planned with (cores, memory, CPU ids, the Python version). Pure; a problem is one line naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Callable, Dict, Optional

from cpuperf.versions import is_version

MAX_COUNT = 1 << 20  # cores, CPUs, sockets: far above any host, far below what breaks arithmetic
MAX_BYTES = 1 << 60  # an exabyte of memory
MAX_TEXT = 4096


class FactsError(ValueError):
    """A facts file field with the wrong type or an impossible value."""


# A range: None where a value (already of its field's type) is in it, else the problem.
Rule = Callable[[object], Optional[str]]


def _within(low: float, high: float, *, above: bool = False) -> Rule:
    """low <= v <= high (low < v where `above`); None always fits (its field's type allows it or not)."""
    def rule(v: object) -> Optional[str]:
        if v is None or isinstance(v, (int, float)) and (low < v if above else low <= v) and v <= high:
            return None
        return f"must be in {low}..{high}, not {v}"

    return rule


def _positive(limit: int) -> Rule:
    return _within(1, limit)


def _non_negative(limit: int) -> Rule:
    return _within(0, limit)


def _quota(v: object) -> Optional[str]:
    fits = _within(0, MAX_COUNT, above=True)(v) is None
    return None if fits else f"must be a positive number of CPUs, not {v}"


def _percent(v: object) -> Optional[str]:
    return _within(0, 100)(v)


def _python_version(v: object) -> Optional[str]:
    return None if isinstance(v, str) and is_version(v) else f"is not a Python version: {str(v)[:40]!r}"


# Ranges by field name (the last part of its path); types come from the dataclasses themselves.
RANGES: Dict[str, Rule] = {
    "sockets": _positive(4096), "physical_cores": _positive(MAX_COUNT), "logical_cpus": _positive(MAX_COUNT),
    "threads_per_core": _positive(64), "total_bytes": _positive(MAX_BYTES), "available_bytes": _non_negative(MAX_BYTES),
    "memory_bytes": _non_negative(MAX_BYTES), "memory_limit_bytes": _positive(MAX_BYTES), "shm_bytes": _non_negative(MAX_BYTES),
    "memory_free_bytes": _non_negative(MAX_BYTES), "cpu_quota": _quota, "id": _non_negative(MAX_COUNT), "socket": _non_negative(4096),
    "core": _non_negative(MAX_COUNT), "node": _non_negative(4096), "cgroup_version": lambda v: None if v in (None, 1, 2)
    else "must be 1 or 2", "python": _python_version, "window_s": _non_negative(3600),
    "loadavg_1m": _non_negative(MAX_COUNT), "runnable_others": _non_negative(MAX_COUNT),
    "psi_some_avg10": _percent,
    "slurm_cpus_per_task": _positive(MAX_COUNT), "slurm_cpus_on_node": _positive(MAX_COUNT),
    "slurm_ntasks": _positive(MAX_COUNT), "slurm_nnodes": _positive(MAX_COUNT), "index": _non_negative(4096),
    "numa_node": _non_negative(4096),
}
CPU_ID_LISTS = ("cpus", "offline_cpus", "allowed_cpus", "cpuset")


def check(tp: object, value: object, path: str) -> None:
    """FactsError naming the first field of `value` (JSON) that does not fit type `tp` (a field's type, as its
    dataclass declares it; None: anything)."""
    if value is None:
        if tp is None or _optional(tp):
            return
        raise FactsError(f"{path} is missing or null")
    tp = _strip_optional(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        _check_record(tp, value, path)
    elif typing.get_origin(tp) in (tuple, typing.Tuple):
        if not isinstance(value, list):
            raise FactsError(f"{path} must be a list")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is not Ellipsis:  # a fixed pair, e.g. (cpu, busy fraction)
            if len(value) != 2:
                raise FactsError(f"{path} must be a pair")
            for i, (sub, item) in enumerate(zip(args, value)):
                check(sub, item, f"{path}[{i}]")
            return
        for i, item in enumerate(value):
            check(args[0] if args else None, item, f"{path}[{i}]")
    elif typing.get_origin(tp) in (dict, typing.Dict):
        if not isinstance(value, dict):
            raise FactsError(f"{path} must be an object")
        for key, item in value.items():
            _text(key, f"{path} key")
            check(typing.get_args(tp)[1], item, f"{path}.{key}")
    else:
        _check_scalar(tp, value, path)


def _optional(tp: object) -> bool:
    return typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)


def _strip_optional(tp: object) -> object:
    """Optional[X] -> X; a union of several types -> None (anything)."""
    if typing.get_origin(tp) is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else None
    return tp


def _check_record(tp: type, value: object, path: str) -> None:
    if not isinstance(value, dict):
        raise FactsError(f"{path} must be an object")
    hints = typing.get_type_hints(tp)
    for f in dataclasses.fields(tp):
        where = f"{path}.{f.name}"
        if f.name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FactsError(f"{where} is missing")
            continue
        check(hints[f.name], value[f.name], where)
        rule = RANGES.get(f.name)
        if rule is not None and not isinstance(value[f.name], (list, dict)):
            problem = rule(value[f.name])
            if problem:
                raise FactsError(f"{where} {problem}")
        if f.name in CPU_ID_LISTS and isinstance(value[f.name], list):
            bad = next((c for c in value[f.name] if isinstance(c, int) and not 0 <= c < MAX_COUNT), None)
            if bad is not None:
                raise FactsError(f"{where}: CPU {bad} is out of range")


def _text(value: object, path: str) -> None:
    if not isinstance(value, str):
        raise FactsError(f"{path} must be a string")
    if len(value) > MAX_TEXT:
        raise FactsError(f"{path} is over {MAX_TEXT} characters")


def _check_scalar(tp: object, value: object, path: str) -> None:
    if tp is bool:
        if not isinstance(value, bool):
            raise FactsError(f"{path} must be true or false")
    elif tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise FactsError(f"{path} must be a whole number, not {str(value)[:40]!r}")
    elif tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise FactsError(f"{path} must be a finite number, not {str(value)[:40]!r}")
    elif tp is str:
        _text(value, path)


def check_host(value: object, path: str = "host") -> None:
    """A HostFacts record (its to_json()) as a facts file holds it."""
    from cpuperf.probe.facts import HostFacts

    check(HostFacts, value, path)
