from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# The suite's own cache directory (measurements, tunings, remembered decisions): what cpuperf cached on this machine
# before (a measurement taken under load prints a warning first on stderr) must not change what a test sees.
# A test that needs another sets CPUPERF_CACHE_DIR itself; tests/cli_util.py hands the one in force to the CLI.
os.environ["CPUPERF_CACHE_DIR"] = tempfile.mkdtemp(prefix="cpuperf-test-cache-")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Tests describe hosts through --sysroot and CPUPERF_OVERRIDE_*; none leak in from outside."""
    for key in list(os.environ):
        if key.startswith(("CPUPERF_OVERRIDE_", "SLURM_")) or key in ("CPUPERF_COMPAT_DIR", "CPUPERF_DEBUG"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    # The live host is bare metal unless a test names the virtual-machine class (as tests/cli_util.py does).
    monkeypatch.setenv("CPUPERF_OVERRIDE_HYPERVISOR", "0")
    from cpuperf.probe import _CACHE

    _CACHE.clear()
    yield
    _CACHE.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The host-class matrix (test_host_classes.py): each cell's outcome, for the table printed at the end."""
    outcome = yield
    rep = outcome.get_result()
    key = getattr(item, "funcargs", {}).get("cell")
    if key is None or rep.when != "call" and not (rep.when == "setup" and rep.failed):
        return
    matrix = sys.modules[item.module.__name__].MATRIX
    if rep.passed:
        matrix[key] = "ok"
    elif rep.failed:
        matrix[key] = "FAIL"


def pytest_terminal_summary(terminalreporter):
    """Print the host-class matrix (classes x paths) when its tests ran."""
    module = sys.modules.get("test_host_classes")
    if module is None or not module.MATRIX:
        return
    matrix = module.MATRIX
    classes = [c.name for c in module.CLASSES if any(k[0] == c.name for k in matrix)]
    paths = list(dict.fromkeys(k[1] for k in matrix))
    mark = {"ok": "ok", "FAIL": "FAIL"}  # and 'n/a' (planned only), 'emu' (run under emulation by another tier)
    width = max(len(p) for p in paths)
    tr = terminalreporter
    tr.section("host-class matrix (classes x paths)")
    tr.write_line(" " * width + " | " + " | ".join(f"{c:^11}" for c in classes))
    for path in paths:
        cells = [matrix.get((c, path), "-") for c in classes]
        tr.write_line(f"{path:<{width}} | " + " | ".join(f"{mark.get(v, v[:3] if v.startswith(('n/a', 'emu')) else v):^11}" for v in cells))
    green = sum(v == "ok" for v in matrix.values())
    na = sum(v.startswith("n/a") for v in matrix.values())
    emu = sum(v.startswith("emu") for v in matrix.values())
    failed = sum(v == "FAIL" for v in matrix.values())
    tr.write_line(f"{green} cells ok, {failed} failed, {emu} run under emulation by the Arm tier "
                  f"(tests/arm/tier.sh), {na} not applicable here: "
                  + "; ".join(sorted({f"{k[0]}: {v[5:]}" for k, v in matrix.items() if v.startswith('n/a')})))
