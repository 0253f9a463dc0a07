"""Resolver cases: every known trap, the 'nothing exists' answers, why_not and doctor findings."""

from __future__ import annotations

import json

import pytest

from cpuperf.knowledge.matrix import load_matrix
from cpuperf.knowledge.resolve import ResolveError, hf_option_status, installed_findings, normalize_python, resolve, why_not
from cpuperf.render.compat import matrix_rows, matrix_table, resolution_lines, torch_rows

INTEL_CPU = "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"
TORCH_CPU = "https://download.pytorch.org/whl/cpu"


@pytest.fixture(scope="module")
def m():
    return load_matrix(environ={})


def rejected(res, package):
    return {r.version: r.reason for r in res.rejected if r.package == package}


# --------------------------------------------------------------------------- pinned torch


def test_oneccl_1_12_0_vs_1_12_1_trap(m):
    res = resolve("3.10", "1.12.1", frozenset({"oneccl"}), matrix=m)
    assert res.torch == "1.12.1"
    assert res.oneccl is not None and res.oneccl.version == "1.12.100"
    reason = rejected(res, "oneccl")["1.12.0"]
    assert "1.12.0" in reason and "1.12.1" in reason and reason.endswith("use 1.12.100")
    # and the other way round
    res0 = resolve("3.10", "1.12.0", {"oneccl"}, matrix=m)
    assert res0.oneccl.version == "1.12.0"


def test_oneccl_old_name_and_index(m):
    res = resolve("3.9", "1.10.0", {"oneccl", "ipex"}, matrix=m)
    assert res.oneccl.version == "1.10.0"
    assert res.oneccl.index_url == "https://software.intel.com/ipex-whl-stable"
    assert res.oneccl.pip_args()[1] == "-f"
    assert res.ipex.version == "1.10.100"


def test_xpu_builds_are_never_a_cpu_answer(m):
    res = resolve("3.11", "2.0.1", {"oneccl"}, matrix=m)
    assert res.oneccl is None
    rej = rejected(res, "oneccl")
    assert "XPU" in rej["2.0.100+gpu"]  # version.txt at tag v2.0.100+gpu: the label was +gpu before 2.1.100
    assert "2.0.0" in rej and "2.0.1" in rej["2.0.0"]
    res8 = resolve("3.11", "2.8.0", {"oneccl"}, matrix=m)
    assert res8.oneccl is None
    assert any("XPU" in r.reason for r in res8.rejected)
    assert all(not (r.version or "").startswith("2.8.0+xpu") or "XPU" in r.reason for r in res8.rejected)


@pytest.mark.parametrize("installed", ["1.13.100+gpu", "2.0.100+gpu", "2.1.100+xpu"])
def test_an_installed_intel_gpu_build_is_named_as_one(m, installed):
    from cpuperf.knowledge.resolve import installed_findings

    torch = {"1.13.100+gpu": "1.13.0", "2.0.100+gpu": "2.0.1", "2.1.100+xpu": "2.1.0"}[installed]
    found = installed_findings("3.10", {"torch": torch, "oneccl-bind-pt": installed}, platform="linux_x86_64", matrix=m)
    assert any(f["id"] == "oneccl-xpu-build" for f in found), found


def test_xpu_listed_but_cpu_chosen_for_same_number(m):
    res = resolve("3.12", "2.7.0", {"oneccl"}, matrix=m)
    assert res.oneccl.version == "2.7.0"
    assert res.oneccl.index_url == INTEL_CPU
    assert "XPU" in rejected(res, "oneccl")["2.7.0+xpu"]


def test_local_version_matches(m):
    res = resolve("3.11", "2.5.0+cpu", {"ipex", "oneccl"}, matrix=m)
    assert res.torch == "2.5.0"
    assert res.ipex.version == "2.5.0" and res.oneccl.version == "2.5.0"
    assert res.ok


