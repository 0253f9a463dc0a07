from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import pkgindex  # noqa: E402  (tests/ on the path first)
import tiers  # noqa: E402
from cli_util import SUITE_TODAY  # noqa: E402

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
    monkeypatch.setenv("CPUPERF_OVERRIDE_TODAY", SUITE_TODAY)  # date-dependent findings never follow the calendar
    from cpuperf.probe import _CACHE

    _CACHE.clear()
    yield
    _CACHE.clear()


# -- packages without the registry (tests/pkgindex.py): shared by test_install.py and test_install_transaction.py --

@pytest.fixture(scope="session")
def index(tmp_path_factory):
    """Loopback indexes: good, cuda (torch's CUDA build only), badinstall, badverify."""
    base = tmp_path_factory.mktemp("index")
    wheels = base / "wheels"
    wheels.mkdir()
    common = [pkgindex.torch_wheel(wheels, "2.6.0+cpu"), pkgindex.torch_wheel(wheels, "2.7.0+cpu"),
              pkgindex.oneccl_wheel(wheels, "2.7.0+cpu"),
              pkgindex.build_wheel(wheels, "helper-pkg", "1.0", {"helper_pkg.py": "X = 1\n"}), pkgindex.allocator_wheel(wheels)]
    good_ipex = pkgindex.ipex_wheel(wheels, "2.7.0")
    cu = wheels / "cu"
    cu.mkdir()
    cuda_torch = pkgindex.torch_wheel(cu, "2.7.0", ["nvidia-cublas-cu12==12.6.4.1"])
    cublas = pkgindex.build_wheel(cu, "nvidia-cublas-cu12", "12.6.4.1", {"nvidia/cublas/__init__.py": ""})
    cu128 = pkgindex.torch_wheel(cu, "2.7.0+cu128")
    bad = wheels / "bad"
    bad.mkdir()
    # pip refuses a wheel that writes outside its target: it fails after torch was already replaced.
    escaping = pkgindex.ipex_wheel(bad, "2.7.0", extra_paths={"../../../../../../../../escape-cpuperf-test.txt": "x"})
    vbad = wheels / "vbad"
    vbad.mkdir()
    broken = pkgindex.ipex_wheel(vbad, "2.7.0", body=pkgindex.BROKEN_IPEX)

    sleepy = wheels / "sleepy"
    sleepy.mkdir()
    slow_ipex = pkgindex.ipex_wheel(sleepy, "2.7.0", body="import time\ntime.sleep(60)\n")

    root = base / "www"
    pkgindex.write_index(root / "good", [*common, good_ipex, cu128])
    pkgindex.write_index(root / "cuda", [cuda_torch, cublas])
    pkgindex.write_index(root / "badinstall", [common[1], escaping])  # no torch 2.6.0+cpu: the stash repacks it
    pkgindex.write_index(root / "badverify", [*common, broken])
    pkgindex.write_index(root / "sleepy", [*common, slow_ipex])

    server = pkgindex.serve(root)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield SimpleNamespace(url=url, good=f"{url}/good/simple", cuda=f"{url}/cuda/simple",
                          badinstall=f"{url}/badinstall/simple", badverify=f"{url}/badverify/simple", sleepy=f"{url}/sleepy/simple",
                          wheels=wheels)
    server.shutdown()


@pytest.fixture(scope="session")
def pip_home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="session")
def torch26_venv(tmp_path_factory, index, pip_home):
    """A venv that already holds torch 2.6.0+cpu and helper-pkg 1.0, built once per test run: every test that
    changes it puts it back as it was (tests/test_install.py, tests/test_install_transaction.py check so)."""
    python = pkgindex.make_venv(tmp_path_factory.mktemp("venvs") / "used", pip_home)
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--index-url", index.good,
                    "torch==2.6.0+cpu", "helper-pkg==1.0"], check=True, capture_output=True,
                   env=pkgindex.hermetic_env(pip_home), timeout=300)
    return python



# -- tiers (tests/tiers.py, docs/testing.md) -------------------------------------------------------------------

def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: leave out the tests marked full or slow (docs/testing.md)")


def pytest_configure(config):
    for line in tiers.MARKERS:
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(config, items):
    doubled = {cmd: tests for cmd, tests in tiers.smoke_owners(items).items() if len(tests) > 1}
    if doubled:
        raise pytest.UsageError("one smoke test per command (tests/tiers.py): "
                                + "; ".join(f"{cmd!r}: {', '.join(tests)}" for cmd, tests in doubled.items()))
    if config.getoption("--fast"):
        dropped = [item for item in items if tiers.is_full(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if not tiers.is_full(item)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol():
    """Every process the test starts (its fixtures' and the in-process CLI's included), for the tier guard."""
    tiers.begin()
    try:
        yield
    finally:
        tiers.end()


def _tier_guard(item, rep) -> None:
    """A passing fast test that started what only the full tier may start fails here (tests/tiers.py)."""
    if rep.when != "call" or not rep.passed or tiers.is_full(item) or item.get_closest_marker("smoke"):
        return
    problem = tiers.verdict(tiers.spawned())
    if problem:
        rep.outcome = "failed"
        rep.longrepr = f"{item.nodeid}: {problem}"


# -- the host-class matrix ---------------------------------------------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The tier guard, and the host-class matrix's cells (test_host_classes.py), sent with the report (so that
    they reach the table printed at the end from an xdist worker too)."""
    outcome = yield
    rep = outcome.get_result()
    _tier_guard(item, rep)
    key = getattr(item, "funcargs", {}).get("cell")
    if key is None or rep.when != "call" and not (rep.when == "setup" and rep.failed):
        return
    value = sys.modules[item.module.__name__].MATRIX.get(key, "FAIL")
    value = "ok" if rep.passed else "FAIL" if rep.failed else value
    rep.user_properties.append(("matrix-cell", [*key, value]))


MATRIX_SEEN: dict = {}  # (class, path) -> "ok" | "FAIL" | "n/a: why", from the reports


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "matrix-cell":
            MATRIX_SEEN[(value[0], value[1])] = value[2]


def pytest_terminal_summary(terminalreporter):
    """Print the host-class matrix (classes x paths) when its tests ran."""
    if not MATRIX_SEEN:
        return
    from host_classes import CLASSES

    matrix = MATRIX_SEEN
    classes = [c.name for c in CLASSES if any(k[0] == c.name for k in matrix)]
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
