"""`cpuperf plot RUN_DIR`: a picture of a run's loss and samples/s (also drawn at the end of `cpuperf train`)."""

from __future__ import annotations

import os
from typing import Any, Dict

from cpuperf.errors import ExitCode, FilesystemError, UsageError
from cpuperf.output import Output


def plot_run(run_dir: str, out_dir: str | None = None) -> Dict[str, Any]:
    """Read RUN_DIR/metrics.jsonl (bounded), write plot.svg (always) and plot.png (with matplotlib) into
    out_dir (default RUN_DIR). Returns the --json object; bad input is a UsageError, a write an exit-10 error."""
    from cpuperf.errors import from_os_error
    from cpuperf.fsutil import InputRefused, atomic_write_bytes, read_capped
    from cpuperf.render import plot

    if not run_dir.strip():
        raise UsageError("RUN_DIR is empty", hint="cpuperf plot runs/train/version_0")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir} is not a run directory ({'not a directory' if os.path.exists(run_dir) else 'no such directory'})",
                         hint="name the directory cpuperf train wrote (its --out, or runs/train/version_N)")
    try:
        text = read_capped(metrics, plot.MAX_METRICS_BYTES).decode("utf-8", "replace")
    except FileNotFoundError:
        raise UsageError(f"{run_dir} holds no metrics.jsonl", hint="name a directory cpuperf train wrote") from None
    except InputRefused as exc:
        raise UsageError(f"metrics {exc}") from None
    except OSError as exc:
        raise from_os_error(exc) from None
    series = plot.parse_metrics(text)
    if not series.loss and not series.samples_per_s:
        raise UsageError(f"{metrics} holds no training step yet", hint="plot a run that has logged a step")
    target = out_dir or run_dir
    title = f"cpuperf train: {os.path.abspath(run_dir)}"
    files = []
    try:
        os.makedirs(target, exist_ok=True)
        svg_path = os.path.join(target, "plot.svg")
        atomic_write_bytes(svg_path, plot.svg(series, title).encode())
        files.append(svg_path)
        png_path = os.path.join(target, "plot.png")
        if plot.png(series, title, png_path):
            files.append(png_path)
    except OSError as exc:
        raise from_os_error(exc) from None
    return {"schema": plot.SCHEMA, "run_dir": os.path.abspath(run_dir), "files": files,
            "png": len(files) > 1, "steps": len(series.loss), "series": series.to_json()}


def run(out: Output, run_dir: str, out_dir: str | None) -> int:
    result = plot_run(run_dir, out_dir)
    if out.json_mode:
        out.json(result)
    else:
        if not result["png"]:
            out.info("plot: matplotlib is not importable, so no plot.png (pip install -e '.[bench]'); plot.svg drawn")
        out.product("\n".join(result["files"]))
    return int(ExitCode.OK)


__all__ = ["plot_run", "run", "FilesystemError"]
