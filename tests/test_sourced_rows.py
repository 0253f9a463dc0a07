"""compat/ rows checked against primary sources (each test names its source): the rows a sample found wrong, the
clock rows a source now exists for, and the ones still unsourced, which the data and `cpuperf doctor` name rather
than guess. doctor runs as a real process on recorded hosts (--sysroot)."""

from __future__ import annotations

import json

import pytest
from cli_util import run_cli, run_json
from hosts import make_arm_host, make_host
from packaging.version import Version

from cpuperf.data import load_builtin
from cpuperf.decide.recommend import recommend
from cpuperf.decide.workload import PRESETS
from cpuperf.knowledge.cpu_peaks import boost_row, hardware_peak, peak_data
from cpuperf.knowledge.gpu import table_peak
from cpuperf.knowledge.hf_flags import sharding_form
from cpuperf.knowledge.matrix import load_matrix
from cpuperf.knowledge.resolve import resolve
from cpuperf.probe import probe_host
from cpuperf.train.loop import peak_tflops
from cpuperf.worker_settings import TrainSettings

SPR = ["avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
       "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni"]


# --------------------------------------------------------------------------- the rows found wrong


@pytest.mark.parametrize("version, cu129", [("2.11.0", True), ("2.12.0", False), ("2.12.1", True), ("2.13.0", True)])
def test_cu129_builds_of_torch_2_11_to_2_13(version, cu129):
    """pytorch/pytorch #185269 (SGLang depends on the 2.11 cu129 binary; 2.12.1's wheels confirmed by two release
    maintainers), PR #186015 'Revive CUDA 12.9 nightly binary builds' and its release/2.13 cherry-pick #188162.
    2.12.0 shipped without (the request that reopened 12.9 came after it)."""
    row = load_matrix().torch_release(Version(version))
    assert row is not None and ("cu129" in row.cuda) is cu129, row.cuda
    source = next(r for r in load_builtin("torch.toml")["torch"] if r["version"] == version)["source"]
    assert not cu129 or "#185269" in source or "#186015" in source


def test_the_onednn_fp32_precision_attribute_first_ships_in_torch_2_9(tmp_path):
    """The issue said 2.4 (docs/source/notes/mkldnn.rst: 'Starting in PyTorch 2.4 ...'), but the released wheels
    say 2.9: torch/backends/mkldnn/__init__.py has no fp32_precision in 2.4.0, 2.5.0, 2.7.0 or 2.8.0 and defines
    matmul = _FP32Precision("mkldnn", "matmul") in 2.9.0. The row keeps 2.9, now with that source: planning the
    lever for torch 2.4-2.8 would make the worker fail setting it."""
    row = load_builtin("tuning.toml")["fp32_math_mode"]
    assert row["min_torch"] == "2.9" and "2.8.0" in row["source"] and "2.9.0" in row["source"]
    for torch, offered in (("2.9.0+cpu", True), ("2.8.0+cpu", False)):
        env = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": torch})}
        facts = probe_host(sysroot=str(make_host(tmp_path / torch, flags=SPR, model=143)), environ=env)
        mode = recommend(facts, PRESETS["tiny"]).levers.fp32_math_mode  # changes fp32 results: offered, never a default
        assert mode.value is None and ("--set fp32_math_mode=bf16 applies it" in mode.reason) == offered, torch


@pytest.mark.parametrize("card, dtype, tf32, tflops", [
    ("NVIDIA H200 NVL", "bf16", False, 835.5), ("NVIDIA H200 NVL", "fp16", False, 835.5),
    ("NVIDIA H200 NVL", "fp32", True, 417.5), ("NVIDIA H200 NVL", "fp32", False, 60.0),
    ("NVIDIA H200", "bf16", False, 989.4), ("NVIDIA H200", "fp32", True, 494.7),
])
def test_the_h200_nvl_has_its_own_mfu_denominator(card, dtype, tf32, tflops):
    """NVIDIA's H200 datasheet lists the NVL card apart: BF16/FP16 1,671, TF32 835 TFLOPS with sparsity, FP32 60
    (the SXM module: 1,979 / 989 / 67). It matched '\\bH200\\b' and took the SXM figures, so the worker's MFU on an
    H200 NVL read 835.5 / 989.4 = 84% of the true value. The worker's own denominator, for the math it runs."""
    settings = TrainSettings(device="cuda", dtype=dtype, tf32=tf32)
    peak = peak_tflops(settings, f"cuda:0 ({card})", dtype if dtype != "fp32" else None)
    assert peak is not None and peak.tflops == tflops
    assert ("H200 NVL column" in peak.source) is card.endswith("NVL")


