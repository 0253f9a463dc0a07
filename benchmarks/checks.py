"""Whether a run's figure is evidence: did another process take its CPUs, and did it run what it is named for?

Each run reports, from inside its process (cpuperf.train.observed), what was in force and the CPU time the
kernel counted on its CPUs while the timed steps ran. Everything on those CPUs that the run itself did not
take went to other processes: a run where they took more than DISTURBED_CPU_SHARE is repeated (at most
MAX_REPEATS times) and, disturbed still, left out of the medians and counted in the report. A run whose
levers read back differ from its name (the allocator not mapped, other threads or CPUs, another dtype,
optimizer kernel or compile state) is no figure for that name; for `auto` that is an error: its plan did not
reach the run.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Optional

# Others' CPU time while the timed steps ran, over their seconds (a share of one CPU): a training step
# runs its threads in lockstep, so time taken from any one of its CPUs delays the step by about as much;
# past 3% a run may lose the 3% that the 0.97x target allows. On a quiet host the runs here saw 0-1%
# (the kernel's threads, the suite's own parent, torchrun's agent).
DISTURBED_CPU_SHARE = 0.03
MAX_REPEATS = 2  # a disturbed run is run again at most this often, then left out
PAUSE_S = 3.0  # before a repeat: a short burst of other work is over by then


def disturbance(res: Dict[str, Any], bar: float = DISTURBED_CPU_SHARE) -> Dict[str, Any]:
    """What others took on the run's CPUs during its timed steps, and whether that disturbs its figure."""
    w = res.get("window") or {}
    elapsed = float(w.get("elapsed_s") or 0.0)
    if elapsed <= 0 or w.get("others_cpu_s") is None:
        return {"others_cpu_share": None, "pressure_share": None, "disturbed": None}
    share = float(w["others_cpu_s"]) / elapsed
    psi = w.get("pressure_some_s")
    return {"others_cpu_share": round(share, 4), "pressure_share": None if psi is None else round(float(psi) / elapsed, 4),
            "disturbed": share > bar}


def expected(config: Dict[str, Any]) -> Dict[str, Any]:
    """What a configuration's run must show from inside (empty: nothing asked, e.g. run_cpu's own choices)."""
    if config.get("run_cpu"):
        return {}
    s = config.get("settings") or {}
    if "point" in config:
        allocator = (config.get("point") or {}).get("allocator")
    else:  # auto: its plan's decision; the default: none (the suite clears any preload)
        allocator = (config.get("decisions") or {}).get("allocator")
    out: Dict[str, Any] = {"ranks": int(config.get("ranks") or 1), "allocator": allocator,
                           "dtype": s.get("dtype") or "fp32", "compile": bool(s.get("compile"))}
    if not s.get("ipex"):  # IPEX swaps in its own optimizer
        out["optimizer"] = "adamw_fused" if s.get("optimizer") == "adamw_fused" else "adamw"
    if s.get("threads_per_rank"):
        out["threads"] = int(s["threads_per_rank"])
    if s.get("cpus_per_rank"):
        out["cpus"] = [sorted(int(c) for c in cpus) for cpus in s["cpus_per_rank"]]
    preload = (config.get("env") or {}).get("LD_PRELOAD") or ""
    if any(os.path.basename(p).startswith("libiomp5") for p in preload.split(":")):
        out["openmp"] = "intel"  # Intel's OpenMP runtime preloaded: it must be mapped (its GOMP_* then serve torch)
        if (config.get("env") or {}).get("KMP_AFFINITY") and "cpus" in out:
            out["cpus_each"] = True  # KMP_AFFINITY binds each thread (the main one too) to one of the rank's CPUs
    return out


def mismatches(expect: Dict[str, Any], ran: Optional[List[Dict[str, Any]]]) -> List[str]:
    """Each way the run's own reading differs from what it was asked to run, one line each."""
    if not expect:
        return []
    if not ran:
        return ["the run reported nothing of what ran"]
    out: List[str] = []
    if len(ran) != expect["ranks"]:
        out.append(f"ranks: planned {expect['ranks']}, ran {len(ran)}")
    for i, r in enumerate(ran):
        who = f" (rank {i})" if len(ran) > 1 else ""
        if r.get("allocator") != expect["allocator"]:
            out.append(f"allocator: planned {expect['allocator'] or 'the default'}, "
                       f"{(r.get('allocator') or 'none') + ' mapped'}{who}")
        if "threads" in expect and r.get("threads") != expect["threads"]:
            out.append(f"threads: planned {expect['threads']}, ran {r.get('threads')}{who}")
        if "cpus" in expect:
            want = expect["cpus"][i % len(expect["cpus"])]
            ran_on = r.get("cpus") or []
            if not (ran_on and set(ran_on) <= set(want)) if expect.get("cpus_each") else ran_on != want:
                out.append(f"CPUs: planned {_cpus(want)}, ran on {_cpus(r.get('cpus') or [])}{who}")
        if "openmp" in expect and expect["openmp"] not in (r.get("openmp") or []):
            out.append(f"OpenMP: planned {expect['openmp']}, ran {'+'.join(r.get('openmp') or []) or 'none'}{who}")
        if r.get("dtype") != expect["dtype"]:
            out.append(f"dtype: planned {expect['dtype']}, ran {r.get('dtype')}{who}")
        if "optimizer" in expect and r.get("optimizer") != expect["optimizer"]:
            out.append(f"optimizer: planned {expect['optimizer']}, ran {r.get('optimizer')}{who}")
        compiled = bool(r.get("compile")) and (r.get("compiled_graphs") is None or r["compiled_graphs"] > 0)
        if compiled != expect["compile"]:
            out.append(f"compile: planned {'compiled' if expect['compile'] else 'eager'}, "
                       f"ran {'compiled' if compiled else 'eager'}{who}")
    return out


