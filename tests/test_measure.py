"""Measurements: the cache per host identity, recorded files, and a real (small) GEMM in a child."""

from __future__ import annotations

import json

import pytest
from hosts import make_host

from cpuperf.data import load_builtin
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
    # measured again: a new bf16 figure where the ratio decided, else the ratio named undecided (a loaded machine
    # may not decide it within the budget: the rule decides then), never the cached 200.0
    assert data["from_cache"] is False and data.get("gemm_bf16_gflops") != 200.0
    assert ("gemm_bf16_gflops" in data) != ("bf16_over_fp32" in data.get("undecided", {})), data
    assert data["repeats"]["gemm_fp32_gflops"]["n"] >= 3 and "under_load" in data["load"]
    assert data["torch_build"]["version"] and data["trusted"] == (not data["flags"])


def test_compile_figures_are_per_model_kept_across_benches_and_validated(tmp_path, monkeypatch):
    """A bench of one model's compile keeps the others'; the engine decides each model from its own."""
    from cpuperf.decide.recommend import RecommendRequest, model_key, recommend
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
    # 40 s / (0.5 s x (1 - 1/1.25)) = 400 steps to pay back. Records without a dtype are fp32's: an fp32 plan reads them.
    fp32 = RecommendRequest(measurements=meas, overrides={"dtype": "fp32"})
    long_tiny = recommend(facts, resolve_workload("tiny", steps=1000), fp32).levers.compile
    assert long_tiny.value is True and long_tiny.evidence["crossover_steps"] == 400 and "1000" in long_tiny.reason
    assert recommend(facts, resolve_workload("micro", steps=1000), fp32).levers.compile.value is False
    # A non-positive figure is no figure: that model's entry is dropped alone, the rest stands.
    path = measure.save(facts, _steady(compile_by_model={model_key(tiny): {**entry, "speedup": -1}}))
    data, _ = measure.read_cached(facts)
    assert set(data["compile_by_model"]) == {model_key(micro)} and path.exists()


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


# -- ratios side by side: what decides, on a busy host -----------------------------------------------

def test_a_ratio_decides_when_its_interval_clears_the_threshold_and_not_before():
    """Rounds side by side are pairs, judged by the one judgement (cpuperf.decide.judge): the rounds' own agreement
    with each other or one side of the threshold is no longer enough by itself."""
    from cpuperf.decide.ratios import Ratio, alternating

    judging = (load_builtin("tuning.toml")["judge"]["confidence"], load_builtin("tuning.toml")["judge"]["resolution"])
    r = Ratio("bf16/fp32 GEMM", 1.0)
    for x in (2.5, 1.1, 1.9):  # every round says bf16 is faster, but 1.1 to 2.5: three rounds cannot say how much
        r = r.add(x)
    assert not r.decided(3, *judging) and "holds 1.00" in r.verdict(3, *judging).why
    for x in (2.2, 1.8, 2.0):  # three more: the interval clears 1.0, the measuring stops
        r = r.add(x)
    assert r.decided(6, *judging) and r.verdict(6, *judging).above and not r.decided(7, *judging)
    noisy = Ratio("mimalloc/default allocator on lm", 1.02, (0.95, 1.23, 1.06))
    assert not noisy.decided(3, *judging)  # on both sides of 1.02, 27% apart: too noisy to decide
    tight = Ratio("x", 1.02, (1.01, 1.03, 1.02, 1.02))
    v = tight.verdict(3, *judging)
    assert v.outcome == "even" and not v.above  # at the threshold within 2%: decided, and no change of plan
    assert noisy.describe() == "1.06x (0.95-1.23 over 3 rounds)"
    assert noisy.to_json(3, *judging)["decided"] is False and noisy.to_json(3, *judging)["verdict"]["n"] == 3
    assert [alternating(("a", "b"), n) for n in range(3)] == [("a", "b"), ("b", "a"), ("a", "b")]