# Each card by the name NVML reports (nvmlDeviceGetName, as nvidia-smi and torch.cuda.get_device_name print it), from
# the public logs the compat/gpu_peaks.toml rows cite, with its dense bf16 / tf32 / fp32 datasheet figures.
CARDS_2026 = [
    ("NVIDIA B200", r"\bB200\b", 2250.0, 1125.0, 75.0),
    ("NVIDIA B300 SXM6 AC", r"\bB300\b", 2250.0, 1125.0, 75.0),
    ("NVIDIA GB200", r"\bGB200\b", 2500.0, 1250.0, 80.0),
    ("NVIDIA GB300", r"\bGB300\b(?![- ]WS)", 2500.0, 1250.0, 83.3),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", r"\bRTX PRO 6000 Blackwell Server Edition\b", 500.0, 125.0,
     125.0),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", r"\bRTX PRO 6000 Blackwell Workstation Edition\b", 500.0,
     125.0, 125.0),
    ("NVIDIA GH200 480GB", r"\bGH200\b", 989.5, 494.5, 67.0),
    ("NVIDIA GH200 144G HBM3e", r"\bGH200\b", 989.5, 494.5, 67.0),
    ("NVIDIA H20", r"\bH20\b", 148.0, 74.0, 44.0),
    ("NVIDIA H800", r"\bH800\b", 989.5, 494.5, 67.0),
    ("NVIDIA H800 PCIe", r"\bH800 PCIe\b", 756.5, 378.0, 51.0),
    ("NVIDIA A800-SXM4-80GB", r"\bA800\b", 312.0, 156.0, 19.5),
    ("NVIDIA A800 80GB PCIe", r"\bA800\b", 312.0, 156.0, 19.5),
    ("NVIDIA L20", r"\bL20\b", 119.5, 59.8, 59.8),
    ("NVIDIA A40", r"\bA40\b", 149.7, 74.8, 37.4),
    ("NVIDIA A30", r"\bA30\b", 165.0, 82.0, 10.3),
    ("NVIDIA RTX 6000 Ada Generation", r"\bRTX 6000 Ada\b", 364.25, 91.1, 91.1),
]


@pytest.mark.parametrize("card, row, bf16, tf32, fp32", CARDS_2026)
def test_each_card_of_2026_matches_its_own_datasheet_row(card, row, bf16, tf32, fp32):
    """The cards of most new clusters took a measured peak (no row), and GH200 never matched '\\bH200\\b': each now
    matches its own row, the worker's MFU denominator for every math it runs, fp16 at the bf16 rate."""
    for dtype, allow_tf32, want, math in (("bf16", False, bf16, "bf16"), ("fp16", False, bf16, "fp16"),
                                          ("fp32", True, tf32, "tf32"), ("fp32", False, fp32, "fp32")):
        settings = TrainSettings(device="cuda", dtype=dtype, tf32=allow_tf32)
        peak = peak_tflops(settings, f"cuda:0 ({card})", dtype if dtype != "fp32" else None)
        assert peak is not None and (peak.tflops, peak.dtype, peak.card) == (want, math, row), (card, dtype)
        assert peak.source.startswith("NVIDIA ")  # the vendor's own document, by name


