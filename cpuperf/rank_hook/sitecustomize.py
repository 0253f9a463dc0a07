"""Rank 0's real GPU memory peak, reported from inside a user's own script (cpuperf train --auto on a GPU).

cpuperf puts this folder first on PYTHONPATH of the job it launches, so Python imports this file at start-up as
`sitecustomize`. It registers one exit handler and then hands over to the sitecustomize the job had without it
(site-packages' or the user's own): `import sitecustomize` afterwards gives that one, and this folder is gone
from sys.path. At exit, where the process imported torch and used a CUDA device, rank 0 (RANK, else LOCAL_RANK,
else a lone process) writes torch.cuda.max_memory_allocated / max_memory_reserved of its device to the file
CPUPERF_GPU_PEAK_FILE names, replaced atomically: the rank's main process ends after its helpers, so its
figure is the one left. Anything that fails here is skipped: the report must never change the job.

Standard library only and no cpuperf import: the user's interpreter need not have cpuperf installed.
CPUPERF_RECORDED_GPU_PEAK (JSON, tests only) stands for what torch.cuda would report, as recorded GPU answers
(CPUPERF_OVERRIDE_GPUS) stand for the card: it lets a host without one drive this path.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys

_FILE = "CPUPERF_GPU_PEAK_FILE"
_RECORDED = "CPUPERF_RECORDED_GPU_PEAK"


def _rank_zero() -> bool:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value is not None:
            return value.strip() == "0"
    return True


def _peak() -> dict[str, object] | None:
    torch = sys.modules.get("torch")
    if torch is None:  # the job never imported torch: nothing to report
        return None
    recorded = os.environ.get(_RECORDED)
    if recorded:
        answer = json.loads(recorded)
        return answer if isinstance(answer, dict) else None
    cuda = torch.cuda
    if not cuda.is_initialized():
        return None
    device = cuda.current_device()
    return {"max_allocated_bytes": int(cuda.max_memory_allocated(device)),
            "max_reserved_bytes": int(cuda.max_memory_reserved(device)), "device_name": str(cuda.get_device_name(device))}


def _report() -> None:
    path = os.environ.get(_FILE)
    if not path or not _rank_zero():
        return
    try:
        peak = _peak()
        if peak is None:
            return
        peak["pid"] = os.getpid()
        temporary = f"{path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(peak))
        os.replace(temporary, path)
    except Exception:  # noqa: BLE001  (a report that fails is a report not made, never a failed job)
        return


def _hand_over() -> None:
    """Run the sitecustomize this job would have run without this folder, and leave sys.path as it would be."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":  # theirs exists and failed: as Python itself would, say so and go on
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)
        if mine is not None and "sitecustomize" not in sys.modules:
            sys.modules["sitecustomize"] = mine
    except Exception as exc:  # noqa: BLE001  (site.py itself says this and goes on)
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


atexit.register(_report)
_hand_over()
