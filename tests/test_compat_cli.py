"""`cpuperf compat` end to end: exit codes first, then the JSON and the human lines."""

from __future__ import annotations

import pytest
from cli_util import run_cli, run_json


@pytest.mark.smoke("compat")
def test_compat_resolves_the_oneccl_trap():
    rep, proc = run_json(["compat", "--python", "3.10", "--torch", "1.12.1", "--with", "ipex,oneccl"], process=True)
    assert rep["schema"] == "cpuperf.compat/1"
    assert rep["torch"] == "1.12.1"
    assert rep["oneccl"]["version"] == "1.12.100"
    assert rep["ipex"]["version"] == "1.12.300"
    assert any(r["version"] == "1.12.0" for r in rep["rejected"])


def test_compat_nothing_fits_is_incompatible_exit_code():
    rep, proc = run_json(["compat", "--python", "3.12", "--torch", "2.13.0", "--with", "ipex"], expect_rc=3)
    assert rep["ipex"] is None and "archived" in rep["rejected"][0]["reason"]


def test_compat_bad_input_is_usage_error_in_json_too():
    rep, proc = run_json(["compat", "--python", "three"], expect_rc=2)
    assert rep["error"]["code"] == 2 and "Python" in rep["error"]["message"]
    proc = run_cli(["compat", "--python", "3.11", "--with", "tensorflow"])
    assert proc.returncode == 2 and "unknown package" in proc.stderr and "Traceback" not in proc.stderr


def test_compat_bad_data_dir_is_bad_data_exit_code(tmp_path):
    (tmp_path / "ipex-bad.toml").write_text("[[ipex]]\nversion = 'x'\n")
    proc = run_cli(["compat", "--python", "3.11"], extra_env={"CPUPERF_COMPAT_DIR": str(tmp_path)})
    assert proc.returncode == 6, proc.stderr
    assert "ipex-bad.toml" in proc.stderr and "Traceback" not in proc.stderr


def test_compat_why_not_and_table():
    proc = run_cli(["compat", "--why-not", "oneccl_bind_pt==1.12.0", "--python", "3.10", "--torch", "1.12.1"])
    assert proc.returncode == 1
    assert "use oneccl_bind_pt 1.12.100" in proc.stdout
    ok = run_cli(["compat", "--why-not", "oneccl_bind_pt==1.12.100", "--python", "3.10", "--torch", "1.12.1"])
    assert ok.returncode == 0 and "fits" in ok.stdout
    table = run_cli(["compat"])
    assert table.returncode == 0 and "IPEX" in table.stdout and "2.8.0" in table.stdout and "XPU" in table.stdout
