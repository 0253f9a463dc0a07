"""A picture of one training run: loss and samples/s against the step, from the run's metrics.jsonl.

Two files: plot.svg, drawn here without any library (so every run and every host gets one), and
plot.png through matplotlib when it is importable (`pip install -e '.[bench]'`), as benchmarks/report.py
draws the suite's throughput.png. The series are parsed once into typed points: a torn last line
(a run killed mid-write) or a non-finite value is skipped and counted, never drawn.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
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

    def to_json(self) -> Dict[str, object]:
        return {"loss": [list(p) for p in self.loss], "samples_per_s": [list(p) for p in self.samples_per_s],
                "eval_loss": [list(p) for p in self.eval_loss], "skipped_lines": self.skipped}


def _finite(value: object) -> Optional[float]:
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
        if rec.get("type") == "settings":  # an attempt starts: from its checkpoint's step, or from 0
            start = rec.get("resumed_from")
            start = start if isinstance(start, int) and not isinstance(start, bool) else 0
            # What an earlier attempt logged past that step was lost with it (a kill, a crash) and done again:
            # one series, each step once (a resume from 0 after a SIGKILL drew steps 1, 10, 1, 10, 20).
            for points in (loss, speed, evals):
                points[:] = [pt for pt in points if pt[0] <= start]
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


def nice_ticks(lo: float, hi: float, most: int = 6) -> List[float]:
    """Round values (1, 2 or 5 times a power of ten apart) from lo to hi, at most `most` of them. Pure."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    span = hi / 2 - lo / 2  # halves: near the float limit hi - lo overflows
    raw = span / max(1, most - 1) * 2
    power = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next((m * power for m in (1, 2, 5, 10) if m * power >= raw), 10 * power)
    if not math.isfinite(step) or step <= 0:
        return [lo, hi]
    first = math.ceil(lo / step) * step
    ticks = []
    k = 0
    while first + k * step <= hi * (1 + 1e-12) + 1e-300 and k <= most + 1:
        ticks.append(round(first + k * step, 12))
        k += 1
    return ticks or [lo, hi]


def log_ticks(lo: float, hi: float, most: int = 7) -> List[float]:
    """Ticks for a log axis from lo to hi (both > 0): decades where the range spans several, else the 1-2-5 values
    of each decade, else finer ones (3, 4, 6, ...), else round values as on a linear axis (a short run's loss from
    6.6 to 5.7 still gets labels between its ends). At least three where the range allows, at most `most`. Pure."""
    if lo <= 0 or hi <= lo:
        return [lo] if lo > 0 else []
    decades = range(math.floor(math.log10(lo)), math.floor(math.log10(hi)) + 1)
    if len(decades) > most:  # many decades: every few
        return [10.0 ** e for e in decades[::math.ceil(len(decades) / most)] if lo <= 10.0 ** e <= hi]
    for mantissas in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [float(f"{m * 10.0 ** e:.6g}") for e in decades for m in mantissas if lo <= m * 10.0 ** e <= hi]
        if 3 <= len(ticks) <= most:
            return ticks
    return [t for t in nice_ticks(lo, hi, 6) if lo <= t <= hi]


class _Axis(NamedTuple):
    """A value axis: its range, whether it is logarithmic, its ticks, and where a value falls (pixels)."""

    lo: float
    hi: float
    log: bool
    ticks: Tuple[float, ...]
    top: float
    bottom: float

    def y(self, v: float) -> float:
        if self.log:
            a, b, x = math.log10(self.lo), math.log10(self.hi), math.log10(v)
        else:
            a, b, x = self.lo / 2, self.hi / 2, v / 2  # halves: near 1e308 hi - lo overflows
        return self.bottom - (x - a) / (b - a) * (self.bottom - self.top)


