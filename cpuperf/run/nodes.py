"""Run one command on many nodes at once: bounded parallelism, a timeout per node, partial results.

Every launch is its own process group: a node past its timeout, or one that prints past a bound, has its whole
group killed (ssh, mpirun and their children), and Ctrl-C kills every group still running before it propagates.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.plan.nodes import DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S
from cpuperf.probe import node as nodefacts
from cpuperf.probe.hosts import resolve_all
from cpuperf.probe.node import NodeResult

# What one node may print: its probe's record is a few KiB, the collectives worker's a few lines. A node that prints
# more (a login banner gone wrong, a shell loop, `yes`) is stopped there and is one failed node, not an OOM of cpuperf.
MAX_STDOUT_BYTES = 4 << 20
MAX_STDERR_BYTES = 256 << 10
# After its group is killed, how long a launch's pipes are read for: a process that left the group (setsid, a
# daemon) may hold them open forever, and the timeout is the node's whole budget.
_DRAIN_S = 2.0


@dataclass(frozen=True)
class Launched:
    returncode: Optional[int]  # None: killed at the timeout, or for printing too much
    stdout: str
    stderr: str
    seconds: float
    flooded: Optional[str] = None  # why it was stopped for its output, if it was


class _Groups:
    """The process groups started so far, to kill on timeout or interrupt."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: List[subprocess.Popen[bytes]] = []
        self.closed = False  # after kill_all: a launch still starting is killed as it registers

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self.lock:
            self.procs.append(proc)
            if self.closed:  # Ctrl-C came between this thread's Popen and here: it must not outlive cpuperf
                _kill(proc)

    def kill_all(self) -> None:
        with self.lock:
            self.closed = True
            for proc in self.procs:
                _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


class _Capped:
    """One pipe's bytes up to its cap."""

    def __init__(self, name: str, cap: int) -> None:
        self.name, self.cap, self.data, self.over = name, cap, bytearray(), False

    def take(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        self.data += chunk[:max(0, room)]
        self.over = self.over or len(chunk) > room

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _read_bounded(proc: subprocess.Popen[bytes], timeout: float,
                  groups: Optional[_Groups]) -> Tuple[bool, Optional[str], _Capped, _Capped]:
    """Read both pipes until they close, the deadline, a cap or an interrupt: (timed out, flooded, out, err).
    The group is killed on any stop; the pipes are then read for at most _DRAIN_S more."""
    import selectors

    out, err = _Capped("stdout", MAX_STDOUT_BYTES), _Capped("stderr", MAX_STDERR_BYTES)
    sel = selectors.DefaultSelector()
    for pipe, sink in ((proc.stdout, out), (proc.stderr, err)):
        if pipe is not None:
            sel.register(pipe, selectors.EVENT_READ, sink)
    deadline, stopped_at = time.monotonic() + timeout, None
    timed_out, flooded = False, None
    try:
        while sel.get_map():
            now = time.monotonic()
            if stopped_at is None:
                over = next((s for s in (out, err) if s.over), None)
                if over is not None:
                    flooded = f"printed more than {over.cap >> 10} KiB on {over.name}: stopped there"
                timed_out = over is None and now >= deadline
                if over is not None or timed_out or (groups is not None and groups.closed):
                    _kill(proc)
                    stopped_at = now
            end = deadline if stopped_at is None else stopped_at + _DRAIN_S
            if now >= end:
                break
            _read_ready(sel, min(0.25, end - now))
    finally:
        sel.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return timed_out, flooded, out, err


def _read_ready(sel: selectors.BaseSelector, wait: float) -> None:
    """One round of reads from whichever pipes are ready; a closed pipe leaves the selector."""
    for key, _ in sel.select(max(0.0, wait)):
        chunk = os.read(key.fd, 1 << 16)
        if chunk:
            key.data.take(chunk)
        else:
            sel.unregister(key.fileobj)


def launch(argv: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None,
           groups: Optional[_Groups] = None) -> Launched:
    """Run argv in its own session with a timeout and a bound on what it prints; never raises for a missing
    tool, a timeout or a flood."""
    t0 = time.monotonic()
    if groups is not None and groups.closed:  # interrupted before this launch started
        return Launched(None, "", "interrupted", 0.0)
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=dict(env) if env is not None else None)
    except OSError as exc:
        return Launched(127, "", f"{argv[0]}: {exc.strerror or exc}", time.monotonic() - t0)
    if groups is not None:
        groups.add(proc)
    timed_out, flooded, out, err = _read_bounded(proc, timeout, groups)
    try:  # its pipes are closed; the leader may still run without them
        returncode: Optional[int] = proc.wait(timeout=max(0.0, t0 + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out or flooded or (groups is not None and groups.closed):
        _kill(proc)
        proc.wait()  # SIGKILL: at once
    seconds = time.monotonic() - t0
    if flooded is not None:  # what it printed is not read: a record cut at the cap is no record
        return Launched(None, "", err.text() if not err.over else "", seconds, flooded)
    if timed_out:
        return Launched(None, out.text(), err.text(), seconds)
    return Launched(returncode, out.text(), err.text(), seconds)


def run_each(hosts: Sequence[str], argv_for: Callable[[str], Sequence[str]], *, timeout: float, parallel: int,
             env: Optional[Mapping[str, str]] = None,
             progress: Optional[Callable[[int, int], None]] = None) -> Dict[str, Launched]:
    """argv_for(host) on every host, `parallel` at a time; host -> what happened."""
    groups = _Groups()
    done: Dict[str, Launched] = {}
    count = [0]

    def one(host: str) -> None:
        done[host] = launch(argv_for(host), timeout, env, groups)
        with groups.lock:
            count[0] += 1
            if progress is not None:
                progress(count[0], len(hosts))

    pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts))), thread_name_prefix="cpuperf-node")
    try:
        for future in [pool.submit(one, h) for h in hosts]:
            future.result()
    except BaseException:
        groups.kill_all()  # Ctrl-C or SIGTERM: no node process outlives cpuperf
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return done


