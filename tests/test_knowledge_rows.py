"""Rows of compat/ corrected against their primary sources (issue 35): each test fails on the old row.

Where the primary source is installed here (torch's run_cpu.py, transformers' training_args.py), the test
reads it; elsewhere it pins the value the cited release file gives (the source field names the file)."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
from packaging.version import Version

from cpuperf.data import load_builtin
from cpuperf.knowledge.matrix import load_matrix
from cpuperf.knowledge.resolve import installed_findings, resolve
from cpuperf.plan.user_script import trainer_default_fused


@pytest.fixture(scope="module")
def m():
    return load_matrix(environ={})


def _installed_file(dist: str, path: str) -> str:
    try:
        located = importlib.metadata.distribution(dist).locate_file(path)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed")
    if not located.exists():  # type: ignore[union-attr]
        pytest.skip(f"{dist} has no {path}")
    return located.read_text(encoding="utf-8")  # type: ignore[union-attr]


# --------------------------------------------------------------------------- tuning.toml


def test_the_trainer_defaults_to_fused_adamw_from_4_54_on_torch_2_8():
    from cpuperf.knowledge.tuning import tuning as typed

    tuning = typed()
    assert trainer_default_fused("4.54.0", "2.8.0", tuning)  # the old row (5.0) said no
    assert trainer_default_fused("4.57.6", "2.13.0+cpu", tuning)
    assert not trainer_default_fused("4.53.3", "2.8.0", tuning)  # 4.53 has the fused branch commented out
    assert not trainer_default_fused("4.54.0", "2.7.1", tuning)


def test_the_installed_transformers_picks_fused_adamw_behind_the_torch_2_8_gate():
    source = _installed_file("transformers", "transformers/training_args.py")
    version = Version(importlib.metadata.version("transformers"))
    tuning = load_builtin("tuning.toml")["hf_trainer"]
    assert version >= Version(tuning["default_fused_min_transformers"])
    assert re.search(r"is_torch_greater_or_equal_than_2_8:\s*\n\s*default_optim = \"adamw_torch_fused\"", source)
    assert tuning["default_fused_min_torch"] == "2.8"


def test_malloc_conf_is_the_string_run_cpu_exports():
    conf = load_builtin("tuning.toml")["allocator"]["jemalloc_malloc_conf"]
    assert "decay_ms" not in conf  # neither launcher sets dirty_decay_ms / muzzy_decay_ms
    assert conf == "oversize_threshold:1,background_thread:true,metadata_thp:auto"
    run_cpu = _installed_file("torch", "torch/backends/xeon/run_cpu.py")
    exported = re.search(r'"MALLOC_CONF",\s*"([^"]+)"', run_cpu)
    assert exported is not None and exported.group(1) == conf


def test_the_pin_domain_example_is_attributed_to_ipex():
    import inspect

    from cpuperf.decide.runtime_env import pin_domain

    doc = inspect.getdoc(pin_domain) or ""
    assert "intel-extension-for-pytorch" in doc and "launcher_distributed.py" in doc
    assert "torch-ccl" not in doc  # intel/torch-ccl has no I_MPI_PIN_DOMAIN example


# --------------------------------------------------------------------------- oneccl.toml


def _xpu(m, version):
    return [r for r in m.oneccl if r.device == "xpu" and r.version == Version(version)]


def test_the_torch_2_5_xpu_bindings_are_2_5_0_plus_xpu(m):
    assert _xpu(m, "2.5.1") == []  # no tag, no version.txt says 2.5.1
    (row,) = _xpu(m, "2.5.0")
    assert row.local == "+xpu" and "v2.5.0+xpu" in row.source
    assert row.accepts(Version("2.5.0")) and row.accepts(Version("2.5.1"))  # IPEX 2.5.10+xpu pairs it with 2.5.1
    found = installed_findings("3.11", {"torch": "2.5.1", "oneccl-bind-pt": "2.5.0+xpu"}, platform="linux_x86_64",
                               matrix=m)
    assert any(f["id"] == "oneccl-xpu-build" for f in found), found


def test_the_torch_1_13_1_gpu_bindings_have_a_row(m):
    (row,) = _xpu(m, "1.13.200")
    assert row.local == "+gpu" and row.accepts(Version("1.13.1")) and not row.accepts(Version("1.13.0"))
    assert row.python == frozenset({"3.7", "3.8", "3.9", "3.10"})
    res = resolve("3.10", "1.13.1", frozenset({"oneccl"}), matrix=m)
    assert any(r.version == "1.13.200+gpu" and "XPU" in r.reason for r in res.rejected), res.rejected


def test_the_torch_2_7_xpu_bindings_list_free_threaded_3_13(m):
    (xpu,) = _xpu(m, "2.7.0")
    assert xpu.python == frozenset({"3.9", "3.10", "3.11", "3.12", "3.13", "3.13t"})
    assert "v2.8.0+xpu README.md" in xpu.source and "3b4b1dc" in xpu.source  # the README that ticks 3.13t for 2.7.0
    (cpu,) = [r for r in m.oneccl if r.device == "cpu" and r.version == Version("2.7.0")]
    assert "3.13t" not in cpu.python  # the v2.7.0+cpu README, the CPU build's only table, has no 3.13t column
    res = resolve("3.13t", "2.7.0", frozenset({"oneccl"}), matrix=m)
    rejected = [r for r in res.rejected if (r.version or "").startswith("2.7.0+xpu")]
    assert rejected and all("XPU" in r.reason and "3.13t" not in r.reason for r in rejected), res.rejected


def test_accelerate_ipex_cites_the_rename_to_ipex_not_the_first_integration(m):
    (row,) = [r for r in m.hf if r.package == "accelerate" and r.name == "--ipex"]
    assert row.introduced == Version("0.20.0")  # launch.py at v0.19.0 has --ipex_enabled; v0.20.0 has --ipex
    assert "166520fe" in row.source and "(first tag v0.19.0) added the flag as --ipex_enabled" in row.source
    assert "109f3272" in row.source and "(first tag v0.20.0" in row.source
    assert "(first tag v0.20.0); src" not in row.source  # the old citation gave 166520fe's first tag as v0.20.0
    assert not row.valid_in(Version("0.19.0")) and row.valid_in(Version("0.20.0"))


# --------------------------------------------------------------------------- hf.toml


def test_accelerate_ccl_was_never_deprecated_only_removed_in_1_13(m):
    (row,) = [r for r in m.hf if r.package == "accelerate" and r.name == "ccl"]
    assert row.deprecated is None  # 1.10.0-1.12.0 still choose 'ccl' in state.py without a warning
    assert row.removed == Version("1.13.0") and row.valid_in(Version("1.12.0"))


# --------------------------------------------------------------------------- cpu_peaks.toml, microarch.toml


def _fp32_per_cycle(uarch, model_name):
    from cpuperf.knowledge.cpu_peaks import hardware_peak

    peak, info = hardware_peak(uarch, "fp32", 1, model_name, nominal_hz=1e9)
    return info.get("flops_per_cycle") if peak else None


@pytest.mark.parametrize("name, rate", [
    ("AMD Ryzen 9 9955HX 16-Core Processor", 64),  # Fire Range: desktop CCDs, full 512-bit (old pattern: 32)
    ("AMD Ryzen 9 9955HX3D 16-Core Processor", 64),
    ("AMD Ryzen Z2 Extreme", 32),  # Strix Point silicon in a handheld (old pattern: 64)
    ("AMD Ryzen AI Z2 Extreme", 32),
    ("AMD Ryzen AI 9 HX 370 w/ Radeon 890M", 32),
    ("AMD Ryzen AI 7 350 w/ Radeon 860M", 32),
    ("AMD Ryzen AI Max+ 395 w/ Radeon 8060S", 64),
    ("AMD Ryzen 9 9950X 16-Core Processor", 64),
])
def test_zen5_datapath_follows_the_silicon_not_the_suffix(name, rate):
    assert _fp32_per_cycle("zen5", name) == rate


@pytest.mark.parametrize("name, rate", [
    ("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", 64),
    ("Intel(R) Xeon(R) Silver 4314 CPU @ 2.40GHz", 64),
    ("Intel(R) Xeon(R) W-3375 CPU @ 2.50GHz", 64),
    ("Intel Xeon Processor (Icelake)", 64),  # QEMU's Icelake-Server model
    ("Intel(R) Xeon(R) CPU @ 2.60GHz", 64),  # a cloud VM that hides the SKU
    ("Intel(R) Xeon(R) W-1390P @ 3.50GHz", 32),  # Rocket Lake: one FMA unit (old pattern 'Xeon': 64)
    ("Intel(R) Xeon(R) E-2388G CPU @ 3.20GHz", 32),
    ("11th Gen Intel(R) Core(TM) i7-11700K @ 3.60GHz", 32),
    ("Intel(R) Xeon(R) W-11955M CPU @ 2.60GHz", 32),  # Tiger Lake-H
])
def test_ice_lake_two_fma_units_only_on_ice_lake_sp_and_w(name, rate):
    assert _fp32_per_cycle("icelake", name) == rate


def test_newer_intel_client_parts_and_v3ae_have_a_datapath():
    assert _fp32_per_cycle("wildcatlake", "Intel(R) Core(TM) 5 320") == 32
    assert _fp32_per_cycle("bartlettlake", "Intel(R) Core(TM) 9 273PQE") == 32
    assert _fp32_per_cycle("neoverse_v3ae", None) == 16  # GCC: 2 vector ops/cycle, V3 has 4
    assert _fp32_per_cycle("neoverse_v3", None) == 32
    # No vendor guide or compiler source gives these datapaths yet: no row, no MFU.
    for uarch in ("novalake", "zen6"):
        assert _fp32_per_cycle(uarch, None) is None


def test_cascade_lake_boost_covers_the_refresh_parts():
    from cpuperf.knowledge.cpu_peaks import boost_row

    row = boost_row("cascadelake", "Intel(R) Xeon(R) Gold 6256 CPU @ 3.60GHz")
    assert row is not None and row["ghz"] >= 4.5  # the old row said 4.4
    assert boost_row("cascadelake", "Intel Xeon Processor (Cascadelake)")["ghz"] == 4.5
    assert boost_row("cascadelake", "Intel(R) Xeon(R) CPU @ 2.80GHz")["ghz"] == 4.5  # a cloud VM
    assert boost_row("cascadelake", "Intel(R) Xeon(R) W-2295 CPU @ 3.00GHz") is None  # Turbo Boost Max 3.0: no row


def test_client_boost_rows_are_the_generations_highest():
    from cpuperf.knowledge.cpu_peaks import boost_row

    assert boost_row("raptorlake", "Intel(R) Core(TM) i9-14900KS")["ghz"] == 6.2
    assert boost_row("alderlake", "12th Gen Intel(R) Core(TM) i9-12900K")["ghz"] == 5.5
    assert boost_row("arrowlake", "Intel(R) Core(TM) Ultra 9 285K")["ghz"] == 5.7


def test_panther_lake_r_is_named():
    from cpuperf.probe.cpu import name_x86

    assert name_x86("GenuineIntel", 6, 0xE5, 0, ()) == ("pantherlake", "model")
    assert name_x86("GenuineIntel", 6, 0xD5, 0, ()) == ("wildcatlake", "model")


# --------------------------------------------------------------------------- doctor at the data's edge


def _doctor(tmp_path, **host):
    from cli_util import run_json
    from hosts import make_host

    rep, _ = run_json(["doctor", "--sysroot", str(make_host(tmp_path, **host))], expect_rc=None)
    return rep


def test_doctor_says_a_cpu_newer_than_the_peak_data_gets_no_mfu(tmp_path):
    """Nova Lake (family 18) is named by the kernel's model number but no guide gives its datapath yet."""
    rep = _doctor(tmp_path, family=18, model=1, flags=["avx2", "fma", "avx_vnni", "lm"],
                  name="Intel(R) Core(TM) Ultra 9 Nova")
    assert rep["host"]["cpu"]["microarchitecture"] == "novalake"
    (f,) = [f for f in rep["findings"] if f["id"] == "cpu-peak-not-in-data"]
    assert "novalake" in f["message"] and "no MFU" in f["message"] and "ISA flags" in f["message"]