def test_torch_minor_only_picks_newest_patch(m):
    res = resolve("3.11", "2.1", {"ipex"}, matrix=m)
    assert res.torch == "2.1.2" and res.ipex.version == "2.1.100"
    res2 = resolve("3.11", "2.1", {"ipex", "oneccl"}, matrix=m)
    assert res2.torch == "2.1.1" and res2.oneccl.version == "2.1.0"


def test_ipex_on_new_torch_is_null_with_eol_reason(m):
    res = resolve("3.12", "2.13.0", {"ipex"}, matrix=m)
    assert res.torch == "2.13.0"
    assert res.ipex is None and not res.ok
    reason = rejected(res, "ipex")["2.8.0"]
    assert "archived" in reason and "torch.compile" in reason and "2.13.0" in reason


def test_oneccl_on_new_torch_is_null_with_eol_reason(m):
    res = resolve("3.12", "2.9.1", {"oneccl"}, matrix=m)
    assert res.oneccl is None
    assert "deprecated" in rejected(res, "oneccl")["2.7.0"]


def test_oneccl_2_7_1_needs_torch_2_7_0(m):
    res = resolve("3.11", "2.7.1", {"oneccl"}, matrix=m)
    assert res.oneccl is None
    assert "install torch 2.7.0" in rejected(res, "oneccl")["2.7.0"]


def test_ipex_python_gap_is_explained(m):
    res = resolve("3.12", "2.4.1", {"ipex"}, matrix=m)
    assert res.ipex is None
    assert "Python 3.12" in rejected(res, "ipex")["2.4.0"]


def test_torch_without_wheel_for_python(m):
    res = resolve("3.9", "2.9.0", matrix=m)
    assert res.torch is None
    assert "Python 3.9" in rejected(res, "torch")["2.9.0"]


def test_installed_torch_is_kept(m):
    res = resolve("3.11", None, {"ipex"}, matrix=m, installed_torch="2.6.0+cpu")
    assert res.torch == "2.6.0" and res.ipex.version == "2.6.0"
    assert any("installed" in n for n in res.notes)


def test_aarch64_has_no_intel_addons(m):
    res = resolve("3.11", "2.5.1", {"ipex"}, platform="linux_aarch64", matrix=m)
    assert res.ipex is None
    assert any("x86_64" in r.reason for r in res.rejected)


# --------------------------------------------------------------------------- best stack (no torch given)


def test_no_torch_plain_is_newest_torch(m):
    res = resolve("3.12", None, matrix=m)
    newest = max(r.version for r in m.torch if "3.12" in r.python)
    assert res.torch == str(newest)
    assert res.torch_index_url == TORCH_CPU


def test_no_torch_ipex_means_torch_2_8(m):
    res = resolve("3.12", None, {"ipex"}, matrix=m)
    assert (res.torch, res.ipex.version) == ("2.8.0", "2.8.0")
    assert res.ipex.index_url == INTEL_CPU and res.ipex.on_pypi
    assert not resolve("3.11", "2.5.1", {"ipex"}, matrix=m).ipex.on_pypi  # yanked there


def test_no_torch_ipex_and_oneccl_means_2_7_0(m):
    res = resolve("3.11", None, {"ipex", "oneccl"}, matrix=m)
    assert (res.torch, res.ipex.version, res.oneccl.version) == ("2.7.0", "2.7.0", "2.7.0")


def test_python_3_13_with_ipex(m):
    res = resolve("3.13", None, {"ipex"}, matrix=m)
    assert (res.torch, res.ipex.version) == ("2.8.0", "2.8.0")
    free = resolve("3.13t", None, {"ipex"}, matrix=m)
    assert free.torch is None and free.ipex is None
    assert "3.13t" in free.rejected[0].reason


def test_python_3_8_with_ipex_goes_back_to_2_4(m):
    res = resolve("3.8", None, {"ipex"}, matrix=m)
    assert res.torch == "2.4.1" and res.ipex.version == "2.4.0"


