"""Schema and content checks of the shipped compat/ data, and of CPUPERF_COMPAT_DIR overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from cpuperf.knowledge.matrix import ENV_DIR, PY_RE, MatrixError, default_matrix, load_matrix, shipped_dir


@pytest.fixture(scope="module")
def m():
    return load_matrix(environ={})


def test_shipped_dir_has_every_subject():
    names = {p.name for p in shipped_dir().glob("*.toml")}
    assert {"ipex.toml", "oneccl.toml", "torch.toml", "eol.toml", "hf.toml"} <= names


def test_every_row_has_a_source(m):
    for kind in ("torch", "cuda", "ipex", "oneccl", "eol", "hf"):
        rows = getattr(m, kind)
        assert rows, kind
        for row in rows:
            assert row.source.strip(), (kind, row)


def test_python_strings_are_well_formed(m):
    for row in (*m.torch, *m.ipex, *m.oneccl):
        assert row.python
        assert all(PY_RE.match(p) for p in row.python), row


IPEX_CPU_RELEASES = [
    "1.10.0", "1.10.100", "1.11.0", "1.11.200", "1.12.0", "1.12.100", "1.12.300", "1.13.0", "1.13.100",
    "2.0.0", "2.0.100", "2.1.0", "2.1.100", "2.2.0", "2.3.0", "2.3.100", "2.4.0", "2.5.0", "2.6.0",
    "2.7.0", "2.8.0",
]


def test_ipex_has_every_cpu_release(m):
    released = [str(r.version) for r in m.ipex if r.status == "release"]
    assert released == IPEX_CPU_RELEASES


def test_ipex_torch_specifier_is_its_own_minor(m):
    for r in m.ipex:
        assert str(r.torch) == f"=={r.version.major}.{r.version.minor}.*"
        assert r.built_against is None or r.torch.contains(r.built_against)


def test_ipex_pypi_yank_state(m):
    unyanked = {str(r.version) for r in m.ipex if r.pypi and not r.pypi_yanked}
    assert unyanked == {"2.6.0", "2.7.0", "2.8.0"}
    assert not next(r for r in m.ipex if str(r.version) == "1.10.0").pypi


def test_ipex_import_check_history(m):
    by = {str(r.version): r.import_check for r in m.ipex}
    assert by["1.11.200"] == "none"
    assert by["1.12.0"] == by["2.5.0"] == "exit127"
    assert by["2.6.0"] == by["2.8.0"] == "attributeerror"


def test_ipex_python_from_pypi_files(m):
    by = {str(r.version): r.python for r in m.ipex}
    assert "3.12" not in by["2.4.0"] and "3.12" in by["2.5.0"]
    assert "3.13" not in by["2.5.0"] and "3.13" in by["2.8.0"]
    assert "3.13t" not in by["2.8.0"]


def test_oneccl_cpu_releases_and_traps(m):
    cpu = {str(r.version): r for r in m.oneccl if r.device == "cpu"}
    assert max(Version(v) for v in cpu) == Version("2.7.0")
    assert not cpu["1.12.0"].accepts(Version("1.12.1"))
    assert cpu["1.12.100"].accepts(Version("1.12.1"))
    assert cpu["2.5.0"].accepts(Version("2.5.0+cpu"))
    assert cpu["1.10.0"].import_name == cpu["1.11.0"].import_name == "torch_ccl"
    assert cpu["1.12.0"].import_name == "oneccl_bindings_for_pytorch"
    assert all("pypi.org" not in r.index_url for r in m.oneccl)
    xpu = {str(r.version) for r in m.oneccl if r.device == "xpu"}
    assert {"2.0.100", "2.1.400", "2.8.0"} <= xpu
    assert "2.8.0" not in cpu


def test_torch_wheels(m):
    by = {str(r.version): r for r in m.torch}
    assert "3.8" in by["2.4.1"].python and "3.8" not in by["2.5.0"].python
    assert "3.9" not in by["2.9.0"].python and "3.14" in by["2.9.0"].python
    assert "3.13" in by["2.8.0"].python
    assert {"1.12.1", "2.7.1", "2.13.0", "2.14.1"} <= set(by)
    assert all(r.cpu_index_url == "https://download.pytorch.org/whl/cpu" for r in m.torch)
    for r in m.torch:
        for tag in r.cuda:
            assert m.cuda_variant(tag) is not None, (r.version, tag)


def test_eol_rows(m):
    ipex = m.eol_notice("ipex")
    ccl = m.eol_notice("oneccl")
    assert ipex is not None and ipex.last_release == Version("2.8.0") and ipex.status == "archived"
    assert ccl is not None and ccl.last_release == Version("2.7.0")
    assert "torch.compile" in ipex.alternative


def test_default_matrix_uses_env(tmp_path, monkeypatch):
    (tmp_path / "ipex-extra.toml").write_text(EXTRA_IPEX)
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    assert any(str(r.version) == "2.9.0" for r in default_matrix().ipex)
    monkeypatch.setenv(ENV_DIR, "")
    assert not any(str(r.version) == "2.9.0" for r in default_matrix().ipex)


EXTRA_IPEX = """
[[ipex]]
version = "2.9.0"
torch = "==2.9.*"
python = ["3.12"]
pypi = false
pypi_yanked = false
index_url = "https://example.invalid/whl/"
index_kind = "extra-index-url"
import_check = "attributeerror"
status = "release"
source = "test fixture"
"""


def test_extra_dir_adds_and_overrides_rows(tmp_path):
    override = EXTRA_IPEX + """
