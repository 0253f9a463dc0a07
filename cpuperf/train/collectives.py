"""A short allreduce across the nodes, one process per node, with each backend every node has.

Self-contained (standard library + torch, no cpuperf import): it travels to nodes as `python -c`
text, like the probe bundle. Rank 0 prints one marked JSON line with the figures.

Arguments: --rank R --world W --master ADDR --port P [--ifname IF] [--bucket-mb 25] [--iters 5]
(anything else, such as the launch script's --interpreter, is ignored).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
from types import ModuleType
from typing import Dict, Mapping, Optional, Sequence

MARKER = "CPUPERF-COLLECTIVES-JSON:"
BACKENDS = ("gloo", "mpi", "ccl")


def _args(argv: Sequence[str]) -> Dict[str, str]:
    out = {"bucket-mb": "25", "iters": "5", "ifname": ""}
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag.startswith("--") and rest and flag[2:] in ("rank", "world", "master", "port", "ifname", "bucket-mb", "iters"):
            out[flag[2:]] = rest.pop(0)
    return out


def _available() -> Dict[str, Optional[str]]:
    """{backend: None if usable here, else why not}."""
    import torch.distributed as dist

    found: Dict[str, Optional[str]] = {"gloo": None if dist.is_gloo_available() else "torch was built without gloo",
             "mpi": None if dist.is_mpi_available() else "torch was built without MPI (pip wheels have none)"}
    try:
        import oneccl_bindings_for_pytorch  # noqa: F401  (registers the 'ccl' backend)
        found["ccl"] = None
    except ImportError:
        try:
            import torch_ccl  # noqa: F401
            found["ccl"] = None
        except ImportError:
            found["ccl"] = "no oneCCL bindings (oneccl_bind_pt)"
    # MPI's world is the one mpirun made; one launch per node makes n worlds of one: not comparable.
    if found["mpi"] is None:
        found["mpi"] = "needs one mpirun world across the nodes (not measured here)"
    return found


def _measure(dist: ModuleType, torch: ModuleType, nbytes: int, iters: int, world: int) -> Dict[str, object]:
    bucket = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    small = torch.ones(1, dtype=torch.float32)
    for _ in range(2):
        dist.all_reduce(bucket)
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(bucket)
        times.append(time.perf_counter() - t0)
    for _ in range(3):
        dist.all_reduce(small)
    lat = []
    for _ in range(20):
        t0 = time.perf_counter()
        dist.all_reduce(small)
        lat.append(time.perf_counter() - t0)
    t = statistics.median(times)
    algbw = bucket.numel() * 4 / t
    # nccl-tests' bus bandwidth: what each link carries in a ring allreduce, comparable across sizes.
    return {"bucket_bytes": bucket.numel() * 4, "seconds": round(t, 6), "algbw_gbps": round(algbw / 1e9, 4),
            "busbw_gbps": round(algbw * 2 * (world - 1) / world / 1e9, 4) if world > 1 else None,
            "latency_us": round(statistics.median(lat) * 1e6, 1), "iters": iters}


def _problem(a: Mapping[str, str]) -> Optional[str]:
    """Why these arguments cannot run (None: they can): one line for stderr, never a traceback."""
    import math

    for key in ("rank", "world", "master", "port"):
        if key not in a:
            return f"--{key} is required"
    numbers = {"rank": (0, 1 << 20), "world": (1, 1 << 20), "port": (1, 65535), "iters": (1, 100000)}
    for key, (low, high) in numbers.items():
        if not a[key].isdigit() or not low <= int(a[key]) <= high:
            return f"--{key} {a[key][:20]!r} is not a whole number in {low}..{high}"
    if int(a["rank"]) >= int(a["world"]):
        return f"--rank {a['rank']} is not below --world {a['world']}"
    try:
        bucket = float(a["bucket-mb"])
    except ValueError:
        bucket = -1.0
    if not (math.isfinite(bucket) and 0 < bucket <= 4096):
        return f"--bucket-mb {a['bucket-mb'][:20]!r} is not a size in MB (0..4096)"
    import re  # standard library only: this file runs as `python -c` on nodes that may not have cpuperf

    if not re.fullmatch(r"[A-Za-z0-9.:-]{1,253}", a["master"]):
        return f"--master {a['master'][:40]!r} is not a host name or IP address"
    if a["ifname"] and not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", a["ifname"]):
        return f"--ifname {a['ifname'][:40]!r} is not a network interface name"
    return None


def main(argv: Sequence[str]) -> int:
    a = _args(argv)
    problem = _problem(a)
    if problem:
        sys.stderr.write(f"cpuperf.train.collectives: {problem}\n")
        return 2
    rank, world = int(a["rank"]), int(a["world"])
    if a["ifname"]:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", a["ifname"])
        os.environ.setdefault("FI_TCP_IFACE", a["ifname"])
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    here = _available()
    timeout = datetime.timedelta(seconds=60)
    os.environ.update(MASTER_ADDR=a["master"], RANK=str(rank), WORLD_SIZE=str(world))
    # Agree first (over gloo) on the backends every node has: one missing on any rank would hang the rest.
    os.environ["MASTER_PORT"] = a["port"]
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    everyone = [dict(here) for _ in range(world)]
    dist.all_gather_object(everyone, here)
    dist.destroy_process_group()
    results: Dict[str, Dict[str, object]] = {}
    for i, backend in enumerate(BACKENDS):
        why = next((f"{why} (rank {r})" for r, got in enumerate(everyone) for b, why in got.items()
                    if b == backend and why), None)
        if why:
            results[backend] = {"skipped": why}
            continue
        os.environ["MASTER_PORT"] = str(int(a["port"]) + 1 + i)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        try:
            results[backend] = _measure(dist, torch, int(float(a["bucket-mb"]) * 2**20), int(a["iters"]), world)
        finally:
            dist.destroy_process_group()
    if rank == 0:
        print(MARKER + json.dumps({"world": world, "torch": torch.__version__, "backends": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
