"""Measurements: the cache per host identity, recorded files, and a real (small) GEMM in a child."""

from __future__ import annotations

import json

import pytest
from hosts import make_host

from cpuperf.probe import probe_host
from cpuperf.run import measure

# An avx512_bf16 host (Zen 4 / Cooper Lake class), through the override: the class, not the CPU running the suite.
NATIVE_ISA = "sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16"


def test_cache_round_trip_is_per_host(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path / "cache"))
    facts = probe_host()
    assert measure.load_cached(facts) is None
    measure.save(facts, {"gemm_fp32_gflops": 100.0, "gemm_bf16_gflops": 10.0, "allocator_speedup": {"tcmalloc": 1.1}})
    got = measure.load_cached(facts)
    assert got is not None and got.gemm_bf16_gflops == 10.0 and got.allocator_speedup == {"tcmalloc": 1.1}
    snapshot = probe_host(sysroot=str(make_host(tmp_path / "other")))
    assert measure.load_cached(snapshot) is None  # never another host's numbers


def test_recorded_file_and_bad_file(tmp_path):
    good = tmp_path / "m.json"
    good.write_text(json.dumps({"gemm_fp32_gflops": 1.0, "unknown_key": 3}))
    assert measure.load_file(str(good)).gemm_fp32_gflops == 1.0
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    from cpuperf.errors import UsageError

    with pytest.raises(UsageError):
        measure.load_file(str(bad))


@pytest.mark.full  # a real measurement
def test_real_gemm_in_a_child_process():
    pytest.importorskip("torch")
    rates = measure.gemm_rates(size=128, seconds=0.2, threads=1)
    assert rates["gemm_fp32_gflops"] > 0 and rates["gemm_bf16_gflops"] > 0 and rates["threads"] == 1


