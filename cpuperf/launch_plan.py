"""The environment and launch line a recommendation implies (rendered by `recommend`).

The runtime variables come from cpuperf.envplan when present (the one owner of those decisions);
the launch line is a torchrun/mpirun command for the user's script.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from cpuperf.hostfile import Host
from cpuperf.probe.facts import HostFacts
from cpuperf.recommend import Recommendation

SCRIPT_PLACEHOLDER = "your_script.py"
DEFAULT_MASTER_PORT = 29500


def recommend_env(facts: HostFacts, rec: Recommendation, hosts: Optional[Sequence[Host]] = None) -> Dict[str, str]:
    v = rec.values()
    env: Dict[str, str] = {}
    if v["device"] == "cpu":
        env["OMP_NUM_THREADS"] = str(v["threads_per_rank"])
    world = v["nproc_per_node"] * v["nnodes"]
    if world > 1:
        env["MASTER_ADDR"] = hosts[0].name if hosts else "127.0.0.1"
        env["MASTER_PORT"] = str(DEFAULT_MASTER_PORT)
    return env


def recommend_launch(facts: HostFacts, rec: Recommendation, hosts: Optional[Sequence[Host]] = None,
                     script: Sequence[str] = (SCRIPT_PLACEHOLDER,)) -> Dict[str, Any]:
    v = rec.values()
    nproc, nnodes = v["nproc_per_node"], v["nnodes"]
    if nproc * nnodes == 1:
        return {"launcher": None, "argv": ["python", *script], "env": {}}
    argv = ["torchrun", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}"]
    if nnodes > 1:
        master = hosts[0].name if hosts else "127.0.0.1"
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={master}:{DEFAULT_MASTER_PORT}"]
    else:
        argv += ["--standalone"]
    return {"launcher": "torchrun", "argv": [*argv, *script], "env": {}}