# The rows whose figures no NVIDIA document reachable here confirms (issue 63): the peak the worker reports names the
# document the figures come from and says that it was not confirmed, and what the figures rest on instead.
UNCONFIRMED = {
    "NVIDIA GB300": ("FP32 83.3 is the rack's rounded 6 PFLOPS divided by 72", "verda.com"),
    "NVIDIA H20": ("secondary reports quote", "zangshuxian.com"),
    "NVIDIA L20": ("dense ratios of the NVIDIA L40 datasheet", "not quoted figures"),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": ("Workstation Edition datasheet", "its own boost clock may differ"),
    "NVIDIA H800": ("H100 SXM column of the NVIDIA H100 datasheet", "nvidia.cn"),
    "NVIDIA H800 PCIe": ("H100 PCIe column of the NVIDIA H100 datasheet", "nvidia.cn"),
    "NVIDIA A800-SXM4-80GB": ("covers the 40GB Active workstation card only", "A100"),
    "NVIDIA A800 80GB PCIe": ("covers the 40GB Active workstation card only", "A100"),
}


@pytest.mark.parametrize("card", sorted(UNCONFIRMED))
def test_a_peak_resting_on_a_weaker_source_says_so(card):
    peak = table_peak(card, "bf16")
    assert peak is not None and peak.source.startswith("NVIDIA ")
    assert "not confirmed here" in peak.source.lower(), peak.source
    assert all(part in peak.source for part in UNCONFIRMED[card]), peak.source


def test_a_peak_from_a_reachable_datasheet_claims_no_caveat():
    for card in ("NVIDIA B200", "NVIDIA GB200", "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"):
        peak = table_peak(card, "bf16")
        assert peak is not None and "not confirmed" not in peak.source.lower(), (card, peak.source)


@pytest.mark.parametrize("card, neighbour", [
    ("NVIDIA GH200 480GB", r"\bH200\b"), ("NVIDIA H200", r"\bGH200\b"), ("NVIDIA H20", r"\bH200\b"),
    ("NVIDIA H200", r"\bH20\b"), ("NVIDIA GB200", r"\bB200\b"), ("NVIDIA B200", r"\bGB200\b"),
    ("NVIDIA GB300", r"\bB300\b"), ("NVIDIA A800-SXM4-80GB", r"\bA100\b"), ("NVIDIA L20", r"\bL4\b"),
])
def test_a_card_never_falls_through_to_its_neighbours_row(card, neighbour):
    """The more specific names come first, and no pattern reaches across a name: GH200 is not an H200 (nor the
    reverse), H20 not H200, GB200 not B200."""
    peak = table_peak(card, "bf16")
    assert peak is not None and peak.card != neighbour


@pytest.mark.parametrize("version, has_315", [("2.13.0", False), ("2.14.0", False), ("2.14.1", False), ("2.15.0", True)])
def test_python_3_15_wheels_are_the_registrys_not_release_mds(version, has_315):
    """pytorch/pytorch RELEASE.md lists 3.15 / 3.15t as experimental for torch 2.13 and 2.14, but the registry's simple
    index (re-read 2026-11-28, identical to tests/fixtures/regen/torch_wheels.txt) holds cp315 wheels from 2.15.0
    only. The python column follows the wheels pip can install, so a 3.15 interpreter gets 2.15.0 and a pinned
    2.14.1 is refused with the reason, not planned into a pip failure."""
    m = load_matrix()
    row = m.torch_release(Version(version))
    for platform in ("linux_x86_64", "linux_aarch64"):
        pys = row.pythons(platform)
        assert "3.14" in pys and "3.14t" in pys
        assert ("3.15" in pys) is ("3.15t" in pys) is has_315, (version, platform, sorted(pys))
    if not has_315:
        assert "RELEASE.md" in row.reason and "cp315" in row.reason
        res = resolve("3.15", version, matrix=m)
        assert res.torch is None and "Python 3.15" in [r.reason for r in res.rejected if r.package == "torch"][0]
    assert resolve("3.15", None, matrix=m).torch == "2.15.0"


def _fsdp_string_row():
    (row,) = [r for r in load_matrix().hf if r.package == "transformers" and r.name == "fsdp"]
    return row


