"""The built wheel ships compat/ inside the package and finds it there (not in a source checkout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.full  # pip builds and installs the wheel
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


def test_parsed_data_is_remembered_per_version_of_the_file(tmp_path):
    """A data file is parsed once (tomllib is pure Python, and ccl-env reads data in every new shell); an edit,
    even one that keeps the size and the mtime, is parsed again."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[rule]\nvalue = "aaaa"\n')
    code = ("import json, sys\nfrom cpuperf.data import load_toml\n"
            "print(json.dumps([load_toml(sys.argv[1]), 'tomllib' in sys.modules]))\n")
    env = {**os.environ, "CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}

    def load() -> list:
        proc = subprocess.run([sys.executable, "-c", code, str(rules)], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    assert load() == [{"rule": {"value": "aaaa"}}, True]
    assert load() == [{"rule": {"value": "aaaa"}}, False]  # remembered: no parser imported
    before = rules.stat()
    rules.write_text('[rule]\nvalue = "bbbb"\n')
    os.utime(rules, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert load() == [{"rule": {"value": "bbbb"}}, True]
    rules.write_text('[rule]\nvalue = "bbbb\n')  # malformed: refused each time, never remembered
    proc = subprocess.run([sys.executable, "-c", code, str(rules)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode != 0 and "malformed data file" in proc.stderr