def test_nothing_exists_python_3_14_ipex(m):
    res = resolve("3.14", None, {"ipex"}, matrix=m)
    d = res.to_json()
    assert d["torch"] is None and d["ipex"] is None and d["oneccl"] is None
    assert d["rejected"][0]["package"] == "ipex"
    assert "Python 3.14" in d["rejected"][0]["reason"]


def test_nothing_exists_python_without_any_torch(m):
    res = resolve("3.5", None, matrix=m)
    assert res.torch is None
    assert rejected(res, "torch")[None].startswith("no torch release")


# --------------------------------------------------------------------------- input errors and JSON


@pytest.mark.parametrize("bad", [dict(python="three"), dict(python="3.11", torch="2.x.1"),
                                 dict(python="3.11", want={"tensorflow"}),
                                 dict(python="3.11", platform="win_amd64"),
                                 dict(python="3.11", installed_torch="latest")])
def test_bad_input_raises_resolve_error(m, bad):
    with pytest.raises(ResolveError):
        resolve(**{"matrix": m, **bad})
    assert issubclass(ResolveError, ValueError)


def test_python_normalisation():
    assert normalize_python("3.11.7") == "3.11"
    assert normalize_python("cp313t") == "3.13t"


def test_want_accepts_pip_names_and_csv(m):
    a = resolve("3.11", "2.6.0", "intel_extension_for_pytorch,oneccl_bind_pt", matrix=m)
    assert a.want == frozenset({"ipex", "oneccl"})


def test_to_json_shape(m):
    d = resolve("3.10", "1.12.1", {"ipex", "oneccl"}, matrix=m).to_json()
    json.dumps(d)
    assert d["schema"] == "cpuperf.compat/1"
    assert {"schema", "torch", "python", "ipex", "oneccl", "rejected", "notes"} <= set(d)
    assert set(d["ipex"]) >= {"version", "index_url"}
    assert all(set(r) == {"package", "version", "reason"} for r in d["rejected"])
    assert d["install"][0][:4] == ["python", "-m", "pip", "install"]


# --------------------------------------------------------------------------- why_not


def test_why_not(m):
    assert why_not("oneccl_bind_pt", "1.12.0", "3.10", "1.12.1", m) != []
    assert why_not("oneccl_bind_pt", "1.12.100", "3.10", "1.12.1", m) == []
    assert any("3.12" in r for r in why_not("ipex", "2.4.0", "3.12", "2.4.1", m))
    reasons = why_not("ipex", "2.8.0", "3.14", "2.13.0", m)
    assert len(reasons) >= 3  # torch, python, and the EOL sentence
    assert why_not("torch", "2.9.0", "3.9", None, m)
    assert "XPU" in why_not("oneccl", "2.8.0", "3.12", "2.8.0", m)[0]
    assert "not a known" in why_not("ipex", "9.9.9", "3.12", None, m)[0]
    with pytest.raises(ResolveError):
        why_not("numpy", "1.0", "3.12", None, m)


# --------------------------------------------------------------------------- doctor findings


def ids(findings):
    return {f["id"] for f in findings}


def test_findings_ipex_mismatch_kills_process(m):
    f = installed_findings("3.11", {"torch": "2.5.1+cpu", "intel_extension_for_pytorch": "2.4.0+cpu"}, m)
    bad = next(x for x in f if x["id"] == "ipex-torch-mismatch")
    assert bad["severity"] == "error" and "127" in bad["message"]
    assert "intel-extension-for-pytorch==2.5.0" in bad["fix"]
    assert all(set(x) == {"id", "severity", "message", "fix"} for x in f)


def test_findings_ipex_on_torch_2_9_says_archived(m):
    f = installed_findings("3.12", {"torch": "2.9.0", "intel-extension-for-pytorch": "2.8.0"}, m)
    bad = next(x for x in f if x["id"] == "ipex-torch-mismatch")
    assert "AttributeError" in bad["message"] and "torch.compile" in bad["message"]
    assert bad["fix"] == "python -m pip uninstall -y intel-extension-for-pytorch"


