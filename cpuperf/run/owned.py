"""Runs cpuperf starts for a search (`--tune`) and owns: each in a session of its own, stopped at its deadline,
and gone when cpuperf goes, however it goes.

Every run carries a marker in its environment (inherited by whatever it starts, in any session or group: a
launcher's ranks, a daemon it forks), and stays in the process tree under cpuperf, which adopts what a run
detaches (`env -i` drops the marker, `setsid` leaves the group; neither leaves the tree). After each run, anything
still carrying the marker, or under cpuperf and started with the run, is killed. A small watchdog process holds
the read end of a pipe from cpuperf and notes that tree: when cpuperf ends, even by SIGKILL, the pipe closes and
the watchdog kills what it noted and what carries the marker, and removes the search's working directory. Where
the host does not let cpuperf adopt them, it says so: then the group and the marker are the only handles. SIGTERM, SIGINT and
SIGHUP to cpuperf stop the run in progress at once and end the command with the signal's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from types import FrameType
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from cpuperf.errors import CpuperfError, exit_code_for_signal

# What signal.signal gives back: a handler, SIG_DFL/SIG_IGN, or None (one set from outside Python).
SignalHandler = Union[Callable[[int, Optional[FrameType]], object], int, None]

MARKER_VAR = "CPUPERF_OWNED_RUN"
MAX_OUTPUT = 4 * 1024 * 1024  # what a run printed, read back for its figure: its tail is enough
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The watchdog: ignores the terminal's and a group's signals (it must outlive cpuperf). While cpuperf lives it
# notes, four times a second (less often where a scan of /proc costs more than 1% of a core), the processes under cpuperf that started after the watchdog (pid and start time:
# cpuperf adopts what the job detaches, so a process that called setsid and cleared its environment is still
# there); when the pipe closes it kills those still alive (the same start time: never a reused pid), what they
# started since, and what carries the marker (until none is left, a few seconds at most), then removes the
# directory. A process started in the last quarter second before a SIGKILL of cpuperf, outside the marker, can
# escape it.
_WATCHDOG = r"""
import os, select, shutil, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
needle, workdir, owner = sys.argv[1].encode() + b"\0", sys.argv[2], int(sys.argv[3])
me = os.getpid()
def table():
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as fh:
                    f = fh.read().rsplit(b")", 1)[1].split()
                out[int(name)] = (int(f[1]), int(f[19]), f[0])
            except (OSError, IndexError, ValueError):
                pass
    return out
def under(now, roots):
    kids = {}
    for pid, row in now.items():
        kids.setdefault(row[0], []).append(pid)
    found, stack = set(), list(roots)
    while stack:
        for child in kids.get(stack.pop(), ()):
            if child != me and child not in found:
                found.add(child)
                stack.append(child)
    return found
def marked():
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open("/proc/%s/environ" % name, "rb") as fh:
                    if needle in fh.read() + b"\0":
                        found.add(int(name))
            except OSError:
                pass
    return found
known, since, wait = {}, None, 0.25
while True:
    ready = select.select([0], [], [], wait)[0]
    if ready and not os.read(0, 4096):
        break
    if owner > 0:
        began = time.process_time()
        now = table()
        if since is None:
            since = now.get(me, (0, 0, b""))[1]
        for pid in under(now, [owner]):
            if now[pid][1] >= since:
                known[pid] = now[pid][1]
        wait = max(0.25, (time.process_time() - began) * 100)  # at most 1% of a core, on a host of many processes
def targets():
    now = table()
    mine = {pid for pid, start in known.items() if pid in now and now[pid][1] == start}
    mine |= under(now, mine) | marked()
    return [pid for pid in mine if pid != me and now.get(pid, (0, 0, b"Z"))[2] != b"Z"]
for _ in range(100):
    left = targets()
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


def start_watchdog(marker: str, workdir: str = "", tree: bool = True) -> subprocess.Popen[bytes]:
    """A process that outlives this one by a moment, however this one ends (SIGKILL too: its pipe closes), and then
    kills every process carrying `marker` in its environment and, with `tree`, every process under this one that
    started after it (noted while this one lives), and removes `workdir`. In a session of its own and deaf to the
    terminal's signals: a Ctrl-C or a kill of this process's group does not take it first."""
    env = {k: v for k, v in os.environ.items() if k != MARKER_VAR}
    owner = str(os.getpid() if tree else 0)
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHDOG, marker, workdir, owner], env=env,
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
        self._old: Dict[int, SignalHandler] = {}
        self._watchdog: Optional[subprocess.Popen[bytes]] = None
        self._count = 0
        self._adopted = False
        self._since = 0  # when the current run started (clock ticks since boot): what started since is its

    def __enter__(self) -> Owner:
        from cpuperf.run.launcher import adopt_orphans, say_no_adoption

        # What a run detaches (setsid, env -i, a double fork) stays under cpuperf: ended after each run.
        self._adopted = adopt_orphans(True)
        if not self._adopted:
            say_no_adoption()
        self._watchdog = start_watchdog(self.marker, self.workdir, tree=self._adopted)
        for sig in _SIGNALS:
            self._old[sig] = signal.signal(sig, self._stop)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._end_current()
        if self._adopted:
            from cpuperf.run.launcher import adopt_orphans

            adopt_orphans(False)
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
            from cpuperf.run.launcher import start_time

            self._since = start_time(self.current.pid)
            try:
                code: Optional[int] = self.current.wait(timeout=max(0.0, timeout))
            except subprocess.TimeoutExpired:
                code = None
            finally:
                self._end_current()
            return code, _tail(log)

    def _end_current(self) -> None:
        """Kill the run's group, everything still carrying its marker (a fork that outlived it) and everything under
        cpuperf that started with or after the run (what it detached with setsid and env -i)."""
        from cpuperf.run.launcher import end_descendants

        proc, self.current = self.current, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.leftovers()
        if proc is not None and self._adopted and self._since:
            watchdog = (self._watchdog.pid,) if self._watchdog is not None else ()
            end_descendants(self._since, exclude=watchdog)
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
