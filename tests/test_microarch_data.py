"""compat/microarch.toml against the kernel's own tables, through `cpuperf doctor --sysroot` with recorded
/proc/cpuinfo files; and Arm/POWER dtype evidence in their own terms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_util import run_cli, run_json
from hosts import CPUINFO, fixture_host, make_host, write

from cpuperf.data import load_builtin
from cpuperf.decide.recommend import Measurements, RecommendRequest, recommend
from cpuperf.decide.workload import PRESETS
from cpuperf.knowledge.cpu_peaks import hardware_peak
from cpuperf.probe import probe_host
from cpuperf.probe.cpu import identify_x86, name_x86
from cpuperf.probe.facts import ARM_ISA, X86_ISA

# Linux arch/x86/kernel/cpu/amd.c, bsp_init_amd(), "Figure out Zen generations" (v6.18 with tip commit
# 847ebc44 "x86/CPU/AMD: Extend Zen6 model range"): family -> [(first model, last model, generation)].
KERNEL_AMD = {
    0x17: [(0x00, 0x2f, "zen"), (0x50, 0x5f, "zen"), (0x30, 0x4f, "zen2"), (0x60, 0x7f, "zen2"),
           (0x90, 0x91, "zen2"), (0xa0, 0xaf, "zen2")],
    0x19: [(0x00, 0x0f, "zen3"), (0x20, 0x5f, "zen3"), (0x10, 0x1f, "zen4"), (0x60, 0xaf, "zen4")],
    0x1a: [(0x00, 0x2f, "zen5"), (0x40, 0x4f, "zen5"), (0x60, 0x7f, "zen5"), (0x50, 0x5f, "zen6"),
           (0x80, 0xaf, "zen6"), (0xc0, 0xcf, "zen6")],
}

# Linux arch/x86/include/asm/intel-family.h (INTEL_* = IFM(family, model)): the models cpuperf names.
KERNEL_INTEL = {
    (6, 0x3C): "haswell", (6, 0x3F): "haswell", (6, 0x45): "haswell", (6, 0x46): "haswell",
    (6, 0x3D): "broadwell", (6, 0x47): "broadwell", (6, 0x4F): "broadwell", (6, 0x56): "broadwell",
    (6, 0x4E): "skylake", (6, 0x5E): "skylake", (6, 0x8E): "skylake", (6, 0x9E): "skylake",
    (6, 0xA5): "skylake", (6, 0xA6): "skylake", (6, 0x66): "cannonlake",
    (6, 0x6A): "icelake", (6, 0x6C): "icelake", (6, 0x7D): "icelake", (6, 0x7E): "icelake",
    (6, 0x9D): "icelake", (6, 0x8C): "icelake", (6, 0x8D): "icelake", (6, 0xA7): "icelake",
    (6, 0x8F): "sapphirerapids", (6, 0xCF): "emeraldrapids", (6, 0xAD): "graniterapids",
    (6, 0xAE): "graniterapids", (19, 0x01): "diamondrapids",
    (6, 0x97): "alderlake", (6, 0x9A): "alderlake", (6, 0xBE): "alderlake_n",
    (6, 0xB7): "raptorlake", (6, 0xBA): "raptorlake", (6, 0xBF): "raptorlake",
    (6, 0xAA): "meteorlake", (6, 0xAC): "meteorlake",
    (6, 0xC5): "arrowlake", (6, 0xC6): "arrowlake", (6, 0xB5): "arrowlake", (6, 0xBD): "lunarlake",
    (6, 0xCC): "pantherlake", (6, 0xE5): "pantherlake", (6, 0xD5): "wildcatlake", (18, 0x01): "novalake", (18, 0x03): "novalake",
    (6, 0xD7): "bartlettlake", (6, 0x8A): "lakefield",
    (6, 0xAF): "sierraforest", (6, 0xB6): "grandridge", (6, 0xDD): "clearwaterforest",
}

# Names Linux prints in /proc/cpuinfo for the x86 features cpuperf uses: the quoted name in each comment of
# arch/x86/include/asm/cpufeatures.h (a flag without one is never printed).
KERNEL_X86_NAMES = {
    "sse4_2", "avx", "f16c", "fma", "avx2", "bmi1", "bmi2", "movbe", "adx", "rdseed", "rdrand", "fsgsbase",
    "xsaveopt", "clflushopt", "xsavec", "clwb", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl",
    "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq",
    "avx512_bf16", "avx512_fp16", "avx512_vp2intersect", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
    "gfni", "vaes", "vpclmulqdq", "serialize", "movdiri", "sha_ni", "clzero", "wbnoinvd", "rdpid", "pku",
    "abm", "lm",
}
# ... and spellings that never appear: no /proc/cpuinfo name, or not Linux's spelling.
NEVER_PRINTED = {"amx_fp16", "avx_ifma", "avx_vnni_int8", "amx_complex", "avx512_vbmi", "avx512_ifma"}
# Arm: arch/arm64/kernel/cpuinfo.c hwcap_str[] names.
KERNEL_ARM_NAMES = {"asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "svebf16", "i8mm", "svei8mm",
                    "sme", "sme2"}

ZEN4 = ["avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi",
        "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16", "gfni", "vaes",
        "vpclmulqdq", "sha_ni", "clzero", "clwb", "wbnoinvd", "rdpid", "pku", "lm"]


FIXTURES = Path(__file__).parent / "fixtures" / "regen"


def _table():
    return load_builtin("microarch.toml")


def test_every_feature_name_is_one_linux_prints():
    for entry in _table()["x86"]:
        assert set(entry["features"]) <= KERNEL_X86_NAMES, (entry["name"], set(entry["features"]) - KERNEL_X86_NAMES)
    assert set(X86_ISA) <= KERNEL_X86_NAMES and not set(X86_ISA) & NEVER_PRINTED
    assert set(ARM_ISA) <= KERNEL_ARM_NAMES


@pytest.mark.parametrize("family", sorted(KERNEL_AMD))
def test_amd_ranges_cover_the_kernel_ranges(family):
    for lo, hi, name in KERNEL_AMD[family]:
        for model in range(lo, hi + 1):
            assert name_x86("AuthenticAMD", family, model, 0, ()) == (name, "model"), (hex(family), hex(model))


def test_amd_models_outside_the_kernel_ranges_are_not_named_by_model():
    covered = {(f, m) for f, ranges in KERNEL_AMD.items() for lo, hi, _ in ranges for m in range(lo, hi + 1)}
    for family in KERNEL_AMD:
        for model in range(256):
            if (family, model) not in covered:
                assert name_x86("AuthenticAMD", family, model, 0, ())[1] != "model", (hex(family), hex(model))


def test_intel_models_match_intel_family_h():
    for (family, model), name in KERNEL_INTEL.items():
        stepping = 0
        assert name_x86("GenuineIntel", family, model, stepping, ()) == (name, "model"), (family, hex(model))
    assert name_x86("GenuineIntel", 6, 0x55, 4, ())[0] == "skylake_avx512"
    assert name_x86("GenuineIntel", 6, 0x55, 7, ())[0] == "cascadelake"
    assert name_x86("GenuineIntel", 6, 0x55, 11, ())[0] == "cooperlake"


def test_a_newer_family_is_never_named_after_an_older_part():
    client = ("avx2", "fma", "bmi1", "bmi2", "movbe", "abm", "avx", "f16c", "avx_vnni", "gfni", "vaes", "serialize",
              "movdiri", "lm")
    assert name_x86("GenuineIntel", 6, 0xF0, 0, client)[0] == "alderlake"  # unknown model of a known family
    assert name_x86("GenuineIntel", 20, 0x01, 0, client) == ("x86_64_v3", "features")
    assert name_x86("GenuineIntel", 18, 0x01, 0, client) == ("novalake", "model")
    assert name_x86("GenuineIntel", 19, 0x01, 0, client) == ("diamondrapids", "model")
    assert name_x86("AuthenticAMD", 0x1b, 0x00, 0, tuple(ZEN4))[0] == "x86_64_v4"


# archspec-json's alderlake list in /proc/cpuinfo spelling (tests/fixtures/regen/archspec_x86_features.json):
# movdiri and movdir64b included, so they tell an Alder Lake from nothing newer.
ALDERLAKE = ["abm", "adx", "aes", "avx", "avx2", "avx_vnni", "bmi1", "bmi2", "clflushopt", "clwb", "fma", "gfni", "lm",
             "movbe", "movdir64b", "movdiri", "pclmulqdq", "rdpid", "rdrand", "rdseed", "serialize", "sha_ni", "vaes",
             "vpclmulqdq", "waitpkg", "xsavec", "xsaveopt"]


@pytest.mark.parametrize("model", [0x97, 0x9A, 0xF0, 0xFE])
def test_an_alder_lake_of_unknown_model_is_never_named_a_later_generation(model):
    """Meteor, Arrow, Lunar, Panther and Wildcat Lake were told from Alder Lake by movdiri, which Alder Lake has
    (archspec-json): an Alder Lake whose model the kernel table lacks was named meteorlake. They are named by model
    only now; the flags of an unknown model name the oldest generation they fit."""
    named = name_x86("GenuineIntel", 6, model, 0, tuple(ALDERLAKE))
    assert named == ("alderlake", "model" if model in (0x97, 0x9A) else "features")


@pytest.mark.parametrize("name, model", [("meteorlake", 0xAA), ("arrowlake", 0xC6), ("lunarlake", 0xBD),
                                         ("pantherlake", 0xCC), ("wildcatlake", 0xD5)])
def test_the_later_hybrids_are_named_by_their_model_and_say_so(name, model):
    row = next(r for r in _table()["x86"] if r["name"] == name)
    assert row["features"] == [] and "named by model only" in row["reason"]
    assert name_x86("GenuineIntel", 6, model, 0, tuple(ALDERLAKE)) == (name, "model")


def test_feature_sets_are_archspecs_where_archspec_names_the_generation():
    """The header says the feature sets come from archspec-json: every feature of a row that archspec names is in
    archspec's list for it (recorded at commit 90b453f), unless the row's source names the document for it. zen,
    zen2 and zen3 listed sha_ni (and wbnoinvd, rdpid) that archspec's lists lack."""
    recorded = json.loads((FIXTURES / "archspec_x86_features.json").read_text())["features"]
    checked = set()
    for row in _table()["x86"]:
        if row["name"] not in recorded:
            continue
        extra = [f for f in row["features"] if f not in recorded[row["name"]]]
        assert all(f in row["source"] for f in extra), (row["name"], extra)
        checked.add(row["name"])
    assert {"zen", "zen2", "zen3", "zen4", "zen5", "alderlake", "arrowlake", "sapphirerapids", "icelake"} <= checked


