"""The edge of cpuperf.plan.launch: start a LaunchPlan, watch its ranks, forward signals, report who failed.

Rank processes are found through the pid files cpuperf.run.rankexec writes (or the child itself for a
direct launch) and followed by cpuperf.run.watch, which costs next to nothing: cpuperf waits on the
child without polling, and its own CPU time while the child runs is measured and reported.

Nothing outlives cpuperf: the run directory is locked for the run's life (a second run into it is
refused before it touches anything), the child gets SIGTERM from the kernel when cpuperf dies
(PR_SET_PDEATHSIG, also set by rankexec in every rank, a user's own launcher's ranks included, so each
rank follows its launcher), SIGTERM/SIGHUP to cpuperf stop the child and, after a grace period, its
whole process group; once the child has ended, any process still carrying this run's environment marker
(a rank its launcher orphaned, in another session or group) is killed, and so is any process under cpuperf
that started with the run (cpuperf adopts what the job detaches, PR_SET_CHILD_SUBREAPER: `setsid env -i`
leaves the group and the marker behind, never the tree); if cpuperf itself is killed a watchdog
(cpuperf.run.owned) kills them: behind `sh -c` or `setsid` no death signal reaches the launcher.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple, Union

from cpuperf.boundary import RANK_ERRORS, RUN_LOCK
from cpuperf.errors import CpuperfError, ExitCode, FilesystemError, LaunchFailedError, UsageError
from cpuperf.fsutil import DirLock, LockBusy, acquire_dir_lock, append_nofollow, ensure_dir, refuse_link
from cpuperf.output import StreamError, write_stream
from cpuperf.plan.launch import LaunchPlan, RankObservation, choose_launcher
from cpuperf.probe.hosts import Host, check_hosts, local_node_rank, require_resolvable
from cpuperf.run import timeline
from cpuperf.run.rankexec import die_with_parent
from cpuperf.run.watch import Watch

# What signal.signal gives back: a handler, SIG_DFL/SIG_IGN, or None (one set from outside Python).
SignalHandler = Union[Callable[[int, Optional[FrameType]], object], int, None]

LOCK_TOKEN_VAR = RUN_LOCK  # the worker finds the run directory locked under this token
ERRORS_VAR = RANK_ERRORS  # the worker leaves rank<R>.json here instead of an error line
STOP_GRACE_S = 20.0  # after SIGTERM/SIGHUP: time for a checkpoint before the group is killed


@dataclass(frozen=True)
class Supervisor:
    """cpuperf's own CPU time (all its threads, user + system) from the child's start to its exit."""

    cpu_s: float
    wall_s: float

    @property
    def cpu_share(self) -> float:
        """Of one core, over the child's life."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> Dict[str, float]:
        return {"cpu_s": round(self.cpu_s, 4), "wall_s": round(self.wall_s, 3), "cpu_share": round(self.cpu_share, 5)}


@dataclass
class ExecResult:
    code: int
    interrupted: bool
    died_first: List[int]  # global ranks whose processes were seen gone first (at one moment)
    launcher_output: str
    observations: Dict[int, RankObservation] = field(default_factory=dict)
    wall_s: float = 0.0
    rank_errors: Dict[int, Dict[str, Any]] = field(default_factory=dict)  # rank -> {code, message, hint}
    signal_name: Optional[str] = None  # the signal that stopped cpuperf (SIGINT, SIGTERM, SIGHUP)
    supervisor: Optional[Supervisor] = None  # cpuperf's own CPU time while the child ran


# -- hosts ---------------------------------------------------------------------------------------------