def test_a_ratio_too_noisy_to_decide_leaves_the_decision_to_the_rule_and_says_so(tmp_path, monkeypatch):
    """A measurement that left bf16/fp32 undecided: no bf16 figure for the plan, the rule's dtype, the reason says
    why; taken side by side, it is not distrusted for the load around it (no warning on later commands)."""
    from cli_util import run_json

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)
    line = "bf16/fp32 GEMM 1.02x (0.70-1.40 over 9 rounds): too noisy to decide (...), so the rule decides the dtype"
    measure.save(facts, {"method": measure.METHOD, "gemm_fp32_gflops": 50.0, "undecided": {"bf16_over_fp32": line},
                         "load": {"under_load": True, "busy_cpus": {"0": 1.0, "1": 1.0}, "figure": "load average 11"}})
    assert measure.assess(measure.read_cached(facts)[0], facts) == (True, [])
    data, proc = run_json(["recommend"], {"CPUPERF_CACHE_DIR": str(tmp_path), "CPUPERF_LOAD_WINDOW": "0",
                                          "CPUPERF_OVERRIDE_ISA": NATIVE_ISA})
    assert _dtype(data)["value"] == "bf16" and "too noisy to decide" in _dtype(data)["reason"]
    assert "warning" not in proc.stderr and "NOT TRUSTED" not in proc.stderr


def test_a_distrusted_past_measurement_is_warned_about_once_with_a_fix_that_runs_here(tmp_path, monkeypatch):
    from cli_util import run_cli

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    measure.save(probe_host(use_cache=False),
                 _steady(load={"under_load": True, "busy_cpus": {"1": 1.0}, "figure": "load average 160"}))
    env = {"CPUPERF_CACHE_DIR": str(tmp_path), "CPUPERF_LOAD_WINDOW": "0", "CPUPERF_OVERRIDE_ISA": NATIVE_ISA}
    quiet = run_cli(["recommend", "--quiet"], env)
    assert quiet.returncode == 0 and quiet.stderr == ""  # --quiet: no messages at all
    said = [run_cli(args, env) for args in (["recommend"], ["recommend"], ["train", "--auto", "--dry-run"],
                                              ["ccl-env"])]
    assert all(p.returncode == 0 for p in said), [p.stderr for p in said]
    warned = [p for p in said if "NOT TRUSTED" in p.stderr]
    assert len(warned) == 1 and warned[0] is said[0]
    assert "`cpuperf bench --refresh` measures again" in said[0].stderr and "quiet host" not in said[0].stderr


def test_progress_is_said_at_least_every_few_seconds_and_never_under_quiet_or_json():
    import time

    from cpuperf.output import Output, Progress, ProgressLine

    lines = []
    with Progress(lambda s: lines.append((time.monotonic(), s)), "measuring", every=0.3, gap=10) as p:
        p.update("round 1", left_s=5, now=True)
        time.sleep(1.2)
    stamps = [t for t, _ in lines]
    assert len(lines) >= 3 and max(b - a for a, b in zip(stamps, stamps[1:])) < 0.8
    assert lines[0][1] == "measuring: round 1 (0 s so far, about 5 s left)"
    assert all(isinstance(s, ProgressLine) for _, s in lines)
    for out in (Output(quiet=True), Output(json_mode=True)):
        import io
        import sys

        err, sys.stderr = sys.stderr, io.StringIO()
        try:
            out.teller("x: ")(ProgressLine("progress"))
            out.teller("x: ")("a note")
            got = sys.stderr.getvalue()
        finally:
            sys.stderr = err
        assert "progress" not in got and (got == "" if out.quiet else got == "x: a note\n")


@pytest.mark.full  # a real measurement
def test_a_real_side_by_side_measurement_under_load_says_how_far_it_is(tmp_path, monkeypatch):
    """Two busy loops keep both CPUs busy: the ratios are still measured (at the CPUs left free: one thread), said
    at least every 10 s, and the whole takes about its budget, not minutes."""
    import subprocess
    import sys
    import time

    pytest.importorskip("torch")
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    facts = probe_host(use_cache=False)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    said = []
    try:
        time.sleep(0.5)
        start = time.monotonic()
        got = measure.run_micro(facts, 2, allocators=False, size=128, seconds=0.2,
                                log=lambda s: said.append((time.monotonic(), str(s))))
        took = time.monotonic() - start
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    stamps = [start] + [t for t, _ in said]
    assert max(b - a for a, b in zip(stamps, stamps[1:])) <= 10.0, said
    assert got["method"] == measure.METHOD and got["ratios"]["bf16_over_fp32"]["rounds"]
    assert got["load"]["under_load"] and got["threads"] == 1  # the CPUs other work left free: at least one
    assert took < 300, took
    decided = got["ratios"]["bf16_over_fp32"]["decided"]
    assert ("gemm_bf16_gflops" in got) == decided and ("bf16_over_fp32" in got["undecided"]) == (not decided)


