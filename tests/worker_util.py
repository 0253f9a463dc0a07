"""The training worker run as users run it (`python -m cpuperf.train.worker`), with tiny shapes
(tests/test_train_worker.py, tests/test_mfu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Tiny shapes so the suite stays fast on 2 cores.
MICRO = {"preset": "micro", "batch_size": 8, "log_every": 5, "eval_every": 10, "ckpt_every": 10,
         "eval_batches": 2, "warmup": 5, "lr": 0.003, "progress": "plain", "threads_per_rank": 1}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "PMI_", "OMPI_",
                                "SLURM_", "CPUPERF_DEBUG"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _settings(out: Path, cache: str, **kw) -> str:
    return json.dumps({**MICRO, "out_dir": str(out), "tokenizer_cache": cache, **kw})


def run_worker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpuperf.train.worker", *args], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=timeout)