def locate_node(hosts: Optional[Sequence[Host]], nnodes: int, node_rank: Optional[int], asked: Optional[str],
                slurm_nodes: Optional[int], mpi: Optional[Tuple[str, str]]) -> Tuple[Optional[int], Optional[str]]:
    """A real run, before anything is planned: every host of a hostfile resolves (exit 7); several nodes: each
    reachable by the launcher, and this node's rank among them (--node-rank, else found from its addresses) and
    its address."""
    if not hosts:
        return node_rank, None
    # Several nodes: the launcher does not depend on the ranks per node (world > 1 whatever they are).
    launcher = choose_launcher(asked, nnodes, nnodes, slurm_nodes, mpi)[0] if nnodes > 1 else None
    addresses = require_resolvable(hosts)  # every host of a hostfile resolves before anything starts
    if launcher is None:
        return node_rank, None
    addresses = check_hosts(hosts, addresses, ssh=launcher == "mpirun")
    if node_rank is None:
        node_rank = local_node_rank(hosts, addresses)
        if node_rank is None:
            if launcher == "torchrun":
                raise UsageError("this machine is not in the hostfile", hint="pass --node-rank R (0 = the first host)")
            node_rank = 0
    if node_rank >= len(hosts):
        raise UsageError(f"--node-rank {node_rank} is outside 0..{len(hosts) - 1}")
    if launcher == "mpirun" and node_rank != 0:
        raise UsageError("mpirun starts every node from the first host of the hostfile",
                         hint="run cpuperf train there, or use --launcher torchrun on each node")
    return node_rank, addresses.get(hosts[node_rank].name)

# -- run ---------------------------------------------------------------------------------------------

class _EchoFilter:
    """Hides Python tracebacks and torchrun's failure banner from the live echo (launcher.log keeps all).

    cpuperf says what failed in one line of its own; CPUPERF_DEBUG=1 shows everything.
    """

    _EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")
    # torch elastic's own error log lines ("E1122 16:24:28.097000 18579 torch/distributed/elastic/...")
    _ELASTIC_ERROR = re.compile(r"^E\d{4} [\d:.]+ \d+ torch/distributed/")

    def __init__(self) -> None:
        self.state = "show"  # show | traceback | banner

    def show(self, line: str) -> bool:
        text = line.rstrip("\n")
        if self.state == "banner":
            if text.startswith("====="):
                self.state = "show"
            return False
        if text.startswith("Traceback (most recent call last):"):
            self.state = "traceback"
            return False
        if text.startswith("====="):  # torchrun's failure report, after its traceback or alone
            self.state = "banner"
            return False
        if self._ELASTIC_ERROR.match(text):
            return False
        if self.state == "traceback":
            if not text or text[:1].isspace():
                return False
            if self._EXC_LINE.match(text) or text.startswith(("The above exception", "During handling")):
                return False
            self.state = "show"
        return True


def lock_run_dir(run_dir: str) -> DirLock:
    """The run directory's lock for this run; one line and exit 10 when another live run holds it."""
    try:
        lock = acquire_dir_lock(run_dir, token=uuid.uuid4().hex)
    except LockBusy as exc:
        who = f" ({exc.holder.describe()})" if exc.holder else ""
        raise CpuperfError(f"run directory {run_dir} is in use by another run{who}",
                           hint="wait for that run to end, or pass another --out", code=ExitCode.BUSY) from None
    except FilesystemError:  # a link or a non-file named .lock: said as such (fsutil)
        raise
    except OSError as exc:
        raise FilesystemError(f"cannot lock run directory {run_dir}: {exc.strerror}", hint="pass a writable --out") from None
    if lock.stale is not None:
        from cpuperf.output import message  # the record is a file: its host name is data

        message(f"note: took over the stale lock of a run that is gone ({lock.stale.describe()})")
    return lock


# What cpuperf writes in a run's logs/ (run/rankexec.py: rank<R>.log appended, rank<R>.pid; launcher.log appended).
_LOG_FILE = re.compile(r"(rank[0-9]+\.(log|pid)|launcher\.log)")


def prepare_log_dir(folder: str) -> None:
    """A run's logs/ before any rank starts: made where absent, never through a link (logs/ itself, or a rank's log,
    pid file or launcher.log in it: exit 10, the link named, before anything is written); last run's pid files gone."""
    ensure_dir(folder)
    for name in sorted(os.listdir(folder)):
        if _LOG_FILE.fullmatch(name):
            refuse_link(os.path.join(folder, name))
    for stale in Path(folder).glob("rank*.pid"):
        stale.unlink()