@pytest.mark.full  # torch, real training steps
def test_the_measuring_server_runs_the_lm_under_bf16_autocast_when_asked():
    """The allocator's bf16 figure (lm-bf16) is the LM stepped under CPU autocast, a model of its own beside the
    fp32 one in the same server, each built and warmed once."""
    pytest.importorskip("torch")
    from cpuperf.train.bench import BenchConfig, ServeCache, _workload_rate

    cache = ServeCache()
    for dtype in ("fp32", "bf16", "bf16"):
        config = BenchConfig.from_json({"workload": "lm", "size": "small", "dtype": dtype, "seconds": 0.05})
        assert _workload_rate(config, cache) > 0
    assert sorted(k[-1] for k in cache.steps) == ["bf16", "fp32"]
    assert measure._workload_request("lm-bf16") == {"workload": "lm", "dtype": "bf16"}
    assert measure._workload_request("mlp") == {"workload": "mlp", "dtype": "fp32"}


# -- a measurement disturbed by other work is taken again, bounded (issue 52) ---------------------------

_BUSY = {"under_load": True, "busy_cpus": {"0": 1.0}, "figure": "CPU 0 100% busy, load average 9"}
_QUIET = {"under_load": False, "busy_cpus": {}, "figure": "load average 0.1"}
# the recorded first `train --auto` on the AMX guest: another job used the CPUs for a while
_DISTURBED_LINE = ("mimalloc/default allocator on mlp 1.02x (0.70-9.16 over 28 rounds): too noisy to decide (...), "
                   "so it does not count")


def _taken(load, undecided):
    return {"method": measure.METHOD, "gemm_fp32_gflops": 50.0, "gemm_bf16_gflops": 400.0, "load": load,
            "undecided": undecided, "ratios": {}}


def _micro_runs(monkeypatch, results):
    """run_micro (the child processes that time the GEMMs and allocators) answering from `results`, in order."""
    calls = []

    def fake(facts, threads, python, log=None, **micro):
        calls.append(micro)
        return dict(results[min(len(calls), len(results)) - 1])
    monkeypatch.setattr(measure, "run_micro", fake)
    return calls


def test_a_disturbed_first_measurement_is_taken_again_and_the_quiet_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)
    calls = _micro_runs(monkeypatch, [_taken(_BUSY, {"allocator mimalloc on mlp": _DISTURBED_LINE}), _taken(_QUIET, {})])
    said = []
    got = measure.measure_if_unsure(facts, 1, log=said.append)
    assert len(calls) == 2 and got is not None and got.undecided == {}
    assert any("left undecided while other work used its CPUs" in s and "try 2 of" in s for s in said)
    cached = measure.read_cached(facts)[0]
    assert cached["tries"] == 2 and cached["load"]["under_load"] is False
    # decided now: the next run measures nothing
    assert measure.measure_if_unsure(facts, 1) is not None and len(calls) == 2


def test_a_host_busy_every_time_is_measured_a_bounded_number_of_times_then_the_rule_decides(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)
    most = load_builtin("tuning.toml")["measure"]["disturbed_tries"]
    calls = _micro_runs(monkeypatch, [_taken(_BUSY, {"allocator mimalloc on mlp": _DISTURBED_LINE})])
    got = measure.measure_if_unsure(facts, 1)
    assert len(calls) == most and got is not None and "allocator mimalloc on mlp" in got.undecided
    assert measure.measure_if_unsure(facts, 1) is not None and len(calls) == most  # tried enough: it stands
    # one cached from an earlier run, disturbed and undecided, is taken again by the next run, counting on
    measure.save(facts, {**_taken(_BUSY, {"allocator mimalloc on mlp": _DISTURBED_LINE}), "tries": 1})
    measure.measure_if_unsure(facts, 1)
    assert len(calls) == 2 * most - 1
    # disturbed but decided, or undecided on a quiet host: nothing to take again
    assert measure.disturbed(_taken(_BUSY, {})) is None and measure.disturbed(_taken(_QUIET, {"x": "y"})) is None