@pytest.mark.parametrize("version, form", [
    ("4.18.0", None), ("4.19.0", "value"), ("5.9.0", "value"), ("5.10.0", "switch"), ("5.19.0", "switch"),
    ("5.20.0", "switch"), ("5.21.0", "switch"), ("5.22.0", "switch"), ("5.23.0", "switch"), ("5.24.0", "switch"),
])
def test_the_fsdp_string_form_per_transformers_release(version, form):
    """A 5.x training_args.py warns that the --fsdp string 'will be removed in v5.20', but the wheels of 5.19.0-5.24.0
    all still declare fsdp as a str with nargs='?' and translate the string (warning only). The row keeps it
    deprecated from 5.10.0 and not removed; cpuperf gives the bare --fsdp switch with --fsdp_config wherever it
    exists (5.10 on) and the string only to 4.19-5.9, where it is the one form."""
    row, v = _fsdp_string_row(), Version(version)
    assert sharding_form(version)["fsdp"] == form
    assert row.valid_in(v) is (form is not None)  # parsed wherever FSDP exists, 5.20-5.24 included
    assert (row.deprecated is not None and v >= row.deprecated) is (form == "switch")
    assert row.removed is None and "5.24.0" in row.source and "5.20.0" in row.reason


@pytest.mark.full  # imports transformers (and torch) into the test interpreter
def test_the_installed_trainer_parses_the_fsdp_string_as_the_row_says(tmp_path):
    """The real consumer: the installed transformers' own argument parser takes the string form exactly where the row
    says it is still parsed (a removal in a newer release would fail here until the row says so)."""
    transformers = pytest.importorskip("transformers")
    installed = Version(transformers.__version__)
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    argv = ["--output_dir", str(tmp_path), "--use_cpu", "--fsdp", "full_shard auto_wrap offload"]
    if not _fsdp_string_row().valid_in(installed):
        with pytest.raises((SystemExit, ValueError)):
            parser.parse_args_into_dataclasses(args=argv)
        return
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    assert args.fsdp
    if installed >= Version("5.10.0"):  # the string is translated into the switch and its config
        assert args.fsdp is True and args.fsdp_config.get("cpu_offload") is True


GA_DRIVERS = {"cu102": "440.33", "cu111": "455.23", "cu113": "465.19.01", "cu115": "495.29.05", "cu116": "510.39.01",
              "cu117": "515.43.04", "cu118": "520.61.05", "cu121": "530.30.02", "cu124": "550.54.14",
              "cu126": "560.28.03", "cu128": "570.26", "cu129": "575.51.03", "cu130": "580.65.06", "cu132": "595.45.04"}


def test_every_cuda_driver_row_cites_table_3_or_the_ga_installer():
    """The rows reasoned 'unverified (from memory)' match the CUDA release notes' Table 3 (audit of issue 55); the
    three it found no source for, cu117/cu121/cu126, are the drivers NVIDIA's GA local installers name
    (cuda_11.7.0_515.43.04_linux.run, cuda_12.1.0_530.30.02_linux.run, cuda_12.6.0_560.28.03_linux.run), and
    cu132's empty toolkit driver is its installer's 595.45.04. Each row says which of those it rests on."""
    m = load_matrix()
    assert {v.tag: v.toolkit_driver_linux for v in m.cuda} == GA_DRIVERS
    for v in m.cuda:
        assert "memory" not in v.reason and "unverified" not in v.reason, v.tag
        assert "Table 3" in v.source or f"cuda_{v.cuda}.0_{v.toolkit_driver_linux}_linux.run" in v.source, v.tag
        assert "minor-version-compatibility" in v.source, v.tag  # the floor's source
    for tag in ("cu117", "cu121", "cu126", "cu132"):
        v = next(r for r in m.cuda if r.tag == tag)
        assert f"cuda_{v.cuda}.0_{v.toolkit_driver_linux}_linux.run" in v.source


def test_a_driver_below_cuda_13_2s_own_is_told_ptx_jit_is_unavailable():
    """cu132's toolkit driver was empty, so every 13.x driver counted as cu132's own; 580 runs it by minor-version
    compatibility, without PTX JIT of newer code below 595.45.04."""
    from cpuperf.knowledge.cuda import cuda_tag_for_driver

    variants = load_matrix().cuda
    tag, why = cuda_tag_for_driver("580.65.06", ["cu130", "cu132"], variants)
    assert tag == "cu132" and "PTX JIT of newer code needs 595.45.04" in why
    tag, why = cuda_tag_for_driver("595.45.04", ["cu130", "cu132"], variants)
    assert tag == "cu132" and "PTX" not in why


