"""Typed levers from a few values, for tests of what reads them (the rest take plain defaults)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from cpuperf.decide.records import Decision, Levers

DEFAULTS: Mapping[str, Any] = {
    "device": "cpu", "dtype": "fp32", "tf32": False, "fp32_math_mode": None, "nproc_per_node": 1, "nnodes": 1,
    "threads_per_rank": 1, "affinity": None, "ddp_backend": None, "ipex": False, "compile": False, "allocator": None,
    "attention": "sdpa", "batch_size": 1, "grad_accum_steps": 1, "grad_checkpointing": False, "optimizer": "adamw",
    "sharding": None, "offload": False, "dataloader_workers": 0, "pin_memory": False, "zero": None}


def levers(values: Mapping[str, Any], overridden: Iterable[str] = ()) -> Levers:
    """Levers with `values` (by id) over DEFAULTS; the ids in `overridden` marked as the user's."""
    unknown = set(values) - set(DEFAULTS)
    assert not unknown, unknown
    mine = set(overridden)
    return Levers(**{k: Decision(k, values.get(k, v), "test", {}, overridden=k in mine) for k, v in DEFAULTS.items()})