def test_bench_shows_each_ratio_with_its_interval_and_its_verdict(tmp_path, monkeypatch):
    from cli_util import run_cli

    from cpuperf.decide.ratios import Ratio

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    judging = (load_builtin("tuning.toml")["judge"]["confidence"], load_builtin("tuning.toml")["judge"]["resolution"])
    ratios = {"bf16_over_fp32": Ratio("bf16/fp32 GEMM", 1.0, (1.9, 2.1, 2.0)).to_json(3, *judging),
              "mimalloc_on_mlp": Ratio("mimalloc/default allocator on mlp", 1.02, (0.95, 1.23, 1.06)).to_json(3, *judging)}
    measure.save(probe_host(use_cache=False), {**_taken(_QUIET, {}), "ratios": ratios, "threads": 1})
    proc = run_cli(["bench"], {"CPUPERF_CACHE_DIR": str(tmp_path), "CPUPERF_OVERRIDE_ISA": NATIVE_ISA})
    assert proc.returncode == 0, proc.stderr
    assert "bf16/fp32 GEMM: 2.00x (1.90-2.10 over 3 rounds; interval 1.8" in proc.stdout and ": above)" in proc.stdout
    assert ("mimalloc/default allocator on mlp: 1.06x (0.95-1.23 over 3 rounds; interval 0.86-1.34 against 1.02: "
            "undecided): too noisy to decide, the rule decides") in proc.stdout


# -- Ctrl-C during the first measurement: what was measured is kept, and the next run measures the rest ---------

_GEMM_ONLY = {"method": measure.METHOD, "gemm_fp32_gflops": 50.0, "gemm_bf16_gflops": 120.0, "threads": 2,
              "torch": "2.13.0+cpu", "repeats": {}, "undecided": {}, "load": _QUIET,
              "ratios": {"bf16_over_fp32": {"name": "bf16/fp32 GEMM", "rounds": [2.4, 2.4, 2.4], "decided": True}}}


def test_a_measurement_stopped_after_its_gemm_ratio_is_cached_and_the_next_run_measures_only_the_rest(
        tmp_path, monkeypatch):
    from cpuperf.errors import CpuperfError, ExitCode

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)

    def stopped(facts, threads, python, log=None, **micro):
        raise measure.Stopped("the allocators", {**_GEMM_ONLY, "interrupted": {"missing": ["allocators"]}})
    monkeypatch.setattr(measure, "run_micro", stopped)
    with pytest.raises(CpuperfError) as err:
        measure.measure_if_unsure(facts, 1)
    assert err.value.code == ExitCode.INTERRUPTED and err.value.hint is None
    assert "the bf16/fp32 GEMM ratio was measured and is cached" in err.value.message
    assert "the allocators against the default were not measured" in err.value.message
    cached = measure.read_cached(facts)[0]
    assert cached["interrupted"] == {"missing": ["allocators"]} and cached["gemm_bf16_gflops"] == 120.0
    # planning reads the part that was measured (the dtype's figures); the allocator is left to the rule
    got = measure.load_cached(facts)
    assert got is not None and got.gemm_bf16_gflops == 120.0 and not got.allocator_speedup
    assert measure.unfinished(cached) == "stopped by Ctrl-C before the allocators against the default were measured"
    # the next run measures the rest only: run_micro is handed what is done, and the complete one replaces it
    calls = _micro_runs(monkeypatch, [{**_GEMM_ONLY, "allocator_speedup": {}}])
    said = []
    measure.measure_if_unsure(facts, 1, log=said.append)
    assert calls and calls[0]["done"]["interrupted"] == {"missing": ["allocators"]}
    assert any("stopped by Ctrl-C before the allocators" in s and "GEMM" not in s for s in said), said
    assert "interrupted" not in measure.read_cached(facts)[0]
    assert measure.unfinished(measure.read_cached(facts)[0]) is None


def test_a_measurement_stopped_before_anything_was_measured_caches_nothing_and_says_so(tmp_path, monkeypatch):
    from cpuperf.errors import CpuperfError, ExitCode

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)

    def stopped(facts, threads, python, log=None, **micro):
        raise measure.Stopped("starting torch")
    monkeypatch.setattr(measure, "run_micro", stopped)
    with pytest.raises(CpuperfError) as err:
        measure.measure_if_unsure(facts, 1)
    assert err.value.code == ExitCode.INTERRUPTED
    assert err.value.message.startswith("interrupted while measuring this host (starting torch): nothing measured")
    assert "CPUPERF_MEASURE=0" in err.value.message
    assert measure.read_cached(facts)[0] is None


