"""A sound MFU: the peak is the sustained GEMM rate at the workload's shapes (or a data peak), never below
the achieved rate, and the same job gives the same MFU run after run."""

from __future__ import annotations

import json
import statistics

import pytest

from cpuperf.knowledge.cpu_peaks import hardware_peak
from cpuperf.knowledge.gpu import Peak
from cpuperf.probe.clocks import measured_clock_hz, nominal_clock_hz
from cpuperf.train.peak import bounded_mfu, cpu_mfu, data_peak, workload_shapes


def test_data_peak_is_cores_times_flops_per_cycle_times_clock():
    zen5 = data_peak("zen5", "fp32", threads=2, clock_hz=2.6e9)
    assert zen5 is not None and zen5.tflops == pytest.approx(2 * 64 * 2.6e9 / 1e12, rel=1e-3)
    assert "hardware:" in zen5.source and "58455" in zen5.source
    assert data_peak("zen5", "bf16", 2, 2.6e9).tflops == pytest.approx(2 * zen5.tflops, rel=1e-3)
    assert data_peak("zen3", "bf16", 2, 3e9) is None  # emulated bf16 has no data peak
    assert data_peak("no_such_cpu", "fp32", 2, 3e9) is None


def test_mfu_is_never_above_100_percent():
    low = Peak(0.01, "fp32", "measured: too short")
    good = Peak(0.05, "fp32", "measured: again")
    mfu, peak, notes = bounded_mfu(0.02, low, 1, remeasure=lambda: good)
    assert mfu == pytest.approx(0.4) and peak is good and "measured again" in notes["peak_note"]
    assert notes["rejected_peak"]["tflops"] == 0.01
    # Still too low, and no data row for this CPU (unknown microarchitecture): no MFU, and it says why.
    mfu, peak, notes = bounded_mfu(0.02, Peak(0.01, "fp16", "measured"), 1, remeasure=lambda: low)
    assert mfu is None and peak is None and "not reported" in notes["peak_note"]
    assert bounded_mfu(0.02, good, 1) == (pytest.approx(0.4), good, {})


def test_variants_server_client_mobile_differ_where_the_hardware_does():
    """Mobile Zen 5 has a 256-bit datapath (half the desktop rate); Xeon Silver one FMA unit, Gold 6xxx two;
    client Ice Lake one FMA, Ice Lake-SP two; client P-cores without AVX-512 the AVX2 rate."""
    def rate(uarch, name, dtype="fp32"):
        peak, info = hardware_peak(uarch, dtype, 1, name, nominal_hz=1e9)
        return info.get("flops_per_cycle") if peak else None

    assert rate("zen5", "AMD Ryzen AI 9 HX 370 w/ Radeon 890M") == 32
    assert rate("zen5", "AMD Ryzen 9 9950X 16-Core Processor") == 64
    assert rate("zen5", "AMD EPYC 9555 64-Core Processor") == 64
    assert rate("zen5", "AMD Ryzen AI 9 HX 370", "bf16") == 64 and rate("zen5", "AMD EPYC 9555", "bf16") == 128
    assert rate("cascadelake", "Intel(R) Xeon(R) Silver 4210 CPU @ 2.20GHz") == 32
    assert rate("cascadelake", "Intel(R) Xeon(R) Gold 5218 CPU @ 2.30GHz") == 32
    assert rate("cascadelake", "Intel(R) Xeon(R) Gold 5222 CPU @ 3.80GHz") == 64
    assert rate("cascadelake", "Intel(R) Xeon(R) Platinum 8280 CPU @ 2.70GHz") == 64
    assert rate("icelake", "Intel(R) Core(TM) i7-1065G7 CPU @ 1.30GHz") == 32
    assert rate("icelake", "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz") == 64
    assert rate("alderlake", "12th Gen Intel(R) Core(TM) i9-12900K") == 32
    assert rate("sapphirerapids", "Intel(R) Xeon(R) Platinum 8480+", "bf16") == 1024
    assert rate("zen3", "AMD EPYC 7763", "bf16") is None  # emulated: no hardware peak


def test_every_peak_row_is_sourced_and_reachable():
    from cpuperf.data import load_builtin

    rows = load_builtin("cpu_peaks.toml")["cpu"]
    names = {r["name"] for r in load_builtin("microarch.toml")["x86"]} | \
        {r["name"] for table in ("arm",) for r in load_builtin("microarch.toml").get(table, [])}
    for row in rows:
        assert row["source"] and row["variant"] and row["fp32"] > 0, row
        assert set(row["match"]) <= names | {"a64fx"}, set(row["match"]) - names
    # A fallback row (no model_name) never stands before a variant of the same generation.
    for i, row in enumerate(rows):
        if not row.get("model_name"):
            later = [r for r in rows[i + 1:] if set(r["match"]) & set(row["match"])]
            assert not later, (row["match"], [r["variant"] for r in later])


