"""Nodes as network namespaces on one bridge (root only), and an rsh agent that reaches them.

Node i is namespace <tag>n<i> holding 10.99.0.<i>/24 on a veth whose peer sits on bridge br0 in
namespace <tag>sw. The agent is what ssh is on a real cluster: Open MPI's plm_rsh_agent (mpirun) and
CPUPERF_SSH (doctor's ssh transport) call it as `agent [options] HOST [--] COMMAND`; it runs COMMAND in
that node's namespace, under a hostname of its own (a UTS namespace) and with that node's own
environment file. A host that is no namespace goes to the real ssh client, which fails as it would.
Only the OS edge (how a command reaches a node) is stand-in; mpirun, its daemons, TCP between the
nodes and the probe are real.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

AGENT = r'''#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
[ "$1" = "--" ] && shift
dir=$(dirname "$0")
line=$(grep "^$host " "$dir/map" | head -1)
if [ -z "$line" ]; then exec ssh -o BatchMode=yes -o ConnectTimeout=3 "$host" "$*"; fi
ns=${line#* }
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1"; set -a; . "$2"; set +a; exec sh -c "$3"' sh "$ns" "$dir/$ns.env" "$*"
'''


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


class Nodes:
    def __init__(self, tag: str, count: int, workdir: Path):
        self.tag, self.count, self.dir = tag, count, workdir
        self.names = [f"{tag}n{i}" for i in range(1, count + 1)]
        self.addresses = [f"10.99.0.{i}" for i in range(1, count + 1)]
        self.agent = workdir / "agent.sh"

    def set_env(self, index: int, env: Dict[str, str]) -> None:
        """That node's own environment (what its shell profile would set)."""
        import shlex

        (self.dir / f"{self.names[index]}.env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))

    def hostfile(self, extra: List[str] = (), count: Optional[int] = None) -> Path:
        path = self.dir / f"hosts{count or self.count}"
        path.write_text("\n".join([*self.addresses[:count or self.count], *extra]) + "\n")
        return path

    def set_hosts(self, index: int, entries: Dict[str, str]) -> None:
        """That node's /etc/hosts (`ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts)."""
        path = Path("/etc/netns") / self.names[index] / "hosts"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in entries.items()))

    def name_table(self) -> Dict[str, str]:
        """Each node's namespace name -> its address: the /etc/hosts a cluster would have."""
        return dict(zip(self.names, self.addresses))

    def env(self) -> Dict[str, str]:
        """What the launching shell on node 1 needs: mpirun and ssh both go through the agent."""
        return {"OMPI_MCA_plm_rsh_agent": str(self.agent), "CPUPERF_SSH": str(self.agent)}

    def on_first(self, argv: List[str]) -> List[str]:
        """argv run on node 1 (an admin's shell there)."""
        return ["ip", "netns", "exec", self.names[0], *argv]


@contextlib.contextmanager
def namespace_nodes(count: int, workdir: Path) -> Iterator[Nodes]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs ip (iproute2) and unshare (util-linux)")
    tag = "c" + uuid.uuid4().hex[:5]
    nodes = Nodes(tag, count, workdir)
    switch = f"{tag}sw"
    made = []
    try:
        steps = [("netns", "add", switch), ("-n", switch, "link", "add", "br0", "type", "bridge"),
                 ("-n", switch, "link", "set", "br0", "up")]
        for i in range(1, count + 1):
            ns, veth, peer = f"{tag}n{i}", f"{tag}v{i}", f"{tag}p{i}"
            steps += [("netns", "add", ns), ("link", "add", veth, "type", "veth", "peer", "name", peer),
                      ("link", "set", veth, "netns", ns), ("link", "set", peer, "netns", switch),
                      ("-n", switch, "link", "set", peer, "master", "br0"), ("-n", switch, "link", "set", peer, "up"),
                      ("-n", ns, "addr", "add", f"10.99.0.{i}/24", "dev", veth), ("-n", ns, "link", "set", veth, "up"),
                      ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            proc = _ip(*step)
            if step[0] == "netns" and step[1] == "add":
                made.append(step[2])
            if proc.returncode != 0:
                pytest.skip(f"ip {' '.join(step)} failed: {proc.stderr.strip()}")
        nodes.agent.write_text(AGENT)
        nodes.agent.chmod(0o755)
        (workdir / "map").write_text("".join(f"{a} {n}\n{n} {n}\n" for a, n in zip(nodes.addresses, nodes.names)))
        for i in range(count):
            nodes.set_env(i, {})
        yield nodes
    finally:
        for name in reversed(made):
            _ip("netns", "del", name)  # a namespace's veth ends go with it
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
