"""A picture of one training run: loss and samples/s against the step, from the run's metrics.jsonl.

Two files: plot.svg, drawn here without any library (so every run and every host gets one), and
plot.png through matplotlib when it is importable (`pip install -e '.[bench]'`), as benchmarks/report.py
draws the suite's throughput.png. The series are parsed once into typed points: a torn last line
(a run killed mid-write) or a non-finite value is skipped and counted, never drawn.
"""

from __future__ import annotations

import json
import math
import os
from html import escape
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

SCHEMA = "cpuperf.plot/1"
MAX_METRICS_BYTES = 256 * 1024 * 1024  # ~2M step records: far past any run's log, bounded all the same


class Series(NamedTuple):
    """The run's points: (step, value) per quantity, in file order (a resumed run appends)."""

    loss: Tuple[Tuple[int, float], ...]
    samples_per_s: Tuple[Tuple[int, float], ...]
    eval_loss: Tuple[Tuple[int, float], ...]
    skipped: int  # lines that were not a record, or held a non-finite value

    def to_json(self) -> Dict[str, Any]:
        return {"loss": [list(p) for p in self.loss], "samples_per_s": [list(p) for p in self.samples_per_s],
                "eval_loss": [list(p) for p in self.eval_loss], "skipped_lines": self.skipped}


def _finite(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def parse_metrics(text: str) -> Series:
    """metrics.jsonl -> Series. Pure."""
    loss: List[Tuple[int, float]] = []
    speed: List[Tuple[int, float]] = []
    evals: List[Tuple[int, float]] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line, parse_constant=lambda _: None)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(rec, dict):
            skipped += 1
            continue
        if rec.get("type") not in ("step", "eval"):
            continue  # settings, summary, runtime reports: not points
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 62:
            continue
        if rec["type"] == "step":
            got = [(_finite(rec.get("loss")), loss), (_finite(rec.get("samples_per_s")), speed)]
            if any(v is None for v, _ in got):
                skipped += 1
            for value, into in got:
                if value is not None:
                    into.append((step, value))
        elif rec["type"] == "eval":
            value = _finite(rec.get("eval_loss"))
            if value is None:
                skipped += 1
            else:
                evals.append((step, value))
    return Series(tuple(loss), tuple(speed), tuple(evals), skipped)


def _scale(values: Sequence[float], lo_px: float, hi_px: float) -> Tuple[float, float, Any]:
    lo, hi = min(values), max(values)
    # Halves: near 1e308, hi - lo overflows to inf (and inf/inf is nan in the SVG); hi/2 - lo/2 stays finite.
    if hi / 2 - lo / 2 < 5e-13:
        lo, hi = lo - 0.5, hi + 0.5
    span = hi / 2 - lo / 2
    return lo, hi, lambda v: hi_px - (v / 2 - lo / 2) / span * (hi_px - lo_px)


