"""Resolver consistency: the same torch with and without `--with`, advice that only names installable
torch releases, `--why-not` agreeing with the answer, and torch releases the data does not list."""

from __future__ import annotations

import re

import pytest
from cli_util import run_cli, run_json
from packaging.version import Version

from cpuperf.knowledge.matrix import load_matrix
from cpuperf.knowledge.resolve import ResolveError, resolve, torch_reasons, why_not


@pytest.fixture(scope="module")
def m():
    return load_matrix(environ={})


def _minor_pairs(m):
    """(python, minor) where the minor's newest release lacks a wheel for python but an older patch has one."""
    out = []
    pys = sorted({p for r in m.torch for p in r.python})
    minors = sorted({(r.version.major, r.version.minor) for r in m.torch})
    for major, minor in minors:
        rows = sorted((r for r in m.torch if (r.version.major, r.version.minor) == (major, minor)),
                      key=lambda r: r.version)
        for py in pys:
            if py not in rows[-1].python and any(py in r.python for r in rows[:-1]):
                out.append((py, f"{major}.{minor}"))
    return out


def test_the_data_has_a_python_only_an_older_patch_release_serves(m):
    # torch.toml: 2.12.1 dropped the 3.13t wheels that 2.12.0 has; the cases below depend on such a pair
    assert ("3.13t", "2.12") in _minor_pairs(m)


@pytest.mark.parametrize("addon", ["ipex", "oneccl"])
def test_with_an_addon_keeps_the_torch_found_without_it(m, addon):
    for py, minor in _minor_pairs(m):
        alone = resolve(py, minor, frozenset(), matrix=m)
        assert alone.ok and alone.torch is not None
        both = resolve(py, minor, frozenset({addon}), matrix=m)
        # the add-on may not exist for this Python, but torch itself can be installed: same pin as without it
        assert both.torch == alone.torch, (py, minor, both.rejected)
        assert not any(r.package == "torch" for r in both.rejected)
        assert not any("torch itself cannot be installed" in n for n in both.notes)


def test_exact_patch_without_a_wheel_points_to_the_patch_that_has_one(m):
    res = resolve("3.13t", "2.12.1", frozenset({"ipex"}), matrix=m)
    assert res.torch is None
    reason = next(r.reason for r in res.rejected if r.package == "torch")
    assert "no linux_x86_64 wheel for Python 3.13t" in reason and "torch 2.12.0 has one" in reason


def test_advice_never_names_a_torch_without_a_wheel_for_this_python(m):
    for py in sorted({p for r in m.torch for p in r.python}):
        for row in m.torch:
            for wants in (frozenset({"ipex"}), frozenset({"oneccl"}), frozenset({"ipex", "oneccl"})):
                res = resolve(py, str(row.version), wants, matrix=m)
                for rej in res.rejected:
                    for named in re.findall(r"install torch (\d+\.\d+\.\d+)", rej.reason):
                        trow = m.torch_release(Version(named))
                        assert trow is not None and not torch_reasons(trow, py, "linux_x86_64"), (py, row.version, rej)


def test_why_not_agrees_with_the_resolver(m):
    for py, minor in _minor_pairs(m):
        res = resolve(py, minor, frozenset(), matrix=m)
        assert why_not("torch", res.torch, py, matrix=m) == []
        newest = max(r.version for r in m.torch if f"{r.version.major}.{r.version.minor}" == minor)
        assert why_not("torch", str(newest), py, matrix=m) != []
    # add-ons: a pinned answer fits, a rejected candidate has reasons
    res = resolve("3.10", "1.12.1", frozenset({"ipex", "oneccl"}), matrix=m)
    assert why_not("ipex", res.ipex.version, "3.10", "1.12.1", matrix=m) == []
    assert why_not("oneccl", res.oneccl.version, "3.10", "1.12.1", matrix=m) == []
    for rej in res.rejected:
        if rej.version:
            assert why_not(rej.package, rej.version.split("+")[0], "3.10", "1.12.1", matrix=m) != [], rej


def test_cli_with_and_without_addon_and_why_not_agree():
    alone, _ = run_json(["compat", "--python", "3.13t", "--torch", "2.12"])
    both, _ = run_json(["compat", "--python", "3.13t", "--torch", "2.12", "--with", "ipex"], expect_rc=3)
    assert alone["torch"] == both["torch"] == "2.12.0"
    assert both["ipex"] is None and all(r["package"] == "ipex" for r in both["rejected"])
    proc = run_cli(["compat", "--why-not", "torch==2.12.0", "--python", "3.13t"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli(["compat", "--why-not", "torch==2.12.1", "--python", "3.13t"])
    assert proc.returncode == 1 and "3.13t" in proc.stdout


@pytest.mark.parametrize("torch", ["9.9", "9.9.0", "2.3.7"])
def test_a_torch_release_the_data_does_not_list_is_a_usage_error(m, torch):
    with pytest.raises(ResolveError):
        resolve("3.11", torch, frozenset(), matrix=m)
    rep, proc = run_json(["compat", "--python", "3.11", "--torch", torch], expect_rc=2)
    assert rep["error"]["code"] == 2
    if torch.startswith("9"):
        assert "data ends at torch 2.15.0" in rep["error"]["message"]
        assert "CPUPERF_COMPAT_DIR" in rep["error"]["message"]


def test_known_torch_edges_still_resolve(m):
    oldest, newest = m.torch[0], m.torch[-1]
    for row in (oldest, newest):
        py = sorted(row.python)[0]
        assert resolve(py, str(row.version), frozenset(), matrix=m).torch == str(row.version)


def test_an_installed_torch_newer_than_the_data_is_kept_with_a_note(m):
    res = resolve("3.11", None, frozenset(), matrix=m, installed_torch="9.9.0")
    assert res.torch == "9.9.0" and any("newer than this data" in n for n in res.notes)
