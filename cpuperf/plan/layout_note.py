"""Your launcher's layout beside cpuperf's plan for the same script, where both were measured on this host.

`cpuperf train --auto -- torchrun --nproc-per-node 2 train.py` runs your layout (said, and kept); when `train --tune`
measured both that command and the same script as cpuperf plans it (`python train.py ...`, cpuperf choosing the
ranks and threads), and yours is slower beyond the tunings' noise, one note says so with both figures and the
command that runs the plan. Nothing cached for one of them: nothing is said beyond what the tuning note says
(`--tune` measures a command). Pure: the cached tunings come in (Measurements.tuned_by_command).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import Any, Mapping, Optional, Sequence, Tuple

from cpuperf.plan.command import CommandLine
from cpuperf.plan.script_read import ScriptRead
from cpuperf.plan.user_script import key_of_command

# A difference under this share is not said, whatever the tunings' own noise (two medians of short runs).
MIN_GAIN = 0.10


def _rate(entry: Optional[Mapping[str, Any]]) -> Optional[float]:
    rate = entry.get("best_samples_per_s") if entry else None
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0 else None


def _best(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    best = entry.get("best")
    return best if isinstance(best, dict) else {}


def _layout(entry: Mapping[str, Any], ranks: Optional[int]) -> str:
    best = _best(entry)
    n = ranks if ranks is not None else best.get("ranks")
    threads = best.get("threads")
    words = f"{n} process(es)" if isinstance(n, int) else "its process(es)"
    return words + (f" x {threads} thread(s)" if isinstance(threads, int) else "")


def _when(entry: Mapping[str, Any]) -> str:
    at = entry.get("measured_at")
    return time.strftime("%Y-%m-%d", time.gmtime(float(at))) if isinstance(at, (int, float)) else "a past run"


def _noise(entry: Mapping[str, Any]) -> float:
    noise = entry.get("noise")
    return float(noise) if isinstance(noise, (int, float)) and not isinstance(noise, bool) else 0.0


def plan_command(command: CommandLine, python: str) -> Optional[Tuple[str, ...]]:
    """The user's command without its launcher: the same script and arguments run by `python`, for cpuperf to place
    (None where the launcher runs no script file of one's own)."""
    cmd = command.script
    if command.launcher is None or cmd.script is None or cmd.module is not None:
        return None
    return (python, cmd.script, *cmd.script_args)


def slower_layout(command: Optional[CommandLine], read: Optional[ScriptRead], script_text: Optional[str],
                  tuned: Mapping[str, Mapping[str, Any]], pythons: Sequence[str]) -> Optional[str]:
    """One note where your launcher's layout of this script measured slower here than cpuperf's plan for it (both
    from cached `train --tune` results of the same script), with both figures and the command that runs the plan;
    None where either is not measured, the layouts are the same, or the difference is within the noise."""
    if command is None or command.launcher is None:
        return None
    yours = tuned.get(key_of_command(command.script, read, script_text))
    for python in dict.fromkeys(pythons):
        argv = plan_command(command, python)
        if argv is None:
            return None
        plain = dataclasses.replace(command.script, argv=argv, launcher=None, nproc=None)
        ours = tuned.get(key_of_command(plain, read, script_text))
        if ours is not None:
            break
    else:
        return None
    y, p = _rate(yours), _rate(ours)
    if yours is None or y is None or p is None:
        return None
    ranks = command.script.nproc
    if ranks is not None and _best(ours).get("ranks") == ranks:
        return None  # the same number of processes: not a layout of yours against the plan's
    if p < y * (1 + max(MIN_GAIN, 2 * max(_noise(yours), _noise(ours)))):
        return None
    line = shlex.join(["cpuperf", "train", "--auto", "--", *command.script.rewrap(argv)])
    if not line.isprintable():
        return None
    launcher = command.script.launcher or "launcher"
    return (f"your {launcher}'s layout ({_layout(yours, ranks)}) trained {y:.1f} samples/s here in its tuning of "
            f"{_when(yours)}; cpuperf's plan for the same script ({_layout(ours, None)}) trained {p:.1f} samples/s in "
            f"its own of {_when(ours)}: {p / y:.1f}x as fast; `{line}` runs the plan")
