"""Measurements for the engine: micro-benchmarks run in a child process, cached with a life span.

`cpuperf bench` fills the cache; `recommend` reads it (never with --sysroot: a snapshot's host is
not this one). Each entry records when it was taken, the torch build, the load on the host just
before and after, and the spread of its repeats. The key is the host identity and the torch build;
an entry expires after [measure].max_age_days. One taken under load or with a wide spread is not
trusted: `train --auto` measures again, `recommend` uses it with the flag in its source, and
`cpuperf bench --refresh` redoes it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from cpuperf.decide.allocator import allocator_rule, preload_env
from cpuperf.decide.recommend import compile_worth_measuring
from cpuperf.decide.records import Measurements
from cpuperf.decide.threads import threads_on
from cpuperf.decide.workload import Workload
from cpuperf.errors import CpuperfError, ExitCode, ProbeFailedError, UsageError
from cpuperf.jsonable import JsonObject
from cpuperf.knowledge.bf16 import bf16_native
from cpuperf.knowledge.tuning import Measure as MeasureRule
from cpuperf.knowledge.tuning import tuning
from cpuperf.knowledge.variables import variables
from cpuperf.probe.facts import HostFacts

if TYPE_CHECKING:
    from cpuperf.decide.ratios import Ratio
    from cpuperf.output import Progress

SCHEMA = "cpuperf.measurement/2"


def cache_dir() -> Path:
    from cpuperf.fsutil import cache_root

    return cache_root() / "measurements"


def torch_build(facts: HostFacts) -> Dict[str, Optional[str]]:
    """The torch build measurements belong to: version, local label, git hash (from its metadata)."""
    from cpuperf.probe.software import torch_git_version

    info = facts.software.packages.get("torch") if facts.software is not None else None
    if info is None:
        return {"version": None, "local": None, "git": None}
    # A recorded host's torch files are not on this machine: its build is its version and label.
    return {"version": info.version, "local": info.local, "git": torch_git_version(info) if facts.live else None}


def host_id(facts: HostFacts) -> str:
    """Same CPU, same CPUs allowed, same torch build -> same measurements."""
    key = json.dumps([facts.cpu.model_name, facts.cpu.microarchitecture, list(facts.cpu.isa),
                      list(facts.usable_cpus()), facts.topology.cpu_quota, torch_build(facts)], sort_keys=True)
    from cpuperf.fsutil import sha256_hex  # hashlib's digest, without loading OpenSSL on every plan's way

    return sha256_hex(key.encode())[:16]


class CacheUnusable(ValueError):
    """A measurement file nothing can be used from (not a file, not JSON, no date or torch build): one line."""


def _validated(data: Any, where: str = "", identity: bool = True) -> Dict[str, Any]:
    """The measurements that fit the schema (cpuperf.decide.measurement_schema): a bad field or entry is dropped
    alone and said once, naming it; CacheUnusable where the file's date or torch build does not fit."""
    from cpuperf.decide.measurement_schema import NotUsable, sanitized

    try:
        kept, notes = sanitized(data, identity)
    except NotUsable as exc:
        raise CacheUnusable(str(exc)) from None
    for note in notes:
        _say_once(f"note: dropped {note} from {where or 'the measurements'} (the rest is used)")
    return kept


_SAID: Set[str] = set()


def _say_once(line: str) -> None:
    """A note about a file, once per process (several readers read the same cache in one command)."""
    from cpuperf.output import message

    if line not in _SAID:
        _SAID.add(line)
        message(line)


def _read_file(path: Path, identity: bool = True) -> Dict[str, Any]:
    """A measurement file: bounded, never blocking (cpuperf.readback), checked; CacheUnusable or OSError."""
    from cpuperf.readback import read_json

    try:
        return _validated(read_json(path), str(path), identity)
    except ValueError as exc:  # readback.Unreadable, fsutil.InputRefused
        if isinstance(exc, CacheUnusable):
            raise
        raise CacheUnusable(str(exc).replace(f"{path} ", "")) from None


def _rules() -> MeasureRule:
    """compat/tuning.toml [measure], typed (cpuperf.knowledge.tuning)."""
    return tuning().measure


def assess(data: Dict[str, Any], facts: HostFacts, now: Optional[float] = None) -> Tuple[bool, List[str]]:
    """(usable, flags): expired or another torch build -> unusable; under load or unsteady -> flagged."""
    rules = _rules()
    now = time.time() if now is None else now
    age_days = (now - float(data.get("measured_at") or 0)) / 86400
    if data.get("torch_build") != torch_build(facts):
        return False, [f"measured with another torch build ({data.get('torch_build')})"]
    if age_days > rules.max_age_days:
        return False, [f"{age_days:.0f} days old (expires after {rules.max_age_days})"]
    flags: List[str] = []
    if data.get("method") in _SIDE_BY_SIDE:
        # Ratios of runs side by side: load fell on both sides alike, and a ratio too noisy to decide was left out
        # of the figures when it was taken (its `undecided` line says why).
        return True, flags
    load = data.get("load") or {}
    if load.get("under_load"):
        flags.append(f"taken under load ({load.get('figure') or 'busy CPUs'})")
    if "load" not in data:
        flags.append("the load during it was not recorded")
    for name, rep in (data.get("repeats") or {}).items():
        spread = rep.get("spread")  # single figures (no comparison to judge): their repeats must agree
        if spread is not None and spread > rules.single_figure_max_spread:
            flags.append(f"{name} spread {spread * 100:.0f}% over {rep.get('n')} repeats "
                         f"(min {rep.get('min'):.1f}, median {rep.get('median'):.1f}, max {rep.get('max'):.1f})")
    return True, flags


def describe(data: Dict[str, Any], now: Optional[float] = None) -> str:
    """'fp32 GEMM 231.0 GFLOP/s, bf16 GEMM 412.3 GFLOP/s, 3 repeats each, 2.1 h ago'."""
    now = time.time() if now is None else now
    parts = [f"{k[5:9]} GEMM {data[k]:.1f} GFLOP/s" for k in ("gemm_fp32_gflops", "gemm_bf16_gflops")
             if isinstance(data.get(k), (int, float))]
    reps = data.get("repeats") or {}
    if reps:
        parts.append(f"median of {min(r.get('n', 0) for r in reps.values())} repeats")
    age = (now - float(data.get("measured_at") or now)) / 3600
    parts.append(f"{age:.1f} h ago" if age < 48 else f"{age / 24:.0f} days ago")
    return ", ".join(parts)


# A snapshot (doctor --save-snapshot) records this host's measurement beside its tree: the recorded host then
# plans from the same figures as the live one did.
RECORDED_FILE = ".cpuperf/measurements.json"


