"""The error family and the exit codes every cpuperf command shares."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes, the same for every command (listed in the README)."""

    OK = 0
    FOUND_ERROR = 1  # the command ran and found or hit an error (doctor: an error finding)
    USAGE = 2  # bad arguments or bad input the user gave
    INCOMPATIBLE_HOST = 3  # nothing can be planned for this host / combination
    PIP_FAILED = 4  # pip (or the post-install verification) failed; environment restored
    PROBE_FAILED = 5  # a probe that the command cannot do without failed
    BAD_DATA = 6  # a compat data file is malformed
    UNREACHABLE = 7  # a package index or host could not be reached
    LAUNCH_FAILED = 8  # a launcher or tool is missing, or a rank died without its own code
    UNSUPPORTED_PLATFORM = 9  # macOS, Windows: cpuperf serves Linux
    BUSY = 10  # another live run holds the run directory (--out)
    INTERRUPTED = 130  # Ctrl-C


class CpuperfError(Exception):
    """An error meant for the user: one line of message, the next thing to try, an exit code."""

    code: ExitCode = ExitCode.FOUND_ERROR

    def __init__(self, message: str, hint: str | None = None, code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def to_json(self) -> dict:
        return {"error": {"code": int(self.code), "name": self.code.name.lower(),
                          "message": self.message, "hint": self.hint}}


class UsageError(CpuperfError, ValueError):
    code = ExitCode.USAGE


class IncompatibleHostError(CpuperfError):
    code = ExitCode.INCOMPATIBLE_HOST


class PipFailedError(CpuperfError):
    code = ExitCode.PIP_FAILED


class ProbeFailedError(CpuperfError):
    code = ExitCode.PROBE_FAILED


class BadDataError(CpuperfError, ValueError):
    code = ExitCode.BAD_DATA


class UnreachableError(CpuperfError, ConnectionError):
    code = ExitCode.UNREACHABLE


class LaunchFailedError(CpuperfError):
    code = ExitCode.LAUNCH_FAILED


class UnsupportedPlatformError(CpuperfError):
    code = ExitCode.UNSUPPORTED_PLATFORM
