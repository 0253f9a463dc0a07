"""The tiers (tests/tiers.py, docs/testing.md): `--fast` leaves out what is marked full, and the guard fails a fast
test that starts heavy processes, in a real pytest run over tests written here, with the suite's own hooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tiers

TESTS = Path(__file__).resolve().parent

HEAVY = [
    ([sys.executable, "-m", "pip", "install", "x"], "python -m pip"),
    ([sys.executable, "-m", "venv", "/tmp/v"], "python -m venv"),
    ([sys.executable, "-m", "cpuperf.train.worker", "--config", "{}"], "python -m cpuperf.train.worker"),
    ([sys.executable, "-m", "cpuperf", "train", "--auto", "--max-steps", "3"], "a real `cpuperf train` (no --dry-run)"),
    ([sys.executable, "-m", "cpuperf", "install", "--yes"], "a real `cpuperf install` (no --dry-run)"),
    (["/usr/bin/torchrun", "--nproc-per-node", "2", "t.py"], "torchrun"),
    (["mpirun", "-np", "2", "python", "t.py"], "mpirun"),
    (["ip", "netns", "exec", "n1", "true"], "ip netns"),
    ([sys.executable, "-c", "import torch; print(torch.ones(1))"], "a Python child importing torch, transformers or accelerate"),
]
LIGHT = [
    [sys.executable, "-m", "cpuperf", "train", "--auto", "--dry-run", "--json"],
    [sys.executable, "-m", "cpuperf", "recommend", "--json"],
    [sys.executable, "-m", "venv", "--without-pip", "/tmp/v"],
    ["mpirun", "--version"],
    [sys.executable, "-m", "pip", "config", "list"],
    [sys.executable, "-m", "pip", "install", "--dry-run", "--report", "-", "torch==2.7.0"],
    ["bash", "--norc", "-c", "eval \"$(cat code.sh)\"; env -0"],
    ["ip", "addr"],
]


@pytest.mark.parametrize("argv, why", HEAVY, ids=[w for _, w in HEAVY])
def test_heavy_processes_are_named(argv, why):
    assert tiers.heavy(argv) == why
    assert "misclassified" in tiers.verdict([argv]) and why in tiers.verdict([argv])


@pytest.mark.parametrize("argv", LIGHT, ids=[" ".join(a[1:3]) for a in LIGHT])
def test_light_processes_pass(argv):
    assert tiers.heavy(argv) is None and tiers.verdict([argv]) is None


def test_more_interpreters_than_a_fast_test_may_start():
    python = [sys.executable, "-c", "print(1)"]
    assert tiers.verdict([python] * tiers.FAST_PYTHON_CHILDREN) is None
    assert f"started {tiers.FAST_PYTHON_CHILDREN + 1} Python interpreters" in tiers.verdict(
        [python] * (tiers.FAST_PYTHON_CHILDREN + 1))
    assert tiers.verdict([["sh", "-c", "true"]] * 50) is None  # a shell is not an interpreter of ours


SUITE = '''
import subprocess, sys
import pytest

HEAVY = [sys.executable, "-c", "pass  # import torch"]  # named heavy by its code, done at once


def test_unmarked_and_heavy():
    subprocess.run(HEAVY, check=True)


@pytest.mark.full
def test_marked_full_and_heavy():
    subprocess.run(HEAVY, check=True)


@pytest.mark.smoke("a command")
def test_the_smoke_test_of_a_command():
    subprocess.run(HEAVY, check=True)


def test_unmarked_and_in_process():
    assert sum(range(10)) == 45


@pytest.mark.parametrize("n", [1, 2])
def test_unmarked_and_one_python_child(n):
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


CONFTEST = '''
import importlib.util, sys
sys.path.insert(0, {tests!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {tests!r} + "/conftest.py")
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
globals().update({{k: v for k, v in vars(suite).items() if not k.startswith("__")}})
'''


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args, str(root)],
                          capture_output=True, text=True, timeout=300, cwd=str(root))


@pytest.fixture
def suite(tmp_path):
    """A test directory whose conftest.py is the suite's own (its hooks and markers)."""
    (tmp_path / "conftest.py").write_text(CONFTEST.format(tests=str(TESTS)))
    (tmp_path / "test_example.py").write_text(SUITE)
    return tmp_path


def test_the_guard_fails_an_unmarked_heavy_test_and_fast_leaves_out_the_full_ones(suite):
    full = _pytest(suite)
    assert full.returncode == 1, full.stdout[-3000:]
    assert "FAILED test_example.py::test_unmarked_and_heavy" in full.stdout, full.stdout[-3000:]
    assert "misclassified" in full.stdout and "a Python child importing torch" in full.stdout
    for name in ("test_marked_full_and_heavy", "test_the_smoke_test_of_a_command", "test_unmarked_and_in_process",
                 "test_unmarked_and_one_python_child[1]"):
        assert f"PASSED test_example.py::{name}" in full.stdout, (name, full.stdout[-3000:])
    fast = _pytest(suite, "--fast", "-k", "not test_unmarked_and_heavy")
    assert fast.returncode == 0, fast.stdout[-3000:]
    assert "test_marked_full_and_heavy" not in fast.stdout
    assert "4 passed, 2 deselected" in fast.stdout, fast.stdout[-3000:]  # the full one and the -k one


def test_two_smoke_tests_of_one_command_are_refused(suite):
    (suite / "test_other.py").write_text('import pytest\n\n\n@pytest.mark.smoke("a command")\ndef test_again():\n    pass\n')
    proc = _pytest(suite, "--collect-only")
    assert proc.returncode != 0
    assert "one smoke test per command" in proc.stderr + proc.stdout and "test_other.py::test_again" in proc.stderr + proc.stdout