def test_the_clock_is_named_nominal_and_measured():
    cpuinfo = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz\ncpu MHz\t\t: 3000.0\n"
               "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz\ncpu MHz\t\t: 1000.0\n")
    assert nominal_clock_hz(cpuinfo, None) == (2.1e9, "the model name")
    assert nominal_clock_hz(cpuinfo, "3900000\n") == (3.9e9, "cpufreq cpuinfo_max_freq")
    assert measured_clock_hz(cpuinfo) == pytest.approx(2.0e9) and measured_clock_hz(cpuinfo, [0]) == pytest.approx(3e9)
    peak, info = hardware_peak("cascadelake", "fp32", 2, "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz", 2.1e9, 3.0e9)
    # The higher clock: a peak the run could beat is no peak.
    assert info["clock_used"] == "measured" and peak.tflops == pytest.approx(2 * 64 * 3.0e9 / 1e12)
    assert "nominal 2.10 GHz" in peak.source and "measured 3.00 GHz" in peak.source



def test_a_guest_reads_its_hosts_tsc_so_its_peak_is_the_boost_clocks_whatever_one_gemm_measured():
    """A VM's cpuinfo clock is its host's TSC rate (2.60 GHz on host D, a Zen 4 guest). Its fp32 GEMM sits within
    noise of the peak at that clock, so one run's GEMM beat it (boost clock) and the next did not (TSC clock): the
    same job read MFU 14.8% and 28.6%. A guest takes the generation's boost clock every time."""
    for achievable in (None, 0.160, 0.170):  # under, near and over 2 x 32 x 2.6 GHz = 0.1664 TFLOP/s
        peak, info = hardware_peak("zen4", "fp32", 2, "AMD EPYC", None, 2.6e9, achievable_tflops=achievable,
                                   guest=True)
        assert peak is not None and info["clock_used"] == "boost" and "TSC" in info["clock_note"], info
        assert peak.tflops == pytest.approx(2 * 32 * info["clock_boost_ghz"] * 1e9 / 1e12, rel=1e-3)
    # bare metal: the clock read is the cores' own; the boost only where a GEMM beats it
    assert hardware_peak("zen4", "fp32", 2, "AMD EPYC", None, 2.6e9, achievable_tflops=0.160)[1]["clock_used"] == "measured"
    assert hardware_peak("zen4", "fp32", 2, "AMD EPYC", None, 2.6e9, achievable_tflops=0.170)[1]["clock_used"] == "boost"

def test_mfu_divides_by_the_hardware_and_the_measured_ceiling_stands_beside_it():
    hw = Peak(0.2, "fp32", "hardware: ...")
    ceiling = Peak(0.1, "fp32", "measured: ...")
    mfu, frac, used, notes = cpu_mfu(0.05, hw, ceiling, 1)
    assert mfu == pytest.approx(0.25) and frac == pytest.approx(0.5) and used is ceiling and not notes
    # No hardware peak (emulated dtype, unknown CPU): no MFU at all, never the measured one in its place.
    mfu, frac, _, _ = cpu_mfu(0.05, None, ceiling, 1)
    assert mfu is None and frac == pytest.approx(0.5)
    # Above the hardware: the table row or the clock is wrong; said, not reported.
    mfu, _, _, notes = cpu_mfu(0.5, hw, ceiling, 1, remeasure=lambda: Peak(1.0, "fp32", "measured: again"))
    assert mfu is None and "impossible" in notes["mfu_note"]


def test_workload_shapes_are_the_model_linears():
    assert workload_shapes(256, 768, 2048) == [(2048, 256, 768), (2048, 256, 256), (2048, 256, 1024),
                                               (2048, 1024, 256), (2048, 256, 768)]


