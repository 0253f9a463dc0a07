"""The Slurm job this process runs in, read once from its environment into a typed fact."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple


@dataclass(frozen=True)
class SlurmFacts:
    """What Slurm tells this process: the allocation it is in, and the job's nodes."""

    allocation: Optional[int]  # nodes of the allocation (a batch script or salloc shell); None outside one or in a step
    nodes: Tuple[str, ...]  # the job's node list, expanded; rank 0 runs on the first


NO_SLURM = SlurmFacts(None, ())  # outside any Slurm job


def slurm_facts(environ: Mapping[str, str]) -> SlurmFacts:
    """SLURM_JOB_ID, SLURM_STEP_ID, SLURM_NNODES and SLURM_JOB_NODELIST (or their older names), parsed once."""
    try:
        nodes = tuple(expand_nodelist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""))
    except ValueError:  # a range Slurm never writes ('n[a-b]'): no node list known
        nodes = ()
    return SlurmFacts(_allocation(environ), nodes)


_READ = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST",
         "SLURM_NODELIST")


def slurm_environ(environ: Mapping[str, str]) -> Dict[str, str]:
    """The part of an environment slurm_facts reads: what a plan may be handed without the rest of the shell."""
    return {k: environ[k] for k in _READ if k in environ}


def _allocation(environ: Mapping[str, str]) -> Optional[int]:
    if not environ.get("SLURM_JOB_ID") or environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID"):
        return None
    raw = environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES") or "1"
    try:
        return max(1, int(raw))
    except ValueError:
        return 1


def expand_nodelist(text: str) -> List[str]:
    """Slurm's compressed host list: 'node[01-03,07],gpu1' -> node01 node02 node03 node07 gpu1."""
    out: List[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", text):
        prefix, ranges = match.group(1), match.group(2)
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if hi:
                width = len(lo)
                out.extend(f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
            else:
                out.append(prefix + lo)
    return [h for h in out if h]
