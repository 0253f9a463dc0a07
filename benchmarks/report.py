"""Markdown table (shown in the README) and a PNG plot of the suite's results."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional


def _fmt(r: Optional[Dict[str, Any]]) -> str:
    if not r or r.get("median") is None:
        return "n/a"
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def _decisions(d: Dict[str, Any]) -> str:
    ranks = d.get("nproc_per_node") or 1
    return (f"{d['dtype']}, {ranks}x{d['threads_per_rank']}" + (", compile" if d.get("compile") else "")
            + (", ipex" if d.get("ipex") else "") + (f", {d['allocator']}" if d.get("allocator") else "")
            + (", fused AdamW" if d.get("optimizer") == "adamw_fused" else ""))


def _targets(r: Dict[str, Any]) -> str:
    t = r.get("targets") or {}
    missed = [k for k, v in t.items() if v is False]
    if missed:
        return "MISSED: " + "; ".join(missed)
    unknown = [k for k, v in t.items() if v is None]  # no round where both runs counted
    return ("n/a: " + "; ".join(unknown)) if unknown else "met" if t else "n/a"


def _mfu(r: Dict[str, Any]) -> str:
    den = r.get("mfu_denominator") or {}
    mfu = f"{r['mfu_auto'] * 100:.1f}%" if r.get("mfu_auto") else "n/a"
    ach = f"{r['pct_of_achievable_auto']:.0f}%" if r.get("pct_of_achievable_auto") else "n/a"
    return f"{mfu} / {ach}" if den.get("tflops") else f"n/a / {ach}"


def _tuning(r: Dict[str, Any]) -> str:
    """The tuning in one line: its time, runs, how it stopped, where it went, and the path's ranking."""
    t = r.get("tuning") or {}
    if not t.get("best"):
        return str(t.get("note") or "")
    path = ", ".join(f"{p['point']} {p['vs_rule_point']:.2f}" for p in (t.get("path") or [])[:4])
    judged = "; ".join(f"{lever} {j['outcome']} ({j['alternative']} {j['ratio']:.2f}x, {j['low']:.2f}-{j['high']:.2f})"
                       for lever, j in (t.get("judged") or {}).items())
    return (f"{t.get('elapsed_s')} s, {t.get('runs')} runs, {t.get('rounds')} round(s), stopped: {t.get('stopped')}, "
            f"noise {(t.get('noise') or 0) * 100:.0f}%" + (f"; judged: {judged}" if judged else "")
            + ("" if t.get("applied") else f" ({t.get('note')})") + f"; path vs the rule's point: {path}")


def _sweep_lines(r: Dict[str, Any]) -> List[str]:
    """The sweep's levers, and what --full left out of the product and why."""
    out: List[str] = []
    levers = r.get("levers") or {}
    if levers:
        out.append(f"- {r['workload']} sweep (" + ("the tuner's path, its best kept for the rounds" if r["mode"] == "quick"
                                                   else "the product every round, less what is left out below")
                   + "): " + "; ".join(f"{k} {'/'.join(v['values'])}" + (f" (not tuned: {v['pruned']})" if v["pruned"] else "")
                                       for k, v in levers.items()) + ".")
    for entry in r.get("left_out") or []:
        out.append(f"- {r['workload']} sweep, left out: {entry['points']} point(s) ({entry['rule']}): {entry['why']}.")
    return out


def runtime_lines(r: Dict[str, Any]) -> List[str]:
    """The runtime levers tried at auto's point, each judged against its baseline, and what was not tried and why."""
    rt = r.get("runtime_levers")
    if not rt:
        return []
    judged = "; ".join(f"{v['point']} {v['outcome']} ({v['verdict']['ratio']:.2f}x {v['against']}, "
                       f"{v['verdict']['low']:.2f}-{v['verdict']['high']:.2f} over {v['verdict']['n']} round(s))"
                       for v in rt.get("verdicts") or [])
    out = [f"- {r['workload']} runtime levers at auto's point (THP {rt.get('thp_mode') or 'unknown'}): " + (judged or "none")
           + "."]
    out += [f"- {r['workload']} runtime lever not tried: {k}: {why}." for k, why in (rt.get("pruned") or {}).items()]
    return out


def head_to_head_line(r: Dict[str, Any]) -> Optional[str]:
    """How auto / best of sweep was taken: fresh pairs after the sweep, and why not the rounds' own figure."""
    h = r.get("head_to_head")
    if not h:
        return None
    c, m = h.get("checks") or {}, h.get("medians") or {}
    return (f"- {r['workload']}: auto / best of sweep is taken head to head: after the rounds picked the best "
            f"({h.get('best')}) as the highest of their medians, auto and it ran {h['pairs']} fresh pairs side by side, which "
            f"ran first alternating ({h['pairs_counted']} pair(s) counted; {c.get('left_out_disturbed', 0)} run(s) left out "
            f"as disturbed, {c.get('not_as_planned', 0)} not as planned, {c.get('failed', 0)} failed); medians auto "
            f"{m.get('auto', 0):.1f}, best {m.get('best', 0):.1f} samples/s. The best's median in the rounds carries the luck "
            "that picked it among many; the fresh pairs do not." + _verdict_words(h.get("verdict")))