def read_cached(facts: HostFacts) -> Tuple[Optional[Dict[str, Any]], Path]:
    """This host's cache (a recorded host's own measurement for a snapshot), as far as it fits its schema; None
    when there is none or nothing in it can be used (said once, and the command goes on without it)."""
    if not facts.live:
        recorded, where = _read_recorded(Path(str(facts.sysroot)) / RECORDED_FILE)
        return (None if recorded is None else _allocators_fresh(recorded)), where
    path = cache_dir() / f"{host_id(facts)}.json"
    try:
        return _allocators_fresh(_fit_host(_read_file(path), facts, path)), path
    except FileNotFoundError:
        return None, path
    except OSError as exc:  # unreadable: say so once, measure or decide without it
        _say_once(f"note: ignoring the measurement cache {path}: {exc.strerror or exc}")
    except CacheUnusable as exc:
        _say_once(f"note: ignoring the measurement cache {path}: {exc} (cpuperf bench --refresh measures again)")
    return None, path


def _allocators_fresh(data: Dict[str, Any]) -> Dict[str, Any]:
    """The cache less allocator figures taken the old way (METHOD /1: torch's default AdamW, on CPU the
    per-parameter loop, where a plan runs the fused kernel): its GEMM part stands, and the allocators are missing,
    as after a Ctrl-C, so `train --auto` measures them (and only them) again and the rule decides until then."""
    if data.get("method") != _OLD_OPTIMIZER_METHOD:
        return data
    if "allocator_speedup" not in data and set(data.get("ratios") or {}) <= {"bf16_over_fp32"}:
        return data  # no allocator figures (none installed, or stopped before them)
    kept = {k: v for k, v in data.items() if k not in ("allocator_speedup", "ratios", "undecided", "repeats")}
    return {**kept, **_gemm_done(data), "interrupted": {"missing": ["allocators"]}}


def _fit_host(data: Dict[str, Any], facts: HostFacts, path: Path) -> Dict[str, Any]:
    """The cache less the tunings whose best point this host cannot run (decide.tune.host_problem), each named
    once: the rules decide for that command or shape, and the next save leaves the entry out."""
    from cpuperf.decide.tune import host_problem

    for kind in ("tuned_by_shape", "tuned_by_command"):
        entries = data.get(kind)
        if not isinstance(entries, dict):
            continue
        for key in list(entries):
            why = host_problem(entries[key], facts)
            if why is not None:
                del entries[key]
                _say_once(f"note: dropped {kind}.{key[:40]!r} from {path}: {why}; the rules decide, and a new "
                          "tuning replaces it")
    return data


def _read_recorded(path: Path) -> Tuple[Optional[Dict[str, Any]], Path]:
    """A snapshot's recorded measurement (read-only: never removed, even when it is bad)."""
    try:
        return _read_file(path), path
    except FileNotFoundError:
        return None, path
    except (OSError, CacheUnusable) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _say_once(f"note: ignoring the recorded measurement {path}: {why}")
        return None, path


def record_in_snapshot(dest: str, facts: HostFacts) -> bool:
    """`doctor --save-snapshot DEST`: this host's cached measurement beside the tree, stamped with the build
    a recorded host has (version and label: its torch files are not on the machine that reads it)."""
    data, _ = read_cached(facts)
    if data is None or not facts.live:
        return False
    target = Path(dest) / RECORDED_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    stamped = {**data, "torch_build": {**(data.get("torch_build") or {}), "git": None}}
    target.write_text(json.dumps(stamped, indent=1, sort_keys=True), encoding="utf-8")
    return True


def load_cached(facts: HostFacts, log: Optional[Callable[[str], object]] = None) -> Optional[Measurements]:
    """This host's cached measurements, or None (none, expired, another torch build).

    An untrusted entry is still returned (recommend never measures) but its source says why, so the
    decisions that use it carry the flag in their evidence; `log` gets the same line.
    """
    data, path = read_cached(facts)
    if data is None:
        return None
    usable, flags = assess(data, facts)
    if not usable:
        if log:
            log(f"cached measurement {path} not used: {'; '.join(flags)} (cpuperf bench --refresh measures again)")
        return None
    source = f"cache {path}: {describe(data)}"
    if flags:
        source += " - NOT TRUSTED: " + "; ".join(flags)
        if log and not getattr(log, "silent", False) and _first_time(path, data):  # unseen under --quiet: not said
            log(f"warning: measurement {source}; `cpuperf bench --refresh` measures again (side by side: a busy "
                "host is fine), and so does the next `cpuperf train --auto`")
    elif log:
        log(f"using measurement {source}")
    return Measurements.from_json({**data, "source": source})


def _first_time(path: Path, data: Mapping[str, Any]) -> bool:
    """True once per cached measurement: the warning about it is said by the first command that reads it, not by
    every recommend, dry run and shell after it."""
    from cpuperf.run.said import first_time

    return first_time("measurement-warnings", f"{path} {data.get('measured_at')}")


def expiry(facts: HostFacts) -> Optional[float]:
    """When the measurement load_cached() reads for `facts` expires (seconds since the epoch); None without one
    (or an expired one, which is not used). Silent: read_cached() reports a bad file. What remembers a decision
    made from the measurement keeps it until then."""
    data, _ = read_cached(facts)
    if data is None:
        return None
    until = float(data["measured_at"]) + float(_rules().max_age_days) * 86400
    return until if until > time.time() else None


def load_file(path: str) -> Measurements:
    """`--measurements FILE`: the user's own input, so a field that does not fit is refused (exit 2), not dropped
    as a cache's would be: planning silently without the figure the user handed in is not what they asked."""
    from cpuperf.decide.measurement_schema import sanitized
    from cpuperf.readback import read_json

    hint = "pass a JSON file written by cpuperf bench --json"
    try:
        data, notes = sanitized(read_json(Path(path)), False)  # a device or FIFO is refused, never read forever
    except (OSError, ValueError) as exc:  # readback.Unreadable, fsutil.InputRefused, NotUsable
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:120]
        raise UsageError(f"cannot read measurements {path}: {why}", hint=hint) from exc
    if notes:
        raise UsageError(f"measurements {path}: {notes[0]}", hint=hint)
    return Measurements.from_json({**data, "source": f"file {path}"})


def save(facts: HostFacts, results: Dict[str, Any]) -> Path:
    from cpuperf.fsutil import atomic_write_bytes

    path = cache_dir() / f"{host_id(facts)}.json"
    previous, _ = read_cached(facts)
    if previous is not None and assess(previous, facts)[0]:
        # Compile figures are per model and slow to take: a later bench keeps the other models' ones.
        results = {**results, **{kind: {**(previous.get(kind) or {}), **(results.get(kind) or {})}
                                     for kind in ("compile_by_model", "tuned_by_shape", "tuned_by_command")}}
        if "allocator_speedup" not in results and previous.get("allocator_speedup"):
            # `bench --no-allocators` measured the rest again: the allocator figures stand until measured anew.
            results["allocator_speedup"] = previous["allocator_speedup"]
            kept = {k: v for k, v in (previous.get("undecided") or {}).items() if k.startswith("allocator")}
            if kept:
                results["undecided"] = {**kept, **(results.get("undecided") or {})}
    record = {"schema": SCHEMA, "host_id": host_id(facts), "torch_build": torch_build(facts),
              "measured_at": int(time.time()), **results}
    atomic_write_bytes(path, json.dumps(record, indent=2).encode())
    return path