def test_new_family_host_gets_a_report_finding(tmp_path):
    flags = ["avx2", "fma", "bmi1", "bmi2", "movbe", "abm", "avx", "f16c", "lm"]
    rep, _ = run_json(["doctor", "--sysroot", str(make_host(tmp_path, family=20, model=1, flags=flags))],
                      expect_rc=None)
    assert rep["host"]["cpu"]["microarchitecture"] == "x86_64_v3"
    assert any(f["id"] == "unknown-microarchitecture" for f in rep["findings"])


def test_alder_lake_n_has_e_cores_only():
    entries = {e["name"]: e for e in _table()["x86"]}
    assert entries["alderlake_n"]["hybrid"] is False and entries["alderlake"]["hybrid"] is True
    assert 0xBE not in entries["alderlake"]["models"]


def test_feature_fallback_never_names_an_avx512_bf16_part_zen():
    for family, model in ((0x1b, 0x00), (0x1a, 0xf0), (0x19, 0xf0)):  # models the kernel does not list
        name, how = name_x86("AuthenticAMD", family, model, 0, tuple(ZEN4))
        assert how == "features" and name in ("zen4", "x86_64_v4"), (hex(family), hex(model), name)
    # AVX-512 without the Zen 4 set still never falls back to a pre-AVX-512 generation
    plain = ("avx2", "fma", "bmi2", "sha_ni", "clzero", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
    assert name_x86("AuthenticAMD", 0x1b, 0, 0, plain)[0] == "x86_64_v4"


def _doctor_cpu(root):
    rep, _ = run_json(["doctor", "--sysroot", str(root)], expect_rc=None)
    return rep["host"]["cpu"]


@pytest.mark.parametrize("fixture", sorted(p.name for p in CPUINFO.iterdir() if p.name.startswith("linux-")))
def test_doctor_names_recorded_hosts(tmp_path, fixture):
    write(tmp_path, "/proc/cpuinfo", (CPUINFO / fixture).read_text())
    cpu = _doctor_cpu(tmp_path)
    assert cpu["microarchitecture"] == fixture.split("-", 2)[2]
    line = next(x for x in (CPUINFO / fixture).read_text().splitlines() if x.lower().startswith(("flags", "features")))
    listed = set(line.split(":", 1)[1].split())
    assert set(cpu["isa"]) == {f for f in (X86_ISA if cpu["arch"] == "x86_64" else ARM_ISA) if f in listed}


@pytest.mark.parametrize("family,model,flags,name", [
    (0x19, 0x61, ZEN4, "zen4"),      # Raphael: amd.c 0x60-0xaf
    (0x1a, 0x44, ZEN4, "zen5"),      # Granite Ridge: amd.c 0x40-0x4f
    (0x1a, 0x60, ZEN4, "zen5"),      # amd.c 0x60-0x7f
    (0x1a, 0x50, ZEN4, "zen6"),      # amd.c 0x50-0x5f
])
def test_doctor_names_amd_generations_and_lists_vbmi(tmp_path, family, model, flags, name):
    cpu = _doctor_cpu(make_host(tmp_path, vendor="AuthenticAMD", family=family, model=model, flags=flags))
    assert cpu["microarchitecture"] == name and cpu["microarchitecture_source"] == "model"
    assert "avx512vbmi" in cpu["isa"] and cpu["bf16_native"] is True


def test_doctor_clearwater_forest_and_alder_lake_n(tmp_path):
    ecore = ["avx2", "fma", "avx_vnni", "gfni", "vaes", "serialize", "lm"]
    assert _doctor_cpu(make_host(tmp_path / "c", model=0xDD, flags=ecore))["microarchitecture"] == "clearwaterforest"
    assert _doctor_cpu(make_host(tmp_path / "n", model=0xBE, flags=ecore))["microarchitecture"] == "alderlake_n"


# --------------------------------------------------------------------------- the model number against the flags
# A hypervisor reports its guest any family/model but exposes only extensions the hardware has: where the flags
# allow a newer generation with vector extensions the model's generation lacks, the flags name the host.

# archspec-json microarchitectures.json at 90b453f (2026-08-19): the AVX-512/AMX features of every generation it
# shares with compat/microarch.toml (Linux spelling; an archspec name absent from it has none).
ARCHSPEC_VECTOR = {
    "skylake_avx512": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"},
    "cascadelake": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"},
    "cannonlake": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi"},
    "icelake": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vnni",
                "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq"},
    "sapphirerapids": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi",
                       "avx512_vnni", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16", "amx_tile",
                       "amx_bf16", "amx_int8"},
    "zen4": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vnni",
             "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16"},
    "zen5": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vnni",
             "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16", "avx512_vp2intersect"},
    **{name: set() for name in ("sandybridge", "ivybridge", "haswell", "broadwell", "skylake", "alderlake",
                                "arrowlake", "zen", "zen2", "zen3")},
}