def _why(result: Launched, transport: str, timeout: float) -> str:
    """One line: the telling line of what the launcher or the node printed."""
    if result.flooded is not None:
        return result.flooded
    if result.returncode is None:
        return f"no answer within {timeout:g} s"
    _, marked = nodefacts.read_output(result.stdout)
    if marked:
        return marked
    text = "\n".join(line for line in (result.stderr + "\n" + result.stdout).splitlines()
                     if line.strip() and not set(line.strip()) <= set("-*="))  # Open MPI's banner rules
    first = next((line.strip() for line in text.splitlines()), "")
    return (first[:297] + "..." if len(first) > 300 else first) or f"{transport} exited with code {result.returncode}"


def classify(name: str, address: Optional[str], result: Launched, transport: str, timeout: float) -> NodeResult:
    """A NodeResult from one launch."""
    facts, error = nodefacts.read_output(result.stdout)
    seconds = round(result.seconds, 3)
    if facts is not None:
        status = nodefacts.OK if facts.host is not None else nodefacts.PROBE_FAILED
        return NodeResult(name, address, status, facts, error, seconds, transport)
    if result.flooded is not None:
        status = nodefacts.PROBE_FAILED
    elif result.returncode is None:
        status = nodefacts.TIMEOUT
    elif result.returncode == 127 and "no Python" in (error or ""):
        status = nodefacts.NO_PYTHON
    elif error:
        status = nodefacts.PROBE_FAILED
    else:
        status = nodefacts.UNREACHABLE
    return NodeResult(name, address, status, None, _why(result, transport, timeout), seconds, transport)