def save_tuned(facts: HostFacts, kind: str, key: str, entry: Dict[str, Any]) -> Path:
    """One tuning result into this host's cache (kind: tuned_by_shape | tuned_by_command), beside what is there;
    the rest of the entry keeps its own time and load."""
    from cpuperf.decide.measurement_schema import tuning

    why = tuning()(entry)
    if why is not None:  # the writer holds the reader's bounds: what it would drop is never written
        raise CpuperfError(f"the tuning is not saved: {why}", hint="a figure or point the measurement cache refuses "
                           "is no measurement; tune again")
    data, _ = read_cached(facts)
    usable = data is not None and assess(data, facts)[0]
    base = {k: v for k, v in (data or {}).items() if k not in ("schema", "host_id", "torch_build")} if usable else {}
    if "load" not in base and "load" in entry:
        base["load"] = entry["load"]
    base.setdefault("measured_at", entry.get("measured_at"))
    return save(facts, {**base, kind: {**(base.get(kind) or {}), key: entry}})


def load_now(facts: HostFacts, threads: int) -> Dict[str, Any]:
    """The load on this host now, and whether fewer than `threads` CPUs are free of other work."""
    from cpuperf.decide.load import describe as describe_load
    from cpuperf.decide.load import taken_cpus
    from cpuperf.probe.load import load_for

    cpus = facts.usable_cpus()
    load = load_for(None, cpus)
    taken = taken_cpus(load, cpus)
    return {"under_load": len(cpus) - len(taken) < threads, "busy_cpus": {str(c): v for c, v in taken.items()},
            "loadavg_1m": load.loadavg_1m, "runnable_others": load.runnable_others,
            "psi_some_avg10": load.psi_some_avg10, "figure": describe_load(load, taken)}


def _spread(values: List[float]) -> Dict[str, Any]:
    med = statistics.median(values)
    return {"n": len(values), "median": round(med, 3), "min": round(min(values), 3), "max": round(max(values), 3),
            "spread": round((max(values) - min(values)) / med, 4) if med > 0 else None}


# Runs in a child interpreter: torch is never imported by cpuperf's own process.
_GEMM_SCRIPT = r"""
import json, sys, time
import torch
n = int(sys.argv[1]); seconds = float(sys.argv[2]); threads = int(sys.argv[3]); repeats = int(sys.argv[4])
if threads > 0:
    torch.set_num_threads(threads)
out = {"threads": torch.get_num_threads(), "torch": torch.__version__}
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    a = torch.randn(n, n, dtype=dtype); b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up: oneDNN primitive creation
    rates = []
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b); count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        rates.append(2.0 * n ** 3 * count / elapsed / 1e9)
    out["gemm_%s_rates" % name] = rates
print(json.dumps(out))
"""


