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

from cpuperf.decide.recommend import Measurements
from cpuperf.errors import ProbeFailedError
from cpuperf.probe.facts import HostFacts


def cache_dir() -> Path:
    base = os.environ.get("CPUPERF_CACHE_DIR") or os.path.join(  # an empty XDG_CACHE_HOME means unset (XDG spec)
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cpuperf")
    return Path(base) / "measurements"


def host_id(facts: HostFacts) -> str:
    """Same CPU, same CPUs allowed, same torch -> same measurements."""
    torch = None
    info = facts.software.packages.get("torch") if facts.software is not None else None
    if info is not None:
        torch = info.version
    key = json.dumps([facts.cpu.model_name, facts.cpu.microarchitecture, list(facts.cpu.isa),
                      list(facts.usable_cpus()), facts.topology.cpu_quota, torch], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


_NUMBERS = ("gemm_fp32_gflops", "gemm_bf16_gflops", "gemm_fp16_gflops", "compile_seconds", "step_seconds",
            "compile_speedup")


def _validated(data: Any) -> Dict[str, Any]:
    """A measurements object with finite positive numbers where the engine does arithmetic; else ValueError."""
    import math

    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    for key in _NUMBERS:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{key} is not a positive number")
    speedups = data.get("allocator_speedup", {})
    if not isinstance(speedups, dict):
        raise ValueError("allocator_speedup is not an object")
    for key, value in speedups.items():
        ok = isinstance(value, dict) if key.endswith("_by_workload") else \
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if not ok:
            raise ValueError(f"allocator_speedup.{key} is not a positive number")
    return data


def load_cached(facts: HostFacts) -> Optional[Measurements]:
    if not facts.live:
        return None
    path = cache_dir() / f"{host_id(facts)}.json"
    try:
        data = _validated(json.loads(path.read_bytes().decode("utf-8")))
        return Measurements.from_json({**data, "source": f"cache {path}"})
    except FileNotFoundError:
        return None
    except OSError as exc:  # unreadable: say so once, measure or decide without it
        sys.stderr.write(f"note: ignoring the measurement cache {path}: {exc.strerror}\n")
        return None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        # Corrupt (a torn write, a hand edit): remove it, so the next bench or --auto run measures again.
        try:
            path.unlink()
            what = "removed"
        except OSError:
            what = "ignored"
        sys.stderr.write(f"note: {what} the corrupt measurement cache {path} ({type(exc).__name__})\n")
        return None


def load_file(path: str) -> Measurements:
    try:
        data = _validated(json.loads(Path(path).read_bytes().decode("utf-8")))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        from cpuperf.errors import UsageError

        why = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise UsageError(f"cannot read measurements {path}: {why}", hint="pass a JSON file written by cpuperf bench --json") from exc
    return Measurements.from_json({**data, "source": f"file {path}"})


def save(facts: HostFacts, results: Dict[str, Any]) -> Path:
    from cpuperf.fsutil import atomic_write_bytes

    path = cache_dir() / f"{host_id(facts)}.json"
    atomic_write_bytes(path, json.dumps(results, indent=2).encode())
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


def run_micro(facts: HostFacts, threads: int, python: str = sys.executable, allocators: bool = True,
              compile: bool = False, size: int = 512, seconds: float = 1.0) -> Dict[str, Any]:
    """The micro-benchmarks the engine uses where its rules are unsure (size, seconds: the GEMM's)."""
    started = time.time()
    results: Dict[str, Any] = {"host_id": host_id(facts), "measured_at": int(started)}
    results.update(gemm_rates(python, size=size, seconds=seconds, threads=threads))
    results.update(gemm_size=size, gemm_seconds=seconds)
    if allocators:
        results["allocator_speedup"] = allocator_speedups(facts, threads, python)
    if compile:
        results.update(compile_measurement(threads, python))
    results["duration_s"] = round(time.time() - started, 2)
    return results


def _benchrun(settings: Dict[str, Any], env_extra: Dict[str, str], python: str, timeout: float = 600.0) -> Optional[Dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(env_extra)
    env.setdefault("PYTHONWARNINGS", "ignore")
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run([python, "-m", "cpuperf.train.bench", json.dumps(settings)], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return None
    return json.loads(lines[-1])


def allocator_libraries(facts: HostFacts) -> Dict[str, str]:
    """One preloadable library per installed allocator (no debug/minimal/profiler variants)."""
    out: Dict[str, str] = {}
    if facts.software is None:
        return out
    for name, paths in facts.software.allocators.items():
        usable = [p for p in paths if not any(tag in os.path.basename(p) for tag in ("minimal", "debug", "profiler"))]
        if usable:
            out[name] = usable[0]
    return out


def allocator_speedups(facts: HostFacts, threads: int, python: str = sys.executable, rounds: int = 2,
                       seconds: float = 3.0, workloads: tuple = ("lm", "mlp")) -> Dict[str, Any]:
    """Throughput with each allocator preloaded over the default, per reference workload, alternating rounds.

    The effect depends on the allocation pattern (measured here: tcmalloc 1.04x on the small LM but
    1.3x on the MLP), so the engine sees every workload's ratio and their geometric mean.
    """
    import math
    import statistics

    libs = allocator_libraries(facts)
    if not libs:
        return {}
    per_workload: Dict[str, Dict[str, float]] = {name: {} for name in libs}
    for workload in workloads:
        settings = {"workload": workload, "size": "small", "threads": threads, "seconds": seconds}
        samples: Dict[str, list] = {name: [] for name in ["default", *libs]}
        for _ in range(rounds):
            for name in samples:
                env = {"OMP_NUM_THREADS": str(threads)}
                if name != "default":
                    env["LD_PRELOAD"] = libs[name]
                res = _benchrun(settings, env, python)
                if res:
                    samples[name].append(res["samples_per_s"])
        base = statistics.median(samples["default"]) if samples["default"] else None
        for name in libs:
            if base and samples[name]:
                per_workload[name][workload] = statistics.median(samples[name]) / base
    out: Dict[str, Any] = {}
    for name, ratios in per_workload.items():
        if ratios:
            out[name] = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
            out[f"{name}_by_workload"] = ratios
    return out


def compile_measurement(threads: int, python: str = sys.executable, seconds: float = 3.0) -> Dict[str, Any]:
    """Compile time and steady speed-up of torch.compile on the built-in LM (slow: tens of seconds)."""
    settings = {"workload": "lm", "size": "small", "threads": threads, "seconds": seconds}
    env = {"OMP_NUM_THREADS": str(threads)}
    eager = _benchrun(settings, env, python)
    compiled = _benchrun({**settings, "compile": True}, env, python, timeout=900)
    if not eager or not compiled:
        return {}
    return {"compile_seconds": max(0.0, compiled["first_step_s"] - eager["first_step_s"]),
            "compile_speedup": compiled["samples_per_s"] / eager["samples_per_s"],
            "step_seconds": 16.0 / eager["samples_per_s"]}


def measure_if_unsure(facts: HostFacts, threads: int, python: str = sys.executable,
                      log: Optional[Any] = None) -> Optional[Measurements]:
    """Measure once per host where a rule is unsure: native bf16 (is it faster?) and installed allocators."""
    if not facts.live:
        return None
    cached = load_cached(facts)
    need_dtype = facts.cpu.bf16_native
    need_alloc = bool(allocator_libraries(facts))
    if cached is not None or not (need_dtype or need_alloc):
        return cached
    if log:
        log("measuring this host once (GEMM rates, allocators); cached for later runs ...")
    results = run_micro(facts, threads, python, allocators=need_alloc)
    save(facts, results)
    return Measurements.from_json({**results, "source": "measured now"})
