"""benchmarks/overhead.py: the run_clm-like script is read as a Trainer script (flags added, its model type named),
the plain run is exactly the plan's command, and the table says when the target is missed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cli_util import run_cli

from benchmarks import overhead


def test_the_script_is_planned_as_a_trainer_script_with_its_model_type(tmp_path):
    text = overhead.corpus(tmp_path / "train.txt", lines=50)
    assert text.read_text() == overhead.corpus(tmp_path / "again.txt", lines=50).read_text()  # the same every time
    argv = overhead.command(text, tmp_path / "out", steps=2)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--out", str(tmp_path / "run"), "--", *argv],
                   extra_env={"CPUPERF_OVERRIDE_GPUS": "[]"})
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    launch = plan["launch"]
    assert launch["launcher"] == "direct" and launch["argv"][:len(argv)] == argv
    added = launch["argv"][len(argv):]
    assert "--use_cpu" in added or "--bf16" not in added  # what the plain run gets too: the plan's own argv
    assert "--model_type gpt2" in json.dumps(plan["workload"])  # read from the script's own parser's arguments


def test_the_table_says_met_or_missed():
    row = {"steps": 3, "rounds": 2, "added_wall_s_median": 0.7, "added_before_first_line_s_median": 0.4,
           "added_after_last_line_s_median": 0.0, "added_script_s_median": 0.3, "added_cpu_s_median": 0.45,
           "added_wall_s": [0.6, 0.8], "met": False, "target": "added wall time <= 0.5 s"}
    line = overhead.markdown(row)[-1]
    assert "+0.70 s" in line and "MISSED: added wall time <= 0.5 s" in line
    assert overhead.markdown({**row, "met": True})[-1].endswith("| met |")
    assert Path(overhead.SCRIPT).is_file() and sys.executable