def gemm_rates(python: str = sys.executable, size: int = 512, seconds: float = 1.0,
               threads: int = 0, timeout: float = 300.0, repeats: Optional[int] = None) -> Dict[str, Any]:
    """fp32 and bf16 GEMM rates (GFLOP/s, the median of `repeats` runs of `seconds`), in a child process."""
    repeats = max(1, int(repeats or _rules().repeats))
    try:
        proc = subprocess.run([python, "-c", _GEMM_SCRIPT, str(size), str(seconds), str(threads), str(repeats)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ProbeFailedError(f"the GEMM benchmark took over {timeout:.0f} s", hint="retry on an idle host") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeFailedError(f"the GEMM benchmark failed: {last}", hint="check that torch imports: cpuperf doctor")
    raw = json.loads(proc.stdout)
    out: Dict[str, Any] = {"threads": raw["threads"], "torch": raw["torch"], "repeats": {}}
    for name in ("fp32", "bf16"):
        stats = _spread(raw[f"gemm_{name}_rates"])
        out[f"gemm_{name}_gflops"] = stats["median"]
        out["repeats"][f"gemm_{name}_gflops"] = stats
    return out


def run_micro(facts: HostFacts, threads: int, python: str = sys.executable, allocators: bool = True,
              compile: bool = False, seconds: float = 1.0, size: int = 512,
              workload: Optional[Workload] = None, log: Optional[Callable[[str], object]] = None,
              done: Optional[Mapping[str, Any]] = None,
              overrides: Optional[Mapping[str, object]] = None) -> Dict[str, Any]:
    """The micro-benchmarks the engine uses where its rules are unsure, with the load around them: the ratios
    that decide (bf16/fp32 GEMM, each allocator over the default) measured side by side (measure_ratios). `done`:
    a cached measurement stopped part-way (`unfinished`), whose GEMM figures stand: only the rest is measured.
    `compile`: torch.compile for `workload` too, at the dtype of its plan with your `overrides` (plan_dtype)."""
    started = time.time()
    before = load_now(facts, threads)
    results: Dict[str, Any] = {"host_id": host_id(facts), "measured_at": int(started)}
    try:
        results.update(measure_ratios(facts, ratio_threads(facts, threads, before), python, allocators=allocators,
                                      size=size, gemm_seconds=max(0.05, seconds / 4), log=log, done=done))
    except Stopped as stop:
        if stop.partial is not None:  # what was measured, with the load around it, for measure_and_save to keep
            stop.partial = {**results, **stop.partial, "gemm_size": size, "gemm_seconds": seconds,
                            "load": {**before, "before": before["figure"], "after": None},
                            "duration_s": round(time.time() - started, 2)}
        raise
    results.update(gemm_size=size, gemm_seconds=seconds)
    if compile:
        meas = Measurements.from_json(results) if results.get("gemm_fp32_gflops") else None
        results.update(compile_measurement(threads, python, workload=workload, log=log,
                                           dtype=plan_dtype(facts, workload, meas, overrides)))
    after = load_now(facts, threads)
    worst = before if before["under_load"] or not after["under_load"] else after
    results["load"] = {**worst, "under_load": before["under_load"] or after["under_load"],
                       "before": before["figure"], "after": after["figure"]}
    results["duration_s"] = round(time.time() - started, 2)
    return results


def ratio_threads(facts: HostFacts, threads: int, load: Mapping[str, Any]) -> int:
    """The threads the ratios are measured with: the plan's, or where other work keeps CPUs busy, only the CPUs it
    leaves free (at least one). An OpenMP team sharing a busy core waits at every barrier for its slowest thread
    (compat/tuning.toml [load]), and that wait, not the lever, would fill the figure; a ratio of two runs on the
    same free cores keeps what the lever changes."""
    if not load.get("under_load"):
        return threads
    free = len(facts.usable_cpus()) - len(load.get("busy_cpus") or {})
    return threads_on(free, threads)


class Stopped(KeyboardInterrupt):
    """Ctrl-C during a measurement: `partial` holds what was measured (the GEMM figures, once their ratio is
    taken; None before), `doing` names the step it stopped in. measure_and_save keeps the partial one."""

    def __init__(self, doing: str, partial: Optional[Dict[str, Any]] = None):
        super().__init__(doing)
        self.doing, self.partial = doing, partial


# The parts of a measurement a Ctrl-C can leave for later (`interrupted.missing` in the cache), by what they say.
_PARTS = {"allocators": "the allocators against the default"}
# The GEMM figures a measurement stopped after its GEMM ratio keeps, and the one that completes it takes over.
_GEMM_KEYS = ("gemm_fp32_gflops", "gemm_bf16_gflops", "threads", "torch")


def unfinished(data: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why a cached measurement is taken on: it was stopped (Ctrl-C) before some of its parts; None: complete."""
    missing = [m for m in ((data or {}).get("interrupted") or {}).get("missing") or [] if m in _PARTS]
    if not missing:
        return None
    if (data or {}).get("method") == _OLD_OPTIMIZER_METHOD:
        return "its allocator figures were measured with torch's default AdamW, not the optimizer a plan runs"
    return "stopped by Ctrl-C before " + " and ".join(_PARTS[m] for m in missing) + " were measured"


def _gemm_done(done: Mapping[str, Any]) -> Dict[str, Any]:
    """The GEMM part of a measurement stopped after it: its figures, rounds and verdict, as measure_ratios has them."""
    out: Dict[str, Any] = {k: done[k] for k in _GEMM_KEYS if k in done}
    out["repeats"] = {k: v for k, v in (done.get("repeats") or {}).items() if k.startswith("gemm_")}
    out["ratios"] = {k: v for k, v in (done.get("ratios") or {}).items() if k == "bf16_over_fp32"}
    out["undecided"] = {k: v for k, v in (done.get("undecided") or {}).items() if k == "bf16_over_fp32"}
    return out


# How a cached measurement was taken: ratios of runs side by side, so load from other work is no reason to distrust
# it (entries without it were single figures, flagged when taken under load). /2: the allocators are measured with
# the optimizer a plan runs (`allocator_optimizer`); /1 stepped torch's default AdamW (on CPU the per-parameter
# loop), not the fused kernel a plan runs, so a /1 entry's allocator figures are stale (its GEMM ratio stands).
METHOD = "side-by-side/2"
_OLD_OPTIMIZER_METHOD = "side-by-side/1"
_SIDE_BY_SIDE = (_OLD_OPTIMIZER_METHOD, METHOD)


class _Server:
    """One `python -m cpuperf.train.bench --serve` child (torch imported once, models kept): a request line in,
    a rate out. Its answers are read by a thread, so a wait for one has a deadline."""

    def __init__(self, python: str, env: Mapping[str, str]):
        import queue
        import threading

        self.proc = subprocess.Popen([python, "-m", "cpuperf.train.bench", "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(env))
        self.lines: queue.Queue[Optional[str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the child is gone

    def answer(self, timeout: float) -> Optional[JsonObject]:
        import queue

        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith("{"):
                got: JsonObject = json.loads(line)  # the server's own answer: one JSON object a line
                return got

    def ask(self, request: Mapping[str, object], timeout: float) -> Optional[float]:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(dict(request)) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return None
        got = self.answer(timeout)
        rate = got.get("rate") if got else None
        return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of requests: the server returns
            self.proc.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _server_env(threads: int, extra: Mapping[str, str]) -> Dict[str, str]:
    preloads = variables().names(lever="allocator")  # each measurement sets its own
    env = {k: v for k, v in os.environ.items() if k not in preloads}
    env.update({"OMP_NUM_THREADS": str(threads), **extra})
    env.setdefault("PYTHONWARNINGS", "ignore")
    pkg_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def measure_ratios(facts: HostFacts, threads: int, python: str = sys.executable, allocators: bool = True,
                   size: int = 512, gemm_seconds: float = 0.25, log: Optional[Callable[[str], object]] = None,
                   budget_s: Optional[float] = None, done: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """bf16/fp32 GEMM and each installed allocator over the default on the reference workloads, as ratios of runs
    side by side (cpuperf.decide.ratios): one server process per allocator, asked in alternating order, round after
    round, until each ratio decides or the time budget ends (counted once torch has started and the models are
    warm). A ratio still too noisy to decide is left out of the figures the plan reads (the rule decides) and named
    in `undecided`; said once, through `log`, as is how far it has got (at least every 6 s). `done`: a measurement
    stopped after its GEMM ratio (`unfinished`): that part is taken from it, the rest measured. Ctrl-C: Stopped,
    with the GEMM part once it is measured."""
    from cpuperf.output import Progress

    rules = _rules()
    budget = float(budget_s if budget_s is not None else rules.budget_s)
    libs = allocator_libraries(facts) if allocators else {}
    out: Dict[str, Any] = {"method": METHOD, "ratios": {}, "undecided": {}}
    if done is not None:
        out.update(_gemm_done(done))
        if not libs:
            return out
    servers = {"default": _Server(python, _server_env(threads, {}))}
    for name, lib in libs.items():
        servers[name] = _Server(python, _server_env(threads, allocator_env(name, lib)))
    what = ("" if done is not None else "bf16/fp32 GEMM, ") + \
        (f"{', '.join(sorted(libs))} against the default allocator" if libs else "")
    workloads = allocator_workloads(facts)
    doing = "starting torch"
    try:
        with Progress(log, f"measuring this host ({what.rstrip(', ')})") as progress:
            progress.update(f"starting torch in {len(servers)} process(es)", now=True)
            _started(servers, out)
            if libs:
                out["allocator_optimizer"] = plan_optimizer(out.get("torch"))
            optimizer = str(out.get("allocator_optimizer") or "")
            progress.update("warming up (building the reference models once per process)")
            doing = "warming up"
            _warm_up(servers, size, gemm=done is None, workloads=workloads if libs else (), optimizer=optimizer)
            # The rounds are what the budget bounds (starting torch and the warm-up have their own time-outs): a
            # warm-up that took the whole budget on a busy host left one round, and nothing decided.
            deadline = time.monotonic() + budget
            gemm_deadline = time.monotonic() + budget * (0.3 if libs else 1.0)
            if done is None:
                doing = "the bf16/fp32 GEMM ratio"
                out.update(_gemm_rounds(servers["default"], size, gemm_seconds, gemm_deadline, deadline, progress,
                                        rules))
            if libs:  # said next (by the timer where no round ends first): the step now running, not the last one
                if done is None:
                    progress.update("the GEMM rounds are done; allocator round 1 is running")
                doing = "the allocators"
                out["allocator_speedup"] = _allocator_rounds(servers, libs, deadline, progress, rules, out, workloads,
                                                             optimizer)
            doing = "stopping the measuring processes"
            progress.update(doing)
            _close(servers)  # inside the progress: a busy host took 20 s here, in silence
    except KeyboardInterrupt:
        # Ctrl-C reaches the measuring processes too (one process group): what was measured before it is kept.
        raise Stopped(doing, _measured_so_far(out, doing, bool(libs))) from None
    finally:
        _close(servers)
    for line in out["undecided"].values():
        if log:
            log(line)
    return out


def _started(servers: Mapping[str, _Server], out: Dict[str, Any]) -> None:
    """Wait for each measuring process's hello (torch imported); its threads and torch go into `out`."""
    for name, server in servers.items():
        hello = server.answer(timeout=300.0)
        if hello is None:
            raise ProbeFailedError(f"the measuring process ({name}) did not start",
                                   hint="check that torch imports: cpuperf doctor")
        out.setdefault("threads", hello.get("threads"))
        out.setdefault("torch", hello.get("torch"))


def _warm_up(servers: Mapping[str, _Server], size: int, gemm: bool, workloads: Sequence[str],
             optimizer: str = "") -> None:
    """One untimed run of what each process will time: oneDNN primitives, the models, the optimizer's state (the
    GEMMs in the default allocator's process, where `gemm`)."""
    for server in servers.values():
        for kind in (["fp32", "bf16"] if server is servers["default"] and gemm else []):
            server.ask({"gemm": kind, "size": size, "seconds": 0.01}, timeout=300.0)
        for w in workloads:
            server.ask({**_workload_request(w, optimizer), "size": "small", "seconds": 0.01}, timeout=600.0)


def _measured_so_far(out: Dict[str, Any], doing: str, allocators: bool) -> Optional[Dict[str, Any]]:
    """What a measurement stopped in `doing` keeps: everything once all is measured; the GEMM part, marked
    `interrupted`, once its ratio is taken and the allocators are not; None before."""
    if doing.startswith("stopping") or ("gemm_fp32_gflops" in out and not allocators):
        return out
    if "gemm_fp32_gflops" not in out:
        return None
    return {**_gemm_done(out), "method": out["method"], "interrupted": {"missing": ["allocators"]}}


def _close(servers: Mapping[str, _Server]) -> None:
    for server in servers.values():
        if server.proc.poll() is None:
            server.close()


def _gemm_rounds(server: _Server, size: int, seconds: float, deadline: float, overall: float, progress: Progress,
                 rules: MeasureRule) -> Dict[str, Any]:
    """fp32 and bf16 GEMM rounds on one server until their ratio decides or `deadline`: the figures for the plan."""
    from cpuperf.decide.ratios import Ratio, alternating

    min_rounds, judging = rules.min_rounds, _judging()
    windows = rules.windows
    ratio = Ratio("bf16/fp32 GEMM", float(tuning().dtype.min_bf16_over_fp32_gemm))
    rates: Dict[str, List[float]] = {"fp32": [], "bf16": []}
    while not ratio.decided(min_rounds, *judging) and (not ratio.rounds or time.monotonic() < deadline):
        got = {}
        for dtype in alternating(("fp32", "bf16"), len(ratio.rounds)):
            rate = server.ask({"gemm": dtype, "size": size, "seconds": seconds, "windows": windows}, timeout=300.0)
            if rate is None:
                raise ProbeFailedError("the GEMM benchmark failed", hint="check that torch imports: cpuperf doctor")
            got[dtype] = rate
            rates[dtype].append(rate)
        ratio = ratio.add(got["bf16"] / got["fp32"])
        progress.update(f"GEMM round {len(ratio.rounds)}: bf16/fp32 {ratio.describe()}",
                        left_s=max(0.0, overall - time.monotonic()))
    out: Dict[str, Any] = {"gemm_fp32_gflops": round(statistics.median(rates["fp32"]), 3),
                           "repeats": {f"gemm_{k}_gflops": _spread(v) for k, v in rates.items()},
                           "ratios": {"bf16_over_fp32": ratio.to_json(min_rounds, *judging)}, "undecided": {}}
    if ratio.decided(min_rounds, *judging):
        out["gemm_bf16_gflops"] = round(statistics.median(rates["bf16"]), 3)
    else:
        out["undecided"]["bf16_over_fp32"] = f"{ratio.name} {ratio.describe()}: {_why_undecided(ratio, min_rounds, judging)}, so the " \
                                    "rule decides the dtype; `cpuperf bench --refresh` measures again"
    return out


def _judging() -> Tuple[float, float]:
    """(confidence, resolution) of the one judgement (compat/tuning.toml [judge])."""
    judge = tuning().judge
    return float(judge.confidence), float(judge.resolution)


def _why_undecided(ratio: Ratio, min_rounds: int, judging: Tuple[float, float]) -> str:
    """Why a ratio did not decide within the budget: too few rounds, or its interval holds the threshold."""
    if len(ratio.rounds) < min_rounds:
        return f"only {len(ratio.rounds)} of the {min_rounds} rounds it needs fitted in the time budget"
    return f"too noisy to decide ({ratio.verdict(min_rounds, *judging).why})"


def _allocator_rounds(servers: Mapping[str, _Server], libs: Mapping[str, str], deadline: float, progress: Progress,
                      rules: MeasureRule, out: Dict[str, Any],
                      workloads: Tuple[str, ...] = ("lm", "mlp"), optimizer: str = "") -> Dict[str, Any]:
    """Each allocator over the default on the reference workloads, rounds side by side until every ratio decides or
    `deadline`; the decided ones as allocator_speedup (per workload, and their geometric mean). `optimizer`: the one
    the workloads step (plan_optimizer)."""
    import math

    from cpuperf.decide.ratios import Ratio, alternating

    min_rounds, judging = rules.min_rounds, _judging()
    threshold = allocator_rule().min_speedup
    request = {"size": "small", "seconds": float(rules.workload_window_s), "windows": rules.windows}
    ratios = {(name, w): Ratio(f"{name}/default allocator on {w}", threshold) for name in libs for w in workloads}
    round_no = 0
    while time.monotonic() < deadline:
        pending = [w for w in workloads if any(not ratios[(n, w)].decided(min_rounds, *judging) for n in libs)]
        if not pending:
            break
        for w in pending:
            got: Dict[str, float] = {}
            for name in alternating(("default", *libs), round_no):
                rate = servers[name].ask({**_workload_request(w, optimizer), **request}, timeout=600.0)
                if rate is not None:
                    got[name] = rate
            for name in libs:
                if "default" in got and name in got:
                    ratios[(name, w)] = ratios[(name, w)].add(got[name] / got["default"])
        round_no += 1
        done = sum(r.decided(min_rounds, *judging) for r in ratios.values())
        progress.update(f"allocator round {round_no}, {done} of {len(ratios)} decided: "
                        + ", ".join(f"{n} on {w} {r.describe()}" for (n, w), r in ratios.items()),
                        left_s=max(0.0, deadline - time.monotonic()))
    speedups: Dict[str, Any] = {}
    for name in libs:
        decided = {w: ratios[(name, w)].verdict(min_rounds, *judging).ratio for w in workloads
                   if ratios[(name, w)].decided(min_rounds, *judging)}
        for w in workloads:
            r = ratios[(name, w)]
            out["ratios"][f"{name}_on_{w}"] = r.to_json(min_rounds, *judging)
            if not r.decided(min_rounds, *judging):
                out["undecided"][f"allocator {name} on {w}"] = (
                    f"{r.name} {r.describe()}: {_why_undecided(r, min_rounds, judging)}, so it does not count (the default "
                    "allocator stays unless a measured ratio says otherwise); `cpuperf bench --refresh` measures again")
        if decided:
            speedups[name] = round(math.exp(sum(math.log(v) for v in decided.values()) / len(decided)), 4)
            speedups[f"{name}_by_workload"] = {w: round(v, 4) for w, v in decided.items()}
    return speedups


_WORKLOADS = ("lm", "mlp")  # the allocation patterns the allocator decision reads (lm stands for every transformer)


def allocator_workloads(facts: HostFacts) -> Tuple[str, ...]:
    """The reference workloads an allocator is measured on here: lm and mlp in fp32, and the LM under bf16 autocast
    (`lm-bf16`) where the host has native bf16 and a plan would train in it: there the allocation pattern is
    another, and the fp32 figure did not stand for it (mimalloc 1.00x on the fp32 LM, 1.10x in bf16, Zen 4)."""
    return _WORKLOADS + (("lm-bf16",) if bf16_native(facts) else ())


def _workload_request(name: str, optimizer: str = "") -> Dict[str, Any]:
    """'lm-bf16' -> the LM under bf16 autocast; 'lm' -> the LM in fp32; stepped with `optimizer` (none: torch's
    default AdamW)."""
    workload, _, dtype = name.partition("-")
    return {"workload": workload, "dtype": dtype or "fp32", **({"optimizer": optimizer} if optimizer else {})}


def plan_optimizer(torch_version: Optional[str]) -> str:
    """The optimizer a plan steps on this CPU with `torch_version` (decide.memory.default_optimizer): the allocators
    are measured with it. Its allocations are part of the pattern an allocator is measured on: torch's default
    AdamW (on CPU the per-parameter loop, a few temporaries per parameter and step) is one no plan runs."""
    from cpuperf.decide.memory import default_optimizer
    from cpuperf.versions import version_or_none

    version = version_or_none(torch_version)
    minimum = version_or_none(tuning().optimizer.fused_cpu_min_torch)
    return default_optimizer(version is not None and minimum is not None and version >= minimum)[0]


def _benchrun(settings: Dict[str, Any], env_extra: Dict[str, str], python: str, timeout: float = 600.0) -> Optional[Dict[str, Any]]:
    preloads = variables().names(lever="allocator")  # each measurement sets its own
    env = {k: v for k, v in os.environ.items() if k not in preloads}
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
    result: Dict[str, Any] = json.loads(lines[-1])
    return result


def allocator_libraries(facts: HostFacts) -> Dict[str, str]:
    """One preloadable library per installed allocator (system or wheel; no debug/profiler builds)."""
    from cpuperf.decide.allocator import preloadable

    out: Dict[str, str] = {}
    if facts.software is None:
        return out
    for name, paths in facts.software.allocators.items():
        path = preloadable(paths)
        if path:
            out[name] = path
    return out


def allocator_env(name: str, library: str) -> Dict[str, str]:
    """What preloading `name` sets: LD_PRELOAD, and for jemalloc the MALLOC_CONF the launchers export."""
    return preload_env(name, library)


def allocator_speedups(facts: HostFacts, threads: int, python: str = sys.executable, rounds: int = 3,
                       seconds: float = 3.0, workloads: Tuple[str, ...] = ("lm", "mlp")) -> Dict[str, Any]:
    """Throughput with each allocator preloaded over the default, per reference workload, alternating rounds.

    The effect depends on the allocation pattern (measured here: tcmalloc 1.04x on the small LM but
    1.3x on the MLP), so the engine reads the ratio of the workload that stands for the model; the
    geometric mean is kept as a summary. Every allocator found (system or wheel) is measured.
    """
    import math
    import statistics

    libs = allocator_libraries(facts)
    if not libs:
        return {}
    per_workload: Dict[str, Dict[str, float]] = {name: {} for name in libs}
    for workload in workloads:
        settings = {"workload": workload, "size": "small", "threads_per_rank": threads, "seconds": seconds}
        samples: Dict[str, List[float]] = {name: [] for name in ["default", *libs]}
        for _ in range(rounds):
            for name in samples:
                env = {"OMP_NUM_THREADS": str(threads)}
                if name != "default":
                    env.update(allocator_env(name, libs[name]))
                res = _benchrun(settings, env, python)
                if res:
                    samples[name].append(res["samples_per_s"])
        base = statistics.median(samples["default"]) if samples["default"] else None
        for name in libs:
            if base and samples[name]:
                per_workload[name][workload] = round(statistics.median(samples[name]) / base, 4)
    out: Dict[str, Any] = {}
    for name, ratios in per_workload.items():
        if ratios:
            out[name] = round(math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios)), 4)
            out[f"{name}_by_workload"] = ratios
    return out


def plan_dtype(facts: HostFacts, workload: Optional[Workload], meas: Optional[Measurements],
               overrides: Optional[Mapping[str, object]] = None) -> str:
    """The dtype the plan for `workload` on this host runs with your `overrides` (--set: `dtype=fp32` is fp32; else
    bf16 autocast where it pays): the one torch.compile is measured at, so its figures are the run's (the plan counts
    figures only at its own dtype). A value of yours that cannot be honoured is refused (UsageError, exit 2), never
    measured at another dtype; a plan that fails otherwise measures at your dtype, else fp32."""
    from cpuperf.decide.recommend import RecommendRequest, recommend, user_constraints
    from cpuperf.decide.records import constraints_of
    from cpuperf.decide.workload import PRESETS

    try:
        return recommend(facts, workload or PRESETS["tiny"],
                         RecommendRequest(measurements=meas, overrides=overrides)).levers.dtype.value
    except CpuperfError as exc:
        if overrides and isinstance(exc, UsageError):
            raise
        asked = constraints_of(user_constraints(overrides)).dtype
        return asked.value if asked is not None and isinstance(asked.value, str) else "fp32"


def compile_measurement(threads: int, python: str = sys.executable, seconds: float = 3.0,
                        workload: Optional[Workload] = None, batch: int = 0, dtype: str = "fp32",
                        modes: Optional[Sequence[str]] = None, rounds: int = 0,
                        log: Optional[Callable[[str], object]] = None) -> Dict[str, Any]:
    """torch.compile's one-time cost and steady speed-up for one model on this host, in each mode the installed
    torch has (worker_settings.COMPILE_MODES, or `modes`), at `dtype` (bf16: under autocast, as the plan runs it).
    Slow: tens of seconds to minutes a mode.

    Eager and each mode in fresh processes, round by round in rotated order ([compile] measure_rounds), inductor's
    cache private to each mode: the compile time is a mode's first step less eager's in the first round (cold,
    what a first run pays; the later rounds' warm figure is kept beside it), the steady speed-up the geometric mean
    of the rounds' compiled/eager ratios, kept with them so the decision judges it against its noise (decide/judge.py).
    Keyed by the model's shape, the mode and the dtype (compile_key), so a decision uses only its own model's figures
    at its own dtype."""
    import tempfile

    from cpuperf.decide.recommend import compile_key
    from cpuperf.decide.workload import PRESETS
    from cpuperf.worker_settings import COMPILE_MODES

    w = workload or PRESETS["tiny"]
    batch = batch or max(1, min(w.batch_size, 16))
    shape = {"n_layer": w.n_layer, "n_head": w.n_head, "d_model": w.d_model, "seq_len": w.seq_len, "vocab_size": w.vocab}
    settings = {"workload": "lm", "shape": shape, "batch": batch, "threads_per_rank": threads, "seconds": seconds,
                "steps": 3, "dtype": dtype}
    wanted = [m for m in (modes or COMPILE_MODES) if m in COMPILE_MODES]
    runs: Dict[str, List[Dict[str, Any]]] = {}  # name -> one result per round (None where it failed)
    with tempfile.TemporaryDirectory(prefix="cpuperf-inductor-") as cache:
        for r in range(max(1, rounds or tuning().compile.measure_rounds)):
            names = ["eager", *wanted]
            order = names if r == 0 else names[r % len(names):] + names[:r % len(names)]  # eager first: the modes
            for name in order:
                if name != "eager" and r > 0 and not runs.get(name):
                    continue  # failed in the first round: not tried again
                if log:
                    log(f"torch.compile for {w.name}, round {r + 1}: {name} ...")
                # each mode its own inductor cache: cold in its first round (no kernel another mode compiled)
                env = {"OMP_NUM_THREADS": str(threads)}
                env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, name)
                res = _benchrun(settings if name == "eager" else {**settings, "compile": True, "compile_mode": name},
                                env, python, timeout=1800)
                if name == "eager" and r == 0:
                    if not res:
                        return {}
                    wanted = [m for m in wanted if m in (res.get("compile_modes") or ["default"])]
                if res:
                    runs.setdefault(name, []).append({**res, "round": r})
    out = {compile_key(w, mode, dtype): entry for mode in wanted
           if (entry := _compile_entry(runs, mode, batch, w.name, threads, dtype))}
    if not out:
        return {}
    return {"compile_by_model": out}