def test_findings_wrong_oneccl_build(m):
    f = installed_findings("3.10", {"torch": "1.12.1", "oneccl_bind_pt": "1.12.0+cpu"}, m)
    bad = next(x for x in f if x["id"] == "oneccl-torch-mismatch")
    assert "oneccl_bind_pt==1.12.100" in bad["fix"]
    x = installed_findings("3.11", {"torch": "2.7.0", "oneccl_bind_pt": "2.7.0+xpu"}, m)
    assert "oneccl-xpu-build" in ids(x)


def test_findings_python_without_wheels(m):
    f = installed_findings("3.5", {"torch": None}, m)
    assert "python-no-wheels" in ids(f)


def test_findings_healthy_stack_only_has_retirement_info(m):
    f = installed_findings("3.11", {"torch": "2.7.0+cpu", "intel-extension-for-pytorch": "2.7.0+cpu",
                                    "oneccl-bind-pt": "2.7.0+cpu"}, m)
    assert {x["severity"] for x in f} == {"info"}
    assert ids(f) == {"ipex-retired", "oneccl-retired"}
    assert installed_findings("3.12", {"torch": "2.13.0"}, m) == []


# --------------------------------------------------------------------------- rendering


def test_rendering_helpers(m):
    rows = matrix_rows(m)
    assert rows[0]["version"] == "2.8.0" and rows[0]["package"] == "intel-extension-for-pytorch"
    assert any(r["status"].startswith("XPU") for r in rows)
    assert torch_rows(m)[0]["version"] == str(m.torch[-1].version)
    table = matrix_table(m)
    assert table.row_count == len(rows)
    lines = resolution_lines(resolve("3.10", "1.12.1", {"oneccl"}, matrix=m))
    text = "\n".join(lines)
    assert "oneccl_bind_pt 1.12.100" in text and "use 1.12.100" in text
    assert "python -m pip install oneccl_bind_pt==1.12.100 -f https://developer.intel.com/ipex-whl-stable" in text


def test_hf_option_history(m):
    assert hf_option_status("transformers", "4.56.2", "use_ipex", m) == "deprecated"
    assert hf_option_status("transformers", "4.57.0", "use_ipex", m) == "removed"
    assert hf_option_status("transformers", "4.52.4", "use_ipex", m) == "ok"
    assert hf_option_status("transformers", "5.0.0", "ddp_backend=ccl", m) == "ok"
    assert hf_option_status("transformers", "5.1.0", "ddp_backend=ccl", m) == "removed"
    assert hf_option_status("transformers", "4.31.0", "use_cpu", m) == "too-old"
    assert hf_option_status("transformers", "4.40.0", "no_cuda", m) == "deprecated"
    assert hf_option_status("accelerate", "1.10.0", "--ipex", m) == "removed"
    assert hf_option_status("transformers", "4.40.0", "nonexistent", m) == "unknown"


def test_findings_ignore_the_oneccl_runtime_wheel(m):
    # pkgscan reports the oneCCL runtime as "oneccl": it is not the PyTorch bindings
    assert installed_findings("3.12", {"torch": "2.8.0", "oneccl": "2021.15.0"}, m) == []


def test_doctor_adapter_on_recorded_facts(m):
    from types import SimpleNamespace

    from cpuperf.decide.doctor import check_stack as doctor_check
    from cpuperf.probe.facts import PackageInfo

    sw = SimpleNamespace(python="3.11.7", python_abi="cp311", packages={
        "torch": PackageInfo("2.5.1", local="cpu"),
        "intel_extension_for_pytorch": PackageInfo("2.4.0", local="cpu"),
        "oneccl_bind_pt": None,
    })
    facts = SimpleNamespace(platform="linux", cpu=SimpleNamespace(arch="x86_64"), software=sw)
    found = {f.id: f for f in doctor_check(facts)}
    assert found["ipex-torch-mismatch"].severity == "error"
    assert "intel-extension-for-pytorch==2.5.0" in found["ipex-torch-mismatch"].fix
