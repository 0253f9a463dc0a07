"""Hostfiles (Open MPI `host slots=N`, Intel MPI/MPICH `host:N`, plain `host`) and host validation.

Every host name that reaches a shell, an env var or a launcher passes through valid_host() first.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from cpuperf.errors import UsageError

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
    return bool(_HOSTNAME.match(text))


def check_host(text: str, what: str = "address") -> str:
    if not valid_host(text):
        raise UsageError(f"{what} {text!r} is not a host name or IP address",
                         hint="use a name like node01 or an address like 10.0.0.1")
    return text


def parse_hostfile_text(text: str, origin: str = "hostfile") -> Tuple[Host, ...]:
    """Parse a hostfile; a malformed line is a UsageError naming the line."""
    hosts: List[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
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
                if key in ("slots", "max_slots", "max-slots") and value.isdigit() and int(value) > 0:
                    if key == "slots":
                        slots = int(value)
                else:
                    raise UsageError(f"{origin}:{number}: cannot read {raw.strip()!r}",
                                     hint="write one host per line: 'node01', 'node01:2' or 'node01 slots=2'")
        elif ":" in line and line.count(":") == 1:  # Intel MPI / MPICH: 'host:4'
            name, _, count = line.partition(":")
            if not count.isdigit() or int(count) < 1:
                raise UsageError(f"{origin}:{number}: {raw.strip()!r} has a bad slot count",
                                 hint="write 'node01:2' with a positive count")
            slots = int(count)
        if not valid_host(name):
            raise UsageError(f"{origin}:{number}: {name!r} is not a host name or IP address",
                             hint="one host per line: 'node01', 'node01:2' or 'node01 slots=2'")
        hosts.append(Host(name, slots))
    if not hosts:
        raise UsageError(f"{origin} names no hosts", hint="write one host per line")
    names = [h.name for h in hosts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"{origin} names {', '.join(dupes)} more than once",
                         hint="list each host once, with its slot count")
    return tuple(hosts)


def read_hostfile(path: str) -> Tuple[Host, ...]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read hostfile {path}: {exc.strerror}", hint="check the path") from exc
    return parse_hostfile_text(text, origin=path)
