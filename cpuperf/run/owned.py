"""Runs cpuperf starts for a search (`--tune`) and owns: each in a session of its own, stopped at its deadline,
and gone when cpuperf goes, however it goes.

Every run carries a marker in its environment (inherited by whatever it starts, in any session or group: a
launcher's ranks, a daemon it forks). After each run, anything still carrying the marker is killed. A small
watchdog process holds the read end of a pipe from cpuperf: when cpuperf ends, even by SIGKILL, the pipe closes
and the watchdog kills what carries the marker and removes the search's working directory. SIGTERM, SIGINT and
SIGHUP to cpuperf stop the run in progress at once and end the command with the signal's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.errors import CpuperfError, exit_code_for_signal

MARKER_VAR = "CPUPERF_OWNED_RUN"
MAX_OUTPUT = 4 * 1024 * 1024  # what a run printed, read back for its figure: its tail is enough
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The watchdog: ignores the terminal's and a group's signals (it must outlive cpuperf), waits for the pipe to
# close, then kills the marked processes (until none is left, a few seconds at most) and removes the directory.
_WATCHDOG = r"""
import os, shutil, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
needle, workdir = sys.argv[1].encode() + b"\0", sys.argv[2]
sys.stdin.buffer.read()
def marked():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/environ" % name, "rb") as fh:
                    if needle in fh.read() + b"\0":
                        found.append(int(name))
            except OSError:
                pass
    return found
for _ in range(100):
    left = marked()
    if not left:
        break
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.05)
if workdir:
    shutil.rmtree(workdir, ignore_errors=True)
"""


def start_watchdog(marker: str, workdir: str = "") -> subprocess.Popen[bytes]:
    """A process that outlives this one by a moment, however this one ends (SIGKILL too: its pipe closes), and then
    kills every process carrying `marker` in its environment and removes `workdir`. In a session of its own and deaf
    to the terminal's signals: a Ctrl-C or a kill of this process's group does not take it first."""
    env = {k: v for k, v in os.environ.items() if k != MARKER_VAR}
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHDOG, marker, workdir], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def stop_watchdog(watchdog: subprocess.Popen[bytes]) -> None:
    """This process is done with its run: the watchdog sweeps once (nothing should be left) and exits."""
    if watchdog.stdin is not None:
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Stopped(CpuperfError):
    """cpuperf was asked to stop (SIGTERM, SIGINT, SIGHUP) while a run it owns was going: 128 + the signal."""

    def __init__(self, signum: int):
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}: the run in progress was stopped and nothing of it is left",
                         hint="nothing was saved from the unfinished search")
        self.code = exit_code_for_signal(name)


class Owner:
    """Start runs that cannot outlive their deadline or cpuperf. Use as a context manager, in the main thread."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.token = uuid.uuid4().hex
        self.marker = f"{MARKER_VAR}={self.token}"
        self.current: Optional[subprocess.Popen[bytes]] = None
        self._old: Dict[int, Any] = {}
        self._watchdog: Optional[subprocess.Popen[bytes]] = None
        self._count = 0

    def __enter__(self) -> Owner:
        self._watchdog = start_watchdog(self.marker, self.workdir)
        for sig in _SIGNALS:
            self._old[sig] = signal.signal(sig, self._stop)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._end_current()
        if self._watchdog is not None:
            stop_watchdog(self._watchdog)  # it sweeps once more and removes the directory

    def _stop(self, signum: int, _frame: object) -> None:
        for sig in _SIGNALS:  # a second signal while stopping is not a second exception
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    def run(self, argv: Sequence[str], env: Mapping[str, str], timeout: float,
            cwd: Optional[str] = None) -> Tuple[Optional[int], str]:
        """(exit code, or None when it ran past `timeout` and was stopped; what it printed, stdout and stderr
        together). Output goes to a file, not a pipe: a child it forked that keeps the pipe open cannot hold us."""
        from cpuperf.run.rankexec import die_with_parent

        parent = os.getpid()
        self._count += 1
        path = os.path.join(self.workdir, f"run{self._count}.log")
        tmp = os.path.join(self.workdir, "tmp")  # what the run makes in TMPDIR goes with the working directory
        os.makedirs(tmp, exist_ok=True)
        with open(path, "w+b") as log:
            try:
                self.current = subprocess.Popen(
                    list(argv), env={**env, MARKER_VAR: self.token, "TMPDIR": tmp}, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                    preexec_fn=lambda: die_with_parent(parent, signal.SIGKILL))
            except OSError as exc:
                return 127, f"cannot start {argv[0]}: {exc.strerror}"
            try:
                code: Optional[int] = self.current.wait(timeout=max(0.0, timeout))
            except subprocess.TimeoutExpired:
                code = None
            finally:
                self._end_current()
            return code, _tail(log)

    def _end_current(self) -> None:
        """Kill the run's group and everything still carrying its marker (a fork that outlived it)."""
        proc, self.current = self.current, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.leftovers()
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def leftovers(self) -> List[int]:
        """SIGKILL what still carries this owner's marker; their pids."""
        from cpuperf.run.launcher import end_leftovers

        return end_leftovers(self.marker)


def _tail(log: IO[bytes]) -> str:
    size = log.seek(0, os.SEEK_END)
    log.seek(max(0, size - MAX_OUTPUT))
    return log.read(MAX_OUTPUT).decode("utf-8", "replace")