@pytest.mark.full  # three real runs
def test_same_job_three_times_divides_by_the_same_peak_and_stays_below_100(tmp_path, monkeypatch):
    monkeypatch.delenv("CPUPERF_OVERRIDE_HYPERVISOR", raising=False)  # a guest is one (its clock is its host's TSC)
    pytest.importorskip("torch")
    from worker_util import _settings, run_worker

    mfus, peaks = [], []
    for i in range(3):
        p = run_worker("--config", _settings(tmp_path / f"r{i}", str(tmp_path / "tok"), max_steps=60,
                                             eval_every=1000, ckpt_every=1000, log_every=50), "--json")
        assert p.returncode == 0, p.stderr[-2000:]
        summary = json.loads(p.stdout)
        ceiling = summary["achievable"]
        assert ceiling["source"].startswith("measured: sustained fp32 GEMM at the workload's shapes"), ceiling
        assert "median of 5" in ceiling["source"] and "spread" in ceiling["source"]
        assert 0 < summary["pct_of_achievable"] <= 100
        if summary["peak"] is None:  # a CPU the table does not know: no MFU, and the summary says why
            assert summary["mfu"] is None and "MFU not reported" in summary["mfu_note"]
            mfus.append(summary["pct_of_achievable"] / 100)
            continue
        assert summary["peak"]["source"].startswith("hardware:"), summary["peak"]
        assert summary["hardware_peak"]["clock_used"] in ("nominal", "measured", "boost")
        assert summary["mfu"] is not None and 0 < summary["mfu"] <= 1.0
        # The hardware is the higher bar: a clock the GEMM beats gave way to the generation's boost clock
        # (the ceiling may be re-measured higher once at the end: 2% for that).
        assert summary["mfu"] <= summary["pct_of_achievable"] / 100 * 1.02 + 1e-9, summary["hardware_peak"]
        mfus.append(summary["mfu"])
        peaks.append((summary["peak"]["tflops"], summary["hardware_peak"]["clock_used"]))
    # The denominator is the host's, not the run's: the same clock in every run (the old 0.3 s 512x512 peak gave 17.8%-200.6%,
    # and a guest's clock flipped between its TSC and the boost clock). The numerator is a timing: how far it moves
    # with other work on the host is the benchmarks' business (a run under CI's own load read 0.054 against 0.159).
    # (a host's reported clock may drift with its governor, within its turbo range: never the 2.2x of that flip)
    if peaks:
        assert len({clock for _, clock in peaks}) == 1, peaks
        assert max(t for t, _ in peaks) / min(t for t, _ in peaks) < 1.25, peaks
    assert statistics.median(mfus) < 1.0


def test_a_clock_the_measured_gemm_beats_gives_way_to_the_generations_boost_clock():
    """A VM reports its TSC (2.45 GHz on an EPYC 7763 guest) while the cores boost: the GEMM then beats
    cores x FLOPs/cycle x that clock, so the peak takes the generation's highest rated boost clock, named."""
    at_tsc = 2 * 32 * 2.45e9 / 1e12  # 0.1568 TFLOP/s
    peak, info = hardware_peak("zen3", "fp32", 2, "AMD EPYC", None, 2.45e9, achievable_tflops=0.1678)
    assert info["clock_used"] == "boost" and info["clock_boost_part"] == "EPYC 72F3"
    assert peak.tflops == pytest.approx(2 * 32 * 4.1e9 / 1e12, rel=1e-3) and peak.tflops > 0.1678 > at_tsc
    assert "beats" in info["clock_note"] and "boost 4.10 GHz (EPYC 72F3" in peak.source
    # A desktop part of the same generation takes its own segment's boost clock.
    _, info = hardware_peak("zen3", "fp32", 2, "AMD Ryzen 9 5950X 16-Core Processor", None, 3.4e9, achievable_tflops=0.3)
    assert info["clock_used"] == "boost" and info["clock_used_ghz"] == 4.9
    # Not beaten: the reported clocks stand, and no boost is named.
    peak, info = hardware_peak("zen3", "fp32", 2, "AMD EPYC", None, 2.45e9, achievable_tflops=0.12)
    assert info["clock_used"] == "measured" and "clock_note" not in info and peak.tflops == pytest.approx(at_tsc, rel=1e-3)
    # Beaten and no boost row (or beaten even at the boost clock): no peak at all, and why.
    peak, info = hardware_peak("haswell", "fp32", 2, "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", 2.5e9, None,
                               achievable_tflops=0.2)
    assert peak is None and "no boost clock for haswell" in info["why_none"]
    peak, info = hardware_peak("zen3", "fp32", 2, "AMD EPYC", None, 2.45e9, achievable_tflops=0.3)
    assert peak is None and "beats" in info["why_none"]


def test_every_boost_row_is_sourced_and_names_a_known_generation():
    from cpuperf.data import load_builtin

    data = load_builtin("microarch.toml")
    names = {r["name"] for kind in ("x86", "arm") for r in data[kind]}
    rows = load_builtin("cpu_peaks.toml")["boost"]
    assert rows
    for row in rows:
        assert row["source"] and row["part"] and 1.0 < row["ghz"] < 7.0, row
        assert set(row["match"]) <= names, set(row["match"]) - names


def test_the_train_line_names_the_peak_and_its_clock():
    from cpuperf.train.worker import _peak_clock

    summary = {"peak": {"tflops": 0.2624}, "hardware_peak": {"clock_used": "boost", "clock_used_ghz": 4.1}}
    assert _peak_clock(summary) == " (262 GFLOP/s at 4.10 GHz, boost clock)"
    assert _peak_clock({"peak": {"tflops": 312.0}}) == ""  # a GPU's table peak: no CPU clock to name
