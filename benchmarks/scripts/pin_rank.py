"""The best hand placement, per rank: `pin_rank.py CMD...` (started once per rank by the launcher, or alone).

Splits the physical cores this process may use into LOCAL_WORLD_SIZE disjoint blocks; local rank R is
pinned to one logical CPU of each core in block R with OMP_NUM_THREADS = the block's size, then execs CMD
(a .py file runs with this Python). What an expert would type; it knows nothing of cpuperf.
"""

import os
import sys


def _core(cpu: int) -> tuple:
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as p, open(base + "core_id") as c:
            return int(p.read()), int(c.read())
    except (OSError, ValueError):
        return (0, cpu)


def blocks(cpus: list, n: int) -> list:
    """n disjoint lists of CPUs, one logical CPU per physical core; each non-empty (cores shared if fewer)."""
    cores: dict = {}
    for cpu in sorted(cpus):
        cores.setdefault(_core(cpu), cpu)  # the first sibling stands for its core
    firsts = sorted(cores.values())
    if len(firsts) < n:
        return [[firsts[i % len(firsts)]] for i in range(n)]
    size, extra = divmod(len(firsts), n)
    out, at = [], 0
    for i in range(n):
        take = size + (1 if i < extra else 0)
        out.append(firsts[at:at + take])
        at += take
    return out


def main() -> None:
    cmd = sys.argv[1:]
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    n = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    mine = blocks(sorted(os.sched_getaffinity(0)), n)[local]
    os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))
    if cmd[0].endswith(".py"):
        cmd = [sys.executable, *cmd]
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
