"""Map a launcher's environment (torchrun, Intel MPI / MPICH, Open MPI, Slurm) to rank facts.

Pure: takes the environment as a mapping, so tests pass dicts. Precedence, first match wins:

1. torchrun / torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
   (https://pytorch.org/docs/stable/elastic/run.html#environment-variables)
2. Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
   (https://docs.open-mpi.org/en/main/tuning-apps/environment-var.html)
3. Intel MPI / MPICH (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
   (Intel MPI reference, "Hydra environment variables"; MPICH sets PMI_RANK / PMI_SIZE)
4. Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
   - only inside a job step (SLURM_STEP_ID set): an sbatch script's own shell also has
     SLURM_PROCID=0 and SLURM_NTASKS=N, and treating it as rank 0 of N would hang.
   (https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES)

torchrun comes first because `srun torchrun ...` / `mpirun torchrun ...` leave the outer
launcher's variables set in torchrun's children, and torchrun's are the ones that describe them.
MASTER_ADDR / MASTER_PORT are taken from the environment when set; otherwise 127.0.0.1:29500 is
only safe when all ranks are on this node (local size == world size), else master_addr is None and
the worker asks the user to set it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from cpuperf.boundary import DEFAULT_MASTER_PORT as BOUNDARY_DEFAULT_PORT
from cpuperf.boundary import LAUNCHER_RANK_VARS

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = BOUNDARY_DEFAULT_PORT


class LaunchEnvError(ValueError):
    """A launcher variable is present but malformed (not an integer, rank out of range)."""


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, and which launcher said so."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: Optional[int]
    master_addr: Optional[str]
    master_port: int
    launcher: str  # "torchrun" | "openmpi" | "mpich" | "slurm"

    def torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads."""
        env = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
               "LOCAL_RANK": str(self.local_rank), "MASTER_PORT": str(self.master_port)}
        if self.master_addr is not None:
            env["MASTER_ADDR"] = self.master_addr
        return env


_SOURCES = LAUNCHER_RANK_VARS  # launcher, rank, size, local rank, local size, required extra variable


def _int(environ: Mapping[str, str], name: str) -> Optional[int]:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        # Slurm writes SLURM_NTASKS_PER_NODE as e.g. "4(x2)"; the leading count is what we need.
        head = raw.strip().split("(")[0].split(",")[0]
        if head.isdigit():
            return int(head)
        raise LaunchEnvError(f"{name}={raw!r} is not an integer") from None


def rank_info(environ: Mapping[str, str]) -> Optional[RankInfo]:
    """RankInfo from the first launcher whose rank and size variables are set, else None."""
    for launcher, v_rank, v_size, v_local, v_lsize, v_need in _SOURCES:
        if v_need is not None and v_need not in environ and "SLURM_STEPID" not in environ:
            continue
        rank, size = _int(environ, v_rank), _int(environ, v_size)
        if rank is None or size is None:
            continue
        if size < 1 or not 0 <= rank < size:
            raise LaunchEnvError(f"{v_rank}={rank} is not within {v_size}={size}")
        local_rank = _int(environ, v_local)
        local_size = _int(environ, v_lsize)
        if local_rank is None:
            local_rank = rank if size == 1 or local_size == size else 0
        port = _int(environ, "MASTER_PORT") or DEFAULT_MASTER_PORT
        addr = environ.get("MASTER_ADDR") or None
        if addr is None and (size == 1 or local_size == size):
            addr = DEFAULT_MASTER_ADDR
        return RankInfo(rank=rank, world_size=size, local_rank=local_rank,
                        local_world_size=local_size, master_addr=addr, master_port=port,
                        launcher=launcher)
    return None