def _compile_entry(runs: Mapping[str, List[Dict[str, Any]]], mode: str, batch: int, model: str, threads: int,
                   dtype: str) -> Optional[Dict[str, Any]]:
    """One mode's cached figures from its runs and eager's, paired round by round."""
    eager = {x["round"]: x for x in runs.get("eager", [])}
    mine = [x for x in runs.get(mode, []) if x["round"] in eager]
    if not mine or not eager:
        return None
    ratios = [x["samples_per_s"] / eager[x["round"]]["samples_per_s"] for x in mine]
    extra = [max(0.1, x["first_step_s"] - eager[x["round"]]["first_step_s"]) for x in mine]
    eager_rate = statistics.median(x["samples_per_s"] for x in eager.values())
    # the steady gain as the judgement takes it (decide/judge.py): the geometric mean of the rounds' ratios
    gain = math.exp(statistics.fmean(math.log(r) for r in ratios))
    entry: Dict[str, Any] = {"compile_seconds": round(extra[0], 2), "speedup": round(gain, 4),
                             "rounds": [round(r, 4) for r in ratios], "step_seconds": round(batch / eager_rate, 4),
                             "batch": batch, "model": model, "threads": threads, "mode": mode, "dtype": dtype}
    if len(extra) > 1:
        entry["compile_seconds_warm"] = round(statistics.median(extra[1:]), 2)
    return entry


