"""Median wall time of `cpuperf ccl-env` (deciding here, and rendering a saved plan with --plan) against the
`python -c "import typer, rich"` floor.

Usage: python benchmarks/ccl_env_latency.py [RUNS]   (bytecode is compiled first, as an install has it)
"""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def medians(commands, runs: int, env):
    """Median wall and CPU (user+sys) time of each argv, runs interleaved so outside load hits all alike."""
    wall = [[] for _ in commands]
    cpu = [[] for _ in commands]
    for _ in range(runs):
        for i, argv in enumerate(commands):
            start = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            _, _, usage = os.wait4(proc.pid, 0)
            wall[i].append(time.perf_counter() - start)
            cpu[i].append(usage.ru_utime + usage.ru_stime)
            proc.returncode = 0
    return [statistics.median(t) for t in wall], [statistics.median(t) for t in cpu]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    root = Path(__file__).resolve().parent.parent
    compileall.compile_dir(str(root / "cpuperf"), quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(root)
    # What the `cpuperf` console script runs (the installed script may belong to another checkout).
    cpuperf = [sys.executable, "-c", "import sys; from cpuperf.entry import main; sys.exit(main())"]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # a saved plan, as `eval "$(cpuperf ccl-env --plan F)"` reads it
        plan = os.path.join(tmp, "plan.json")
        subprocess.run(cpuperf + ["recommend", "--save", plan, "--quiet"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (floor, ccl, ccl_json, ccl_plan), (floor_cpu, ccl_cpu, _, plan_cpu) = medians(
            [[sys.executable, "-c", "import typer, rich"], cpuperf + ["ccl-env"], cpuperf + ["ccl-env", "--json"],
             cpuperf + ["ccl-env", "--plan", plan]], runs, env)
    result = {"runs": runs, "floor_s": round(floor, 4), "ccl_env_s": round(ccl, 4),
              "ccl_env_json_s": round(ccl_json, 4), "ratio": round(ccl / floor, 2),
              "ccl_env_plan_s": round(ccl_plan, 4), "plan_ratio": round(ccl_plan / floor, 2),
              "floor_cpu_s": round(floor_cpu, 4), "ccl_env_cpu_s": round(ccl_cpu, 4),
              "cpu_ratio": round(ccl_cpu / floor_cpu, 2), "plan_cpu_ratio": round(plan_cpu / floor_cpu, 2),
              "load_avg_1m": os.getloadavg()[0]}
    print(json.dumps(result))
    return 0 if min(ccl, ccl_plan) <= 1.5 * floor else 1


if __name__ == "__main__":
    raise SystemExit(main())