def test_the_gemm_part_a_stopped_measurement_keeps_is_what_the_completing_one_starts_from():
    partial = measure._measured_so_far({**_GEMM_ONLY, "ratios": {**_GEMM_ONLY["ratios"], "mimalloc_on_lm": {}},
                                        "undecided": {"allocator mimalloc on lm": "x"}}, "the allocators", True)
    assert partial is not None and partial["interrupted"] == {"missing": ["allocators"]}
    assert list(partial["ratios"]) == ["bf16_over_fp32"] and partial["undecided"] == {}
    assert measure._measured_so_far({"method": measure.METHOD, "ratios": {}, "undecided": {}}, "warming up", True) is None
    assert "interrupted" not in measure._measured_so_far(dict(_GEMM_ONLY), "stopping the measuring processes", True)
    # with nothing left to measure (no allocator installed now), the completing run starts no process at all
    done = measure.measure_ratios(probe_host(), 1, allocators=False, done=partial)
    assert done["gemm_bf16_gflops"] == 120.0 and list(done["ratios"]) == ["bf16_over_fp32"]
    import time

    from cpuperf.decide.measurement_schema import sanitized

    build = {"version": None, "local": None, "git": None}
    assert sanitized({**partial, "measured_at": int(time.time()), "torch_build": build})[1] == []  # the schema holds it


