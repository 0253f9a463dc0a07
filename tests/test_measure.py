"""Measurements: the cache per host identity, recorded files, and a real (small) GEMM in a child."""

from __future__ import annotations

import json

import pytest
from hosts import make_host

from cpuperf.probe import probe_host
from cpuperf.run import measure


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


def test_real_gemm_in_a_child_process():
    pytest.importorskip("torch")
    rates = measure.gemm_rates(size=128, seconds=0.2, threads=1)
    assert rates["gemm_fp32_gflops"] > 0 and rates["gemm_bf16_gflops"] > 0 and rates["threads"] == 1


def test_measure_if_unsure_skips_hosts_with_nothing_to_decide(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    snapshot = probe_host(sysroot=str(make_host(tmp_path / "snap")))
    assert measure.measure_if_unsure(snapshot, threads=1) is None  # never measures for a snapshot


def test_allocator_speedups_measure_real_preloads(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    facts = probe_host()
    if not measure.allocator_libraries(facts):
        pytest.skip("no tcmalloc/jemalloc installed on this host")
    ratios = measure.allocator_speedups(facts, threads=1, rounds=1, seconds=0.3)
    libs = set(measure.allocator_libraries(facts))
    assert {k for k in ratios if not k.endswith("_by_workload")} == libs
    assert all(ratios[name] > 0 and set(ratios[f"{name}_by_workload"]) == {"lm", "mlp"} for name in libs)
