"""Errors the training worker reports as one line on stderr, each with its own exit code.

The codes extend cpuperf.errors.ExitCode (2 usage, 3 incompatible host, 8 launch failed, 130
interrupted) with the worker's own SIGTERM code.
"""

from __future__ import annotations

import enum

from cpuperf.errors import CpuperfError, ExitCode


class TrainExit(enum.IntEnum):
    """Exit codes of `python -m cpuperf.train.worker`."""

    OK = int(ExitCode.OK)
    FAILED = int(ExitCode.FOUND_ERROR)  # the run started and hit an error (NaN loss, I/O error, ...)
    BAD_CONFIG = int(ExitCode.USAGE)  # the settings are malformed or contradict each other (cpuperf.worker_settings.ConfigError)
    MISSING_FEATURE = int(ExitCode.INCOMPATIBLE_HOST)  # asked for IPEX / oneCCL / MPI / CUDA that this host or env lacks
    DIST_INIT_FAILED = int(ExitCode.LAUNCH_FAILED)  # torch.distributed could not start (matches LAUNCH_FAILED)
    BUSY = int(ExitCode.BUSY)  # another live run holds out_dir
    INTERRUPTED = int(ExitCode.INTERRUPTED)  # SIGINT (Ctrl-C): 128 + 2, a checkpoint was written
    FILESYSTEM = int(ExitCode.FILESYSTEM)  # a file cannot be written: no space left, read-only, permissions
    TERMINATED = int(ExitCode.TERMINATED)  # SIGTERM: 128 + 15, a checkpoint was written
    HANGUP = int(ExitCode.HANGUP)  # SIGHUP: 128 + 1, a checkpoint was written


class TrainError(CpuperfError):
    """A failure meant for the user: a one-line message, the next thing to try, an exit code."""

    code = TrainExit.FAILED  # type: ignore[assignment]  # the worker's own exit codes (TrainExit, not ExitCode)


class MissingFeatureError(TrainError):
    """A requested optional component (IPEX, oneCCL, CUDA, MPI backend) is not available."""

    code = TrainExit.MISSING_FEATURE


class DistInitError(TrainError):
    """torch.distributed failed to initialise."""

    code = TrainExit.DIST_INIT_FAILED


class RunDirBusyError(TrainError):
    """Another live run holds the run directory's lock."""

    code = TrainExit.BUSY


class DiskFullError(TrainError):
    """A write hit ENOSPC: said as such, with the path, not as the library's own wording."""

    code = TrainExit.FILESYSTEM  # exit code 10 (docs/exit-codes.md)