[[ipex]]
version = "2.8.0"
torch = "==2.8.*"
python = ["3.12"]
pypi = true
pypi_yanked = true
index_url = "https://example.invalid/whl/"
index_kind = "extra-index-url"
import_check = "attributeerror"
status = "release"
source = "test fixture: pretend 2.8.0 was yanked"
"""
    (tmp_path / "ipex-newer.toml").write_text(override)
    m = load_matrix(tmp_path, environ={})
    by = {str(r.version): r for r in m.ipex}
    assert by["2.9.0"].index_url == "https://example.invalid/whl/"
    assert by["2.8.0"].pypi_yanked and by["2.8.0"].python == frozenset({"3.12"})
    assert len(m.ipex) == len(load_matrix(environ={}).ipex) + 1


BAD = """
cpu_index_url = "not a url"

[[ipex]]
version = "two point five"
torch = "==2.5.*"
python = ["3.11"]
pypi = true
pypi_yanked = false
index_url = "https://x.invalid/"
index_kind = "extra-index-url"
import_check = "exit127"
status = "release"
source = "s"

[[ipex]]
version = "2.5.1"
torch = ">>2"
python = ["3.11", "py3"]
pypi = "yes"
pypi_yanked = false
index_url = "https://x.invalid/"
index_kind = "find-links"
import_check = "explodes"
status = "release"
source = "s"
colour = "blue"

[[oneccl]]
version = "2.7.1"
device = "gpu"
torch = []
python = ["3.11"]
index_url = "https://x.invalid/"
index_kind = "extra-index-url"
import_name = "oneccl_bindings_for_pytorch"

[[wheels]]
name = "x"
"""


def test_malformed_extra_dir_lists_every_bad_row(tmp_path, monkeypatch):
    (tmp_path / "ipex-bad.toml").write_text(BAD)
    (tmp_path / "tuning.toml").write_text("[[not_ours]]\nx = 1\n")  # other modules' files are skipped
    (tmp_path / "oneccl-broken.toml").write_text("[[ipex]\nversion = ")
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    with pytest.raises(MatrixError) as info:
        load_matrix()
    err = info.value
    assert isinstance(err, ValueError)
    text = str(err)
    rows = {(p.file, p.row) for p in err.problems}
    assert ("ipex-bad.toml", "cpu_index_url") in rows
    assert ("ipex-bad.toml", "[[ipex]] #1 (two point five)") in rows
    assert ("ipex-bad.toml", "[[ipex]] #2 (2.5.1)") in rows
    assert ("ipex-bad.toml", "[[oneccl]] #1 (2.7.1)") in rows
    assert ("ipex-bad.toml", "wheels") in rows
    assert any(p.file == "oneccl-broken.toml" and "TOML" in p.problem for p in err.problems)
    # every problem of a row is named, not just the first
    second = next(p for p in err.problems if p.row == "[[ipex]] #2 (2.5.1)").problem
    for needle in ("torch", "py3", "pypi", "import_check", "colour"):
        assert needle in second
    third = next(p for p in err.problems if p.row.startswith("[[oneccl]]")).problem
    for needle in ("device", "torch", "missing required field 'source'", "gpu"):
        assert needle in third
    assert "6 problem(s)" in text


def test_duplicate_rows_in_one_layer_are_reported(tmp_path):
    (tmp_path / "ipex-a.toml").write_text(EXTRA_IPEX)
    (tmp_path / "ipex-b.toml").write_text(EXTRA_IPEX)
    with pytest.raises(MatrixError) as info:
        load_matrix(tmp_path, environ={})
    assert any("duplicate" in p.problem for p in info.value.problems)


def test_missing_extra_dir_is_an_error(tmp_path):
    with pytest.raises(MatrixError, match=ENV_DIR):
        load_matrix(tmp_path / "nope", environ={})


def test_shipped_data_files_are_under_repo_compat():
    assert shipped_dir() == Path(__file__).resolve().parent.parent / "compat"


def test_env_dir_is_pathsep_separated(tmp_path):
    import os

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "ipex-new.toml").write_text(EXTRA_IPEX)
    (b / "ipex-new.toml").write_text(EXTRA_IPEX.replace("https://example.invalid/whl/", "https://later.invalid/"))
    m = load_matrix(environ={ENV_DIR: f"{a}{os.pathsep}{b}"})
    assert next(r for r in m.ipex if str(r.version) == "2.9.0").index_url == "https://later.invalid/"


def test_oneccl_local_labels_follow_the_builds_setup_py():
    # intel/torch-ccl setup.py create_version(): no local label before v1.12.0, '+cpu' appended from v1.12.0
    m = load_matrix(environ={})
    labels = {str(r.version): r.local for r in m.oneccl if r.device == "cpu"}
    assert labels["1.10.0"] == "" and labels["1.11.0"] == ""
    assert labels["1.12.0"] == "+cpu" and labels["1.12.100"] == "+cpu"


def test_hf_rows_claiming_verified_while_saying_unverified_are_rejected(tmp_path):
    (tmp_path / "hf-x.toml").write_text(
        '[[hf]]\npackage = "transformers"\nname = "bf16"\nkind = "trainer-arg"\nintroduced = "4.13.0"\n'
        'verified = true\nsource = "memory"\nreason = "unverified"\n')
    with pytest.raises(MatrixError, match="unverified"):
        load_matrix(tmp_path, environ={})