def test_doctor_says_nothing_about_peaks_for_a_cpu_in_the_data(tmp_path):
    rep = _doctor(tmp_path, family=6, model=0xE5, flags=["avx2", "fma", "avx_vnni", "lm"],
                  name="Intel(R) Core(TM) Ultra 7 Panther Lake R")
    assert rep["host"]["cpu"]["microarchitecture"] == "pantherlake"
    assert not [f for f in rep["findings"] if f["id"] in ("cpu-peak-not-in-data", "unknown-microarchitecture")]


def test_doctor_on_an_unknown_family_says_what_it_assumes(tmp_path):
    rep = _doctor(tmp_path, family=20, model=1, flags=["avx2", "fma", "bmi1", "bmi2", "movbe", "abm", "avx", "f16c",
                                                       "lm"])
    (f,) = [f for f in rep["findings"] if f["id"] == "unknown-microarchitecture"]
    assert "ISA flags only" in f["message"] and "no MFU" in f["message"] and "newer than its data" in f["message"]
    assert not [f for f in rep["findings"] if f["id"] == "cpu-peak-not-in-data"]  # one finding, not two


def test_an_installed_ipex_outside_the_data_is_named_with_what_cpuperf_assumes(m):
    found = installed_findings("3.11", {"torch": "2.10.0", "intel-extension-for-pytorch": "2.10.10+xpu"},
                               platform="linux_x86_64", matrix=m)
    (xpu,) = [f for f in found if f["id"] == "ipex-xpu-build"]
    assert "2.10.10+xpu" in xpu["message"] and "end at 2.8.0" in xpu["message"] and "absent" in xpu["message"]
    found = installed_findings("3.11", {"torch": "2.9.1", "intel-extension-for-pytorch": "2.9.0+cpu"},
                               platform="linux_x86_64", matrix=m)
    (newer,) = [f for f in found if f["id"] == "ipex-newer-than-data"]
    assert "newer than cpuperf's data" in newer["message"] and "own major.minor" in newer["message"]
    healthy = installed_findings("3.11", {"torch": "2.8.0", "intel-extension-for-pytorch": "2.8.0+cpu"},
                                 platform="linux_x86_64", matrix=m)
    assert not [f for f in healthy if f["id"] in ("ipex-xpu-build", "ipex-newer-than-data")]


