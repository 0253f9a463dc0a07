"""Measurements for the engine: micro-benchmarks run in a child process, cached per host identity.

`cpuperf bench` fills the cache; `recommend` reads it (never with --sysroot: a snapshot's host is
not this one).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from cpuperf.errors import ProbeFailedError
from cpuperf.probe.facts import HostFacts
from cpuperf.recommend import Measurements


def cache_dir() -> Path:
    base = os.environ.get("CPUPERF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cpuperf")
    return Path(base) / "measurements"


def host_id(facts: HostFacts) -> str:
    """Same CPU, same CPUs allowed, same torch -> same measurements."""
    torch = None
    if facts.software is not None and facts.software.packages.get("torch"):
        torch = facts.software.packages["torch"].version
    key = json.dumps([facts.cpu.model_name, facts.cpu.microarchitecture, list(facts.cpu.isa),
                      list(facts.usable_cpus()), facts.topology.cpu_quota, torch], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def load_cached(facts: HostFacts) -> Optional[Measurements]:
    if not facts.live:
        return None
    path = cache_dir() / f"{host_id(facts)}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Measurements.from_json({**data, "source": f"cache {path}"})


def load_file(path: str) -> Measurements:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        from cpuperf.errors import UsageError

        raise UsageError(f"cannot read measurements {path}: {exc}", hint="pass a JSON file written by cpuperf bench --json") from exc
    return Measurements.from_json({**data, "source": f"file {path}"})


def save(facts: HostFacts, results: Dict[str, Any]) -> Path:
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{host_id(facts)}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, path)
    return path


# Runs in a child interpreter: torch is never imported by cpuperf's own process.
_GEMM_SCRIPT = r"""
import json, sys, time
import torch
n = int(sys.argv[1]); seconds = float(sys.argv[2]); threads = int(sys.argv[3])
if threads > 0:
    torch.set_num_threads(threads)
out = {"threads": torch.get_num_threads(), "torch": torch.__version__}
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    a = torch.randn(n, n, dtype=dtype); b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up: oneDNN primitive creation
    count, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b); count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    out["gemm_%s_gflops" % name] = 2.0 * n ** 3 * count / elapsed / 1e9
print(json.dumps(out))
"""


def gemm_rates(python: str = sys.executable, size: int = 512, seconds: float = 1.0,
               threads: int = 0, timeout: float = 120.0) -> Dict[str, Any]:
    """fp32 and bf16 GEMM rates (GFLOP/s), measured in a child process."""
    try:
        proc = subprocess.run([python, "-c", _GEMM_SCRIPT, str(size), str(seconds), str(threads)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ProbeFailedError(f"the GEMM benchmark took over {timeout:.0f} s", hint="retry on an idle host") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeFailedError(f"the GEMM benchmark failed: {last}", hint="check that torch imports: cpuperf doctor")
    return json.loads(proc.stdout)


def run_micro(facts: HostFacts, threads: int, python: str = sys.executable) -> Dict[str, Any]:
    """The quick micro-benchmarks the engine uses where its rules are unsure."""
    started = time.time()
    results: Dict[str, Any] = {"host_id": host_id(facts), "measured_at": int(started)}
    results.update(gemm_rates(python, threads=threads))
    results["duration_s"] = round(time.time() - started, 2)
    return results
