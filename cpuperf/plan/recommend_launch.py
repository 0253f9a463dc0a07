"""The environment and launch line a recommendation implies (rendered by `recommend`).

Both delegate: the runtime variables to cpuperf.decide.runtime_env (the one owner of those decisions), the
launch line to cpuperf.plan.launch.plan_launch (the planner `cpuperf train` executes), so what `recommend`
prints is what `cpuperf train --auto -- python your_script.py` would run.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from cpuperf.decide.recommend import Recommendation
from cpuperf.probe.facts import HostFacts
from cpuperf.probe.hosts import Host

SCRIPT_PLACEHOLDER = "your_script.py"
DEFAULT_MASTER_PORT = 29500


def _env_vars(facts: HostFacts, rec: Recommendation, hosts: Optional[Sequence[Host]]) -> List[Any]:
    from cpuperf.decide import runtime_env as envplan
    v = rec.values()
    backend = v["ddp_backend"] if v["ddp_backend"] in ("ccl", "gloo") else "gloo"
    nnodes = max(1, int(v["nnodes"]))
    master = None if hosts else ("127.0.0.1" if nnodes > 1 else None)  # placeholder a user replaces
    rt = envplan.runtime_env(facts, rec.placement, backend=backend, hosts=hosts, master_addr=master,
                             preload=bool(v["allocator"]), nnodes=nnodes, environ={})
    return list(rt.vars)


def recommend_env(facts: HostFacts, rec: Recommendation, hosts: Optional[Sequence[Host]] = None) -> Dict[str, str]:
    """name -> value of the variables the launch sets (CPU threads, oneCCL, rendezvous, preload)."""
    v = rec.values()
    world = v["nproc_per_node"] * v["nnodes"]
    env: Dict[str, str] = {}
    for var in _env_vars(facts, rec, hosts):
        if v["device"] != "cpu" and var.name == "OMP_NUM_THREADS":
            continue
        if world <= 1 and var.name.startswith(("MASTER_", "GLOO_", "CCL_")):
            continue
        env[var.name] = var.value
    if v["device"] == "cpu" and "OMP_NUM_THREADS" in env:
        env["OMP_NUM_THREADS"] = str(v["threads_per_rank"])  # a --set threads_per_rank wins over placement
    return env


def recommend_launch(facts: HostFacts, rec: Recommendation, hosts: Optional[Sequence[Host]] = None,
                     script: Sequence[str] = (SCRIPT_PLACEHOLDER,)) -> Dict[str, Any]:
    """{"launcher", "argv", "env"}: the command line plan_launch makes for `python your_script.py`."""
    from cpuperf.plan.launch import SLOTS_VAR, plan_launch

    v = rec.values()
    env_vars = _env_vars(facts, rec, hosts)
    plan = plan_launch(facts, rec.placement, rank_command=["python", *script], env_vars=env_vars,
                       hosts=hosts, nnodes=max(1, int(v["nnodes"])), pin=v["device"] == "cpu", python="python",
                       launcher=None if not hosts or len(hosts) <= 1 else "torchrun", local_addr=None)
    argv = list(plan.argv)
    if plan.launcher == "torchrun":
        argv = ["torchrun", *argv[3:]]  # `python -m torch.distributed.run` is the `torchrun` script
    extra = {SLOTS_VAR: plan.env[SLOTS_VAR]} if SLOTS_VAR in plan.env else {}
    if plan.launcher == "direct" and plan.affinity:
        from cpuperf.probe.parse import format_cpulist

        argv = ["taskset", "-c", format_cpulist(plan.affinity), *argv]
    return {"launcher": None if plan.launcher == "direct" else plan.launcher, "argv": argv, "env": extra}