def _cpus(cpus: List[int]) -> str:
    from cpuperf.probe.parse import format_cpulist

    return format_cpulist(cpus) or "none"


def run_checked(run_one: Callable[[Dict[str, Any]], Dict[str, Any]], config: Dict[str, Any],
                log: Callable[[str], Any], max_repeats: int = MAX_REPEATS, bar: float = DISTURBED_CPU_SHARE,
                pause_s: float = PAUSE_S) -> Dict[str, Any]:
    """One run of `config`, repeated while disturbed (at most max_repeats times); the last one with its checks:
    `attempts` (each one's figure and disturbance), `disturbed` (the last one was: it is left out),
    `not_as_planned` (what ran differently; for auto also an `error`)."""
    attempts: List[Dict[str, Any]] = []
    res: Dict[str, Any] = {}
    for n in range(1 + max(0, max_repeats)):
        res = run_one(config)
        if "error" in res:
            attempts.append({"samples_per_s": None, "error": res["error"]})
            break
        off = mismatches(expected(config), res.get("ran"))
        if off:
            res["not_as_planned"] = off
            if config["name"] == "auto":
                res["error"] = "auto did not run its plan: " + "; ".join(off)
            attempts.append({"samples_per_s": res.get("samples_per_s"), "not_as_planned": off})
            break
        d = disturbance(res, bar)
        attempts.append({"samples_per_s": res.get("samples_per_s"), **d})
        if not d["disturbed"]:
            break
        log(f"    {config['name']}: disturbed (others took {d['others_cpu_share'] * 100:.0f}% of a CPU while it ran"
            + (f"; CPU pressure {d['pressure_share'] * 100:.0f}%" if d.get("pressure_share") is not None else "") + ")"
            + (f": running it again ({n + 1} of {max_repeats})" if n < max_repeats else ": left out of the medians"))
        if n < max_repeats:
            time.sleep(pause_s)
    res["attempts"] = attempts
    res["disturbed"] = bool(attempts and attempts[-1].get("disturbed"))
    return res


def counted(res: Optional[Dict[str, Any]]) -> Optional[float]:
    """The run's samples/s where it is evidence (ran, as planned, undisturbed), else None."""
    if not res or "error" in res or res.get("disturbed") or res.get("not_as_planned"):
        return None
    sps = res.get("samples_per_s")
    return float(sps) if sps else None


def tally(rounds: List[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """How many runs were disturbed, repeated, left out, or not as planned; the host's others' share seen."""
    runs = [r for rnd in rounds for r in rnd.values()]
    attempts = [a for r in runs for a in r.get("attempts") or []]
    shares = sorted(a["others_cpu_share"] for a in attempts if a.get("others_cpu_share") is not None)
    return {"runs": len(runs), "attempts": len(attempts),
            "disturbed_attempts": sum(1 for a in attempts if a.get("disturbed")),
            "repeated": sum(1 for r in runs if len(r.get("attempts") or []) > 1),
            "left_out_disturbed": sum(1 for r in runs if r.get("disturbed")),
            "not_as_planned": sum(1 for r in runs if r.get("not_as_planned")),
            "failed": sum(1 for r in runs if "error" in r and not r.get("not_as_planned")),
            "others_cpu_share_median": shares[len(shares) // 2] if shares else None,
            "others_cpu_share_max": shares[-1] if shares else None,
            "bar": DISTURBED_CPU_SHARE, "max_repeats": MAX_REPEATS}


def ran_line(ran: Optional[List[Dict[str, Any]]]) -> str:
    """What ran, as read back inside the run: 'bf16, fused AdamW, mimalloc mapped, 2 threads on CPUs 0-1, eager'."""
    if not ran:
        return "not reported"
    first = ran[0]
    opt = {"adamw_fused": "fused AdamW", "adamw": "AdamW (foreach)"}.get(first.get("optimizer") or "", first.get("optimizer"))
    head = (f"{first.get('dtype')}, {opt}, {(first.get('allocator') or 'no allocator') + (' mapped' if first.get('allocator') else '')}"
            f", {'compiled' if first.get('compile') else 'eager'}")
    places = "; ".join(f"{'r%d ' % i if len(ran) > 1 else ''}{r.get('threads')} thread(s) on CPUs {_cpus(r.get('cpus') or [])}"
                       for i, r in enumerate(ran))
    return f"{head}; {places}"