def _verdict_words(v: Optional[Dict[str, Any]]) -> str:
    """The pairs judged against the target's bar (cpuperf.decide.judge): ' Judged: above 0.97x (...)'."""
    if not v:
        return ""
    return (f" Judged against {v['bar']:.2f}x: {v['outcome']} ({v['ratio']:.2f}x, interval {v['low']:.2f}-"
            f"{v['high']:.2f} over {v['n']} pair(s)).")


def checked_lines(r: Dict[str, Any]) -> List[str]:
    """Each run checked: how many were disturbed, repeated, left out; what each configuration ran, beside its figure."""
    from benchmarks.checks import ran_line

    c = r.get("checks") or {}
    out: List[str] = []
    if r.get("auto_not_as_planned"):
        out.append(f"**{r['workload']}: auto did not run its plan** (an error, not a slow figure; those runs are left "
                   "out): " + "; ".join(r["auto_not_as_planned"]) + ".")
    if c:
        pct = (lambda x: "n/a" if x is None else f"{x * 100:.1f}%")
        out.append(f"{r['workload']}: {c['runs']} runs ({c['attempts']} with repeats); {c['disturbed_attempts']} disturbed "
                   f"(other processes took over {c['bar'] * 100:.0f}% of a CPU on the run's CPUs while it was timed), "
                   f"{c['repeated']} run(s) repeated (at most {c['max_repeats']} times), {c['left_out_disturbed']} left out "
                   f"of the medians as disturbed, {c['not_as_planned']} not as planned, {c['failed']} failed; others' "
                   f"share of a CPU per run: median {pct(c['others_cpu_share_median'])}, max {pct(c['others_cpu_share_max'])}.")
    out.append("")
    out.append(f"| {r['workload']}: configuration | median samples/s (min-max) | runs counted | what ran (read back inside the run) |")
    out.append("|---|---|---|---|")
    for cfg in r.get("configs") or []:
        runs = cfg.get("runs") or []
        good = _counted_figures(cfg)
        fig = f"{cfg['median']:.1f} ({min(good):.1f}-{max(good):.1f})" if good and cfg.get("median") else "n/a"
        why = sorted({x.get("error") or "; ".join(x.get("not_as_planned") or []) for x in runs
                      if not x.get("counted") and (x.get("error") or x.get("not_as_planned"))})
        out.append(f"| {cfg['name']} | {fig} | {len(good)} of {len(runs)} | {ran_line(cfg.get('ran'))}"
                   + (f"; NOT COUNTED: {'; '.join(why)}" if why else "") + " |")
    out.append("")
    return out