def test_a_newer_rows_vector_extensions_are_ones_the_older_generation_lacks():
    """The flags overrule a model only by a newer row's AVX-512/AMX features that the model's row does not list:
    each of those must be one the model's generation really lacks (archspec's full lists), or a real host of that
    generation would be renamed."""
    rows = _table()["x86"]
    for old in rows:
        if old["name"] not in ARCHSPEC_VECTOR:
            continue
        for new in rows:
            if new["vendor"] != old["vendor"] or new["order"] <= old["order"]:
                continue
            beyond = {f for f in new["features"] if f.startswith(("avx512", "amx_"))} - set(old["features"])
            assert not beyond & ARCHSPEC_VECTOR[old["name"]], (old["name"], new["name"], beyond)


def _masked(text, **fields):
    """A recorded cpuinfo with some of its fields (model, stepping) replaced, as a hypervisor may report them."""
    keys = {"model": "model\t\t", "stepping": "stepping\t"}
    out = []
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip()
        out.append(f"{keys[key]}: {fields[key]}" if key in fields else line)
    return "\n".join(out) + "\n"


def test_the_recorded_amx_guest_is_named_by_its_flags_with_the_amx_peak(tmp_path):
    """The KVM guest that reports Rocket Lake's model 167 with AMX and avx512_fp16: sapphirerapids, both names
    shown, a finding, and the AMX bf16 peak (before: icelake, no bf16 row, every MFU 'n/a')."""
    rep, _ = run_json(["doctor", "--sysroot", str(fixture_host(tmp_path, "intel-kvm-model167-amx"))], expect_rc=None)
    cpu = rep["host"]["cpu"]
    assert (cpu["model"], cpu["microarchitecture"], cpu["microarchitecture_source"]) == (167, "sapphirerapids",
                                                                                         "features")
    assert cpu["microarchitecture_by_model"] == "icelake"
    assert cpu["peak_data"]["flops_per_cycle"]["bf16"] == 1024
    finding = next(f for f in rep["findings"] if f["id"] == "microarchitecture-from-flags")
    assert "model 167 (icelake" in finding["message"] and "named sapphirerapids" in finding["message"]
    for flag in ("avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"):
        assert flag in finding["message"]
    assert "avx512cd" not in finding["message"]  # Ice Lake has it: no disagreement there
    peak, info = hardware_peak(cpu["microarchitecture"], "bf16", 2, cpu["model_name"], nominal_hz=2.6e9)
    assert peak is not None and info["flops_per_cycle"] == 1024
    text = run_cli(["doctor", "--sysroot", str(tmp_path)]).stdout
    assert "sapphirerapids (by features; family 6 model 167 says icelake)" in text


