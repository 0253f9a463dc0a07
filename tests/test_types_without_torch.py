"""`mypy` (strict, the whole package: pyproject.toml [tool.mypy]) is clean where torch is not installed too: a
user's venv before `cpuperf install`, and the CI image of a project that vendors cpuperf. Without torch, `nn.Module`
is Any to mypy, so the model classes that subclass it need their ignore in both worlds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from host_classes import linked_venv

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_is_clean_without_torch(tmp_path):
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    python = linked_venv(tmp_path / "notorch", ("torch", "functorch"))
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "True", probe.stderr
    proc = subprocess.run([mypy, "--python-executable", python, "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