def test_ipex_retirement_was_announced_in_issue_867_on_2025_10_10():
    (row,) = [r for r in load_builtin("eol.toml")["eol"] if r["component"] == "ipex"]
    assert row["announced"] == "2025-10-10" and "#867" in row["source"]  # 2025-08-08 is 2.8.0's release date


# --------------------------------------------------------------------------- clock rows with a source now


@pytest.mark.parametrize("name, ghz", [
    ("Intel(R) Xeon(R) 6980P", 3.9), ("Intel(R) Xeon(R) 6979P", 3.9), ("Intel(R) Xeon(R) 6972P", 3.9),
    ("Intel(R) Xeon(R) 6952P", 3.9), ("Intel(R) Xeon(R) 6960P", 3.9),
    ("Intel(R) Xeon(R) 6767P", None),  # Xeon 6700P: no launch table here
])
def test_xeon_6900p_boosts_to_3_9_ghz(name, ghz):
    """Intel's Xeon 6900P launch table (hardwareluxx, 2024-09): base / boost / all-core 2.0/3.9/3.2 GHz (6980P) ..."""
    row = boost_row("graniterapids", name)
    assert (row and row["ghz"]) == ghz and (row is None or "hardwareluxx" in row["source"])


def test_ampere_altra_and_panther_lake_clocks():
    """heise (2020-06): Altra Q80-33 at a fixed 3.3 GHz; hardwareluxx (2021-09): Altra Max M128-30 at 3.0 GHz;
    hardwareluxx (2026-01-26): Core Ultra X9 388H, Panther Lake's flagship, up to 5.1 GHz."""
    assert boost_row("neoverse_n1", None)["ghz"] == 3.3  # /proc/cpuinfo names no Arm part: the higher row
    assert boost_row("neoverse_n1", "Ampere(R) Altra(R) Max Processor M128-30")["ghz"] == 3.0
    assert boost_row("pantherlake", "Intel(R) Core(TM) Ultra X9 388H")["ghz"] == 5.1
    # The boost fallback at work: a GEMM beating 2 cores x 16 FLOPs x 3.0 GHz on an N1 uses Altra's 3.3 GHz.
    peak, info = hardware_peak("neoverse_n1", "fp32", 2, None, 3.0e9, None, achievable_tflops=0.1)
    assert peak is not None and info["clock_used"] == "boost" and info["clock_used_ghz"] == 3.3


# --------------------------------------------------------------------------- still unsourced: said, not guessed


@pytest.mark.parametrize("micro, kind, what", [
    ("lunarlake", "boost_clock", "Lunar Lake"), ("neoverse_v1", "boost_clock", "Neoverse V1 whose model name"),
    ("neoverse_v2", "boost_clock", "NVIDIA Grace"), ("emeraldrapids", "boost_clock", "Emerald Rapids"),
    ("power10", "flops_per_cycle", "POWER10"),
    ("zen6", "flops_per_cycle", "Zen 6"), ("novalake", "flops_per_cycle", "Nova Lake"),
    ("novalake", "boost_clock", "Nova Lake"),
])
def test_unsourced_generations_are_named_in_the_data(micro, kind, what):
    data = peak_data(micro, None)
    gaps = [g for g in data["unsourced"] if g["kind"] == kind]
    assert gaps and what in gaps[0]["what"] and gaps[0]["why"]
    assert data[kind] is None  # left out, not guessed


def test_an_unsourced_bf16_rate_is_not_called_emulated():
    peak, info = hardware_peak("neoverse_v1", "bf16", 2, None, 2.6e9)
    assert peak is None and "unsourced" in info["why_none"] and "emulated" not in info["why_none"]
    peak, info = hardware_peak("zen3", "bf16", 2, None, 2.6e9)
    assert peak is None and "emulated" in info["why_none"]