# Synthetic masked samples: a recorded host's cpuinfo under another generation's model number, or a flag set from a
# named document under a model the kernel gives an older generation.
@pytest.mark.parametrize("fixture,fields,by_model", [
    ("linux-centos7-cascadelake", {"model": 63}, "haswell"),        # intel-family.h HASWELL_X 0x3F
    ("linux-centos7-cascadelake", {"model": 94}, "skylake"),        # intel-family.h SKYLAKE 0x5E (client)
    ("linux-centos7-cascadelake", {"stepping": 4}, "skylake_avx512"),  # SDM Vol. 4 table 2-1: 0x55 stepping 4
])
def test_a_recorded_host_under_an_older_model_is_named_by_its_flags(tmp_path, fixture, fields, by_model):
    write(tmp_path, "/proc/cpuinfo", _masked((CPUINFO / fixture).read_text(), **fields))
    rep, _ = run_json(["doctor", "--sysroot", str(tmp_path)], expect_rc=None)
    cpu = rep["host"]["cpu"]
    assert (cpu["microarchitecture"], cpu["microarchitecture_source"]) == ("cascadelake", "features")
    assert cpu["microarchitecture_by_model"] == by_model
    assert any(f["id"] == "microarchitecture-from-flags" and "avx512_vnni" in f["message"] for f in rep["findings"])


