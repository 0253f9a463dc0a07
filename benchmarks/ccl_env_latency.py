"""Median wall time of `cpuperf ccl-env` against the `python -c "import typer, rich"` floor.

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
    """Median wall time of each argv; runs interleaved so that load from elsewhere hits all alike."""
    times = [[] for _ in commands]
    for _ in range(runs):
        for i, argv in enumerate(commands):
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    root = Path(__file__).resolve().parent.parent
    compileall.compile_dir(str(root / "cpuperf"), quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(root)
    floor, ccl, ccl_json = medians([[sys.executable, "-c", "import typer, rich"],
                                    [sys.executable, "-m", "cpuperf", "ccl-env"],
                                    [sys.executable, "-m", "cpuperf", "ccl-env", "--json"]], runs, env)
    result = {"runs": runs, "floor_s": round(floor, 4), "ccl_env_s": round(ccl, 4),
              "ccl_env_json_s": round(ccl_json, 4), "ratio": round(ccl / floor, 2)}
    print(json.dumps(result))
    return 0 if ccl <= 1.5 * floor else 1


if __name__ == "__main__":
    raise SystemExit(main())
