"""A picture of a run: `cpuperf plot RUN_DIR` and the end of `cpuperf train` draw loss and samples/s from
metrics.jsonl (plot.svg always, plot.png with matplotlib); --json carries the series."""

from __future__ import annotations

import importlib.util
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_util import run_cli

from cpuperf.render import plot

METRICS = "\n".join([
    json.dumps({"type": "settings", "schema": "cpuperf.train/1", "settings": {}}),
    json.dumps({"type": "step", "step": 1, "loss": 6.6, "samples_per_s": 18.0}),
    json.dumps({"type": "step", "step": 2, "loss": 6.4, "samples_per_s": 90.5}),
    '{"type": "step", "step": 3, "loss": NaN, "samples_per_s": 91.0}',
    json.dumps({"type": "eval", "step": 2, "eval_loss": 6.3}),
    json.dumps({"type": "step", "step": 4, "loss": 6.1, "samples_per_s": 95.0}),
    '{"type": "step", "step": 5, "loss": 6.0, "sampl',  # torn by a kill mid-write
]) + "\n"


def test_parse_keeps_finite_points_and_counts_the_rest():
    s = plot.parse_metrics(METRICS)
    assert s.loss == ((1, 6.6), (2, 6.4), (4, 6.1))
    assert s.samples_per_s == ((1, 18.0), (2, 90.5), (3, 91.0), (4, 95.0))
    assert s.eval_loss == ((2, 6.3),) and s.skipped == 2
    doc = ET.fromstring(plot.svg(s, "run <&>"))  # well-formed, the title escaped
    lines = doc.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 2 and all(len(p.get("points", "").split()) >= 1 for p in lines)  # train loss, samples/s
    assert len(doc.findall("{http://www.w3.org/2000/svg}circle")) == 2  # the eval point, and its legend mark


def _attempt(resumed_from, steps, evals=()):
    lines = [json.dumps({"type": "settings", "settings": {}, "resumed_from": resumed_from})]
    lines += [json.dumps({"type": "step", "step": s, "loss": 10.0 - s / 10 - (resumed_from or 0) / 1000,
                          "samples_per_s": 50.0 + s}) for s in steps]
    lines += [json.dumps({"type": "eval", "step": s, "eval_loss": 5.0}) for s in evals]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("attempts, steps, evals", [
    # SIGKILL before the first checkpoint, then --resume: it starts from step 0 again (issue 53, case 4)
    ([(None, (1, 10), ()), (None, (1, 10, 20), ())], (1, 10, 20), ()),
    # killed after the checkpoint at step 10, having logged 15: the resumed attempt does 11.. again
    ([(None, (1, 10, 15), (10, 15)), (10, (20, 30), (20,))], (1, 10, 20, 30), (10, 20)),
    # three attempts, the middle one killed before logging a step
    ([(None, (1, 5), ()), (5, (), ()), (5, (10,), ())], (1, 5, 10), ()),
])
def test_a_resumed_run_draws_one_series_each_step_once(attempts, steps, evals):
    s = plot.parse_metrics("".join(_attempt(r, st, ev) for r, st, ev in attempts))
    assert tuple(x for x, _ in s.loss) == steps and tuple(x for x, _ in s.samples_per_s) == steps
    assert tuple(x for x, _ in s.eval_loss) == evals
    last = attempts[-1][0] or 0  # the points after the resume point are the last attempt's
    assert all(v == 10.0 - x / 10 - last / 1000 for x, v in s.loss if x > last)