def measure_if_unsure(facts: HostFacts, threads: int, python: str = sys.executable,
                      log: Optional[Callable[[str], object]] = None,
                      workload: Optional[Workload] = None) -> Optional[Measurements]:
    """Measure once per host and torch build where a rule is unsure (native bf16, installed allocators),
    and torch.compile for `workload`'s model where its run is long enough for compile to matter.

    A cached entry that is expired, from another torch build, taken under load or unsteady is
    measured again; if the new one is no better it is used with its flag (never silently).
    """
    if not facts.live:
        return None
    got = _measure_if_unsure(facts, threads, python, log)
    dtype = plan_dtype(facts, workload, got) if workload is not None else "fp32"
    if workload is not None and compile_worth_measuring(workload, got or Measurements(), threads, tuning(), dtype):
        if log:
            log(f"measuring torch.compile for {workload.name} ({workload.steps} steps: long enough for it to "
                "matter); cached for later runs ...")
        entry = compile_measurement(threads, python, workload=workload, log=log, dtype=dtype)
        if entry:
            data, _ = read_cached(facts)
            base = {k: v for k, v in (data or {}).items() if k not in ("schema", "host_id", "torch_build")}
            base.setdefault("load", load_now(facts, threads))
            save(facts, {**base, **entry})
            got = load_cached(facts, log)
    return got