def _start(plan: LaunchPlan, env: Dict[str, str], stdout_is_product: bool,
           tee_stderr: bool = False, tee_stdout: bool = False) -> subprocess.Popen[bytes]:
    """Popen the plan's argv in its own process group, pinned, dying with us (PR_SET_PDEATHSIG)."""
    affinity = plan.affinity
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec
        die_with_parent(parent)
        if affinity:
            os.sched_setaffinity(0, affinity)

    direct = plan.launcher == "direct"
    try:
        return subprocess.Popen(list(plan.argv), env=env, preexec_fn=preexec, start_new_session=not plan.own_session,
                                stdin=subprocess.DEVNULL,
                                stdout=(subprocess.PIPE if tee_stdout else None if stdout_is_product
                                        else sys.stderr.fileno()) if direct else subprocess.PIPE,
                                stderr=(subprocess.PIPE if tee_stderr else None) if direct else subprocess.STDOUT)
    except FileNotFoundError:
        if direct or plan.yours is not None:  # the first word is your command's, not a launcher cpuperf chose
            raise LaunchFailedError(f"{plan.argv[0]}: command not found",
                                    hint="check the first word of your command after `--`") from None
        raise LaunchFailedError(f"{plan.argv[0]} not found", hint="install it, or choose another --launcher") from None
    except OSError as exc:
        raise LaunchFailedError(f"cannot start {plan.argv[0]}: {exc.strerror}") from exc


def _pump(proc: subprocess.Popen[bytes], log: IO[bytes], echo: Optional[TextIO],
          captured: List[str]) -> threading.Thread:
    """A thread copying the launcher's output to `log` (launcher.log, appended; closed at the end), `captured` and
    the echo."""
    quiet = None if os.environ.get("CPUPERF_DEBUG") == "1" else _EchoFilter()

    def pump() -> None:
        assert proc.stdout is not None
        shown = echo
        with log:
            for raw in iter(proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode("utf-8", "replace")
                captured.append(line)
                if shown is not None and (quiet is None or quiet.show(line)):
                    try:  # a closed stderr or its reader gone: dropped (cpuperf.output), the pipe still drained
                        write_stream(shown, line)
                    except StreamError:  # a full disk under 2> FILE: the rest stays in launcher.log
                        shown = None
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return reader


class _Stopper:
    """Signal handling while the child runs: SIGINT to the child; SIGTERM/SIGHUP end the whole group.

    The main thread blocks in waitpid (signal handlers still run: PEP 475 retries the wait after them);
    the grace period after SIGTERM/SIGHUP is a timer that SIGKILLs the group, not a poll.
    """

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen[bytes]] = None  # set once started (signals may come first)
        self.signum: Optional[int] = None
        self.deadline: Optional[float] = None
        self.timer: Optional[threading.Timer] = None
        self.old: Dict[int, SignalHandler] = {}

    def forward(self, signum: int, _frame: object) -> None:
        self.signum = signum
        # The worker checkpoints on SIGTERM (SIGHUP would kill it outright); torchrun stops its ranks.
        sent = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
        if signum != signal.SIGINT and self.deadline is None:
            self.deadline = time.monotonic() + STOP_GRACE_S
        if self.proc is None:
            return  # not started yet: started() passes it on
        self._arm()
        try:
            self.proc.send_signal(sent)
        except ProcessLookupError:
            pass

    def _arm(self) -> None:
        """Past the deadline, SIGKILL the child's group (once; from a timer thread)."""
        if self.deadline is None or self.timer is not None or self.proc is None:
            return
        self.timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), kill_tree, (self.proc.pid,))
        self.timer.daemon = True
        self.timer.start()

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        if self.signum is not None:
            self.forward(self.signum, None)

    def __enter__(self) -> _Stopper:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self.old[sig] = signal.signal(sig, self.forward)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for signum, handler in self.old.items():
            signal.signal(signum, handler)

    def wait(self) -> int:
        """The child's exit status (a blocking wait: no wake-ups while the child runs)."""
        assert self.proc is not None
        while True:
            try:
                code = self.proc.wait()
            except KeyboardInterrupt:  # pragma: no cover - handler installed above
                self.forward(signal.SIGINT, None)
                continue
            if self.timer is not None:
                self.timer.cancel()
            return code