def value_axis(values: Sequence[float], top: float, bottom: float, log: bool = False, zero: bool = False) -> _Axis:
    """The axis for `values`: logarithmic when asked and every value is positive, from zero when `zero`. Pure."""
    lo, hi = min(values), max(values)
    if log and lo > 0 and hi / lo > 1.0000001:
        lo, hi = lo / 1.05, hi * 1.05
        return _Axis(lo, hi, True, tuple(log_ticks(lo, hi)), top, bottom)
    if zero and lo >= 0:
        lo = 0.0
        hi = hi * 1.1 if 0 < hi < 1e300 else hi if hi > 0 else 1.0
    if hi / 2 - lo / 2 < 5e-13:
        lo, hi = lo - 0.5, hi + 0.5
    return _Axis(lo, hi, False, tuple(nice_ticks(lo, hi)), top, bottom)


_BLUE, _RED, _GREY = "#1f77b4", "#d62728", "#666666"


def _panel(x0: int, title: str, axis_values: Sequence[float], steps: Tuple[int, int],
           series: Sequence[Tuple[str, str, Sequence[Tuple[int, float]], str]], log: bool = False,
           zero: bool = False, median: Optional[float] = None) -> List[str]:
    """One chart as SVG elements: a frame, ticks on both axes, each series as a line or as points (`kind`), the
    legend above the frame (never over the data), a dashed median line where given."""
    w, h, top, left = 440, 280, 58, 64
    out = [f'<text x="{x0 + left}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
           f'<rect x="{x0 + left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    if not axis_values:
        return out + [f'<text x="{x0 + left + 10}" y="{top + 20}">no points</text>']
    axis = value_axis(list(axis_values) + ([median] if median is not None else []), top, top + h, log, zero)
    s0, s1 = steps

    def x_of(step: int) -> float:
        return x0 + left + (step - s0) / max(1, s1 - s0) * w

    for t in axis.ticks:
        y = axis.y(t)
        if top - 0.5 <= y <= top + h + 0.5:
            out.append(f'<line x1="{x0 + left - 4}" y1="{y:.1f}" x2="{x0 + left + w}" y2="{y:.1f}" stroke="#e6e6e6"/>')
            out.append(f'<text x="{x0 + left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{t:.4g}</text>')
    for t in nice_ticks(float(s0), float(s1), 6) if s1 > s0 else [float(s0)]:
        x = x_of(int(t))
        out.append(f'<line x1="{x:.1f}" y1="{top + h}" x2="{x:.1f}" y2="{top + h + 4}" stroke="#999"/>')
        out.append(f'<text x="{x:.1f}" y="{top + h + 16}" font-size="11" text-anchor="middle">{int(t)}</text>')
    out.append(f'<text x="{x0 + left + w / 2}" y="{top + h + 32}" font-size="11" text-anchor="middle">step</text>')
    if axis.log:
        out.append(f'<text x="{x0 + left + w}" y="20" font-size="11" text-anchor="end" fill="{_GREY}">log scale</text>')
    legend: List[Tuple[str, str, str]] = []
    for name, colour, pts, kind in series:
        if not pts:
            continue  # nothing drawn: no legend entry for it
        legend.append((name, colour, kind))
        if kind == "points":
            out += [f'<circle cx="{x_of(s):.1f}" cy="{axis.y(v):.1f}" r="3.5" fill="{colour}"/>' for s, v in pts]
        else:
            coords = " ".join(f"{x_of(s):.1f},{axis.y(v):.1f}" for s, v in pts)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
    if median is not None:
        y = axis.y(median)
        out.append(f'<line x1="{x0 + left}" y1="{y:.1f}" x2="{x0 + left + w}" y2="{y:.1f}" stroke="{_GREY}" '
                   'stroke-dasharray="6,4"/>')
        legend.append((f"median {median:.4g}", _GREY, "dashed"))
    x = x0 + left
    for name, colour, kind in legend:  # one row above the frame
        mark = (f'<circle cx="{x + 8}" cy="38" r="3.5" fill="{colour}"/>' if kind == "points" else
                f'<line x1="{x}" y1="38" x2="{x + 16}" y2="38" stroke="{colour}" stroke-width="2"'
                + (' stroke-dasharray="4,3"' if kind == "dashed" else "") + "/>")
        out += [mark, f'<text x="{x + 22}" y="42" font-size="11">{escape(name)}</text>']
        x += 30 + 7 * len(name)
    return out


def svg(series: Series, title: str) -> str:
    """The two charts as one SVG document: loss (log scale, ticks, eval as points) and samples/s (from zero, its
    median dashed). Pure."""
    every = [s for s, _ in series.loss + series.samples_per_s + series.eval_loss] or [0]
    steps = (min(every), max(every))
    losses = [v for _, v in series.loss + series.eval_loss]
    speeds = [v for _, v in series.samples_per_s]
    median = statistics.median(speeds) if speeds else None
    body = _panel(0, "loss", losses, steps, [("train loss", _BLUE, series.loss, "line"),
                                             ("eval loss", _RED, series.eval_loss, "points")], log=True) \
        + _panel(540, "samples/s", speeds, steps, [("samples/s", _RED, series.samples_per_s, "line")], zero=True,
                 median=median if median is not None and math.isfinite(median) else None)
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="1080" height="400" font-family="sans-serif">\n'
            f'<rect width="1080" height="400" fill="white"/>\n<title>{escape(title)}</title>\n' + "\n".join(body)
            + "\n</svg>\n")


