"""Hostfiles (Open MPI `host slots=N`, Intel MPI/MPICH `host:N`, plain `host`), host validation, the one
host resolver (resolve / resolve_all: getaddrinfo with a real timeout), and whether each host is reachable
(a route, ssh where mpirun logs in) and which one is this machine.

Every host name that reaches a shell, an env var or a launcher passes through valid_host() first.
Parsing is linear in the file and bounded (MAX_HOSTFILE_BYTES, MAX_HOSTS): a hostfile is input.
"""

from __future__ import annotations

import ipaddress
import queue
import re
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from cpuperf.errors import UnreachableError, UsageError

# Far above any real cluster (the largest have ~10^4 nodes), far below what makes parsing slow.
MAX_HOSTS = 65536
MAX_HOSTFILE_BYTES = 16 * 1024 * 1024
# What one host can run: the most CPUs a Linux kernel can be built for (x86-64 CONFIG_NR_CPUS with MAXSMP, 8192;
# arch/x86/Kconfig NR_CPUS_RANGE_END); a slot count above it is a typo, not a host (Open MPI and hydra take any).
MAX_SLOTS = 8192
RESOLVE_TIMEOUT_S = 3.0
_RESOLVER_THREADS = 16
_MAX_ROUNDS = 10

# RFC 1123 host names: labels of letters, digits and hyphens, not starting or ending with a hyphen.
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: Optional[int]


def valid_host(text: str) -> bool:
    """A host name (RFC 1123) or an IPv4/IPv6 address; nothing else."""
    if not text or len(text) > 253:
        return False
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    return bool(_HOSTNAME.fullmatch(text))  # fullmatch: `$` alone lets "node01\n" through


def check_host(text: str, what: str = "address") -> str:
    if not valid_host(text):
        raise UsageError(f"{what} {text!r} is not a host name or IP address",
                         hint="use a name like node01 or an address like 10.0.0.1")
    return text


def parse_hostfile_text(text: str, origin: str = "hostfile") -> Tuple[Host, ...]:
    """Parse a hostfile; a malformed line is a UsageError naming the line."""
    hosts: List[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if len(hosts) >= MAX_HOSTS:
            raise UsageError(f"{origin} names more than {MAX_HOSTS} hosts",
                             hint="list each node once; cpuperf reads at most that many")
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        slots: Optional[int] = None
        name = line
        match = re.fullmatch(r"(\S+)\s+(.*)", line)
        if match:  # Open MPI: 'host slots=4 max_slots=8'
            name, rest = match.group(1), match.group(2)
            for option in rest.split():
                key, _, value = option.partition("=")
                if key not in ("slots", "max_slots", "max-slots"):
                    raise UsageError(f"{origin}:{number}: cannot read {raw.strip()[:80]!r}",
                                     hint="write one host per line: 'node01', 'node01:2' or 'node01 slots=2'")
                count = _slot_count(value, f"{origin}:{number}: {key}")
                if key == "slots":
                    slots = count
        elif ":" in line and line.count(":") == 1:  # Intel MPI / MPICH: 'host:4'
            name, _, value = line.partition(":")
            slots = _slot_count(value, f"{origin}:{number}: the slot count of {name[:80]!r}")
        if not valid_host(name):
            raise UsageError(f"{origin}:{number}: {name!r} is not a host name or IP address",
                             hint="one host per line: 'node01', 'node01:2' or 'node01 slots=2'")
        hosts.append(Host(name, slots))
    if not hosts:
        raise UsageError(f"{origin} names no hosts", hint="write one host per line")
    # A Counter, not list.count per name: a hostfile of 10^6 lines takes a second, not minutes.
    dupes = sorted(n for n, count in Counter(h.name for h in hosts).items() if count > 1)
    if dupes:
        shown = ", ".join(dupes[:5]) + (f" (and {len(dupes) - 5} more)" if len(dupes) > 5 else "")
        raise UsageError(f"{origin} names {shown} more than once",
                         hint="list each host once, with its slot count")
    return tuple(hosts)


def _slot_count(value: str, where: str) -> int:
    """A slot count as a hostfile gives it: ASCII digits, 1..MAX_SLOTS (readback's count check); else exit 2."""
    from cpuperf.readback import count

    why = count(1, MAX_SLOTS)(int(value)) if value.isascii() and value.isdigit() and len(value) <= 30 else \
        f"must be a whole number, not {value[:40]!r}"
    if why:
        raise UsageError(f"{where} {why}", hint=f"give the number of processes the host runs (1..{MAX_SLOTS}), "
                         "e.g. 'node01:2' or 'node01 slots=2'")
    return int(value)


def read_hostfile(path: str) -> Tuple[Host, ...]:
    """Read and parse a hostfile: unreadable, too large, binary or non-UTF-8 files are a UsageError."""
    from cpuperf.fsutil import InputRefused, read_capped

    try:  # bounded, never blocking: /dev/zero, a FIFO or a huge file must not hang
        data = read_capped(path, MAX_HOSTFILE_BYTES)
    except OSError as exc:
        raise UsageError(f"cannot read hostfile {path}: {exc.strerror or exc}", hint="check the path") from exc
    except InputRefused as exc:
        raise UsageError(f"hostfile {exc}", hint="write one host per line") from None
    if b"\0" in data:
        raise UsageError(f"hostfile {path} is a binary file, not text", hint="write one host per line")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"hostfile {path} is not UTF-8 text (byte {exc.start})",
                         hint="write one host per line, in UTF-8") from exc
    return parse_hostfile_text(text, origin=path)


