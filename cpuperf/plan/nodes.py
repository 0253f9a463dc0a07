"""How to run one command on one node of a cluster: through the launcher the job will use. Pure.

srun inside a Slurm allocation, mpirun (Open MPI, or Intel MPI / MPICH hydra) where one is installed,
ssh where neither fits. Each node gets its own launch, so one dead node costs its own timeout and
never the others' results.
"""

from __future__ import annotations

import shlex
from typing import List, Optional, Sequence, Tuple

from cpuperf.errors import ExitCode, FieldError, LaunchFailedError, UsageError

TRANSPORTS = ("srun", "mpirun", "ssh")
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_PARALLEL = 32  # launches at once: 64 nodes take two rounds, and sshd's MaxStartups (10:30:100) holds

# Run the job's interpreter when the node has it; else any python3, saying the job's one is missing.
# $1 = the program, $2 = the job's interpreter, the rest = the program's arguments.
_RUN_PYTHON = ('c="$1"; p="$2"; shift 2; '
               'if [ -x "$p" ]; then exec "$p" -c "$c" --interpreter "$p" "$@"; fi; '
               'if command -v python3 >/dev/null 2>&1; then exec python3 -c "$c" --interpreter "$p" --interpreter-missing "$@"; fi; '
               'echo "CPUPERF-NODE-ERROR: no Python on this node (neither $p nor python3)"; exit 127')


def choose_transport(asked: Optional[str], in_slurm: bool, mpi: Optional[Tuple[str, str]],
                     ssh: Optional[str]) -> Tuple[str, str]:
    """(transport, why): the launcher the job itself would use to reach the nodes."""
    if asked is not None:
        if asked not in TRANSPORTS:
            raise FieldError("launcher", asked, "{flag} {value!r}: use srun, mpirun or ssh")
        if asked == "mpirun" and mpi is None:
            raise FieldError("launcher", asked, "{typed}, but no Open MPI, Intel MPI or MPICH mpirun was found",
                             "apt-get install openmpi-bin, or use {flag} ssh", code=ExitCode.LAUNCH_FAILED)
        if asked == "ssh" and ssh is None:
            raise FieldError("launcher", asked, "{typed}, but no ssh client was found", "apt-get install openssh-client",
                             code=ExitCode.LAUNCH_FAILED)
        return asked, "as asked"
    if in_slurm:
        return "srun", "inside a Slurm allocation: srun reaches its nodes"
    if mpi is not None:
        return "mpirun", f"mpirun ({mpi[1]}) starts the job's ranks on the nodes"
    if ssh is not None:
        return "ssh", "no srun allocation or mpirun: ssh (BatchMode, no password prompts)"
    raise LaunchFailedError("no way to reach the nodes: no Slurm allocation, mpirun or ssh",
                            hint="install openssh-client or Open MPI, or run inside salloc/sbatch")


def python_command(program: str, interpreter: str, args: Sequence[str]) -> List[str]:
    """argv that runs `program` (python -c text) with the job's interpreter, or python3 if it is missing."""
    return ["sh", "-c", _RUN_PYTHON, "cpuperf-node", program, interpreter, *args]


def node_argv(transport: str, host: str, command: Sequence[str], *, mpirun: Optional[Tuple[str, str]] = None,
              ssh: Sequence[str] = ("ssh",), euid: int = 1000, connect_timeout_s: float = 10.0) -> List[str]:
    """argv that runs `command` on `host` alone through `transport`."""
    if transport == "srun":
        # --overlap: a step beside a running job's steps (Slurm >= 20.11); one task on that one node.
        return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap", "--quiet",
                "--kill-on-bad-exit=1", *command]
    if transport == "mpirun":
        if mpirun is None:
            raise LaunchFailedError("no mpirun to reach the nodes with")
        path, flavour = mpirun
        if flavour == "openmpi":
            argv = [path, "-np", "1", "--host", host, "--bind-to", "none"]
            if euid == 0:
                argv.append("--allow-run-as-root")  # Open MPI refuses root without it
            return [*argv, *command]
        return [path, "-n", "1", "-hosts", host, *command]  # Intel MPI / MPICH hydra
    if transport == "ssh":
        # BatchMode: a node that wants a password fails at once instead of waiting on a prompt.
        return [*ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(connect_timeout_s))}",
                host, "--", shlex.join(list(command))]
    raise UsageError(f"unknown transport {transport!r}")