def test_accelerate_ipex_flag_was_deprecated_from_1_8(m):
    (row,) = [r for r in m.hf if r.package == "accelerate" and r.name == "--ipex"]
    assert row.deprecated == Version("1.8.0") and row.removed == Version("1.10.0")  # the old row had no deprecation


# --------------------------------------------------------------------------- torch 2.15's CUDA builds


def test_torch_2_15_builds_cuda_13_only(m):
    (row,) = [r for r in m.torch if r.version == Version("2.15.0")]
    assert row.cuda == ("cu130", "cu132")  # the old row listed none
    assert "cuda-toolkit==13.2.2" in row.source and "#8739" in row.source


@pytest.mark.parametrize("driver, want", [("570.86.10", ("2.14.1", "cu126")), ("535.104.05", ("2.14.1", "cu126")),
                                          ("580.65.06", ("2.15.0", "cu132")), ("418.40", None)])
def test_a_driver_below_cuda_13_walks_to_the_newest_torch_with_a_build(m, driver, want):
    from cpuperf.knowledge.cuda import newest_release_for_driver

    row, tag, why = newest_release_for_driver(m.torch, Version("2.15.0"), driver, m.cuda)
    if want is None:
        assert row is None and "torch 2.15.0 builds cu130, cu132" in why and "580" in why
    else:
        assert (str(row.version), tag) == want


