"""tests/run.sh and the venv it runs the suite in (issue 53, case 16): a venv whose editable cpuperf points into
another checkout, or a deleted one, is named and installed again from this checkout, never used as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def _held(python: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(CHECKOUT / "tests" / "venv_cpuperf.py"), str(CHECKOUT)],
                          capture_output=True, text=True, timeout=60, cwd=str(CHECKOUT))


def test_a_venv_of_another_or_a_deleted_checkout_is_named(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True, timeout=120)
    python = tmp_path / "v" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    other = tmp_path / "other-checkout"
    (other / "cpuperf").mkdir(parents=True)
    (other / "cpuperf" / "__init__.py").write_text("")
    (site / "_editable_cpuperf.pth").write_text(f"{other}\n")  # as an editable install of that checkout writes it
    got = _held(python)
    assert got.returncode == 1 and f"imports the cpuperf of {other}, not this checkout's" in got.stderr, got.stderr
    shutil.rmtree(other)
    got = _held(python)
    assert got.returncode == 1 and "imports no cpuperf" in got.stderr, got.stderr
    (site / "_editable_cpuperf.pth").write_text(f"{CHECKOUT}\n")  # this checkout's: used as it is
    got = _held(python)
    assert got.returncode == 0 and got.stderr == "", got.stderr


def test_run_sh_installs_this_checkout_where_the_venv_holds_another():
    text = (CHECKOUT / "tests" / "run.sh").read_text()
    assert "python tests/venv_cpuperf.py \"$PWD\" || pip install -q -e '.[test]'" in text
