"""The error family and the exit codes every cpuperf command shares."""

from __future__ import annotations

import enum
from typing import Protocol


class ExitCode(enum.IntEnum):
    """Exit codes, the same for every command (listed in docs/exit-codes.md)."""

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
    FILESYSTEM = 10  # a file or directory cannot be read or written (permissions, read-only, disk full)
    INSTALL_UNFINISHED = 11  # an earlier install was killed half-way: `cpuperf install --recover`
    BUSY = 12  # another live run holds the run directory (--out)
    PLAN_MISMATCH = 13  # a saved plan (--plan) was made for another host or stack
    NODES_DIFFER = 14  # the nodes of a multi-node job differ in a way that breaks it (torch, oneCCL, Python, names)
    HANGUP = 129  # SIGHUP (128 + 1): the terminal went away
    INTERRUPTED = 130  # Ctrl-C (SIGINT, 128 + 2)
    TERMINATED = 143  # SIGTERM (128 + 15): a batch scheduler, `timeout`, `kill`


# A stop by signal ends every cpuperf process (the CLI, an install, the built-in worker) with 128 + the signal,
# as a shell reports it: the one map, by signal name.
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_EXIT_ON_SIGNAL = {"SIGINT": ExitCode.INTERRUPTED, "SIGTERM": ExitCode.TERMINATED, "SIGHUP": ExitCode.HANGUP}


def exit_code_for_signal(name: str | None) -> ExitCode:
    """SIGINT 130, SIGTERM 143, SIGHUP 129; anything else (or unknown) counts as an interrupt."""
    return _EXIT_ON_SIGNAL.get(name or "SIGINT", ExitCode.INTERRUPTED)


class CpuperfError(Exception):
    """An error meant for the user: one line of message, the next thing to try, an exit code."""

    code: ExitCode = ExitCode.FOUND_ERROR

    def __init__(self, message: str, hint: str | None = None, code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, dict[str, object]]:
        return {"error": {"code": int(self.code), "name": self.code.name.lower(),
                          "message": self.message, "hint": self.hint}}


class UsageError(CpuperfError, ValueError):
    code = ExitCode.USAGE


class FieldError(UsageError):
    """A value the user gave for one field cannot be used (exit 2), said about the field, never a flag: pure layers
    raise it, and the command that read the value names the flag the user typed (cpuperf.commands.flags, at the
    error boundary). Like packaging's InvalidMarker, it knows nothing of a command line.

    `field`: a knob id when `setting` (a `--set` key, the decision vocabulary), else an option's field (`nnodes`,
    `params`, `master_port`). `template` and `hint_template` are str.format templates: `{typed}` is the field as
    the user typed it with its value, `{flag}` the field alone, `{value}` the value (`{value!r}` quoted),
    `{set.KEY}` another --set key and `{opt.FIELD}` another option. Until a command names the flags, `message`
    reads with the fields' own names (`nnodes 0 must be at least 1`, `dtype=bf17: expected one of ...`)."""

    def __init__(self, field: str, value: object, template: str, hint_template: str | None = None,
                 setting: bool = False, code: ExitCode | None = None):
        self.field, self.value, self.setting = field, value, setting
        self.template, self.hint_template = template, hint_template
        message, hint = self.render(_plain_spelling)
        super().__init__(message, hint, code)

    def render(self, spell: Spelling) -> tuple[str, str | None]:
        """(message, hint) with each field spelled by `spell(field, setting, value)` (value None: the field alone)."""
        names = {"typed": spell(self.field, self.setting, str(self.value)), "flag": spell(self.field, self.setting, None),
                 "value": self.value, "set": _Names(spell, True), "opt": _Names(spell, False)}
        return (self.template.format_map(names),
                None if self.hint_template is None else self.hint_template.format_map(names))

    def as_option(self) -> FieldError:
        """The same error about the option of the same name (a value read from `--batch-size`, checked as the
        `batch_size` setting is)."""
        return FieldError(self.field, self.value, self.template, self.hint_template, False, self.code)


def verbatim(text: object) -> str:
    """Text put into a FieldError template as it is (a path, a model name): its braces doubled."""
    return str(text).replace("{", "{{").replace("}", "}}")


class Spelling(Protocol):
    def __call__(self, field: str, setting: bool, value: str | None) -> str: ...


def _plain_spelling(field: str, setting: bool, value: str | None) -> str:
    """A field by its own name: `nnodes 0`, `dtype=bf16`, `seq_len`."""
    if value is None:
        return field
    return f"{field}={value}" if setting else f"{field} {value}"


class _Names:
    """`{set.KEY}` / `{opt.FIELD}` in a template: another field, spelled alone."""

    def __init__(self, spell: Spelling, setting: bool):
        self._spell, self._setting = spell, setting

    def __getattr__(self, field: str) -> str:
        return self._spell(field, self._setting, None)


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


class NodesDifferError(CpuperfError):
    code = ExitCode.NODES_DIFFER


class FilesystemError(CpuperfError, OSError):
    code = ExitCode.FILESYSTEM


def one_line(text: str, limit: int = 400) -> str:
    """A message as one line: the first line of a multi-line text, with a count of the rest."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    # A traceback's telling line is its last one (the exception); other texts lead with the point.
    head = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    first = head if len(lines) == 1 else f"{head} (+{len(lines) - 1} more line(s); CPUPERF_DEBUG=1 shows all)"
    return first if len(first) <= limit else first[:limit - 3] + "..."


def from_os_error(exc: OSError) -> FilesystemError:
    """An OSError the host caused (permissions, read-only, full disk) as one line naming the path."""
    import errno

    path = exc.filename if exc.filename is not None else "a file"
    why = exc.strerror or type(exc).__name__
    if exc.errno == errno.ENOSPC:
        return FilesystemError(f"no space left on the device holding {path}", hint="free some space, or choose another path")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return FilesystemError(f"cannot use {path}: {why}",
                               hint="choose a path you can write (--out DIR, CPUPERF_CACHE_DIR, HOME)")
    if exc.errno == errno.ELOOP:
        return FilesystemError(f"cannot use {path}: {why}",
                               hint=f"its symbolic links point at each other: `ls -l {path}`, then link it to a real file")
    return FilesystemError(f"cannot use {path}: {why}", hint="check the path (a file where a directory should be?)")
