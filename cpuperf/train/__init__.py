"""The built-in training loop that `cpuperf train` launches (worker: `python -m cpuperf.train.worker`).

Nothing in this package imports torch at module import time, except model.py and worker.py,
which are only imported inside the worker process. Importing `cpuperf.train` itself is cheap.
"""

from __future__ import annotations

SCHEMA = "cpuperf.train/1"