def test_an_installed_oneccl_newer_than_the_data_is_named_with_what_cpuperf_assumes(m):
    found = installed_findings("3.11", {"torch": "2.9.0", "oneccl_bind_pt": "2.9.0+cpu"},
                               platform="linux_x86_64", matrix=m)
    (newer,) = [f for f in found if f["id"] == "oneccl-newer-than-data"]
    assert "newer than cpuperf's data (data ends at 2.8.0+xpu)" in newer["message"]
    assert "plans CPU DDP with gloo" in newer["message"] and newer["severity"] == "info"
    assert not [f for f in found if f["id"] == "oneccl-unknown"]  # one finding, not two
    from cpuperf.knowledge.addons import cpu_ddp_backend

    assert cpu_ddp_backend("2.9.0", "2.9.0+cpu", "3.11").name == "gloo"  # what the finding says cpuperf does
    healthy = installed_findings("3.11", {"torch": "2.7.0", "oneccl_bind_pt": "2.7.0+cpu"},
                                 platform="linux_x86_64", matrix=m)
    assert not [f for f in healthy if f["id"] in ("oneccl-newer-than-data", "oneccl-unknown")]


# --------------------------------------------------------------------------- boost rows from ARK


@pytest.mark.parametrize("micro, name, ghz", [
    ("sapphirerapids", "Intel(R) Xeon(R) Gold 6416H", 4.2),
    ("sapphirerapids", "Intel(R) Xeon(R) Platinum 8488C", 4.2),  # AWS m7i
    ("sapphirerapids", "Intel(R) Xeon(R) CPU Max 9480", 4.2),
    ("sapphirerapids", "Intel Xeon Processor (SapphireRapids)", 4.2),  # QEMU's model
    ("sapphirerapids", "Intel(R) Xeon(R) w9-3495X", 4.8),  # Turbo Boost Max 3.0 on the workstation parts
    ("icelake", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", 3.7),  # AWS m6i
    ("icelake", "Intel(R) Xeon(R) CPU @ 2.60GHz", 3.7),  # a cloud VM's generic name
    ("icelake", "Intel(R) Xeon(R) D-2796NT CPU @ 2.00GHz", 3.7),
    ("icelake", "Intel(R) Xeon(R) W-1390P @ 3.50GHz", 5.3),  # Rocket Lake's Xeon: the generation's row
    ("icelake", "Intel(R) Xeon(R) E-2388G CPU @ 3.20GHz", 5.3),
    ("icelake", "Intel(R) Xeon(R) W-3375 CPU @ 2.50GHz", 5.3),
    ("icelake", "11th Gen Intel(R) Core(TM) i9-11900K @ 3.50GHz", 5.3),
])
def test_sapphire_rapids_and_ice_lake_have_their_segments_highest_boost(micro, name, ghz):
    from cpuperf.knowledge.cpu_peaks import boost_row

    row = boost_row(micro, name)
    assert row is not None and row["ghz"] == ghz and "ark.intel.com" in row["source"]  # no row before