def disturbed(data: Mapping[str, Any]) -> Optional[str]:
    """Why a side-by-side measurement is taken again: a ratio left undecided while other work used its CPUs (the
    load before or after it), fewer than [measure].disturbed_tries times so far; None: it stands (decided, taken
    on a quiet host, or tried enough: then the rule decides what it left undecided, and says so)."""
    undecided = data.get("undecided") or {}
    load = data.get("load") or {}
    if data.get("method") != METHOD or not undecided or not load.get("under_load"):
        return None
    tries, most = int(data.get("tries") or 1), _rules().disturbed_tries
    if tries >= most:
        return None
    return (f"{len(undecided)} ratio(s) left undecided while other work used its CPUs "
            f"({load.get('figure') or 'busy CPUs'}): taken again, try {tries + 1} of {most}")


def _why_measure(data: Optional[Dict[str, Any]], facts: HostFacts) -> Tuple[bool, List[str]]:
    """(usable as it is, why it is measured now): nothing cached, expired, flagged, disturbed and undecided, or
    stopped part-way (Ctrl-C)."""
    if data is None:
        return False, ["no measurement yet"]
    usable, flags = assess(data, facts)
    again = (unfinished(data) or disturbed(data)) if usable else None
    return usable, flags + ([again] if again else [])