# Flag sets: ZEN4 above (archspec-json microarchitectures.json zen4, Linux spelling); Cooper Lake and Sapphire
# Rapids from Intel's ISA extensions reference (AVX512_BF16; AMX-TILE/BF16/INT8, AVX512-FP16, AVX-VNNI) as
# tests/test_probe.py builds them.
_SKX = ["avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "clwb", "lm"]
_SPR = _SKX + ["avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni"]


@pytest.mark.parametrize("vendor,family,model,stepping,flags,name,by_model", [
    ("AuthenticAMD", 0x17, 0x31, 0, ZEN4, "zen4", "zen2"),    # Zen 4 flags under Rome's model (amd.c 0x30-0x4f)
    ("AuthenticAMD", 0x19, 0x01, 0, ZEN4, "zen4", "zen3"),    # ... under Milan's (amd.c 0x00-0x0f)
    ("GenuineIntel", 6, 0x55, 7, _SKX + ["avx512_vnni", "avx512_bf16"], "cooperlake", "cascadelake"),
    ("GenuineIntel", 6, 0x6A, 6, _SPR, "sapphirerapids", "icelake"),   # Ice Lake-SP's model
])
def test_flags_of_a_newer_generation_overrule_the_model(vendor, family, model, stepping, flags, name, by_model):
    named = identify_x86(vendor, family, model, stepping, tuple(flags))
    assert (named.name, named.how, named.by_model) == (name, "features", by_model)
    assert named.beyond_model and all(f.startswith(("avx512", "amx_")) for f in named.beyond_model)


CLIENT = ["avx2", "fma", "bmi1", "bmi2", "movbe", "abm", "avx", "f16c", "avx_vnni", "gfni", "vaes", "serialize", "lm"]


@pytest.mark.parametrize("family,model,flags,name", [
    (6, 0xCF, _SPR, "emeraldrapids"),     # the same flags as Sapphire Rapids: the model tells them apart
    (6, 0xAD, _SPR, "graniterapids"),
    (6, 0x97, CLIENT + ["movdiri"], "alderlake"),   # a newer client row's movdiri is no vector extension
    (6, 0x97, CLIENT + ["movdiri"] + _SPR[2:7] + ["avx512_vnni", "avx512_bf16", "avx512_fp16"], "alderlake"),
    (6, 0x6A, _SKX + sorted(ARCHSPEC_VECTOR["icelake"]) + ["gfni", "vaes", "vpclmulqdq"], "icelake"),
])
def test_flags_that_allow_nothing_newer_keep_the_models_name(family, model, flags, name):
    assert identify_x86("GenuineIntel", family, model, 0, tuple(flags)) == (name, "model", None, ())


# --------------------------------------------------------------------------- Arm and POWER dtype evidence


def _arm_host(tmp_path, features=None):
    write(tmp_path, "/proc/cpuinfo", (CPUINFO / "linux-amazon-neoverse_v1").read_text())
    if features is not None:
        text = "".join(f"Features\t: {features}\n" if line.startswith("Features") else line + "\n"
                       for line in (CPUINFO / "linux-amazon-neoverse_v1").read_text().splitlines())
        write(tmp_path, "/proc/cpuinfo", text)
    return tmp_path


def test_arm_dtype_evidence_is_arm_features(tmp_path):
    facts = probe_host(sysroot=str(_arm_host(tmp_path)))
    d = recommend(facts, PRESETS["tiny"]).levers.dtype
    assert d.value == "fp32"
    assert d.evidence["bf16"] is True and d.evidence["i8mm"] is True and d.evidence["sve"] is True
    assert "avx512_bf16" not in d.evidence and "amx_bf16" not in d.evidence
    assert "Arm BF16" in d.reason and "fp32 kept" in d.reason and "cpuperf bench" in d.reason
    fast = Measurements(gemm_fp32_gflops=100.0, gemm_bf16_gflops=300.0, source="recorded")
    d = recommend(facts, PRESETS["tiny"], RecommendRequest(measurements=fast)).levers.dtype
    assert d.value == "bf16" and "3.00x" in d.reason and "Arm BF16" in d.reason


def test_arm_without_bf16_keeps_fp32_even_when_a_measurement_looks_fast(tmp_path):
    facts = probe_host(sysroot=str(_arm_host(tmp_path, "fp asimd evtstrm aes pmull sha1 sha2 crc32 asimddp")))
    fast = Measurements(gemm_fp32_gflops=100.0, gemm_bf16_gflops=300.0, source="recorded")
    d = recommend(facts, PRESETS["tiny"], RecommendRequest(measurements=fast)).levers.dtype
    assert d.value == "fp32" and d.evidence["bf16"] is False and "no Arm BF16" in d.reason


@pytest.mark.parametrize("gen,mma", [("POWER9", False), ("POWER10", True)])
def test_power_dtype_evidence_is_mma(tmp_path, gen, mma):
    write(tmp_path, "/proc/cpuinfo", f"processor\t: 0\ncpu\t\t: {gen} (architected), altivec supported\n"
                                     "clock\t\t: 3000MHz\nrevision\t: 2.0 (pvr 0080 0200)\n\n")
    facts = probe_host(sysroot=str(tmp_path))
    assert ("mma" in facts.cpu.isa) is mma and "vsx" in facts.cpu.isa
    d = recommend(facts, PRESETS["tiny"]).levers.dtype
    assert d.value == "fp32" and d.evidence["mma"] is mma and "avx512_bf16" not in d.evidence
    assert ("MMA" in d.reason) and (("no MMA" in d.reason) is not mma)


def test_recommend_json_on_a_recorded_arm_host(tmp_path):
    root = _arm_host(tmp_path)
    rep, _ = run_json(["recommend", "--sysroot", str(root)])
    d = next(x for x in rep["decisions"] if x["id"] == "dtype")
    assert d["value"] == "fp32" and d["evidence"]["bf16"] is True and "Arm BF16" in d["reason"]


# archspec-json microarchitectures.json at 90b453f (2026-08-19): every Arm entry with a 'cpupart'.
ARCHSPEC_ARM_PARTS = {"thunderx2": (0x43, 0x0af), "a64fx": (0x46, 0x001), "cortex_a72": (0x41, 0xd08),
                      "neoverse_n1": (0x41, 0xd0c), "neoverse_v1": (0x41, 0xd40), "neoverse_v2": (0x41, 0xd4f),
                      "neoverse_n2": (0x41, 0xd49), "ampere1": (0xc0, 0xac3), "ampere1a": (0xc0, 0xac4),
                      "neoverse_v3ae": (0x41, 0xd83), "m1": (0x61, 0x022), "m2": (0x61, 0x032)}


@pytest.mark.parametrize("name", sorted(ARCHSPEC_ARM_PARTS))
def test_every_archspec_arm_part_is_named_the_same(name):
    from cpuperf.probe.cpu import name_arm

    implementer, part = ARCHSPEC_ARM_PARTS[name]
    assert name_arm(implementer, part)[0] == name and name_arm(implementer, part)[2] == "model"


def test_azure_cobalt_is_a_neoverse_n2():
    from cpuperf.probe.cpu import name_arm

    assert name_arm(0x6d, 0xd49) == ("neoverse_n2", "Microsoft", "model")