def png(series: Series, title: str, path: str) -> bool:
    """plot.png through matplotlib (Agg), the same picture as the SVG; False when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    try:
        _draw(left, right, series)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        from cpuperf.fsutil import atomic_write_bytes

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        # Replaced as a whole, as plot.svg is: never written through a link that stands there (a plot.png linked
        # to a file outside the run directory got the PNG's bytes).
        atomic_write_bytes(path, buf.getvalue())
    except (ValueError, ArithmeticError):  # values near the float limit: matplotlib's transforms turn singular
        return False  # the SVG (drawn here, with halved arithmetic) is the picture
    finally:
        plt.close(fig)
    return True


def _draw(left: Any, right: Any, series: Series) -> None:
    """The two matplotlib panels of png(): as svg() draws them."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator
    if series.loss:
        left.plot(*zip(*series.loss), color=_BLUE, label="train loss")
    if series.eval_loss:
        left.plot(*zip(*series.eval_loss), "o", color=_RED, label="eval loss")
    losses = [v for _, v in series.loss + series.eval_loss]
    if losses and min(losses) > 0 and max(losses) > min(losses):
        lo, hi = min(losses) / 1.05, max(losses) * 1.05
        left.set_yscale("log")
        left.set_ylim(lo, hi)
        left.yaxis.set_major_locator(FixedLocator(log_ticks(lo, hi)))
        left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.4g}"))
        left.yaxis.set_minor_locator(NullLocator())
        left.yaxis.set_minor_formatter(NullFormatter())
        left.set_title("loss (log scale)")
    else:
        left.set_title("loss")
    speeds = [v for _, v in series.samples_per_s]
    if series.samples_per_s:
        right.plot(*zip(*series.samples_per_s), color=_RED, label="samples/s")
        median = statistics.median(speeds)
        right.axhline(median, color=_GREY, linestyle="--", label=f"median {median:.4g}")
        if min(speeds) >= 0:
            right.set_ylim(0, max(speeds) * 1.1 if 0 < max(speeds) < 1e300 else max(speeds) or 1)
    right.set_title("samples/s")
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.grid(True, color="#e6e6e6")
        if ax.get_legend_handles_labels()[0]:  # below the axes: never over the data
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)


def _why_no_metrics(run_dir: str) -> Optional[str]:
    """A run of a user's command (its status.json) that left no metrics.jsonl, said in the run's terms; None where
    the directory holds no such record."""
    from cpuperf.fsutil import read_capped

    try:
        status = json.loads(read_capped(os.path.join(run_dir, "status.json"), 1 << 20))
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict) or status.get("kind") != "script":
        return None
    command = status.get("command")
    words = command if isinstance(command, list) else []
    script = next((os.path.basename(str(a)) for a in words if str(a).endswith(".py")), "your command")
    log = status.get("log")
    return (f"{run_dir} is a run of {script} (exit {status.get('exit_code')}): it logged no per-step loss cpuperf "
            "reads (the Trainer's loss lines, Lightning's CSV log)" + (f"; its output is in {log}" if log else ""))


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
        why = _why_no_metrics(run_dir)
        if why is not None:
            raise UsageError(why) from None
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