# -- resolving ---------------------------------------------------------------------------------------

def _lookup(host: str) -> Optional[str]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError, ValueError):
        return None
    return str(infos[0][4][0]) if infos else None


def resolve_all(names: Iterable[str], timeout: float = RESOLVE_TIMEOUT_S) -> Dict[str, Optional[str]]:
    """name -> first IPv4/IPv6 address, or None when it does not resolve within `timeout`.

    getaddrinfo has no timeout of its own (socket.setdefaulttimeout does not bound it), so lookups run
    in daemon worker threads and the caller waits at most `timeout` per round of workers: a stuck DNS
    server costs seconds, never a hang, and no process-wide socket state changes.
    """
    unique = list(dict.fromkeys(names))
    found: Dict[str, Optional[str]] = {}
    todo: queue.Queue[str] = queue.Queue()
    for name in unique:
        try:
            found[name] = str(ipaddress.ip_address(name))  # a literal address needs no lookup
        except ValueError:
            todo.put(name)
    pending = todo.qsize()
    if pending:
        done: Dict[str, Optional[str]] = {}
        finished = threading.Condition()

        def work() -> None:
            while True:
                try:
                    name = todo.get_nowait()
                except queue.Empty:
                    return
                ip = _lookup(name)
                with finished:
                    done[name] = ip
                    finished.notify_all()

        workers = min(_RESOLVER_THREADS, pending)
        for _ in range(workers):
            threading.Thread(target=work, daemon=True, name="cpuperf-resolve").start()
        # Each round of workers gets `timeout`, 10 rounds at most: a stuck lookup is abandoned, not awaited,
        # and a huge hostfile of stuck names costs seconds, not hours (the rest count as unresolved).
        rounds = min(-(-pending // workers), _MAX_ROUNDS)
        with finished:
            finished.wait_for(lambda: len(done) == pending, timeout=timeout * rounds)
            for name in unique:
                if name not in found:
                    found[name] = done.get(name)
    return found


def resolve(host: str, timeout: float = RESOLVE_TIMEOUT_S) -> Optional[str]:
    """The host's first IPv4/IPv6 address, or None (unresolvable, or no answer within `timeout`)."""
    return resolve_all([host], timeout)[host]


def require_resolvable(hosts: Sequence[Host], timeout: float = RESOLVE_TIMEOUT_S) -> Dict[str, str]:
    """Every host resolves (name -> address), else UnreachableError (exit 7) naming the ones that do not."""
    found = resolve_all([h.name for h in hosts], timeout)
    missing = [name for name, ip in found.items() if ip is None]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        raise UnreachableError(f"host{'s' if len(missing) > 1 else ''} {shown} "
                               f"do{'' if len(missing) > 1 else 'es'} not resolve",
                               hint="check the hostfile and /etc/hosts or DNS")
    return {name: ip for name, ip in found.items() if ip is not None}


def this_node_names(hosts: Optional[Sequence[Host]] = None, node_rank: Optional[int] = None) -> List[str]:
    """The names this machine may have in a plan over several nodes: its hostfile entry, its host name."""
    names = [hosts[node_rank].name] if hosts and node_rank is not None and node_rank < len(hosts) else []
    full = socket.gethostname()
    return names + [full, full.split(".")[0]]


# -- reaching them (cpuperf.run.launcher.locate_node, before a real run) ---------------------------------

def routable(ip: str) -> bool:
    """The kernel has a route to ip (a UDP connect sends nothing)."""
    return _udp_accepts(ip, lambda s: s.connect((ip, 9)))


def is_local(ip: str) -> bool:
    """ip belongs to this host (binding to it works)."""
    return _udp_accepts(ip, lambda s: s.bind((ip, 0)))


def _udp_accepts(ip: str, use: Callable[[socket.socket], None]) -> bool:
    """Whether a UDP socket of ip's family takes `use` without an OSError."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            use(s)
        return True
    except OSError:
        return False


def tcp_open(ip: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_hosts(hosts: Sequence[Host], addresses: Dict[str, str], *, ssh: bool) -> Dict[str, str]:
    """Every host, resolved by the one resolver (cpuperf.probe.hosts.require_resolvable) to `addresses`, is
    routable (and answers on ssh when mpirun must log in): name -> ip."""
    found: Dict[str, str] = {}
    for h in hosts:
        ip = addresses[h.name]
        if not routable(ip):
            raise UnreachableError(f"host {h.name} ({ip}) is unreachable: no route", hint=f"ip route get {ip}")
        if ssh and not is_local(ip) and not tcp_open(ip, 22):
            raise UnreachableError(f"host {h.name} ({ip}) does not answer on ssh (port 22), which mpirun needs",
                                   hint="start cpuperf train --launcher torchrun ... on every node instead")
        found[h.name] = ip
    return found


def local_node_rank(hosts: Sequence[Host], addresses: Dict[str, str]) -> Optional[int]:
    """Index of the hostfile entry that is this machine."""
    for i, h in enumerate(hosts):
        ip = addresses.get(h.name)
        if ip and is_local(ip):
            return i
    return None
