"""Measure allreduce across the nodes (cpuperf/train/collectives.py, one process per node) and cache it.

The cache key is the node set and each node's torch: the DDP backend and bucket size can then be
chosen from `read_cached(names)` (decide.cluster.choose_ddp) without measuring again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from cpuperf.probe.node import NodeResult
from cpuperf.run.nodes import run_each

MARKER = "CPUPERF-COLLECTIVES-JSON:"
DEFAULT_BUCKET_MB = 25.0  # torch DistributedDataParallel(bucket_cap_mb=25), its default
DEFAULT_PORT = 29507


def worker_code() -> str:
    """The allreduce worker's source, to run as `python -c` on each node (read, not imported)."""
    return (Path(__file__).resolve().parent.parent / "train" / "collectives.py").read_text(encoding="utf-8")


def cache_path(names: Sequence[str]) -> Path:
    from cpuperf.run.measure import cache_dir

    key = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    return cache_dir() / "collectives" / f"{key}.json"


def read_cached(names: Sequence[str]) -> Optional[Dict[str, Any]]:
    """The last measurement over exactly these nodes (in this order), or None."""
    try:
        return dict(json.loads(cache_path(names).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def measure(results: Sequence[NodeResult], argv_for: Callable[[str, Sequence[str]], Sequence[str]], *,
            bucket_mb: float = DEFAULT_BUCKET_MB, port: int = DEFAULT_PORT, timeout: float = 180.0) -> Dict[str, Any]:
    """Run the worker on every node at once (a collective needs all of them); rank 0's figures + cache."""
    names = [r.name for r in results]
    master = results[0].address or results[0].name
    ranks = {r.name: i for i, r in enumerate(results)}
    ifnames = {r.name: (r.facts.rendezvous_ifname if r.facts else None) or "" for r in results}

    def args(name: str) -> Sequence[str]:
        return ["--rank", str(ranks[name]), "--world", str(len(results)), "--master", master, "--port", str(port),
                "--ifname", ifnames[name], "--bucket-mb", f"{bucket_mb:g}"]

    t0 = time.monotonic()
    done = run_each(names, lambda n: argv_for(n, args(n)), timeout=timeout, parallel=len(names))
    first = done[names[0]]
    record = next((json.loads(line[len(MARKER):]) for line in first.stdout.splitlines() if line.startswith(MARKER)), None)
    failed = {n: (d.stderr.strip().splitlines() or [f"exit {d.returncode}"])[-1][:300]
              for n, d in done.items() if d.returncode != 0}
    out: Dict[str, Any] = {"nodes": names, "master": master, "bucket_mb": bucket_mb,
                           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "seconds": round(time.monotonic() - t0, 2), "failed": failed}
    if record is not None:
        out.update(record)
        from cpuperf.fsutil import atomic_write_bytes

        path = cache_path(names)
        try:
            os.makedirs(path.parent, exist_ok=True)
            atomic_write_bytes(path, json.dumps(out, indent=1).encode())
            out["cached_at"] = str(path)
        except OSError:
            pass  # a read-only home: the figure is still shown
    return out
