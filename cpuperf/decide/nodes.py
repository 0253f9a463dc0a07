"""How many nodes a job runs on: one rule, for every command that plans one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from cpuperf.errors import FieldError

if TYPE_CHECKING:  # ccl-env's path counts nodes without a hostfile: no socket or ipaddress to import
    from cpuperf.probe.hosts import Host


def job_nodes(nnodes: Optional[int], hosts: Optional[Sequence[Host]], slurm_nodes: Optional[int],
              planned: Optional[int] = None) -> Tuple[Optional[Tuple[Host, ...]], int]:
    """The job's nodes: --nnodes, else the count a saved plan was made for, else the hostfile's length, else the
    Slurm allocation's, else 1; the hostfile cut to that count (exit 2 where it names fewer)."""
    if nnodes is not None and nnodes < 1:
        raise FieldError("nnodes", nnodes, "{typed} must be at least 1")
    count = nnodes or planned or (len(hosts) if hosts else None) or slurm_nodes or 1
    if hosts and count > len(hosts):
        raise FieldError("nnodes", count, f"{{typed}} but the hostfile names {len(hosts)} host(s)",
                         "list every node in the hostfile, or lower {flag}")
    return (tuple(hosts[:count]) if hosts else None), count
