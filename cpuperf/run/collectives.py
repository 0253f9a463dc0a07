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
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, Set, Tuple

from cpuperf.jsonable import JsonObject
from cpuperf.probe.node import NodeResult
from cpuperf.run.nodes import run_each

if TYPE_CHECKING:
    from cpuperf.readback import Check

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


def _schema() -> Tuple[Dict[str, Check], Check, Check]:
    """(the record's fields, one measured backend, one skipped backend), with types and ranges."""
    from cpuperf.readback import count, list_of, map_of, nullable, number, positive, record, text

    fields = {"nodes": list_of(text(253), 65536), "master": text(253), "bucket_mb": positive(1 << 20),
              "measured_at": text(64), "seconds": number(), "failed": map_of(text()), "world": count(1, 65536),
              "torch": text(64), "cached_at": text()}
    measured = record({"bucket_bytes": count(1, 1 << 40), "seconds": positive(), "algbw_gbps": number(),
                       "busbw_gbps": nullable(number()), "latency_us": number(), "iters": count()},
                      required=("bucket_bytes", "seconds", "algbw_gbps", "latency_us"))
    skipped = record({"skipped": text()}, required=("skipped",))
    return fields, measured, skipped


_SAID: Set[str] = set()


def _say(line: str) -> None:
    """A note about the cache, once per process (a plan may read it more than once)."""
    if line not in _SAID:
        _SAID.add(line)
        from cpuperf.output import message

        message(f"note: {line}")


def read_cached(names: Sequence[str]) -> Optional[JsonObject]:
    """The last measurement over exactly these nodes (in this order), or None. Read bounded, without blocking, and
    checked field by field: a bad field or backend is dropped alone and said once; a file that cannot be read,
    or is of other nodes, is not used (said once) and never removed."""
    from cpuperf.readback import Unreadable, entries, pruned, read_json

    path = cache_path(names)
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # a FIFO, a device, too big (InputRefused), not JSON (Unreadable)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"it {exc}" if isinstance(
            exc, Unreadable) else str(exc)
        _say(f"collectives cache {path} is not used: {why}")
        return None
    if not isinstance(data, dict):
        _say(f"collectives cache {path} is not used: it holds no measurement")
        return None
    fields, measured, skipped = _schema()
    kept, notes = pruned(data, fields, str(path))
    if "nodes" in data and kept.get("nodes") != list(names):  # the file name is a digest of the names: a collision
        _say(f"collectives cache {path} is not used: it is of other nodes")
        return None
    if "backends" in kept:
        def backend(v: object) -> Optional[str]:
            if not isinstance(v, dict):
                return "must be an object"
            return skipped(v) if "skipped" in v else measured(v)

        backends, dropped = entries(kept["backends"], backend, f"{path}.backends")
        kept["backends"] = backends
        notes += dropped
    for note in notes:
        _say(f"collectives cache: {note}: not used")
    return kept


def measure(results: Sequence[NodeResult], argv_for: Callable[[str, Sequence[str]], Sequence[str]], *,
            bucket_mb: float = DEFAULT_BUCKET_MB, port: int = DEFAULT_PORT, timeout: float = 180.0) -> JsonObject:
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
    failed: JsonObject = {n: (d.stderr.strip().splitlines() or [f"exit {d.returncode}"])[-1][:300]
              for n, d in done.items() if d.returncode != 0}
    out: JsonObject = {"nodes": [*names], "master": master, "bucket_mb": bucket_mb,
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