def probe_nodes(names: Sequence[str], argv_for: Callable[[str], Sequence[str]], transport: str, *,
                timeout: float, parallel: int, env: Optional[Mapping[str, str]] = None,
                progress: Optional[Callable[[int, int], None]] = None) -> List[NodeResult]:
    """Resolve every name (bounded), then probe the ones that resolve; results in the names' order."""
    t0 = time.monotonic()
    addresses = resolve_all(names)
    reachable = [n for n in names if addresses.get(n) is not None]
    launched = run_each(reachable, argv_for, timeout=timeout, parallel=parallel, env=env, progress=progress)
    # A launch that failed outright gets one more try: concurrent mpiruns can collide on their session
    # directories ("A call to mkdir was unable to create the desired directory"), sshd drops
    # connections past MaxStartups. A node that is really down fails again, fast; a hung one is not retried.
    again = [n for n in reachable if launched[n].returncode not in (None, 0)
             and nodefacts.read_output(launched[n].stdout) == (None, None)]
    if again:
        launched.update(run_each(again, argv_for, timeout=timeout, parallel=max(1, parallel // 4), env=env))
    results: List[NodeResult] = []
    for name in names:
        address = addresses.get(name)
        if address is None:
            results.append(NodeResult(name, None, nodefacts.UNRESOLVABLE, None,
                                      f"{name} does not resolve on this host", round(time.monotonic() - t0, 3), transport))
            continue
        results.append(classify(name, address, launched[name], transport, timeout))
    return results


# -- one cluster: how its nodes are reached, then probed ---------------------------------------------

@dataclass(frozen=True)
class Reach:
    """How this cluster's nodes are reached: the transport and what its argv needs."""

    transport: str
    why: str
    mpirun: Optional[Tuple[str, str]]
    ssh: Tuple[str, ...]
    interpreter: str  # the job's interpreter on the nodes
    connect_timeout_s: float

    def argv(self, host: str, program: str, args: Sequence[str]) -> List[str]:
        """argv that runs `program` (python -c text) with `args` on `host`, with the job's interpreter."""
        from cpuperf.plan import nodes as plan

        return plan.node_argv(self.transport, host, plan.python_command(program, self.interpreter, list(args)),
                              mpirun=self.mpirun, ssh=self.ssh, euid=os.geteuid(),
                              connect_timeout_s=self.connect_timeout_s)


def ssh_command(environ: Mapping[str, str]) -> Tuple[str, ...]:
    """CPUPERF_SSH (e.g. 'ssh -p 2222', or a wrapper) else ssh."""
    import shlex

    raw = (environ.get("CPUPERF_SSH") or "").strip()
    return tuple(shlex.split(raw)) if raw else ("ssh",)


def this_host_mpi() -> Optional[Tuple[str, str]]:
    """The MPI launcher on this host, (path, flavour) or None (cpuperf.probe.software.mpi_flavour of its probe): for
    a command that reaches nodes from here without having gathered this host's facts (doctor --hostfile)."""
    from cpuperf.probe import probe_host
    from cpuperf.probe.software import mpi_flavour

    return mpi_flavour(probe_host())


def choose_reach(launcher: Optional[str], hostfile: bool, python: Optional[str], environ: Mapping[str, str],
                 timeout: float = DEFAULT_TIMEOUT_S, *, mpi: Optional[Tuple[str, str]]) -> Reach:
    """The transport the job's own launcher gives (srun to a Slurm allocation's own nodes, mpirun, else ssh);
    LaunchFailedError if none. `hostfile`: the nodes are a hostfile's, not the allocation's. `mpi`: the MPI
    launcher on this host, as the caller's edge found it once (cpuperf.run.edge.Found.mpi, this_host_mpi)."""
    import shutil
    import sys

    from cpuperf.plan import nodes as plan
    from cpuperf.probe.slurm import slurm_facts

    # srun --nodelist starts steps on the allocation's own nodes only: a hostfile may name others, and inside a
    # step (no allocation of its own, cpuperf.probe.slurm) there is none to start them in.
    in_slurm = not hostfile and slurm_facts(environ).allocation is not None
    ssh = ssh_command(environ)
    transport, why = plan.choose_transport(launcher, in_slurm, mpi, shutil.which(ssh[0]))
    return Reach(transport, why, mpi, ssh, os.path.abspath(python or sys.executable), min(10.0, timeout))


def probe_cluster(names: Sequence[str], reach: Reach, *, timeout: float = DEFAULT_TIMEOUT_S, parallel: int = DEFAULT_PARALLEL,
                  progress: Optional[Callable[[int, int], None]] = None) -> List[NodeResult]:
    """cpuperf's probe on every node (the first is the rendezvous host): one NodeResult per name, in order."""
    from cpuperf.run.probe_bundle import bundle_code, probe_args

    code, master = bundle_code(), names[0]
    return probe_nodes(names, lambda host: reach.argv(host, code, probe_args(host, master)), reach.transport,
                       timeout=timeout, parallel=parallel, progress=progress)
