"""What crosses a process boundary, named once: the variables cpuperf hands from the planner to the launcher,
the per-rank step (run/rankexec.py) and the built-in worker (train/), the rank variables each launcher sets,
and the default rendezvous port. The planner writes these names, the step and the worker read them: a name
spelled in two places would let the two sides drift apart."""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

# cpuperf's own variables, set by the launch plan.
RANK_SLOTS = "CPUPERF_RANK_SLOTS"  # JSON list by local rank: {"cpus": [...], "threads": N}, read by the per-rank step
RANK_LOGDIR = "CPUPERF_RANK_LOGDIR"  # the step writes rank<R>.log and rank<R>.pid here
RANK_PIDDIR = "CPUPERF_RANK_PIDDIR"  # a user's launcher: the step writes only rank<L>.pid here (output stays theirs)
RANK_ERRORS = "CPUPERF_RANK_ERRORS"  # a directory where a worker rank leaves rank<R>.json instead of an error line
RUN_LOCK = "CPUPERF_RUN_LOCK"  # the token of the run-directory lock the launching cpuperf holds
RDZV_TIMEOUT = "CPUPERF_RDZV_TIMEOUT"  # seconds the worker's process group may take to form

# cpuperf's own exports: `ccl-env` writes this beside the variables it sets, `NAME:DIGEST,...` (a digest of each
# value, cpuperf.decide.runtime_env.ours_marker), and a later cpuperf reads it (runtime_env.users_own): a variable
# that still holds the value ccl-env wrote is cpuperf's, not the user's; one changed since is the user's again.
CCL_ENV_MARKER = "CPUPERF_CCL_ENV"

# torch.distributed's conventional rendezvous port (torch/distributed/run.py: --master-port default 29500).
DEFAULT_MASTER_PORT = 29500


class RankVars(NamedTuple):
    """The variables one launcher sets in each rank it starts."""

    launcher: str
    rank: str
    world_size: str
    local_rank: str
    local_world_size: str
    required: Optional[str]  # present only under this launcher (tells srun's tasks from a shell's leftovers)


# In the order a rank looks for them: torchrun, Open MPI, MPICH / Intel MPI (Hydra), Slurm srun.
LAUNCHER_RANK_VARS: Tuple[RankVars, ...] = (
    RankVars("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", None),
    RankVars("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE", None),
    RankVars("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
    RankVars("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_ID"),
)
LOCAL_RANK_VARS = tuple(v.local_rank for v in LAUNCHER_RANK_VARS)
RANK_VARS = tuple(v.rank for v in LAUNCHER_RANK_VARS)
WORLD_SIZE_VARS = tuple(v.world_size for v in LAUNCHER_RANK_VARS)

# A user's own script on a GPU (train --auto): rank 0 writes its real memory peak here (cpuperf/rank_hook/).
GPU_PEAK_FILE = "CPUPERF_GPU_PEAK_FILE"