def markdown(results: List[Dict[str, Any]], latency: Optional[Dict[str, Any]]) -> str:
    lines = []
    if results:
        m = results[0]["machine"]
        lines.append(f"Machine: {m['cpu']} ({m['microarchitecture']}, {m['physical_cores']} cores, "
                     f"bf16 native: {m['bf16_native']}), torch {m['torch']}; {results[0]['rounds']} alternating rounds "
                     f"(order rotated each round), {results[0]['seconds_per_run']:g} s timed per run, medians with "
                     "(min-max) of the per-round ratios.")
        den = results[0].get("mfu_denominator") or {}
        if den.get("tflops"):
            clock = f"{den['clock_used_ghz']:.2f} GHz, the {den['clock_used']} clock" if den.get("clock_used_ghz") else ""
            lines.append(f"MFU = achieved / hardware peak: {den['tflops'] * 1e3:.0f} GFLOP/s = "
                         f"{den['source'].split(' (')[0].removeprefix('hardware: ')}"
                         + (f" ({clock}" + (f"; {den['clock_note']}" if den.get("clock_note") else "") + ")" if clock else "")
                         + ". % of achievable = achieved / measured 1024x1024 GEMM rate.")
        else:
            lines.append(f"MFU not reported: {den.get('why_none')}; % of achievable = achieved / measured GEMM rate.")
        lines.append("")
        lines.append("| workload | auto / default | auto / best of sweep (best) | auto / run_cpu | auto samples/s | "
                     "MFU / % of achievable | auto decisions | targets |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in results:
            spread = r["ratio_spread"]
            auto = next(c for c in r["configs"] if c["name"] == "auto")
            h2h = r.get("head_to_head") or {}
            best_col = (f"{_fmt(spread['auto_vs_best_sweep'])} ({r['best_sweep'] or 'n/a'}"
                        + (f"; head to head, {h2h['pairs_counted']} of {h2h['pairs']} pairs; in the sweep rounds "
                           f"{_fmt(spread.get('auto_vs_best_sweep_in_rounds'))}" if spread.get("auto_vs_best_sweep_in_rounds") else "")
                        + ")")
            lines.append(f"| {r['workload']} | {_fmt(spread['auto_vs_default'])} | {best_col} | {_fmt(spread['auto_vs_run_cpu'])} | "
                         + (f"{auto['median']:.1f}" if auto["median"] else "n/a") + " | "
                         f"{_mfu(r)} | {_decisions(r['auto_decisions'])} | {_targets(r)} |")
        lines.append("")
        for r in results:
            lines += _sweep_lines(r)
            lines += runtime_lines(r)
            line = head_to_head_line(r)
            if line:
                lines.append(line)
        for r in results:
            line = _tuning(r)
            if line:
                lines.append(f"- {r['workload']} tuning: {line}")
        for r in results:
            reasons = r.get("auto_reasons") or {}
            if reasons:
                lines.append(f"- {r['workload']}: allocator: {reasons.get('allocator', 'n/a')}; compile: "
                             f"{reasons.get('compile', 'n/a')}")
        lines.append("")
        for r in results:
            lines += checked_lines(r)
        lines.append("First-step (warm-up / compile) seconds, median: " + "; ".join(
            f"{r['workload']}: " + ", ".join(f"{k} {sorted(x for x in v if x)[len([x for x in v if x]) // 2]:.1f}"
                                             for k, v in r["first_step_s"].items() if any(v))
            for r in results))
    if latency:
        lines.append("")
        lines.append("| command | median wall time | median CPU time |")
        lines.append("|---|---|---|")
        for name, v in latency.items():
            if isinstance(v, dict) and "median_s" in v:
                cpu = f"{v['cpu_median_s'] * 1000:.0f} ms" if "cpu_median_s" in v else "-"
                lines.append(f"| `{name}` | {v['median_s'] * 1000:.0f} ms | {cpu} |")
        r = latency["ratios"]
        lines.append("")
        lines.append(f"doctor / collect_env = {r['doctor_vs_collect_env']:.2f} (target <= 0.2: "
                     f"{'met' if latency['targets']['doctor <= 0.2x collect_env'] else 'MISSED'}); "
                     f"ccl-env / typer+rich import = {r['ccl_env_vs_typer_rich_floor']:.2f} (target <= 1.5: "
                     f"{'met' if latency['targets']['ccl-env <= 1.5x typer+rich'] else 'MISSED'})"
                     + (f"; in CPU time {r['doctor_vs_collect_env_cpu']:.2f} and {r['ccl_env_vs_typer_rich_floor_cpu']:.2f}"
                        if "doctor_vs_collect_env_cpu" in r else "")
                     + (f"; load average {latency['load_avg_1m']:.1f} while measured" if "load_avg_1m" in latency else "")
                     + ".")
    return "\n".join(lines) + "\n"


def _counted_figures(cfg: Dict[str, Any]) -> List[float]:
    """A configuration's figures that count (ran as planned, undisturbed); all of them in results before the checks."""
    runs = cfg.get("runs")
    if runs is None:
        return [s for s in cfg.get("samples_per_s") or [] if s]
    return [x["samples_per_s"] for x in runs if x.get("counted") and x.get("samples_per_s")]


def plot(results: List[Dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not results:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.5), squeeze=False)
    for ax, r in zip(axes[0], results):
        names = [c["name"] for c in r["configs"]]
        medians = [c["median"] or 0 for c in r["configs"]]
        figures = [_counted_figures(c) for c in r["configs"]]  # the runs the medians are taken over
        lows = [m - min(f or [m]) for m, f in zip(medians, figures)]
        highs = [max(f or [m]) - m for m, f in zip(medians, figures)]
        colours = ["#d62728" if n == "auto" else ("#7f7f7f" if n in ("default", "run_cpu") else "#1f77b4") for n in names]
        ax.barh(names, medians, xerr=[lows, highs], color=colours)
        ax.invert_yaxis()
        ax.set_title(f"{r['workload']} (auto/default {r['ratios']['auto_vs_default'] or 0:.2f}x)")
        ax.set_xlabel("samples/s (median, min-max bars)")
    fig.suptitle(f"cpuperf --auto vs defaults, sweep and run_cpu on {results[0]['machine']['microarchitecture']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(out: Path, results: List[Dict[str, Any]], latency: Optional[Dict[str, Any]],
                 user_results: Optional[List[Dict[str, Any]]] = None,
                 launcher_results: Optional[List[Dict[str, Any]]] = None, name: str = "summary.md") -> None:
    text = markdown(results, latency)
    if user_results:
        from benchmarks.user_scripts import markdown_rows

        text += "\n".join(markdown_rows(user_results)) + "\n"
    if launcher_results:
        from benchmarks.user_launchers import markdown_rows as launcher_rows

        text += "\n".join(launcher_rows(launcher_results)) + "\n"
    (out / name).write_text(text)
    plot(results, out / "throughput.png")
