"""The built wheel ships compat/ inside the package and finds it there (not in a source checkout)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_installed_wheel_finds_its_data(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("cpuperf-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "cpuperf/compat/ipex.toml" in names and "cpuperf/compat/tuning.toml" in names
        zf.extractall(site)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from cpuperf.knowledge.matrix import shipped_dir, default_matrix; from cpuperf.data import builtin_compat_dir; "
            "assert str(shipped_dir()).startswith(sys.argv[1]), shipped_dir(); "
            "assert str(builtin_compat_dir()).startswith(sys.argv[1]); "
            "m = default_matrix(); assert any(str(r.version) == '2.8.0' for r in m.ipex), 'no IPEX rows'")
    run = subprocess.run([sys.executable, "-I", "-c", code, str(site)], capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
