"""THE thread count of a rank, in one place (issue 54): how many threads a rank's CPUs give (`threads_on`: the
placement's slots, the GPU ranks, the load adjustment, the measurement under load and the note on a crowded
OMP_NUM_THREADS all call it) and which count a job applies (`rank_threads`: OMP_NUM_THREADS, the launch's per-rank
count, the worker's setting, ccl-env). A newcomer changing how threads are counted edits this file."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # records imports placement, which imports this module
    from cpuperf.decide.records import Levers


def threads_on(cpus: int, budget: Optional[int] = None) -> int:
    """A rank's compute threads: one per compute CPU it may use, within its share of the CPU budget where one
    applies (quota, Slurm, the CPUs other work leaves free); at least one, since no rank runs without a thread."""
    return max(1, cpus if budget is None else min(cpus, budget))


def rank_threads(levers: Levers, auto: bool) -> Optional[int]:
    """The threads each rank runs with (OMP_NUM_THREADS, the launch's per-rank count, the worker's setting, ccl-env):
    the decided count under --auto or where you set it, on CPUs and GPUs alike (torchrun would give GPU ranks 1);
    None (torch's own) otherwise. Beside the record, so ccl-env's start-up reads it without the planner."""
    if not (auto or levers.threads_per_rank.overridden):
        return None
    return levers.threads_per_rank.value