def _panel(x0: int, title: str, unit: str, lines: Sequence[Tuple[str, Sequence[Tuple[int, float]]]],
           steps: Tuple[int, int]) -> List[str]:
    """One chart as SVG elements: axes, min/max labels, a polyline per series."""
    w, h, top, left = 440, 300, 40, 60
    out = [f'<text x="{x0 + left}" y="24" font-size="14">{escape(title)}</text>',
           f'<rect x="{x0 + left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    values = [v for _, pts in lines for _, v in pts]
    if not values:
        return out + [f'<text x="{x0 + left + 10}" y="{top + 20}">no points</text>']
    s0, s1 = steps
    lo, hi, y_of = _scale(values, top, top + h)

    def x_of(step: int) -> float:
        return x0 + left + (step - s0) / max(1, s1 - s0) * w

    out += [f'<text x="{x0 + 4}" y="{top + 10}" font-size="11">{hi:.4g}</text>',
            f'<text x="{x0 + 4}" y="{top + h}" font-size="11">{lo:.4g}</text>',
            f'<text x="{x0 + left}" y="{top + h + 18}" font-size="11">step {s0}</text>',
            f'<text x="{x0 + left + w - 60}" y="{top + h + 18}" font-size="11">step {s1}</text>',
            f'<text x="{x0 + left + w / 2 - 20}" y="{top + h + 34}" font-size="11">{escape(unit)}</text>']
    for i, (name, pts) in enumerate(lines):
        colour = ("#1f77b4", "#d62728")[i % 2]
        coords = " ".join(f"{x_of(s):.1f},{y_of(v):.1f}" for s, v in pts)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
        out.append(f'<text x="{x0 + left + w - 120}" y="{top + 16 + 14 * i}" font-size="11" fill="{colour}">'
                   f'{escape(name)}</text>')
    return out


def svg(series: Series, title: str) -> str:
    """The two charts as one SVG document. Pure."""
    every = [s for s, _ in series.loss + series.samples_per_s + series.eval_loss] or [0]
    steps = (min(every), max(every))
    body = _panel(0, "loss", "step", [("train loss", series.loss), ("eval loss", series.eval_loss)], steps) \
        + _panel(520, "samples/s", "step", [("samples/s", series.samples_per_s)], steps)
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="1040" height="420" font-family="sans-serif">\n'
            f"<title>{escape(title)}</title>\n" + "\n".join(body) + "\n</svg>\n")


def png(series: Series, title: str, path: str) -> bool:
    """plot.png through matplotlib (Agg); False when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if series.loss:
        left.plot(*zip(*series.loss), label="train loss")
    if series.eval_loss:
        left.plot(*zip(*series.eval_loss), "o-", label="eval loss")
    left.set_xlabel("step")
    left.set_title("loss")
    left.legend()
    if series.samples_per_s:
        right.plot(*zip(*series.samples_per_s), color="#d62728")
    right.set_xlabel("step")
    right.set_title("samples/s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_run(run_dir: str, out_dir: str | None = None) -> Dict[str, Any]:
    """Read RUN_DIR/metrics.jsonl (bounded), write plot.svg (always) and plot.png (with matplotlib) into
    out_dir (default RUN_DIR). Returns the --json object; bad input is a UsageError, a write an exit-10 error."""
    from cpuperf.errors import UsageError, from_os_error
    from cpuperf.fsutil import InputRefused, atomic_write_bytes, read_capped
    if not run_dir.strip():
        raise UsageError("RUN_DIR is empty", hint="cpuperf plot runs/train/version_0")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir} is not a run directory ({'not a directory' if os.path.exists(run_dir) else 'no such directory'})",
                         hint="name the directory cpuperf train wrote (its --out, or runs/train/version_N)")
    try:
        text = read_capped(metrics, MAX_METRICS_BYTES).decode("utf-8", "replace")
    except FileNotFoundError:
        raise UsageError(f"{run_dir} holds no metrics.jsonl", hint="name a directory cpuperf train wrote") from None
    except InputRefused as exc:
        raise UsageError(f"metrics {exc}") from None
    except OSError as exc:
        raise from_os_error(exc) from None
    series = parse_metrics(text)
    if not series.loss and not series.samples_per_s:
        raise UsageError(f"{metrics} holds no training step yet", hint="plot a run that has logged a step")
    target = out_dir or run_dir
    title = f"cpuperf train: {os.path.abspath(run_dir)}"
    files = []
    try:
        os.makedirs(target, exist_ok=True)
        svg_path = os.path.join(target, "plot.svg")
        atomic_write_bytes(svg_path, svg(series, title).encode())
        files.append(svg_path)
        png_path = os.path.join(target, "plot.png")
        if png(series, title, png_path):
            files.append(png_path)
    except OSError as exc:
        raise from_os_error(exc) from None
    return {"schema": SCHEMA, "run_dir": os.path.abspath(run_dir), "files": files,
            "png": len(files) > 1, "steps": len(series.loss), "series": series.to_json()}
