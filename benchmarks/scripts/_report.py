"""What a benchmark script reports, wherever its stdout goes (a launcher may send rank output to logs).

Every rank writes what it ran with ($BENCH_RESULT.rank<R>.json: CPUs, torch threads, OMP_NUM_THREADS);
rank 0 also writes the result ($BENCH_RESULT) and prints it as one JSON line.
"""

import json
import os


def rank() -> int:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def world_size() -> int:
    """Processes the launcher started (each doing the same work, whether DDP or independent copies)."""
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def report(result: dict) -> None:
    import torch

    seen = {"rank": rank(), "cpus": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    path = os.environ.get("BENCH_RESULT")
    if path:
        with open(f"{path}.rank{seen['rank']}.json", "w") as fh:
            json.dump(seen, fh)
    if seen["rank"] != 0:
        return
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh)
    print(json.dumps(result), flush=True)
