"""Fake Python environments for ccl-env: real venvs (python -m venv, no pip) whose site-packages hold distribution
metadata (dist-info RECORD) and env scripts, as the registry wheels and the oneCCL bindings lay them out
(tests/test_cclenv.py, tests/test_shell_matrix.py)."""

from __future__ import annotations

import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict


def parse_env0(path: Path) -> Dict[str, str]:
    out = {}
    for item in path.read_bytes().split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            out[k.decode()] = v.decode()
    return out


def make_venv(root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    return root


def site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def add_dist(site: Path, name: str, version: str, files: Dict[str, str], *, executable: bool = False) -> None:
    """A distribution as pip leaves it: its files and a dist-info RECORD listing them."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = []
    for rel, text in files.items():
        path = (site / rel).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if executable:
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        record.append(f"{rel},sha256=x,{len(text)}")
    record.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


SETVARS = textwrap.dedent('''\
    # like oneccl_bindings_for_pytorch/env/setvars.sh: finds its root from its own path
    CCL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    export CCL_ROOT
    export LD_LIBRARY_PATH="${CCL_ROOT}/lib:${LD_LIBRARY_PATH}"
    export FI_PROVIDER_PATH="${CCL_ROOT}/lib/prov:${CCL_ROOT}/lib/prov"
    export PATH="${CCL_ROOT}/bin:${PATH}"
    export CCL_CONFIGURATION=cpu
    ''')