def _measure_if_unsure(facts: HostFacts, threads: int, python: str,
                       log: Optional[Callable[[str], object]]) -> Optional[Measurements]:
    need_dtype = bf16_native(facts)  # the owner's answer (Arm BF16 and POWER10 MMA count: their rule needs a figure)
    need_alloc = bool(allocator_libraries(facts))
    data, _ = read_cached(facts)
    usable, flags = _why_measure(data, facts)
    if usable and not flags:
        return load_cached(facts, log)
    if not (need_dtype or need_alloc):
        return load_cached(facts, log) if usable else None
    done = data if usable and unfinished(data) else None
    if log:
        parts = (["the bf16/fp32 GEMM ratio"] if done is None else []) + \
            (["the allocators against the default"] if need_alloc else [])
        log(f"measuring this host ({'; '.join(flags)}): {', '.join(parts) or 'what is left'}, side by side, "
            f"at most about {_rules().budget_s} s; cached for later runs ...")
    measure_and_save(facts, threads, python, tries_before(data), log, allocators=need_alloc, done=done)
    return load_cached(facts, log)


def tries_before(data: Optional[Mapping[str, Any]]) -> int:
    """How many times the cached measurement was taken while disturbed (0: it stands, or there is none)."""
    return int((data or {}).get("tries") or 1) if data is not None and disturbed(data) else 0


def measure_and_save(facts: HostFacts, threads: int, python: str = sys.executable, tries: int = 0,
                     log: Optional[Callable[[str], object]] = None, **micro: Any) -> Tuple[Dict[str, Any], Path]:
    """run_micro, cached; taken again while other work disturbed it and left a ratio undecided (`disturbed`), at
    most [measure].disturbed_tries times in all (`tries`: how many were taken before). (the last results, path).
    Ctrl-C: what was measured is cached, marked `interrupted` (the next run measures the rest), and said in one
    line (exit 130); during a try taken again, the try before it stands as it was cached."""
    saved: Optional[Path] = None
    while True:
        try:
            results = run_micro(facts, threads, python, log=log, **micro)
        except Stopped as stop:
            if saved is not None:
                raise CpuperfError(f"interrupted while measuring this host again ({stop.doing}): the try before "
                                   f"stands, cached ({saved})", code=ExitCode.INTERRUPTED) from None
            raise _stopped(facts, stop) from None
        tries += 1
        results["tries"] = tries
        path = saved = save(facts, results)
        again = disturbed(results)
        if again is None:
            return results, path
        if log:
            log(again)


def _stopped(facts: HostFacts, stop: Stopped) -> CpuperfError:
    """The one line a Ctrl-C during a measurement ends with (exit 130), once what it measured is cached."""
    later = "the next `cpuperf train --auto` or `cpuperf bench`"
    if stop.partial is None:
        return CpuperfError(f"interrupted while measuring this host ({stop.doing}): nothing measured yet, nothing "
                            f"cached; {later} measures it (CPUPERF_MEASURE=0 skips it)", code=ExitCode.INTERRUPTED)
    try:
        path = save(facts, stop.partial)
    except OSError as exc:
        return CpuperfError(f"interrupted while measuring this host ({stop.doing}): the bf16/fp32 GEMM ratio was "
                            f"measured but not cached ({exc.strerror or exc})", code=ExitCode.INTERRUPTED)
    if "interrupted" not in stop.partial:
        return CpuperfError(f"interrupted while {stop.doing}: everything was measured and cached ({path})",
                            code=ExitCode.INTERRUPTED)
    missing = " and ".join(_PARTS[m] for m in stop.partial["interrupted"]["missing"])
    return CpuperfError(f"interrupted while measuring this host: the bf16/fp32 GEMM ratio was measured and is cached "
                        f"({path}); {missing} were not measured: {later} measures them", code=ExitCode.INTERRUPTED)


def planning_measurements(facts: HostFacts, log: Optional[Callable[[str], object]] = None) -> Optional[Measurements]:
    """The measurements every planning command (recommend, ccl-env, train --dry-run, train --auto) decides
    from: this host's cached ones as they stand (flagged if taken under load), else None, and the rules
    decide, each saying it was not measured. Planning never measures and never needs torch: `cpuperf bench`
    measures, and so does the start of a real `train --auto` where nothing is cached (measure_before_run)."""
    return load_cached(facts, log)  # a snapshot's recorded one, for a recorded host


def measure_before_run(facts: HostFacts, threads: int, log: Callable[[str], object],
                       workload: Optional[Workload] = None) -> Optional[Measurements]:
    """A real `train --auto` on a host where a rule is unsure and nothing usable is cached: measure now (said,
    and cached, so the next plan in any command is the same one); with `workload` (the built-in loop), tune the
    plan's levers on its shape where nothing is tuned for it yet and the run is long enough to pay for it
    (cpuperf.run.tune). CPUPERF_MEASURE=0 skips both. A measurement that fails (no torch in this interpreter)
    leaves the rules to decide, and says so."""
    if not facts.live or facts.gpus or os.environ.get("CPUPERF_MEASURE", "1").strip() == "0":
        return planning_measurements(facts, log)
    data, _ = read_cached(facts)
    usable, flags = _why_measure(data, facts)
    if usable and not flags:
        meas = load_cached(facts, log)
    else:  # nothing cached, expired, a single-figure one taken under load, or one disturbed and left undecided
        try:
            meas = measure_if_unsure(facts, threads, log=log)
        except ProbeFailedError as exc:
            log(f"could not measure this host ({exc.message}): the rules decide; `cpuperf bench` measures later")
            return planning_measurements(facts, log)
    if workload is None:
        return meas
    from cpuperf.run.tune import tune_before_run

    return tune_before_run(facts, workload, meas, log)


def train_measurements(facts: HostFacts, environ: Mapping[str, str], log: Callable[[str], object], *,
                       auto: bool, threads: Optional[int], shape: Optional[Workload]) -> Optional[Measurements]:
    """What `train` plans from. --auto: the cache (else the rules), measured first with `threads` per rank where
    a real run starts (`threads` given) on a host with nothing cached, the built-in loop's `shape` also tuned when
    the run is long enough; plain: the cache as it is. CPUPERF_MEASURE other than 0 or 1 is refused (exit 2)."""
    measure_ok = environ.get("CPUPERF_MEASURE", "1").strip() or "1"
    if measure_ok not in ("0", "1"):
        raise UsageError(f"CPUPERF_MEASURE={measure_ok[:40]!r} is not 0 or 1", hint="unset it, or 0 to skip measuring")
    if auto and threads is not None:
        return measure_before_run(facts, threads, log, shape)
    if auto:
        return planning_measurements(facts, log)
    return load_cached(facts, log)
