"""The schema of the measurement cache (`cpuperf bench`, `train --tune`, a snapshot's recorded measurement): every
field typed and ranged, each entry checked on its own. Pure.

What dates and attributes the measurements (when, which torch build) must fit, or nothing in the file can be
used; any other field or entry that does not fit is dropped alone, with a note naming it, and the rest stands
(a tuning that reported `inf` must not take the host's GEMM and allocator figures with it).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from cpuperf import readback as rb
from cpuperf.decide.judge import FIGURE_MAX
from cpuperf.jsonable import JsonObject
from cpuperf.worker_settings import COMPILE_MODES


def _timestamp(v: object) -> Optional[str]:
    """Seconds since the epoch: after 2001 and not over a day ahead of this clock (a clock set to 1970, or a
    hand-edited date in the future that would never expire, is not when it was measured)."""
    import time

    return rb.number(1e9, time.time() + 86400)(v)


TIMESTAMP = _timestamp
BUILD = rb.record({"version": rb.nullable(rb.text(128)), "local": rb.nullable(rb.text(128)),
                   "git": rb.nullable(rb.text(128))}, required=("version", "local", "git"))
LOAD = rb.record({"under_load": rb.boolean, "busy_cpus": rb.map_of(rb.number(0, 1), rb.text(16)),
                  "loadavg_1m": rb.nullable(rb.number(0, rb.MAX_COUNT)),
                  "runnable_others": rb.nullable(rb.number(0, rb.MAX_COUNT)),
                  "psi_some_avg10": rb.nullable(rb.number(0, 100)), "figure": rb.nullable(rb.text()),
                  "before": rb.nullable(rb.text()), "after": rb.nullable(rb.text())})
REPEAT = rb.record({"n": rb.count(), "median": rb.positive(), "min": rb.positive(), "max": rb.positive(),
                    "spread": rb.nullable(rb.number(0, 1e6))}, required=("n", "median", "min", "max"))
# torch.compile for one model in one mode (cpuperf.run.measure.compile_measurement): the cold compile, the steady
# speed-up over eager (the geometric mean of `rounds`, one compiled/eager ratio per round side by side), eager's step. An
# entry without `mode` is the whole model in the default mode (a cache written before the modes were measured); one
# without `dtype` was measured at fp32 (before the measurement took the plan's dtype; decide.recommend.compile_dtype).
COMPILED = rb.record({"compile_seconds": rb.positive(), "speedup": rb.positive(1e6), "step_seconds": rb.positive(),
                      "batch": rb.positive(), "model": rb.text(256), "threads": rb.count(),
                      "mode": rb.one_of(*COMPILE_MODES), "dtype": rb.one_of("fp32", "bf16", "fp16"),
                      "rounds": rb.list_of(rb.positive(1e6), 1000), "compile_seconds_warm": rb.number(0, 1e9)},
                     required=("compile_seconds", "speedup", "step_seconds", "batch"))
RATIO = rb.positive(1e6)
# A comparison judged (cpuperf.decide.judge.Verdict.to_json): its ratio, interval, bar, how many, the outcome.
_FIGURE = rb.number(0, FIGURE_MAX)
VERDICT = {"ratio": _FIGURE, "low": _FIGURE, "high": _FIGURE, "bar": _FIGURE, "n": rb.count(0)}
# A ratio measured side by side (cpuperf.decide.ratios.Ratio.to_json), and why one did not decide.
ROUNDS = rb.record({"name": rb.text(256), "median": rb.number(0, 1e6), "rounds": rb.list_of(RATIO, 100000),
                    "spread": rb.number(0, 1e6), "threshold": RATIO, "decided": rb.boolean,
                    "verdict": rb.record({**VERDICT, "outcome": rb.one_of("above", "below", "even", "undecided")},
                                         required=tuple(VERDICT))},
                   required=("name", "rounds", "decided"))
# Each lever of a tuning as judged (cpuperf.decide.tune.TuneResult.judged).
JUDGED = rb.map_of(rb.record({**VERDICT, "outcome": rb.one_of("moved", "kept", "undecided"),
                              "alternative": rb.text(256), "why": rb.text(512)},
                             required=(*VERDICT, "outcome", "alternative")),
                   rb.text(32))
UNDECIDED = rb.map_of(rb.text(1000), rb.text(128))
# A measurement stopped part-way (Ctrl-C): the parts it did not reach, which the next run measures.
INTERRUPTED = rb.record({"missing": rb.list_of(rb.one_of("allocators"), 4)}, required=("missing",))


def _point() -> rb.Check:
    """A tuned point's values from the closed sets of the one vocabulary (cpuperf.knowledge.knobs)."""
    from cpuperf.knowledge.knobs import BY_ID

    return rb.record({"dtype": rb.one_of(*BY_ID["dtype"].choices), "allocator": rb.one_of(*BY_ID["allocator"].choices),
                      "optimizer": rb.one_of(None, *BY_ID["optimizer"].choices), "ranks": rb.count(1, 4096),
                      "threads": rb.count(1, 4096), "pinned": rb.boolean, "compile": rb.boolean,
                      "memory": rb.one_of(None, *(c for c in BY_ID["numa_memory"].choices if c is not None))},
                     required=("dtype", "ranks", "threads", "pinned"))


