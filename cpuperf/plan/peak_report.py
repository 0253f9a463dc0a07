"""Rank 0's real GPU memory peak, asked of a user's own script: the job's variables that make its rank 0 report it.

The built-in loop reports its own peak (cpuperf.train.loop); a user's script cannot be asked to. On a GPU under
--auto, cpuperf puts `cpuperf/rank_hook` first on the job's PYTHONPATH (its sitecustomize hands over to the
job's own and writes the peak at exit) and names the file rank 0 writes in the run directory. Placement of the
report only: the job's code, its math and its other variables stay as they were, and a plain run gets nothing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from cpuperf.boundary import GPU_PEAK_FILE
from cpuperf.decide.runtime_env import EnvVar
from cpuperf.plan.job import JobPlan

HOOK_DIR = str(Path(__file__).resolve().parent.parent / "rank_hook")
PEAK_FILE_NAME = "gpu_peak.json"
WHY = "rank 0 reports its real GPU memory peak at exit (cpuperf/rank_hook: your own sitecustomize still runs)"


def reporting_peak(jp: JobPlan, environ: Mapping[str, str]) -> JobPlan:
    """The plan with rank 0's peak report added, where a user's script runs on a GPU under --auto; else as it is."""
    if not (jp.request.auto and jp.request.asked.user_argv and jp.rec.levers.on_gpu):
        return jp
    theirs = environ.get("PYTHONPATH", "")
    added = (EnvVar("PYTHONPATH", HOOK_DIR + (os.pathsep + theirs if theirs else ""), "cpuperf", WHY),
             EnvVar(GPU_PEAK_FILE, peak_file(jp.request.out_dir), "cpuperf", WHY))
    names = {e.name for e in added}
    launch = replace(jp.launch, env={**jp.launch.env, **{e.name: e.value for e in added}},
                     env_reasons={**jp.launch.env_reasons, **{e.name: e.reason for e in added}})
    return replace(jp, env=(*(e for e in jp.env if e.name not in names), *added), launch=launch)


def peak_file(run_dir: str) -> str:
    return os.path.join(run_dir, PEAK_FILE_NAME)
