"""How `recommend` shows the launch line of its JobPlan (cpuperf.plan.job): the command a user would type."""

from __future__ import annotations

from typing import Dict, List, Optional, TypedDict

from cpuperf.plan.launch import SLOTS_VAR, LaunchPlan

SCRIPT_PLACEHOLDER = "your_script.py"


class LaunchView(TypedDict):
    launcher: Optional[str]  # None: cpuperf starts the command itself (direct)
    argv: List[str]
    env: Dict[str, str]


def launch_view(plan: LaunchPlan) -> LaunchView:
    """{"launcher", "argv", "env"}: plan_launch's command for `python your_script.py`, as typed by hand."""
    argv = list(plan.argv)
    if plan.launcher == "torchrun":
        argv = ["torchrun", *argv[3:]]  # `python -m torch.distributed.run` is the `torchrun` script
    extra = {SLOTS_VAR: plan.env[SLOTS_VAR]} if SLOTS_VAR in plan.env else {}
    if plan.launcher == "direct" and plan.affinity:
        from cpuperf.probe.parse import format_cpulist

        argv = ["taskset", "-c", format_cpulist(plan.affinity), *argv]
    return LaunchView(launcher=None if plan.launcher == "direct" else plan.launcher, argv=argv, env=extra)