def _lever() -> rb.Check:
    return rb.record({"value": rb.text(256), "figure": rb.positive(),
                      "alternatives": rb.map_of(rb.positive(), rb.text(256))},
                     required=("value", "figure", "alternatives"))


def tuning() -> rb.Check:
    """One tuning (cpuperf.decide.tune.TuneResult.to_json plus what run.tune adds): finite positive figures."""
    point = _point()
    return rb.record({"best": point, "start": point, "levers": rb.map_of(_lever(), rb.text(32)),
                      "best_samples_per_s": rb.nullable(rb.positive()),
                      "start_samples_per_s": rb.nullable(rb.positive()), "noise": rb.nullable(rb.number(0, 1e6)),
                      "stopped": rb.one_of("converged", "budget", "failed"), "elapsed_s": rb.number(0, 1e9),
                      "rounds": rb.count(0), "runs": rb.count(0), "measured_at": TIMESTAMP, "budget_s": rb.positive(),
                      "skipped": rb.map_of(rb.text(), rb.text(32)), "shape": rb.text(256),
                      "command": rb.list_of(rb.text(printable=False), 4096), "script_sha256": rb.nullable(rb.text(64)),
                      "steps": rb.count(), "load": LOAD, "judged": JUDGED},
                     required=("best", "levers", "measured_at"))


def _speedups(value: object, where: str) -> Tuple[JsonObject, List[str]]:
    """allocator_speedup: name -> ratio, name_by_workload -> {workload: ratio}; each entry on its own."""
    by_workload = rb.map_of(RATIO, rb.text(64))
    if not isinstance(value, dict):
        return {}, [f"{where} must be an object"]
    kept: JsonObject = {}
    notes: List[str] = []
    for key, item in value.items():
        why = rb.text(64)(key) or (by_workload if str(key).endswith("_by_workload") else RATIO)(item)
        if why:
            notes.append(f"{where}.{str(key)[:40]!r} {why}")
        else:
            kept[key] = item
    return kept, notes


class NotUsable(ValueError):
    """The file's identity (its date, its torch build) does not fit: nothing in it can be used."""


def sanitized(data: object, identity: bool = True) -> Tuple[Dict[str, Any], List[str]]:
    """(the cache as it can be used, a note per field or entry dropped); NotUsable where nothing can be.
    `identity`: the file must say when and with which torch build it was measured (a cache; a file a user hands
    to --measurements need not)."""
    if not isinstance(data, dict):
        raise NotUsable("is not a JSON object")
    for name, rule in (("measured_at", TIMESTAMP), ("torch_build", BUILD)):
        why = rule(data.get(name)) if name in data else "is missing" if identity else None
        if why:
            raise NotUsable(f"{name} {why}")
    scalars = {"schema": rb.text(64), "host_id": rb.text(64), "threads": rb.count(), "torch": rb.text(128),
               "gemm_fp32_gflops": rb.positive(), "gemm_bf16_gflops": rb.positive(), "gemm_fp16_gflops": rb.positive(),
               "gemm_size": rb.count(), "gemm_seconds": rb.positive(), "duration_s": rb.number(0, 1e9), "load": LOAD,
               "method": rb.text(64), "allocator_optimizer": rb.text(64), "undecided": UNDECIDED, "tries": rb.count(), "interrupted": INTERRUPTED}
    out, notes = rb.pruned(data, scalars, "")
    for section, check in (("repeats", REPEAT), ("ratios", ROUNDS), ("compile_by_model", COMPILED), ("tuned_by_shape", tuning()),
                           ("tuned_by_command", tuning())):
        if section in out:
            out[section], dropped = rb.entries(out[section], check, section)
            notes += dropped
    if "allocator_speedup" in out:
        out["allocator_speedup"], dropped = _speedups(out["allocator_speedup"], "allocator_speedup")
        notes += dropped
    return out, [n.lstrip(".") for n in notes]
