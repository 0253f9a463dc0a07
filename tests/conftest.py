from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Tests describe hosts through --sysroot and CPUPERF_OVERRIDE_*; none leak in from outside."""
    for key in list(os.environ):
        if key.startswith(("CPUPERF_OVERRIDE_", "SLURM_")) or key in ("CPUPERF_COMPAT_DIR", "CPUPERF_DEBUG"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    from cpuperf.probe import _CACHE

    _CACHE.clear()
    yield
    _CACHE.clear()