@pytest.mark.smoke("plot")
def test_plot_command_writes_the_picture_and_json(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(METRICS)
    proc = run_cli(["plot", str(run), "--json"], process=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == "cpuperf.plot/1" and data["series"]["loss"] == [[1, 6.6], [2, 6.4], [4, 6.1]]
    assert data["files"][0] == str(run / "plot.svg") and (run / "plot.svg").stat().st_size > 500
    assert data["png"] == (importlib.util.find_spec("matplotlib") is not None)
    if data["png"]:
        assert (run / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run_cli(["plot", str(run), "--out", str(tmp_path / "pics")])
    assert text.returncode == 0 and text.stdout.splitlines()[0] == str(tmp_path / "pics" / "plot.svg")


@pytest.mark.parametrize("setup, code, words", [
    ("missing", 2, "no such directory"), ("file", 2, "not a directory"), ("empty", 2, "no metrics.jsonl"),
    ("nosteps", 2, "no training step"), ("fifo", 2, "FIFO"), ("out-is-file", 10, "plot.svg"),
])
def test_plot_bad_input_is_one_line(tmp_path, setup, code, words):
    run = tmp_path / "run"
    args = []
    if setup == "file":
        run.write_text("x")
    elif setup != "missing":
        run.mkdir()
    if setup == "nosteps":
        (run / "metrics.jsonl").write_text('{"type": "settings"}\n')
    if setup == "fifo":
        os.mkfifo(run / "metrics.jsonl")
    if setup == "out-is-file":
        (run / "metrics.jsonl").write_text(METRICS)
        (tmp_path / "pics").mkdir()
        (tmp_path / "pics" / "plot.svg").mkdir()  # a directory where the picture goes
        args = ["--out", str(tmp_path / "pics")]
    proc = run_cli(["plot", str(run), *args])
    assert proc.returncode == code, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and words in errors[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.full  # a real run
def test_train_draws_the_plot_at_the_end(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    proc = run_cli(["train", "--model", "micro", "--max-steps", "6", "--set", "log_every=2", "--set", "eval_every=0",
                    "--out", str(out), "--json"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["plot"][0] == str(out / "plot.svg") and result["run_dir"] == str(out)
    assert result["run_files"]["status"] == str(out / "status.json") and (out / "status.json").is_file()
    assert ET.parse(Path(out / "plot.svg")).getroot().tag.endswith("svg")


@pytest.mark.parametrize("big", [1e308, 1.7976931348623157e308])
def test_values_near_the_float_limit_give_finite_coordinates(tmp_path, big):
    lines = [{"type": "step", "step": 1, "loss": big, "samples_per_s": -big},
             {"type": "step", "step": 2, "loss": -big, "samples_per_s": big},
             {"type": "step", "step": 3, "loss": 1.0, "samples_per_s": 5.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    proc = run_cli(["plot", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(tmp_path / "plot.svg").getroot()
    points = [p.get("points") for p in root.iter("{http://www.w3.org/2000/svg}polyline") if p.get("points")]
    assert points
    for coords in points:
        for pair in coords.split():
            assert all(abs(float(c)) < 2000 for c in pair.split(",")), coords


def _run_metrics(steps, eval_every=0):
    import math

    out = []
    for step in range(1, steps + 1):
        out.append({"type": "step", "step": step, "loss": 3.4 + 7.0 * math.exp(-step / 60) + 0.2 * ((step * 7) % 5) / 5,
                    "samples_per_s": 1.5 if step == 1 else 8.0 + (step % 3)})
        if eval_every and step % eval_every == 0:
            out.append({"type": "eval", "step": step, "eval_loss": 3.3 + 7.0 * math.exp(-step / 60)})
    return "\n".join(json.dumps(r) for r in out) + "\n"


def _texts(doc):
    return [t.text for t in doc.iter("{http://www.w3.org/2000/svg}text")]


def test_the_picture_reads_at_a_glance_log_loss_eval_points_speed_from_zero_legends_above():
    """400 steps with an eval every 100: loss on a log axis with labelled ticks between its ends, eval as points,
    samples/s from zero with its median, every legend above its frame (never over the data)."""
    s = plot.parse_metrics(_run_metrics(400, eval_every=100))
    doc = ET.fromstring(plot.svg(s, "run"))
    texts = _texts(doc)
    assert "log scale" in texts and {"4", "5", "6", "8", "10"} <= set(texts)  # loss ticks between 3.4 and 10.4
    assert "0" in texts and any(t.startswith("median 9") for t in texts)  # samples/s from zero; its median
    circles = doc.findall("{http://www.w3.org/2000/svg}circle")
    assert len(circles) == 4 + 1  # four eval points and the legend's mark
    frames = [r for r in doc.iter("{http://www.w3.org/2000/svg}rect") if r.get("stroke")]
    frame_top = min(float(r.get("y")) for r in frames)
    legend = [t for t in doc.iter("{http://www.w3.org/2000/svg}text") if t.text in ("train loss", "eval loss", "samples/s")
              or (t.text or "").startswith("median")]
    assert legend and all(float(t.get("y")) < frame_top for t in legend)  # above the data, not over it
    assert plot.log_ticks(3.2, 11) == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0] and plot.nice_ticks(0, 11) == [0, 5, 10]
    assert plot.log_ticks(5.7, 6.6) == [5.8, 6.0, 6.2, 6.4, 6.6]  # a short run's narrow range still gets labels


def test_a_short_run_without_eval_draws_no_eval_legend():
    doc = ET.fromstring(plot.svg(plot.parse_metrics(_run_metrics(5)), "run"))
    assert "eval loss" not in _texts(doc) and "train loss" in _texts(doc)
    assert not [c for c in doc.iter("{http://www.w3.org/2000/svg}circle")]


def test_a_png_beside_the_svg_where_matplotlib_is_installed(tmp_path):
    """The same picture through matplotlib: written, a real PNG of a sensible size (look at it: pytest --basetemp
    DIR keeps it under DIR)."""
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.jsonl").write_text(_run_metrics(400, eval_every=100))
    got = plot.plot_run(str(tmp_path))
    assert got["png"] and got["files"] == [str(tmp_path / "plot.svg"), str(tmp_path / "plot.png")]
    head = (tmp_path / "plot.png").read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert width > 1000 and 400 < height < 600