def _doctor(root):
    proc = run_cli(["doctor", "--sysroot", str(root)])
    assert proc.returncode in (0, 1), proc.stderr
    return " ".join(proc.stdout.split())


def test_doctor_prints_the_clock_rows_and_names_the_unsourced(tmp_path):
    gnr = make_host(tmp_path / "gnr", flags=SPR, model=0xAD, name="Intel(R) Xeon(R) 6980P")
    assert "highest rated clock 3.90 GHz (Xeon 6980P" in _doctor(gnr)
    ptl = make_host(tmp_path / "ptl", flags=["avx2", "fma", "avx_vnni"], model=0xCC, name="Intel(R) Core(TM) Ultra X9 388H")
    assert "highest rated clock 5.10 GHz (Core Ultra X9 388H)" in _doctor(ptl)
    assert "highest rated clock 3.30 GHz (Ampere Altra Q80-33" in _doctor(make_arm_host(tmp_path / "n1", "neoverse_n1"))
    lnl = make_host(tmp_path / "lnl", flags=["avx2", "fma", "avx_vnni"], model=0xBD, name="Intel(R) Core(TM) Ultra 7 258V")
    text = _doctor(lnl)
    assert "unsourced: Lunar Lake" in text and "cpu-data-unsourced" in text
    text = _doctor(make_arm_host(tmp_path / "v2", "neoverse_v2"))
    assert "unsourced: NVIDIA Grace highest rated clock" in text


def test_doctor_names_emerald_rapids_clock_as_unsourced(tmp_path):
    """Family 6 model 207 had neither a [[boost]] row nor an [[unsourced]] entry, so doctor said only 'no row' and
    nothing of the gap: ark.intel.com and Intel's 5th-gen launch table are not reachable here (the articles found
    give 'up to 4.1 GHz' with no table of parts). A Xeon guest like the recorded H100 host (its model name masked
    to 'Intel(R) Xeon(R) Processor', measured 2.10 GHz) now gets the gap named, and no boost guessed."""
    emr = make_host(tmp_path / "emr", flags=SPR, model=207, name="Intel(R) Xeon(R) Processor")
    rep, _ = run_json(["doctor", "--sysroot", str(emr)], expect_rc=None)
    assert rep["host"]["cpu"]["microarchitecture"] == "emeraldrapids"
    text = _doctor(emr)
    assert "unsourced: Emerald Rapids (Xeon 5th gen) highest rated boost clock" in text and "cpu-data-unsourced" in text
    assert boost_row("emeraldrapids", "Intel(R) Xeon(R) Platinum 8592+") is None


@pytest.mark.parametrize("micro, name, ghz", [
    ("neoverse_v2", "AWS Graviton4 Processor", 2.8), ("neoverse_v2", None, None), ("neoverse_v2", "NVIDIA Grace", None),
    ("neoverse_v1", "AWS Graviton3 Processor", 2.6), ("neoverse_v1", None, None),
    ("neoverse_n1", "AWS Graviton2 Processor", 2.5), ("neoverse_n1", None, 3.3),  # unnamed: Altra's bound stands
    ("neoverse_n1", "Ampere(R) Altra(R) Max Processor M128-30", 3.0),
])
def test_graviton_clocks_apply_to_the_graviton_named_only(micro, name, ghz):
    """aws/aws-graviton-getting-started README, 'Building for Graviton': Graviton2 2500 MHz, Graviton3(E) 2600 MHz,
    Graviton4 2800 MHz (2700 on the 48xlarge), no turbo. Graviton4 shares Neoverse V2 with NVIDIA Grace (and
    Graviton2 N1 with Ampere Altra), and an Arm /proc/cpuinfo names no part: a row applies only where the model name
    says Graviton, and an unnamed V2 keeps Grace's gap named instead of taking Graviton4's clock."""
    row = boost_row(micro, name)
    assert (row and row["ghz"]) == ghz
    assert row is None or ("Graviton" in row["part"]) is ("Graviton" in (name or ""))
    assert row is None or "Graviton" not in row["part"] or "aws-graviton-getting-started" in row["source"]
    gap = [g for g in peak_data(micro, name)["unsourced"] if g["kind"] == "boost_clock"]
    assert bool(gap) is (row is None)  # a clock, or its gap said: never neither
    if micro == "neoverse_v2" and row is None:
        assert "NVIDIA Grace" in gap[0]["what"]