@pytest.mark.full  # real processes: torch in the measuring servers, a real SIGINT, then a real completing run
def test_ctrl_c_during_the_first_measurement_keeps_what_was_measured_and_the_next_run_completes_it(tmp_path):
    """As at a terminal: `train --auto` on a host with nothing cached measures first; Ctrl-C (SIGINT to the whole
    process group) once the allocator rounds have begun ends it with one line, exit 130, the GEMM ratio cached and
    marked as stopped; the next `train --auto` measures only the allocators, then trains."""
    import glob
    import os
    import signal
    import subprocess
    import sys

    from cli_util import cli_env

    pytest.importorskip("torch")
    if not measure.allocator_libraries(probe_host(use_cache=False)):
        pytest.skip("no preloadable allocator here: the measurement has no second part to stop in")
    env = cli_env({"CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "CPUPERF_MEASURE": "1", "PYTHONWARNINGS": "ignore"})
    argv = [sys.executable, "-m", "cpuperf", "train", "--auto", "--max-steps", "2"]
    proc = subprocess.Popen(argv, env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    seen = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "allocator round" in line:  # the GEMM ratio is taken: the allocators are under way
                break
        os.killpg(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (seen[-3:], rest)
    last = [ln for ln in rest.splitlines() if ln.strip()]
    assert len(last) == 1, rest  # one line: what was measured, what was not, what measures the rest
    files = glob.glob(str(tmp_path / "cache" / "measurements" / "*.json"))
    if "nothing measured yet" in last[0]:  # stopped while the GEMM ratio was still undecided: nothing to keep
        assert not files
        pytest.skip("the GEMM ratio was not decided before the signal on this (busy) host")
    assert "the bf16/fp32 GEMM ratio was measured and is cached" in last[0], last[0]
    assert "allocators against the default were not measured" in last[0] and "measures them" in last[0]
    assert len(files) == 1
    partial = json.loads(open(files[0]).read())
    assert partial["interrupted"] == {"missing": ["allocators"]} and partial["gemm_bf16_gflops"] > 0
    assert "allocator_speedup" not in partial

    done = subprocess.run(argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped by Ctrl-C before the allocators against the default were measured" in done.stderr
    assert "GEMM round" not in done.stderr  # the GEMM ratio was not measured again
    full = json.loads(open(files[0]).read())
    assert "interrupted" not in full and "allocator_speedup" in full
    assert full["ratios"]["bf16_over_fp32"] == partial["ratios"]["bf16_over_fp32"]


def test_ctrl_c_while_a_disturbed_measurement_is_taken_again_keeps_the_try_before(tmp_path, monkeypatch):
    from cpuperf.errors import CpuperfError, ExitCode

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)
    first = _taken(_BUSY, {"allocator mimalloc on mlp": _DISTURBED_LINE})
    calls = []

    def runs(facts, threads, python, log=None, **micro):
        calls.append(micro)
        if len(calls) > 1:
            raise measure.Stopped("the bf16/fp32 GEMM ratio")
        return dict(first)
    monkeypatch.setattr(measure, "run_micro", runs)
    with pytest.raises(CpuperfError) as err:
        measure.measure_if_unsure(facts, 1)
    assert err.value.code == ExitCode.INTERRUPTED and "the try before stands, cached" in err.value.message
    cached = measure.read_cached(facts)[0]
    assert cached["tries"] == 1 and "interrupted" not in cached and cached["gemm_bf16_gflops"] == 400.0


# -- the allocators are measured with the optimizer a plan runs -----------------------------------------------

def test_the_allocator_rounds_step_the_optimizer_a_plan_runs():
    """A plan steps fused AdamW where torch has it on CPU; the measuring servers stepped torch's default AdamW (on
    CPU the per-parameter loop), an allocation pattern no plan runs. The request names the plan's optimizer, and
    the server steps it."""
    assert measure.plan_optimizer("2.13.0+cpu") == "adamw_fused"
    assert measure.plan_optimizer("2.3.1") == "adamw" and measure.plan_optimizer(None) == "adamw"
    assert measure._workload_request("lm-bf16", "adamw_fused") == {"workload": "lm", "dtype": "bf16",
                                                                   "optimizer": "adamw_fused"}


@pytest.mark.full  # torch, real training steps
def test_the_measuring_server_steps_the_optimizer_it_is_asked_for():
    pytest.importorskip("torch")
    from cpuperf.train.bench import BenchConfig, ServeCache, _workload_rate

    cache = ServeCache()
    for opt in ("adamw_fused", "adamw", ""):
        config = BenchConfig.from_json({"workload": "mlp", "size": "small", "optimizer": opt, "seconds": 0.01})
        assert _workload_rate(config, cache) > 0
    steps = {k[3]: fn for k, fn in cache.steps.items()}
    assert sorted(steps) == ["", "adamw", "adamw_fused"]
    defaults = {k: fn.__closure__ for k, fn in steps.items()}  # each step holds its own optimizer
    opts = {k: next(c.cell_contents for c in cells if type(c.cell_contents).__name__ == "AdamW")
            for k, cells in defaults.items()}
    assert opts["adamw_fused"].defaults["fused"] and opts["adamw"].defaults["foreach"]
    assert not opts[""].defaults["fused"] and not opts[""].defaults["foreach"]


def test_allocator_figures_measured_with_the_old_optimizer_are_stale_and_measured_again(tmp_path, monkeypatch):
    """A cache of side-by-side/1 measured the allocators with torch's default AdamW: its GEMM ratio stands, its
    allocator figures are not used (the rule decides), and the next measurement takes the allocators only."""
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", NATIVE_ISA)
    facts = probe_host(use_cache=False)
    speedup = {"mimalloc": 0.9956, "mimalloc_by_workload": {"lm-bf16": 0.9956}}
    lines = {"allocator mimalloc on lm": "mimalloc/default allocator on lm 1.01x: too noisy to decide"}
    ratios = {**_GEMM_ONLY["ratios"], "mimalloc_on_lm-bf16": {"name": "mimalloc/default allocator on lm-bf16",
                                                               "rounds": [1.0, 0.99, 1.0], "decided": True}}
    measure.save(facts, {**_GEMM_ONLY, "method": "side-by-side/1", "allocator_speedup": speedup, "ratios": ratios,
                         "undecided": lines})
    cached = measure.read_cached(facts)[0]
    assert "allocator_speedup" not in cached and list(cached["ratios"]) == ["bf16_over_fp32"]
    assert not cached["undecided"] and cached["gemm_bf16_gflops"] == 120.0
    assert measure.unfinished(cached) == ("its allocator figures were measured with torch's default AdamW, not the "
                                          "optimizer a plan runs")
    got = measure.load_cached(facts)
    assert got is not None and got.gemm_bf16_gflops == 120.0 and not got.allocator_speedup
    calls = _micro_runs(monkeypatch, [{**_GEMM_ONLY, "allocator_speedup": speedup,
                                       "allocator_optimizer": "adamw_fused"}])
    monkeypatch.setattr(measure, "allocator_libraries", lambda facts: {"mimalloc": "/x/libmimalloc.so"})
    said = []
    measure.measure_if_unsure(facts, 1, log=said.append)
    assert calls and calls[0]["done"]["interrupted"] == {"missing": ["allocators"]} and calls[0]["allocators"]
    assert any("not the optimizer a plan runs" in s and "GEMM" not in s for s in said), said
    fresh = measure.read_cached(facts)[0]
    assert fresh["method"] == measure.METHOD == "side-by-side/2" and fresh["allocator_speedup"] == speedup
    assert fresh["allocator_optimizer"] == "adamw_fused" and measure.unfinished(fresh) is None
