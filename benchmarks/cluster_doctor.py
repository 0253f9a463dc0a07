"""`cpuperf doctor --hostfile` wall time for 1, 2 and 4 nodes: the nodes are probed in parallel, so the
time should stay nearly flat as nodes are added (root only: the nodes are network namespaces).

Each node is a network namespace on one bridge, reached through real mpirun (tests/netns.py has the
setup and the rsh agent). Rounds alternate 1, 2, 4 nodes so outside load hits every size alike; the
figures are medians and their ratio to the 1-node time.

Usage: python benchmarks/cluster_doctor.py [ROUNDS]   (3 by default)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1, 2, 4)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?")
    except OSError:
        return "?"


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sys.path.insert(0, str(ROOT / "tests"))
    from cli_util import cli_env
    from netns import namespace_nodes

    times = {n: [] for n in SIZES}
    with tempfile.TemporaryDirectory() as tmp, namespace_nodes(max(SIZES), Path(tmp)) as nodes:
        env = cli_env({**nodes.env(), "PYTHONPATH": str(ROOT)})
        for _ in range(rounds):
            for n in SIZES:
                argv = nodes.on_first([sys.executable, "-m", "cpuperf", "doctor", "--hostfile",
                                       str(nodes.hostfile(count=n)), "--json"])
                t0 = time.perf_counter()
                proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
                times[n].append(time.perf_counter() - t0)
                rows = json.loads(proc.stdout)["nodes"]
                if proc.returncode != 0 or [r["status"] for r in rows] != ["ok"] * n:
                    print(proc.stderr[-2000:], file=sys.stderr)
                    return 1
    med = {n: statistics.median(t) for n, t in times.items()}
    print(json.dumps({"host": _cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
                      "rounds": rounds, "transport": "mpirun", "median_s": {str(n): round(t, 2) for n, t in med.items()},
                      "ratio_to_1_node": {str(n): round(t / med[1], 2) for n, t in med.items()},
                      "load_avg_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
