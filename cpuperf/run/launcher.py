"""The edge of cpuperf.plan.launch: start a LaunchPlan, watch its ranks, forward Ctrl-C, report who failed.

Rank processes are found through the pid files cpuperf.run.rankexec writes (or the child itself for a
direct launch); what they really run with is read from /proc/<pid>/{status,maps,environ}.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from cpuperf.errors import LaunchFailedError, UnreachableError
from cpuperf.plan.launch import LaunchPlan, RankObservation
from cpuperf.probe.hosts import Host


@dataclass
class ExecResult:
    code: int
    interrupted: bool
    died_first: List[int]  # global ranks whose processes were seen gone first (one poll)
    launcher_output: str
    observations: Dict[int, RankObservation] = field(default_factory=dict)
    wall_s: float = 0.0


# -- hosts -------------------------------------------------------------------------------------------

def resolve(host: str, timeout: float = 3.0) -> Optional[str]:
    """The host's first IPv4/IPv6 address, or None."""
    socket.setdefaulttimeout(timeout)
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return None
    finally:
        socket.setdefaulttimeout(None)
    return str(infos[0][4][0]) if infos else None


def routable(ip: str) -> bool:
    """The kernel has a route to ip (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
        return True
    except OSError:
        return False


def is_local(ip: str) -> bool:
    """ip belongs to this host (binding to it works)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def tcp_open(ip: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_hosts(hosts: Sequence[Host], *, ssh: bool) -> Dict[str, str]:
    """Every host resolves and is routable (and answers on ssh when mpirun must log in): name -> ip."""
    found: Dict[str, str] = {}
    for h in hosts:
        ip = resolve(h.name)
        if ip is None:
            raise UnreachableError(f"host {h.name} does not resolve", hint="check the hostfile and /etc/hosts or DNS")
        if not routable(ip):
            raise UnreachableError(f"host {h.name} ({ip}) is unreachable: no route", hint=f"ip route get {ip}")
        if ssh and not is_local(ip) and not tcp_open(ip, 22):
            raise UnreachableError(f"host {h.name} ({ip}) does not answer on ssh (port 22), which mpirun needs",
                                   hint="use --launcher torchrun and start cpuperf train on every node")
        found[h.name] = ip
    return found


def local_node_rank(hosts: Sequence[Host], addresses: Dict[str, str]) -> Optional[int]:
    """Index of the hostfile entry that is this machine."""
    for i, h in enumerate(hosts):
        ip = addresses.get(h.name)
        if ip and is_local(ip):
            return i
    return None


# -- /proc -------------------------------------------------------------------------------------------

def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state != ["Z"]


def observe(rank: int, pid: int) -> Optional[RankObservation]:
    """What a running rank really has: allowed CPUs, OS threads, OMP_NUM_THREADS, OpenMP, allocator."""
    from cpuperf.probe.parse import parse_cpulist, parse_maps

    status = _read(f"/proc/{pid}/status")
    maps = _read(f"/proc/{pid}/maps")
    if status is None or maps is None:
        return None
    obs = RankObservation(rank=rank, pid=pid)
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            obs.allowed_cpus = tuple(parse_cpulist(value.strip()) or ())
        elif key == "Threads":
            obs.threads = int(value.strip())
    environ = _read(f"/proc/{pid}/environ") or ""
    for item in environ.split("\0"):
        if item.startswith("OMP_NUM_THREADS="):
            obs.omp_num_threads = item.split("=", 1)[1]
    libs = parse_maps(maps)
    obs.openmp = list(libs.openmp)
    obs.allocator = libs.allocator
    return obs


# -- run ---------------------------------------------------------------------------------------------

class _Watch(threading.Thread):
    """Follows rank pid files: samples /proc, notes the first rank to vanish, tails rank 0's log."""

    def __init__(self, plan: LaunchPlan, direct_pid: Optional[int], echo: Optional[TextIO]):
        super().__init__(daemon=True)
        self.plan = plan
        self.direct_pid = direct_pid
        self.echo = echo
        self.stop = threading.Event()
        self.pids: Dict[int, int] = {}
        self.dead_order: List[int] = []
        self.died_first: List[int] = []
        self.observations: Dict[int, RankObservation] = {}
        self._log_pos = 0

    def _pids(self) -> None:
        if self.direct_pid is not None:
            self.pids.setdefault(0, self.direct_pid)
            return
        if not self.plan.log_dir:
            return
        base = self.plan.node_rank * self.plan.nproc_per_node
        for local in range(self.plan.nproc_per_node):
            rank = base + local
            if rank in self.pids:
                continue
            text = _read(os.path.join(self.plan.log_dir, f"rank{rank}.pid"))
            if text and text.strip().isdigit():
                self.pids[rank] = int(text.strip())

    def _tail(self) -> None:
        if self.echo is None or not self.plan.log_dir or self.direct_pid is not None:
            return
        rank0 = self.plan.node_rank * self.plan.nproc_per_node
        path = os.path.join(self.plan.log_dir, f"rank{rank0}.log")
        try:
            with open(path, "rb") as fh:
                fh.seek(self._log_pos)
                chunk = fh.read()
        except OSError:
            return
        if chunk:
            self._log_pos += len(chunk)
            self.echo.write(chunk.decode("utf-8", "replace"))
            self.echo.flush()

    _ticks = 0
    _first_tick = -1

    def tick(self) -> None:
        self._ticks += 1
        self._pids()
        for rank, pid in self.pids.items():
            if rank in self.dead_order:
                continue
            if not alive(pid):
                self.dead_order.append(rank)
                if not self.died_first or self._ticks == self._first_tick:
                    self._first_tick = self._ticks
                    self.died_first.append(rank)
                continue
            obs = observe(rank, pid)
            # Keep the latest sample taken once torch (and its OpenMP runtime) is loaded.
            if obs is not None and (obs.openmp or rank not in self.observations):
                self.observations[rank] = obs
        self._tail()

    def run(self) -> None:
        while not self.stop.is_set():
            self.tick()
            self.stop.wait(0.05)  # fine enough to tell which rank died first
        self.tick()


def execute(plan: LaunchPlan, *, echo: Optional[TextIO] = None, environ: Optional[Dict[str, str]] = None,
            stdout_is_product: bool = False, tee_stderr: bool = False) -> ExecResult:
    """Run the plan; returns the exit code (the child's own for a direct launch) and what was seen.

    stdout_is_product: a direct child's stdout goes to ours (a user's script without --json); else to
    stderr, keeping our stdout for the one summary object. tee_stderr: a direct child's stderr still
    goes to ours, and its tail is kept in launcher_output (to explain a rejected flag).
    """
    env = dict(os.environ if environ is None else environ)
    env.update(plan.env)
    if plan.log_dir:
        Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
        for stale in Path(plan.log_dir).glob("rank*.pid"):
            stale.unlink()
    affinity = plan.affinity

    def preexec() -> None:  # runs in the child between fork and exec
        if affinity:
            os.sched_setaffinity(0, affinity)

    direct = plan.launcher == "direct"
    launcher_log = os.path.join(plan.log_dir, "launcher.log") if (plan.log_dir and not direct) else None
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(list(plan.argv), env=env, preexec_fn=preexec if affinity else None,
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=(None if stdout_is_product else sys.stderr.fileno()) if direct else subprocess.PIPE,
                                stderr=(subprocess.PIPE if tee_stderr else None) if direct else subprocess.STDOUT)
    except FileNotFoundError:
        raise LaunchFailedError(f"{plan.argv[0]} not found", hint="install it, or choose another --launcher") from None
    except OSError as exc:
        raise LaunchFailedError(f"cannot start {plan.argv[0]}: {exc.strerror}") from exc
    watch = _Watch(plan, proc.pid if direct else None, echo)
    watch.start()
    captured: List[str] = []
    reader: Optional[threading.Thread] = None
    if not direct:
        def pump() -> None:
            assert proc.stdout is not None
            with open(launcher_log, "wb") if launcher_log else open(os.devnull, "wb") as log:
                for raw in iter(proc.stdout.readline, b""):
                    log.write(raw)
                    log.flush()
                    captured.append(raw.decode("utf-8", "replace"))
                    if echo is not None:
                        echo.write(raw.decode("utf-8", "replace"))
                        echo.flush()
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
    elif tee_stderr:
        def tee() -> None:
            assert proc.stderr is not None
            for raw in iter(proc.stderr.readline, b""):
                text = raw.decode("utf-8", "replace")
                sys.stderr.write(text)
                sys.stderr.flush()
                captured.append(text)
                del captured[:-200]
        reader = threading.Thread(target=tee, daemon=True)
        reader.start()

    interrupted = False

    def forward(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        try:
            proc.send_signal(signum)  # the launcher (or the worker) stops its ranks cleanly
        except ProcessLookupError:
            pass

    old: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, forward)
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler installed above
                forward(signal.SIGINT, None)
    finally:
        for signum_, handler in old.items():
            signal.signal(signum_, handler)
        watch.stop.set()
        watch.join(timeout=5)
        if reader is not None:
            reader.join(timeout=5)
    if code < 0:
        code = 128 - code  # killed by a signal: the shell's convention
    return ExecResult(code=code, interrupted=interrupted, died_first=list(watch.died_first),
                      launcher_output="".join(captured)[-200_000:], observations=watch.observations,
                      wall_s=time.monotonic() - t0)


def kill_tree(pid: int) -> None:
    """SIGKILL a process group started by execute() (tests, cleanup)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def result_summary_from_metrics(path: str) -> Tuple[Optional[dict], Optional[dict]]:
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