def test_a_graviton4_guest_takes_its_fixed_clock_as_the_peak():
    """On a guest the clocks read are the host's TSC: the generation's rated clock is used, here the fixed 2.8 GHz."""
    peak, info = hardware_peak("neoverse_v2", "fp32", 4, "AWS Graviton4 Processor", 1.0e9, None, guest=True)
    assert peak is not None and info["clock_used"] == "boost" and info["clock_used_ghz"] == 2.8
    assert peak.tflops == round(4 * 32 * 2.8e9 / 1e12, 4)
    peak, info = hardware_peak("neoverse_v2", "fp32", 4, None, 1.0e9, None, guest=True)  # a Grace, or unnamed
    assert peak is not None and info["clock_used"] == "nominal"


@pytest.mark.parametrize("kind, native", [("neoverse_v1", True), ("neoverse_v2", True), ("neoverse_n1", False)])
def test_doctors_bf16_line_agrees_with_the_arm_isa_it_prints(tmp_path, kind, native):
    """The V2 said 'bf16 native: no' beside 'bf16 svebf16': the line read x86's avx512_bf16/AMX flag only."""
    rep, _ = run_json(["doctor", "--sysroot", str(make_arm_host(tmp_path, kind))], expect_rc=None)
    cpu = rep["host"]["cpu"]
    assert cpu["bf16_native"] is native is ("bf16" in cpu["isa"])
    assert ("bf16 native yes" if native else "bf16 native no") in _doctor(tmp_path)


def test_a_cpu_arm_host_takes_the_registrys_newest_cpu_build():
    """The registry's Linux aarch64 torch is a CPU build up to 2.10 (2.9.1: a 104 MB wheel, no nvidia-*
    requirement) and a CUDA build from 2.11 (about 400 MiB, nvidia-* requirements in its metadata): `cpuperf
    install` on a CPU Arm host without the PyTorch CPU index takes 2.10.0, never a CUDA payload it cannot use."""
    from cpuperf.plan.install import registry_cpu_builds

    offered = ["2.15.0", "2.14.1", "2.13.0", "2.11.0", "2.10.0", "2.9.1"]
    keep, cuda = registry_cpu_builds(offered, load_matrix(), "linux_aarch64")
    assert keep == ["2.10.0", "2.9.1"] and cuda == ["2.15.0", "2.14.1", "2.13.0", "2.11.0"]
    assert registry_cpu_builds(offered, load_matrix(), "linux_x86_64") == (offered, [])


def test_every_unsourced_row_names_a_known_generation_and_why():
    data = load_builtin("microarch.toml")
    names = {r["name"] for kind in ("x86", "arm") for r in data[kind]} | {"power10"}  # POWER: named by probe/cpu.py
    for row in load_builtin("cpu_peaks.toml")["unsourced"]:
        assert set(row["match"]) <= names and row["kind"] in ("flops_per_cycle", "boost_clock"), row
        assert row["what"] and row["why"]


def test_diamond_rapids_has_no_rate_until_a_source_covers_it():
    """The Xeon 4th-6th gen row's sources say nothing of Panther Cove: Diamond Rapids gets no FLOPs per cycle (no MFU
    against a guess) and an [[unsourced]] entry saying why; Granite Rapids keeps the row."""
    dmr = peak_data("diamondrapids", "Intel(R) Xeon(R) 7")
    assert dmr["flops_per_cycle"] is None
    assert [u["kind"] for u in dmr["unsourced"]] == ["flops_per_cycle"] and "Panther Cove" in dmr["unsourced"][0]["what"]
    assert hardware_peak("diamondrapids", "bf16", 2, "Intel(R) Xeon(R) 7", nominal_hz=2.0e9)[0] is None
    assert peak_data("graniterapids", "Intel(R) Xeon(R) 6980P")["flops_per_cycle"]["bf16"] == 1024