def _rank_errors(errors_dir: str) -> Dict[int, Dict[str, Any]]:
    """The error records ranks left (rank<R>.json), by rank."""
    found: Dict[int, Dict[str, Any]] = {}
    for name in sorted(os.listdir(errors_dir)):
        m = re.fullmatch(r"rank(\d+)\.json", name)
        if not m:
            continue
        try:
            with open(os.path.join(errors_dir, name), encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("message"):
            found[int(m.group(1))] = rec
    return found


def execute(plan: LaunchPlan, *, echo: Optional[TextIO] = None, environ: Optional[Dict[str, str]] = None,
            stdout_is_product: bool = False, run_dir: Optional[str] = None, tee_stderr: bool = False,
            output_log: Optional[str] = None, locked: Optional[Callable[[], None]] = None) -> ExecResult:
    """Run the plan; returns the exit code (the child's own for a direct launch) and what was seen.

    stdout_is_product: a direct child's stdout goes to ours (a user's script without --json); else to
    stderr, keeping our stdout for the one summary object. run_dir (default: the log directory's
    parent, cpuperf train's --out) is locked before anything in it is touched; `locked` is called then (the
    run's plan written into it). output_log: a direct child's stdout and stderr are also appended there (a
    user's script: its full log), as they are shown; PYTHONUNBUFFERED=1 unless the environment sets it, so
    the lines come as the script writes them, not in blocks at its end.
    """
    from cpuperf.run.owned import start_watchdog, stop_watchdog

    run_dir = run_dir or (os.path.dirname(plan.log_dir) if plan.log_dir else None)
    lock = lock_run_dir(run_dir) if run_dir else None
    errors_dir = tempfile.mkdtemp(prefix="cpuperf-rank-errors-")
    # The job's processes are found two ways: the environment marker every process inherits, and the process tree
    # under cpuperf, which adopts what the job detaches (`env -i` drops the marker, `setsid` leaves the group; neither
    # leaves the tree). After the run both are ended; when cpuperf is killed, even by SIGKILL, the watchdog is.
    adopted = adopt_orphans(True)
    if not adopted:
        say_no_adoption()
    watchdog = start_watchdog(f"{ERRORS_VAR}={errors_dir}", errors_dir, tree=adopted)
    since = start_time(watchdog.pid)
    timeline.mark("lock the run directory, start the watchdog")
    try:
        env = dict(os.environ if environ is None else environ)
        env.update(plan.env)
        env[ERRORS_VAR] = errors_dir
        if lock is not None:
            env[LOCK_TOKEN_VAR] = lock.holder.token
        if locked is not None:
            locked()
        if output_log is not None and plan.launcher == "direct":
            env.setdefault("PYTHONUNBUFFERED", "1")
            return _run(plan, env, echo, stdout_is_product, errors_dir, tee_stderr, output_log)
        return _run(plan, env, echo, stdout_is_product, errors_dir, tee_stderr)
    finally:
        if adopted:
            end_descendants(since, exclude=(watchdog.pid,))  # what the job detached, in any session or environment
            adopt_orphans(False)
        shutil.rmtree(errors_dir, ignore_errors=True)
        stop_watchdog(watchdog)
        if lock is not None:
            lock.release()
        timeline.mark("end what the job left, stop the watchdog, unlock")


_NO_ADOPTION = ("note: this host does not let cpuperf adopt the processes your command detaches (no "
                "PR_SET_CHILD_SUBREAPER): one that leaves both its process group and cpuperf's environment marker "
                "(setsid with env -i) may outlive the run")


def say_no_adoption() -> None:
    """Said where the process tree is no handle on the job: only the process group and the marker are."""
    from cpuperf.output import message

    message(_NO_ADOPTION)


def _tee(proc: subprocess.Popen[bytes], captured: List[str]) -> threading.Thread:
    """A direct child's stderr still goes to ours; its tail is kept (to explain a rejected flag)."""
    def tee() -> None:
        assert proc.stderr is not None
        shown = True
        for raw in iter(proc.stderr.readline, b""):
            text = raw.decode("utf-8", "replace")
            if shown:
                try:  # as _pump: the child's stderr is drained whatever becomes of ours
                    write_stream(sys.stderr, text)
                except StreamError:
                    shown = False
            captured.append(text)
            del captured[:-200]

    thread = threading.Thread(target=tee, daemon=True)
    thread.start()
    return thread


def _tee_both(proc: subprocess.Popen[bytes], log: IO[bytes], stdout_is_product: bool,
              captured: List[str]) -> threading.Thread:
    """A direct child's stdout (to ours where it is the product, else to stderr) and stderr (to ours), each line also
    appended to `log` (the run's output.log, closed at the end); stderr's tail kept (to explain a rejected flag)."""
    assert proc.stdout is not None and proc.stderr is not None
    guard = threading.Lock()

    def copy(pipe: IO[bytes], shown: Optional[TextIO], keep: bool) -> None:
        for raw in iter(pipe.readline, b""):
            with guard:
                try:
                    log.write(raw)
                    log.flush()
                except (OSError, ValueError):
                    pass  # a full disk: the log stops, the run and the terminal go on
            text = raw.decode("utf-8", "replace")
            if shown is not None:
                try:  # as _pump: the child's output is drained whatever becomes of ours
                    write_stream(shown, text)
                except StreamError:
                    shown = None
            if keep:
                with guard:
                    captured.append(text)
                    del captured[:-200]

    out = threading.Thread(target=copy, args=(proc.stdout, sys.stdout if stdout_is_product else sys.stderr, False),
                           daemon=True)
    out.start()

    def both() -> None:
        copy(proc.stderr, sys.stderr, True)  # type: ignore[arg-type]  # asserted above
        out.join()
        with guard:
            log.close()

    thread = threading.Thread(target=both, daemon=True)
    thread.start()
    return thread


def _run(plan: LaunchPlan, env: Dict[str, str], echo: Optional[TextIO], stdout_is_product: bool,
         errors_dir: str, tee_stderr: bool = False, output_log: Optional[str] = None) -> ExecResult:
    for folder in {d for d in (plan.log_dir, plan.pid_dir, os.path.dirname(output_log or "")) if d}:
        prepare_log_dir(folder)
    direct = plan.launcher == "direct"
    launcher_log = os.path.join(plan.log_dir, "launcher.log") if (plan.log_dir and not direct) else None
    # Opened before the launch: a link named launcher.log is refused (exit 10) before any rank starts.
    log: Optional[IO[bytes]] = None
    if not direct:
        log = os.fdopen(append_nofollow(launcher_log), "ab") if launcher_log else open(os.devnull, "wb")
    elif output_log is not None:
        log = os.fdopen(append_nofollow(output_log), "ab")
    t0 = time.monotonic()
    timeline.mark("prepare the logs")
    # Handlers first: a SIGTERM right after the start must reach the child, not end cpuperf alone.
    with _Stopper() as stopper:
        try:
            proc = _start(plan, env, stdout_is_product, (tee_stderr or log is not None) and direct,
                          tee_stdout=direct and log is not None)
        except BaseException:
            if log is not None:
                log.close()
            raise
        cpu0, wall0 = time.process_time(), time.monotonic()
        timeline.mark("start the job (its exec)" if direct and plan.yours is None else f"start {_launcher_name(plan)}")
        stopper.started(proc)
        watch = Watch(plan, proc.pid if (direct and not plan.pid_dir) else None, echo)
        watch.start()
        captured: List[str] = []
        if direct and log is not None:
            reader: Optional[threading.Thread] = _tee_both(proc, log, stdout_is_product, captured)
        else:
            reader = _tee(proc, captured) if (direct and tee_stderr) else (None if log is None else _pump(proc, log, echo, captured))
        try:
            code = stopper.wait()
            supervisor = Supervisor(cpu_s=time.process_time() - cpu0, wall_s=time.monotonic() - wall0)
            _mark_job(plan, direct)
        finally:
            kill_tree(proc.pid)  # whatever the child left in its group (it has exited)
            end_leftovers(f"{ERRORS_VAR}={errors_dir}")  # and any process of the job that left the group
            watch.finish(timeout=5)
            if reader is not None:
                reader.join(timeout=5)
            timeline.mark("reap the job's group and output")
    if code < 0:
        code = 128 - code  # killed by a signal: the shell's convention
    name = signal.Signals(stopper.signum).name if stopper.signum else None
    return ExecResult(code=code, interrupted=stopper.signum is not None, died_first=list(watch.died_first),
                      launcher_output="".join(captured)[-200_000:], observations=watch.observations,
                      wall_s=time.monotonic() - t0, rank_errors=_rank_errors(errors_dir), signal_name=name,
                      supervisor=supervisor)


def _mark_job(plan: LaunchPlan, direct: bool) -> None:
    """The job's part of the timeline: under a launcher, from its start to the first rank's exec (the rank's pid
    file, written just before it), then the job until the launcher exits."""
    folder = plan.pid_dir or (plan.log_dir if not direct else None)
    times = []
    for pidfile in Path(folder).glob("rank*.pid") if folder else ():
        try:
            times.append(pidfile.stat().st_mtime)
        except OSError:
            continue
    if times:
        timeline.mark(f"{_launcher_name(plan)} until the first rank's exec", at=timeline.since_boot(min(times)),
                      whose="the launcher")
    timeline.mark("job", whose="the job")


def _launcher_name(plan: LaunchPlan) -> str:
    """The launcher that starts the ranks: cpuperf's, or yours (which cpuperf runs as a direct child)."""
    return f"your {plan.yours.launcher}" if plan.yours is not None else plan.launcher


def job_processes(marker: str) -> List[int]:
    """Processes whose environment holds `marker` (this run's own CPUPERF_RANK_ERRORS=DIR, inherited by every
    process of the job, whatever launcher started it and whatever session or group it moved to)."""
    needle = marker.encode() + b"\0"
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read() + b"\0":
                    found.append(int(name))
        except OSError:
            continue  # gone, or another user's
    return found


def end_leftovers(marker: str) -> List[int]:
    """SIGKILL every process of the job still running after its launcher ended (a rank its launcher
    orphaned); returns their pids. Children of ours among them are reaped."""
    left = job_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in left:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return left


# -- the process tree: a handle that neither `env -i` nor `setsid` escapes ------------------------------

PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans of our descendants are re-parented to us, not to init


def adopt_orphans(on: bool) -> bool:
    """Linux: make this process its descendants' subreaper (on), or stop (off), so that a process the job detaches
    (setsid, a double fork) stays in our tree; False where the host does not allow it (then it is said)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _proc_table() -> Dict[int, Tuple[int, int, str]]:
    """pid -> (parent pid, start time in clock ticks since boot, state) of every process (/proc/PID/stat)."""
    table: Dict[int, Tuple[int, int, str]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            table[int(name)] = (int(fields[1]), int(fields[19]), fields[0].decode("ascii", "replace"))
        except (OSError, IndexError, ValueError):
            continue  # gone, or not readable
    return table


def start_time(pid: int) -> int:
    """When `pid` started (clock ticks since boot; 0 where it cannot be read)."""
    return _proc_table().get(pid, (0, 0, ""))[1]


def descendants(root: int, since: int = 0, exclude: Sequence[int] = ()) -> List[int]:
    """The processes under `root` in the process tree that started at or after `since`, leaving out the subtrees
    of `exclude` (a watchdog); zombies included (they are reaped, not killed)."""
    table = _proc_table()
    children: Dict[int, List[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: List[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child in exclude or child in found:
                continue
            stack.append(child)
            if table[child][1] >= since:
                found.append(child)
    return found


def end_descendants(since: int, exclude: Sequence[int] = ()) -> List[int]:
    """SIGKILL every process under this one started at or after `since` (the job's: with adopt_orphans, one that
    called setsid and cleared its environment is still here) and reap those that are our children; their pids."""
    ended: List[int] = []
    for _ in range(40):
        left = descendants(os.getpid(), since, exclude)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02 if left else 0)
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        ended += [p for p in left if p not in ended]
        if not left:
            break
    return ended


def kill_tree(pid: int) -> None:
    """SIGKILL a process group started by execute() (tests, cleanup)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def result_summary_from_metrics(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """(last summary record, last settings record's runtime report) of a worker metrics file."""
    import json

    summary = runtime = None
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") == "summary":
                    summary = rec
                elif rec.get("type") == "settings":
                    runtime = rec.get("runtime")
                    summary = None  # a new segment starts
    except OSError:
        pass
    return summary, runtime
