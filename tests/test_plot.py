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
    assert len(lines) == 3 and all(len(p.get("points", "").split()) >= 1 for p in lines)


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
    assert f"plot: {out / 'plot.svg'}" in proc.stderr
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
