"""`train --verbose`: where a run's wall time went outside the job, each part named, for a direct launch and a
torchrun launch of a user's command (real processes: cpuperf's own start counts from the kernel's start time)."""

from __future__ import annotations

import re
import sys

import pytest
from cli_util import run_cli

from cpuperf.run import timeline


def _parts(stderr: str):
    return [(m.group(1), float(m.group(2))) for m in re.finditer(r"timing: (.+?) ([0-9.]+) s", stderr)]


@pytest.mark.full  # a real train run, as a process: its start is the kernel's
def test_a_direct_launch_names_each_part_and_the_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import time\ntime.sleep(0.3)\nprint('done')\n")
    proc = run_cli(["train", "--auto", "--verbose", "--out", str(tmp_path / "run"), "--", sys.executable, str(script)],
                   process=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = [name for name, _ in _parts(proc.stderr)]
    assert names[0] == "start Python, import cpuperf, read the options"
    assert names.index("start the job (its exec)") < names.index("job") < names.index("reap the job's group and output")
    assert names[-1] == "cpuperf's own"  # the total outside the job
    parts = dict(_parts(proc.stderr))
    assert parts["job"] >= 0.3  # the script's own sleep is the job's
    own = sum(s for n, s in _parts(proc.stderr)[:-1] if n != "job")  # a direct launch: no launcher's part
    assert abs(own - parts["cpuperf's own"]) < 0.01
    quiet = run_cli(["train", "--auto", "--out", str(tmp_path / "run2"), "--", sys.executable, str(script)],
                    process=True, timeout=120)
    assert quiet.returncode == 0 and "timing:" not in quiet.stderr  # only asked for


@pytest.mark.full
def test_a_torchrun_launch_says_when_the_first_rank_started(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("print('rank')\n")
    proc = run_cli(["train", "--auto", "--verbose", "--nproc-per-node", "2", "--out", str(tmp_path / "run"), "--",
                    sys.executable, str(script)], process=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    names = [name for name, _ in _parts(proc.stderr)]
    assert names.index("start torchrun") < names.index("torchrun until the first rank's exec") < names.index("job")
    assert "torchrun until the first rank's exec" in proc.stderr.split("(the launcher)")[0].splitlines()[-1]


def test_parts_count_from_the_process_start_and_never_go_back():
    timeline.reset()
    timeline.mark("a")
    timeline.mark("b", at=timeline.now() - 3600, whose="the job")  # a time before the last mark: 0, not negative
    timeline.mark("c")
    rows = timeline.parts()
    assert [p for p, _, _ in rows] == ["a", "b", "c"] and rows[1][1] == 0.0 and all(s >= 0 for _, s, _ in rows)
    assert rows[0][1] > 0  # from this process's own start (the interpreter and the test's imports)
    lines = timeline.render()
    assert lines[-1].startswith("timing: cpuperf's own") and "(the job)" in lines[1]
    assert abs(float(lines[-1].split()[3]) - rows[0][1] - rows[2][1]) < 0.002
    timeline.reset()
