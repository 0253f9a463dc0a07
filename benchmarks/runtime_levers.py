"""The runtime levers alone: each tried at auto's point, in alternating rounds, judged against its own noise.

`python -m benchmarks.runtime_levers [--only lm-small,mlp-small] [--rounds 6] [--seconds 2] [--points TEXT,...]
[--out DIR]` plans auto as `cpuperf train --auto --dry-run` does (with the LM's shape for an LM workload), then runs
auto and every point of benchmarks.sweep.runtime_points (GNU OpenMP's wait policy and spin count, Intel's libiomp5
with each KMP_BLOCKTIME and KMP_AFFINITY where it is found, each allocator found in auto's place, transparent huge
pages for torch's allocator and for each allocator's own switch, fewer threads than cores), or with --points only
those whose label holds one of the texts (and the points they are judged against), each run a fresh process, the
order rotated round by round. Libraries are found as the probe finds them: a directory in LD_LIBRARY_PATH counts.
Each point is judged against auto (or against its own baseline, and against its rival where it has one) by
cpuperf.decide.judge.paired over the rounds' ratios: won, lost, even, or undecided. Unlike the
suite's rounds, a run that others disturbed is counted (its share of others' CPU time is recorded beside it): on a
shared host nearly every run is disturbed, and pairs side by side put the disturbance on both sides of a ratio.
The same points run inside `python -m benchmarks` (its sweep, where the disturbance check applies).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from benchmarks import checks, sweep
from benchmarks.suite import _rotated, auto_config, lm_model, machine_info, run_config


def render(results: Dict[str, Dict[str, Any]]) -> str:
    """One row per point: its median ratio against its baseline, the 90% interval and the verdict."""
    lines = ["| workload | lever | point | against | ratio (90% interval) | pairs | verdict |", "|---|---|---|---|---|---|---|"]
    for workload, res in results.items():
        for v in res["verdicts"]:
            j = v["verdict"]
            lines.append(f"| {workload} | {v['lever']} | {v['point']} | {v['against']} | {j['ratio']:.3f}x "
                         f"({j['low']:.3f}-{j['high']:.3f}) | {j['n']} | {v['outcome']} |")
    notes = sorted({f"{k}: {w}" for res in results.values() for k, w in res["pruned"].items()})
    return "\n".join(lines) + "\n\n" + "".join(f"- not tried: {n}\n" for n in notes)


def bench(item: str, rounds: int, seconds: float, log: Any, wanted: Optional[List[str]] = None) -> Dict[str, Any]:
    from cpuperf.knowledge.tuning import tuning
    from cpuperf.probe import probe_host

    workload, size = item.split("-", 1)
    auto = auto_config(200, lm_model(workload, size))
    host = sweep.runtime_host(probe_host())
    d = auto["decisions"]
    points, pruned = sweep.runtime_points(host, d.get("allocator"), int(d.get("threads_per_rank") or 1))
    points = sweep.select_points(points, wanted or [])
    log(f"{item}: OpenMP runtimes {sorted(k for k, v in host.openmp.items() if v)}, allocators "
        f"{host.allocators or 'none'}, THP {host.thp}; {len(points)} point(s) beside auto")
    for lever, why in pruned.items():
        log(f"runtime lever not tried: {lever}: {why}")
    cfgs = [auto] + [sweep.runtime_config(auto, p, host.allocators) for p in points]
    all_rounds: List[Dict[str, Dict[str, Any]]] = []
    loads: List[Optional[List[float]]] = []
    for r in range(rounds):
        figures: Dict[str, Dict[str, Any]] = {}
        for cfg in _rotated(cfgs, r):
            # Never left out as disturbed (bar above any share): paired ratios carry the disturbance on both sides.
            res = checks.run_checked(lambda c: run_config(c, workload, size, seconds), cfg, log, 0, float("inf"))
            figures[cfg["name"]] = res
            share = checks.disturbance(res).get("others_cpu_share")
            log(f"{item} round {r + 1}/{rounds} {cfg['name']:<58} {res.get('samples_per_s') or res.get('error')}"
                + (f" (others {share * 100:.0f}% of a CPU)" if share is not None else ""))
        all_rounds.append(figures)
        loads.append(_loadavg())
    judge = tuning().judge
    return {"auto": {"decisions": d, "env": auto.get("env"), "settings": auto.get("settings")},
            "host": {"thp_mode": host.thp, "glibc": ".".join(map(str, host.glibc)) if host.glibc else None,
                     "openmp": {k: list(v) for k, v in host.openmp.items()}, "allocators": host.allocators},
            "pruned": pruned, "verdicts": sweep.lever_verdicts(cfgs, all_rounds, judge.confidence, judge.resolution),
            "medians": {c["name"]: statistics.median([x for x in (checks.counted(rd.get(c["name"])) for rd in all_rounds)
                                                      if x] or [0.0]) for c in cfgs},
            "others_cpu_share_median": statistics.median([s for rd in all_rounds for s in (
                checks.disturbance(x).get("others_cpu_share") for x in rd.values()) if s is not None] or [0.0]),
            "loadavg_by_round": loads,
            "configs": [{"name": c["name"], "env": c.get("env"), "settings": c.get("settings")} for c in cfgs],
            "rounds": [{k: {f: v.get(f) for f in ("samples_per_s", "error", "not_as_planned", "window", "first_step_s",
                                                   "allocator", "openmp")}
                        for k, v in rd.items()} for rd in all_rounds]}


def _loadavg() -> Optional[List[float]]:
    """The host's load averages (1, 5, 15 minutes), as the results record them beside the figures."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.runtime_levers", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", default="lm-small,mlp-small")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--points", default="", help="only the points whose label holds one of these texts, "
                    "comma-separated (with the points they are judged against)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    out = Path(args.out) if args.out else None
    results: Dict[str, Dict[str, Any]] = {}
    for item in [i for i in args.only.split(",") if i]:
        start_load = _loadavg()
        results[item] = bench(item, args.rounds, args.seconds, log, [w for w in args.points.split(",") if w])
        if out is not None:  # each workload as it is done: a later one stopped keeps the earlier ones
            out.mkdir(parents=True, exist_ok=True)
            (out / f"runtime-levers-{item}.json").write_text(json.dumps(
                {"machine": machine_info(), "rounds": args.rounds, "seconds": args.seconds, "workload": item,
                 "points_asked": args.points or None, "ld_library_path": os.environ.get("LD_LIBRARY_PATH"),
                 "loadavg_start": start_load, "loadavg_end": _loadavg(),
                 **results[item]}, indent=1) + "\n")
            (out / f"runtime-levers-{item}.md").write_text(render({item: results[item]}))
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
