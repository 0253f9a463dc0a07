"""A host whose cpuinfo contradicts itself (issue 62, class 4): flags of another maker than its vendor string (AMX
under AuthenticAMD), or another vendor's family/model numbering (AuthenticAMD family 6 model 143), get a doctor finding
naming the contradiction; the flags name a generation, and count as a capability, only where the vendor agrees; a
family below 1 or a negative model is refused as input (exit 2, the value named). Recorded trees (tests/hosts.py)
through the in-process CLI."""

from __future__ import annotations

import pytest
from cli_util import run_cli, run_json
from hosts import make_host

from cpuperf.errors import ExitCode
from cpuperf.probe.cpu import identify_x86, x86_contradictions

AMX = ("amx_tile", "amx_bf16", "amx_int8")
SPR = ("avx2", "fma", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
       "avx512vbmi", "vaes", "vpclmulqdq", "bmi1", "bmi2", "f16c", "abm", "movbe", "avx", "lm") + AMX
ZEN = ("avx2", "fma", "bmi2", "sha_ni", "clzero", "lm", "avx", "bmi1", "f16c", "abm", "movbe", "sse4a")


def _doctor(tmp_path, **host):
    root = make_host(tmp_path / "h", **host)
    rep, _ = run_json(["doctor", "--sysroot", str(root)], expect_rc=None)
    found = {f["id"]: f for f in rep["findings"]}
    return rep, found


@pytest.mark.parametrize("family,model", [(23, 1), (23, 49), (25, 17)])
def test_amd_with_amx_flags_is_named_by_its_vendor_and_gets_a_finding(tmp_path, family, model):
    """AMD family 23 with AMX flags was "zen" with "native bf16 (AMX)" and no finding."""
    rep, found = _doctor(tmp_path, vendor="AuthenticAMD", family=family, model=model, flags=ZEN + AMX)
    cpu = rep["host"]["cpu"]
    assert cpu["amx"]["supported"] is False and cpu["bf16_native"] is False and "amx_bf16" not in cpu["isa"]
    assert cpu["microarchitecture"].startswith("zen")
    finding = found["cpu-identity-contradicts"]
    assert finding["severity"] == "warning"
    assert "amx_bf16, amx_int8, amx_tile are GenuineIntel extensions" in finding["message"]
    assert "AuthenticAMD" in finding["message"] and finding["fix"]


def test_amd_vendor_with_intels_family_6_model_143_names_no_generation(tmp_path):
    """AuthenticAMD family 6 model 143 was "zen4" with AMX: both the numbering and the AMX flags are Intel's."""
    rep, found = _doctor(tmp_path, vendor="AuthenticAMD", family=6, model=143, flags=SPR)
    cpu = rep["host"]["cpu"]
    assert cpu["microarchitecture"] == "x86_64_v4" and cpu["amx"]["supported"] is False
    message = found["cpu-identity-contradicts"]["message"]
    assert "family 6 model 143 is GenuineIntel's sapphirerapids" in message and "amx_tile" in message


@pytest.mark.parametrize("vendor,family,model,flags", [
    ("GenuineIntel", 6, 143, SPR),  # Sapphire Rapids as it is
    ("AuthenticAMD", 25, 17, ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512vbmi", "vaes",
                               "vpclmulqdq", "sse4a")),  # Zen 4 with its own SSE4a
    ("HygonGenuine", 24, 1, ("avx2", "fma", "bmi2", "clzero", "sse4a")),  # Hygon: AMD's flags are its own
])
def test_a_consistent_host_has_no_contradiction(vendor, family, model, flags):
    assert x86_contradictions(vendor, family, model, 8, flags).said == ()
    assert identify_x86(vendor, family, model, 8, flags).name not in ("x86_64_v4", "x86_64_v3", "unknown")


def test_intel_with_amd_only_flags_is_a_contradiction():
    said = x86_contradictions("GenuineIntel", 6, 143, 8, SPR + ("xop", "fma4"))
    assert said.foreign_flags == ("fma4", "xop") and "AuthenticAMD or HygonGenuine" in said.said[0]
    assert identify_x86("GenuineIntel", 6, 143, 8, SPR + ("xop",)).name == "sapphirerapids"  # its own flags still name it


@pytest.mark.parametrize("field,value", [("family", 0), ("family", -1), ("model", -5), ("model", -1)])
def test_a_family_below_1_or_a_negative_model_is_refused_as_input(tmp_path, field, value):
    """family 0, model -5: "sapphirerapids", no finding, the negative model accepted."""
    host = {"vendor": "GenuineIntel", "family": 6, "model": 143, "flags": SPR, field: value}
    root = make_host(tmp_path / "h", **host)
    for args in (["doctor", "--sysroot", str(root)], ["recommend", "--sysroot", str(root)]):
        proc = run_cli(args)
        assert proc.returncode == ExitCode.USAGE, proc.stderr[-1500:]
        key = "cpu family" if field == "family" else "model"
        assert f"proc/cpuinfo: {key} {value} is not a CPUID" in proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_model_0_is_a_real_cpuid_model_and_stays(tmp_path):
    root = make_host(tmp_path / "h", vendor="AuthenticAMD", family=26, model=0,
                     flags=("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512vbmi",
                            "avx512_vp2intersect", "avx_vnni", "movdiri"))
    rep, _ = run_json(["doctor", "--sysroot", str(root)], expect_rc=None)
    cpu = rep["host"]["cpu"]
    assert cpu["model"] == 0 and cpu["microarchitecture"] == "zen5"


def test_an_overridden_isa_speaks_for_itself_whatever_the_hosts_vendor(tmp_path):
    """CPUPERF_OVERRIDE_ISA (a container's statement, the host-class matrix's Sapphire Rapids run on an AMD machine)
    is what the CPU can do: its AMX counts, and the host's own vendor string raises no contradiction against it."""
    root = make_host(tmp_path / "h", vendor="AuthenticAMD", family=25, model=17, flags=ZEN)
    rep, _ = run_json(["doctor", "--sysroot", str(root)], expect_rc=None,
                      extra_env={"CPUPERF_OVERRIDE_ISA": ",".join(SPR)})
    cpu = rep["host"]["cpu"]
    assert cpu["amx"]["supported"] is True and cpu["bf16_native"] is True
    assert "cpu-identity-contradicts" not in {f["id"] for f in rep["findings"]}
