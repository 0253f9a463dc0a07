"""Errors the training worker reports as one line on stderr, each with its own exit code.

The codes match cpuperf.errors.ExitCode (2 usage, 3 incompatible host, 130 interrupted); they are
kept here so the worker, which runs in its own process, needs nothing outside cpuperf.train.
"""

from __future__ import annotations

import enum


class TrainExit(enum.IntEnum):
    """Exit codes of `python -m cpuperf.train.worker`."""

    OK = 0
    FAILED = 1  # the run started and hit an error (NaN loss, I/O error, ...)
    BAD_CONFIG = 2  # the settings are malformed or contradict each other
    MISSING_FEATURE = 3  # asked for IPEX / oneCCL / MPI / CUDA that this host or env lacks
    DIST_INIT_FAILED = 8  # torch.distributed could not start (matches LAUNCH_FAILED)
    INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2, a checkpoint was written
    TERMINATED = 143  # SIGTERM: 128 + 15, a checkpoint was written


class TrainError(Exception):
    """A failure meant for the user: a one-line message, the next thing to try, an exit code."""

    code: TrainExit = TrainExit.FAILED

    def __init__(self, message: str, hint: str | None = None, code: TrainExit | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def to_json(self) -> dict:
        """The error as the JSON object printed on stdout in --json mode."""
        return {"error": {"code": int(self.code), "name": self.code.name.lower(),
                          "message": self.message, "hint": self.hint}}


class ConfigError(TrainError, ValueError):
    """Malformed or contradictory settings."""

    code = TrainExit.BAD_CONFIG


class MissingFeatureError(TrainError):
    """A requested optional component (IPEX, oneCCL, CUDA, MPI backend) is not available."""

    code = TrainExit.MISSING_FEATURE


class DistInitError(TrainError):
    """torch.distributed failed to initialise."""

    code = TrainExit.DIST_INIT_FAILED
