"""CPython's end of life (compat/eol.toml [[python_eol]], each row from its release PEP): `cpuperf doctor` says when
the running Python is past it or within six months of it, naming the newest torch in compat/torch.toml with a wheel
for it. The Python and the day are the host's facts, described here by CPUPERF_OVERRIDE_PYTHON and _TODAY."""

from __future__ import annotations

import datetime

import pytest
from cli_util import run_cli, run_json

from cpuperf.knowledge.matrix import load_matrix
from cpuperf.knowledge.resolve import newest_torch_for_python, python_eol_finding

LIVE = {"CPUPERF_OVERRIDE_GPUS": "[]", "CPUPERF_OVERRIDE_PACKAGES": '{"torch": null}'}


def _doctor(python: str, today: str):
    rep, proc = run_json(["doctor"], {**LIVE, "CPUPERF_OVERRIDE_PYTHON": python, "CPUPERF_OVERRIDE_TODAY": today},
                         expect_rc=None)
    return [f for f in rep["findings"] if f["id"].startswith("python-end-of-life")], rep, proc


def test_every_minor_has_its_peps_end_of_life():
    """PEP 596 (3.9: ended 2025-10-31), 619 (3.10: 2026-10), 664, 693, 719, 745, 790: five years after each .0."""
    rows = {r.python: r for r in load_matrix(environ={}).python_eol}
    assert {py: str(r.last_day()) for py, r in rows.items()} == {
        "3.9": "2025-10-31", "3.10": "2026-10-31", "3.11": "2027-10-31", "3.12": "2028-10-31",
        "3.13": "2029-10-31", "3.14": "2030-10-31", "3.15": "2031-10-31"}
    peps = {"3.9": 596, "3.10": 619, "3.11": 664, "3.12": 693, "3.13": 719, "3.14": 745, "3.15": 790}
    for py, pep in peps.items():
        assert rows[py].source.startswith(f"PEP {pep} 'Python {py} Release Schedule'"), py


def test_python_310_on_a_host_after_october_2026_is_a_warning_naming_the_newest_torch_with_a_wheel():
    found, rep, proc = _doctor("3.10.14", "2026-11-28")
    assert proc.returncode == 0  # a warning, not an error
    assert [(f["id"], f["severity"]) for f in found] == [("python-end-of-life", "warning")]
    message = found[0]["message"]
    assert "Python 3.10 reached its end of life on 2026-10-31 (PEP 619)" in message
    # compat/torch.toml: 2.14.1 is the last release with cp310 wheels; 2.15.0 has none
    assert "the newest torch with a linux_x86_64 wheel for it is 2.14.1 (torch 2.15.0 has none)" in message
    assert "uv venv --python 3.15" in found[0]["fix"]
    text = run_cli(["doctor"], {**LIVE, "CPUPERF_OVERRIDE_PYTHON": "3.10", "CPUPERF_OVERRIDE_TODAY": "2026-11-28"})
    assert "reached its end of life" in text.stdout


@pytest.mark.parametrize("python, today, want", [
    ("3.11", "2026-11-28", None),                          # 11 months ahead: nothing to say yet
    ("3.11", "2027-04-30", None),                          # a day more than six months (183 days) before
    ("3.11", "2027-05-01", "python-end-of-life-soon"),
    ("3.11", "2027-10-31", "python-end-of-life-soon"),     # its last day is still supported
    ("3.11", "2027-11-01", "python-end-of-life"),
    ("3.9", "2026-11-28", "python-end-of-life"),
    ("3.14", "2026-11-28", None),
])
def test_the_finding_follows_the_day(python, today, want):
    found, _, _ = _doctor(python, today)
    assert [f["id"] for f in found] == ([want] if want else [])
    if want == "python-end-of-life-soon":
        assert found[0]["severity"] == "info" and "within six months" in found[0]["message"]
        assert "torch 2.15.0, the newest in cpuperf's data, still ships linux_x86_64 wheels for it" in found[0]["message"]


def test_a_free_threaded_build_ends_with_its_minor_and_names_its_own_wheels():
    """3.13t has 3.13's end of life, but its wheels are its own: compat/torch.toml lists 3.13t up to 2.12.0."""
    m = load_matrix(environ={})
    assert str(newest_torch_for_python(m, "3.13t")) == "2.12.0"
    assert str(newest_torch_for_python(m, "3.13")) == "2.15.0"
    found = python_eol_finding("3.13t", datetime.date(2029, 6, 1), m)
    assert found is not None and found["id"] == "python-end-of-life-soon"
    assert "Python 3.13t reaches its end of life on 2029-10-31 (PEP 719)" in found["message"]
    assert "is 2.12.0" in found["message"]
    assert python_eol_finding("3.13t", datetime.date(2029, 4, 1), m) is None


def test_a_python_the_data_has_no_row_for_gets_no_finding():
    assert python_eol_finding("3.8", datetime.date(2026, 11, 28), load_matrix(environ={})) is None


def test_a_bad_today_override_is_a_usage_error():
    proc = run_cli(["doctor"], {**LIVE, "CPUPERF_OVERRIDE_TODAY": "28/11/2026"})
    assert proc.returncode == 2, proc.stderr
    assert "CPUPERF_OVERRIDE_TODAY" in proc.stderr and "YYYY-MM-DD" in proc.stderr