def test_measure_if_unsure_skips_hosts_with_nothing_to_decide(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    snapshot = probe_host(sysroot=str(make_host(tmp_path / "snap")))
    assert measure.measure_if_unsure(snapshot, threads=1) is None  # never measures for a snapshot


@pytest.mark.full  # real measurements
def test_allocator_speedups_measure_real_preloads(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    facts = probe_host()
    if not measure.allocator_libraries(facts):
        pytest.skip("no tcmalloc/jemalloc installed on this host")
    ratios = measure.allocator_speedups(facts, threads=1, rounds=1, seconds=0.3)
    libs = set(measure.allocator_libraries(facts))
    assert {k for k in ratios if not k.endswith("_by_workload")} == libs
    assert all(ratios[name] > 0 and set(ratios[f"{name}_by_workload"]) == {"lm", "mlp"} for name in libs)


# -- measurements with a life span ------------------------------------------------------------------

def _steady(**extra):
    rep = {"n": 3, "median": 200.0, "min": 195.0, "max": 204.0, "spread": 0.045}
    return {"gemm_fp32_gflops": 100.0, "gemm_bf16_gflops": 200.0, "threads": 2,
            "repeats": {"gemm_fp32_gflops": {**rep, "median": 100.0, "min": 98.0, "max": 101.0, "spread": 0.03},
                        "gemm_bf16_gflops": rep},
            "load": {"under_load": False, "busy_cpus": {}, "figure": "load average 0.1"}, **extra}


def _dtype(data):
    return next(d for d in data["decisions"] if d["id"] == "dtype")


def test_a_steady_measurement_is_used_and_printed_with_its_figure(tmp_path, monkeypatch):
    from cli_util import run_json

    # dtype uses the measurement where bf16 is native: that class, whatever CPU runs the suite
    env = {"CPUPERF_CACHE_DIR": str(tmp_path), "CPUPERF_LOAD_WINDOW": "0", "CPUPERF_OVERRIDE_ISA": NATIVE_ISA}
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    measure.save(probe_host(use_cache=False), _steady())
    data, proc = run_json(["recommend"], env)
    assert _dtype(data)["evidence"]["gemm_bf16_gflops"] == 200.0
    assert "NOT TRUSTED" not in _dtype(data)["evidence"]["measured"]
    assert "using measurement" in proc.stderr and "bf16 GEMM 200.0 GFLOP/s" in proc.stderr


def test_a_measurement_under_load_is_never_used_silently(tmp_path, monkeypatch):
    from cli_util import run_json

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)
    loaded = _steady(load={"under_load": True, "busy_cpus": {"1": 1.0}, "figure": "CPU 1 100% busy, load average 160"})
    measure.save(facts, loaded)
    usable, flags = measure.assess(measure.read_cached(facts)[0], facts)
    assert usable and any("under load" in f and "load average 160" in f for f in flags)
    got = measure.load_cached(facts)
    assert got is not None and "NOT TRUSTED" in got.source and "load average 160" in got.source
    data, proc = run_json(["recommend"], {"CPUPERF_CACHE_DIR": str(tmp_path), "CPUPERF_LOAD_WINDOW": "0",
                                          "CPUPERF_OVERRIDE_ISA": NATIVE_ISA})
    assert "NOT TRUSTED" in proc.stderr and "load average 160" in proc.stderr
    assert "NOT TRUSTED" in _dtype(data)["evidence"]["measured"]
    # A wide spread is flagged the same way.
    wide = _steady()
    wide["repeats"]["gemm_fp32_gflops"].update(min=40.0, max=100.0, spread=0.6)
    measure.save(facts, wide)
    assert any("spread 60%" in f for f in measure.assess(measure.read_cached(facts)[0], facts)[1])


def test_a_changed_torch_build_or_an_old_entry_invalidates_it(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    facts = probe_host(use_cache=False)
    path = measure.save(facts, _steady())
    assert measure.load_cached(facts) is not None
    # Another build: another key, so the entry is not found; and a recorded file naming another build
    # at this host's key is refused with the reason.
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cu128"}))
    other = probe_host(use_cache=False)
    assert measure.host_id(other) != measure.host_id(facts) and measure.load_cached(other) is None
    record = json.loads(path.read_text())
    record["torch_build"] = {"version": "2.12.0+cpu", "local": "cpu", "git": "abc"}
    path.write_text(json.dumps(record))
    said = []
    assert measure.load_cached(facts, said.append) is None and "another torch build" in said[0]
    record = {**json.loads(path.read_text()), "torch_build": measure.torch_build(facts),
              "measured_at": int(time.time()) - 40 * 86400}
    path.write_text(json.dumps(record))
    assert measure.load_cached(facts, said.append) is None and "40 days old" in said[-1]


@pytest.mark.full  # real measurements
def test_bench_reuses_a_trusted_entry_and_refresh_measures_again(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from cli_util import run_json

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    measure.save(probe_host(use_cache=False), _steady())
    env = {"CPUPERF_CACHE_DIR": str(tmp_path)}
    args = ["bench", "--no-allocators", "--seconds", "0.2", "--size", "128", "--threads", "1"]
    data, _ = run_json(args, env)
    assert data["from_cache"] is True and data["gemm_bf16_gflops"] == 200.0
    data, _ = run_json([*args, "--refresh"], env)
    assert data["from_cache"] is False and data["gemm_bf16_gflops"] != 200.0
    assert data["repeats"]["gemm_fp32_gflops"]["n"] >= 3 and "under_load" in data["load"]
    assert data["torch_build"]["version"] and data["trusted"] == (not data["flags"])


def test_compile_figures_are_per_model_kept_across_benches_and_validated(tmp_path, monkeypatch):
    """A bench of one model's compile keeps the others'; the engine decides each model from its own."""
    from cpuperf.decide.recommend import model_key, recommend
    from cpuperf.decide.workload import PRESETS, resolve_workload

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    facts = probe_host(use_cache=False)
    tiny, micro = PRESETS["tiny"], PRESETS["micro"]
    entry = {"compile_seconds": 40.0, "speedup": 1.25, "step_seconds": 0.5, "batch": 16}
    measure.save(facts, _steady(compile_by_model={model_key(tiny): entry}))
    measure.save(facts, _steady(compile_by_model={model_key(micro): {**entry, "speedup": 0.9}}))
    data, _ = measure.read_cached(facts)
    assert set(data["compile_by_model"]) == {model_key(tiny), model_key(micro)}
    meas = measure.load_cached(facts)
    # 40 s / (0.5 s x (1 - 1/1.25)) = 400 steps to pay back.
    long_tiny = recommend(facts, resolve_workload("tiny", steps=1000), measurements=meas).decision("compile")
    assert long_tiny.value is True and long_tiny.evidence["crossover_steps"] == 400 and "1000" in long_tiny.reason
    assert recommend(facts, resolve_workload("micro", steps=1000), measurements=meas).get("compile") is False
    # A non-positive figure is a corrupt cache: removed, not used.
    path = measure.save(facts, _steady(compile_by_model={model_key(tiny): {**entry, "speedup": -1}}))
    assert measure.read_cached(facts)[0] is None and not path.exists()


def test_a_bench_without_allocators_keeps_the_measured_allocator_figures(tmp_path, monkeypatch):
    """`cpuperf bench --compile --no-allocators` re-measures the GEMMs: the allocator decision keeps its evidence."""
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    facts = probe_host(use_cache=False)
    speedup = {"mimalloc": 1.1, "mimalloc_by_workload": {"lm": 0.9, "mlp": 1.3}}
    measure.save(facts, _steady(allocator_speedup=speedup))
    measure.save(facts, _steady())  # what run_micro(allocators=False) writes
    assert measure.read_cached(facts)[0]["allocator_speedup"] == speedup
    measure.save(facts, _steady(allocator_speedup={"mimalloc": 0.95}))  # measured anew: replaced
    assert measure.read_cached(facts)[0]["allocator_speedup"] == {"mimalloc": 0.95}
