"""torch.compile decided from each mode's measured figures: the mode whose steady gain, judged against its noise,
pays back its cold compile within the run's steps; else off with the figures. Carried to the built-in worker (its
compile_mode) and to a Trainer script (--torch_compile, --torch_compile_mode), parsed by the installed transformers."""

from __future__ import annotations

import json
import sys

import pytest
from cli_util import run_cli
from levers_util import levers

from cpuperf.decide.measurement_schema import sanitized
from cpuperf.decide.recommend import Measurements, RecommendRequest, compile_key, recommend
from cpuperf.decide.records import Decision, compile_mode_of
from cpuperf.decide.workload import resolve_workload
from cpuperf.knowledge.hf_flags import TRAINER_COMPILE_MODES
from cpuperf.knowledge.tuning import tuning
from cpuperf.plan.user_script import FlagContext, speed_flags
from cpuperf.probe import probe_host
from cpuperf.run import measure
from cpuperf.run.measure import _compile_entry
from cpuperf.worker_settings import COMPILE_MODES, ConfigError, TrainSettings

TUNING = tuning()
ALL = {"use_cpu", "bf16", "optim", "optim_fused", "torch_compile", "torch_compile_mode"}


REGIONAL = [1.25 * 1.01, 1.25, 1.25 / 1.01]  # a geometric mean of 1.25, ~1% apart


def _entry(mode, speedup_rounds, compile_s, step_s=0.5, batch=16, dtype="bf16"):
    ratios = sorted(speedup_rounds)
    return {"compile_seconds": compile_s, "speedup": ratios[len(ratios) // 2], "rounds": list(speedup_rounds),
            "step_seconds": step_s, "batch": batch, "mode": mode, "dtype": dtype, "model": "tiny", "threads": 2}


def _measured(w, **modes):
    return Measurements(compile_by_model={compile_key(w, m.replace("_", "-")): e for m, e in modes.items()},
                        source="recorded")


@pytest.fixture(scope="module")
def facts():
    return probe_host(use_cache=False)


def _compile(facts, steps, meas, dtype="bf16", **request):
    """The compile decision for tiny's plan at `dtype` (set: the figures count only at their own dtype, on any host)."""
    w = resolve_workload("tiny", steps=steps)
    overrides = {"dtype": dtype, **request.pop("overrides", {})}
    return recommend(facts, w, RecommendRequest(measurements=meas, nproc_per_node=1, overrides=overrides,
                                                **request)).levers.compile


def _tiny(steps=1000):
    return resolve_workload("tiny", steps=steps)


# -- the decision ------------------------------------------------------------------------------------

def test_a_mode_that_pays_back_within_the_run_is_on_with_its_mode_and_figures(facts):
    # regional: 40 s cold, 1.25x over 0.5 s steps (noise ~1%): 40 / (0.5 x 0.2) = 400 steps to pay back.
    # default: 1.03x, its rounds 0.92-1.12: not above its noise, never counted as a gain.
    meas = _measured(_tiny(), default=_entry("default", [0.92, 1.12, 1.05], 30.0),
                     regional=_entry("regional", REGIONAL, 40.0))
    d = _compile(facts, 1000, meas)
    assert d.value is True and compile_mode_of(d) == "regional"
    assert d.evidence["crossover_steps"] == 400 and d.evidence["modes"]["default"]["crossover_steps"] is None
    assert d.evidence["modes"]["regional"]["verdict"]["outcome"] == "above"
    assert "regional" in d.reason and "pays back after 400 steps" in d.reason and "this run has 1000" in d.reason
    assert "bf16" in d.reason  # the dtype it was measured at


def test_a_mode_that_does_not_pay_back_within_the_run_is_off_with_the_figure(facts):
    meas = _measured(_tiny(), regional=_entry("regional", REGIONAL, 40.0))
    d = _compile(facts, 300, meas)
    assert d.value is False and "pays back after 400 steps" in d.reason and "only 300" in d.reason
    assert compile_mode_of(d) == "regional"  # the mode a compile you set would run in
    unknown = _compile(facts, None, meas)
    assert unknown.value is False and "run length is unknown" in unknown.reason


def test_a_gain_inside_its_noise_never_pays_back(facts):
    # lm-small on host D: 1.03x (0.92-1.15): undecided, so no crossover, whatever the run's length
    meas = _measured(_tiny(), default=_entry("default", [0.93, 1.15, 1.03, 1.0, 1.06], 2.0))
    d = _compile(facts, 10_000_000, meas)
    assert d.value is False and d.evidence["crossover_steps"] is None and compile_mode_of(d) == "default"
    assert "not above its noise" in d.reason and "never pays back" in d.reason


def test_the_mode_that_saves_the_run_most_wins(facts):
    # default 1.2x after 40 s: 240 steps; max-autotune 1.4x after 300 s: 2100 steps. 1000 steps: only default pays;
    # a million: max-autotune saves more (its larger compile spread over the run).
    meas = _measured(_tiny(), default=_entry("default", [1.19, 1.2, 1.21], 40.0),
                     max_autotune=_entry("max-autotune", [1.39, 1.4, 1.41], 300.0))
    assert compile_mode_of(_compile(facts, 1000, meas)) == "default"
    long = _compile(facts, 1_000_000, meas)
    assert long.value is True and compile_mode_of(long) == "max-autotune"
    # a Trainer script's path takes only the modes it can apply
    regional = _measured(_tiny(), regional=_entry("regional", REGIONAL, 40.0))
    d = _compile(facts, 1_000_000, regional, compile_modes=TRAINER_COMPILE_MODES)
    assert d.value is False and d.evidence["measured"] == "assumed"


def test_you_set_compile_runs_in_the_best_measured_mode(facts):
    meas = _measured(_tiny(), regional=_entry("regional", REGIONAL, 40.0))
    d = _compile(facts, 30, meas, overrides={"compile": True})
    assert d.value is True and d.overridden and compile_mode_of(d) == "regional"


def test_a_cache_entry_per_mode_is_read_back_and_a_bad_mode_dropped_alone():
    good = _entry("regional", [1.2, 1.3], 40.0)
    data = {"compile_by_model": {"k regional": good, "k fastest": {**good, "mode": "fastest"}}}
    out, notes = sanitized(data, identity=False)
    assert list(out["compile_by_model"]) == ["k regional"] and any("fastest" in n for n in notes)


def test_a_mode_entry_pairs_each_round_with_eagers_and_keeps_the_cold_compile():
    eager = [{"round": r, "samples_per_s": 100.0 + r, "first_step_s": 0.5} for r in range(3)]
    regional = [{"round": 0, "samples_per_s": 125.0, "first_step_s": 40.5},
                {"round": 1, "samples_per_s": 126.25, "first_step_s": 2.5},
                {"round": 2, "samples_per_s": 127.5, "first_step_s": 2.5}]
    e = _compile_entry({"eager": eager, "regional": regional}, "regional", 16, "tiny", 2, "bf16")
    assert e is not None
    assert e["compile_seconds"] == 40.0 and e["compile_seconds_warm"] == 2.0  # cold: the first round's
    assert e["rounds"] == [1.25, 1.25, 1.25] and e["speedup"] == 1.25 and e["mode"] == "regional"
    assert e["step_seconds"] == round(16 / 101.0, 4) and e["dtype"] == "bf16"
    assert _compile_entry({"eager": eager}, "default", 16, "tiny", 2, "bf16") is None  # failed: no entry


# -- the dtype the figures were measured at ---------------------------------------------------------

def test_bf16_figures_do_not_decide_an_fp32_plan_nor_fp32_figures_a_bf16_one(facts):
    # regional at bf16: 40 s cold, 1.25x: pays back after 400 steps, for a bf16 plan only
    bf16 = _measured(_tiny(), regional=_entry("regional", REGIONAL, 40.0, dtype="bf16"))
    assert _compile(facts, 1000, bf16, dtype="bf16").value is True
    d = _compile(facts, 1000, bf16, dtype="fp32")
    assert d.value is False and d.evidence["measured"] == "assumed" and d.evidence["measured_dtypes"] == ["bf16"]
    assert "not measured for fp32, only for bf16" in d.reason and "--set dtype=fp32` measures it" in d.reason
    assert "modes" not in d.evidence and compile_mode_of(d) == "default"
    # compile you set on the fp32 plan runs the default mode, not the mode bf16's figures name
    assert compile_mode_of(_compile(facts, 30, bf16, dtype="fp32", overrides={"compile": True})) == "default"
    fp32 = _measured(_tiny(), regional=_entry("regional", REGIONAL, 40.0, dtype="fp32"))
    d = _compile(facts, 1000, fp32, dtype="bf16")
    assert d.value is False and d.evidence["measured"] == "assumed" and "not measured for bf16, only for fp32" in d.reason


def test_each_dtype_reads_its_own_figures_cached_side_by_side(facts):
    w = _tiny()
    meas = Measurements(compile_by_model={
        compile_key(w, "regional", "bf16"): _entry("regional", REGIONAL, 40.0, dtype="bf16"),
        compile_key(w, "regional", "fp32"): _entry("regional", [0.98, 1.0, 1.02], 40.0, dtype="fp32")},
        source="recorded")
    on = _compile(facts, 1000, meas, dtype="bf16")
    assert on.value is True and "measured here for this model, bf16" in on.reason
    off = _compile(facts, 1000, meas, dtype="fp32")
    assert off.value is False and "measured here for this model, fp32" in off.reason and "never pays back" in off.reason


def test_a_record_without_a_dtype_counts_as_fp32_the_dtype_it_was_measured_at(facts):
    # cached before the records named their dtype: the bench worker then ran its default, fp32
    legacy = {k: v for k, v in _entry("default", [1.19, 1.2, 1.21], 40.0).items() if k != "dtype"}
    meas = Measurements(compile_by_model={compile_key(_tiny()): legacy}, source="recorded")
    d = _compile(facts, 1000, meas, dtype="fp32")
    assert d.value is True and "measured here for this model, fp32" in d.reason
    d = _compile(facts, 1000, meas, dtype="bf16")
    assert d.value is False and d.evidence["measured"] == "assumed" and "only for fp32" in d.reason
    # and a cache file holding one still loads
    out, notes = sanitized({"compile_by_model": {compile_key(_tiny()): legacy}}, identity=False)
    assert out["compile_by_model"] == {compile_key(_tiny()): legacy} and not notes


def test_your_dtype_is_the_dtype_torch_compile_is_measured_at(tmp_path, monkeypatch):
    """plan_dtype picks the dtype `bench --compile` measures at: the plan's, with your --set."""
    from hosts import make_host

    from cpuperf.errors import UsageError
    from cpuperf.knowledge.knobs import parse_assignments

    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    plain = probe_host(sysroot=str(make_host(tmp_path / "avx2")))  # no native bf16: the rule runs fp32
    native = probe_host(sysroot=str(make_host(tmp_path / "zen4", vendor="AuthenticAMD", family=25, model=17, flags=(
        "avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"))))
    w = _tiny()
    assert measure.plan_dtype(plain, w, None) == "fp32" and measure.plan_dtype(native, w, None) == "bf16"
    assert measure.plan_dtype(plain, w, None, parse_assignments(["dtype=bf16"])) == "bf16"
    assert measure.plan_dtype(native, w, None, parse_assignments(["dtype=fp32"])) == "fp32"
    with pytest.raises(UsageError, match="lr"):  # refused (exit 2), never measured at another dtype
        measure.plan_dtype(native, w, None, parse_assignments(["lr=0.1"]))


def test_bench_refuses_a_set_it_cannot_measure_for_before_measuring(tmp_path):
    env = {"CPUPERF_CACHE_DIR": str(tmp_path)}
    alone = run_cli(["bench", "--set", "dtype=fp32"], env)
    assert alone.returncode == 2 and "only with --compile" in alone.stderr
    bad = run_cli(["bench", "--compile", "--model", "tiny", "--set", "lr=0.1"], env)
    assert bad.returncode == 2 and "--set lr" in bad.stderr and not list(tmp_path.glob("*.json"))  # nothing measured


# -- the built-in worker ---------------------------------------------------------------------------

def test_the_worker_takes_every_mode_and_refuses_another():
    for mode in COMPILE_MODES:
        assert TrainSettings.from_dict({"compile": True, "compile_mode": mode}).compile_mode == mode
    with pytest.raises(ConfigError, match="compile_mode"):
        TrainSettings.from_dict({"compile": True, "compile_mode": "fastest"})


def test_regional_compile_compiles_each_block_of_the_built_in_model_in_place():
    torch = pytest.importorskip("torch")
    from cpuperf.knowledge.models import PRESETS
    from cpuperf.train.bench import available_compile_modes, compiled_model
    from cpuperf.train.model import build_model
    from cpuperf.train.observed import compiled

    model = build_model(PRESETS["micro"])
    assert compiled_model(torch, model, "regional") is model  # the blocks compiled, the model itself not wrapped
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in model.blocks)
    assert compiled(model) and not compiled(build_model(PRESETS["micro"]))  # what the rank reports it ran
    assert type(compiled_model(torch, build_model(PRESETS["micro"]), "default")).__name__ == "OptimizedModule"
    assert available_compile_modes(torch) == list(COMPILE_MODES)  # torch 2.13 has every one


def test_the_built_in_plan_runs_the_mode_measured_to_pay_back(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path))
    facts = probe_host(use_cache=False)
    w = resolve_workload(None, host=facts)
    _steady_cache(facts, {compile_key(w, "regional"): _entry("regional", REGIONAL, 40.0, batch=w.batch_size)})
    env = {"CPUPERF_CACHE_DIR": str(tmp_path)}
    bf16 = ["--set", "dtype=bf16"]  # the figures' dtype, on any host
    plan = json.loads(run_cli(["train", "--dry-run", "--auto", "--max-steps", "100000", "--json", *bf16], env).stdout)
    decided = {d["id"]: d for d in plan["decisions"]}
    assert decided["compile"]["value"] is True and "regional" in decided["compile"]["reason"]
    assert plan["settings"]["compile"] is True and plan["settings"]["compile_mode"] == "regional"
    short = json.loads(run_cli(["train", "--dry-run", "--auto", "--max-steps", "50", "--json", *bf16], env).stdout)
    assert {d["id"]: d["value"] for d in short["decisions"]}["compile"] is False


# -- a Trainer script ------------------------------------------------------------------------------

CPU = {"device": "cpu", "dtype": "fp32", "compile": False}


def _with_mode(lv, mode, overridden=False):
    from dataclasses import replace

    return replace(lv, compile=Decision("compile", True, "measured", {"mode": mode}, overridden=overridden,
                                        needs_torch=True))


def test_a_trainer_gets_the_compile_flags_of_the_mode_decided():
    ctx = FlagContext("5.24.0", "2.13.0", 1, TUNING, ALL)
    flags, _ = speed_flags(_with_mode(levers(dict(CPU, compile=True)), "max-autotune"), ctx)
    args = [a for f in flags for a in f.args]
    assert "--torch_compile" in args and args[args.index("--torch_compile_mode") + 1] == "max-autotune"
    flags, _ = speed_flags(_with_mode(levers(dict(CPU, compile=True)), "default"), ctx)
    assert [f.args for f in flags if "compile" in f.name] == [("--torch_compile",)]  # the default mode: no mode flag
    _, skipped = speed_flags(levers(CPU), ctx)
    assert ("--torch_compile", "test") in skipped  # off: said with the decision's reason


SCRIPT = """
import json, os, sys
from transformers import HfArgumentParser, TrainingArguments
(args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()
json.dump({"torch_compile": args.torch_compile, "torch_compile_mode": args.torch_compile_mode,
           "torch_compile_backend": args.torch_compile_backend}, sys.stdout)
"""


@pytest.mark.full
def test_the_installed_transformers_parses_the_compile_flags(tmp_path):
    """transformers 5.x: --torch_compile (a bool that takes no value) and --torch_compile_mode; the backend is
    inductor by default. Real parse, real TrainingArguments."""
    pytest.importorskip("transformers")
    import subprocess

    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    ctx = FlagContext("5.24.0", "2.13.0", 1, TUNING, ALL)
    flags, _ = speed_flags(_with_mode(levers(dict(CPU, compile=True)), "max-autotune"), ctx)
    args = [a for f in flags if "compile" in f.name for a in f.args]
    proc = subprocess.run([sys.executable, str(script), "--output_dir", str(tmp_path / "o"), "--use_cpu", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"torch_compile": True, "torch_compile_mode": "max-autotune", "torch_compile_backend": "inductor"}


def test_a_trainer_script_keeps_its_own_compile_flags(tmp_path):
    """The user's --torch_compile_mode (any of the three options) rules the compile family out: nothing added."""
    from command_util import merge_flags

    ctx = FlagContext("5.24.0", "2.13.0", 1, TUNING, ALL)
    flags, _ = speed_flags(_with_mode(levers(dict(CPU, compile=True)), "max-autotune"), ctx)
    add, left = merge_flags(["--output_dir", "o", "--torch_compile_mode", "reduce-overhead"], flags)
    assert not [f for f in add if "compile" in f.name]
    assert any(flag.startswith("--torch_compile") and why.startswith("you decided") for flag, why in left)


def _steady_cache(facts, compile_by_model):
    rep = {"n": 3, "median": 200.0, "min": 195.0, "max": 204.0, "spread": 0.045}
    measure.save(facts, {"gemm_fp32_gflops": 100.0, "gemm_bf16_gflops": 200.0, "threads": 2,
                         "repeats": {"gemm_fp32_gflops": {**rep, "median": 100.0, "min": 98.0, "max": 101.0},
                                     "gemm_bf16_gflops": rep},
                         "load": {"under_load": False, "busy_cpus": {}, "figure": "load average 0.1"},
                         "compile_by_model": compile_by_model})


def test_a_trainer_script_is_compiled_in_the_mode_measured_to_pay_back_within_its_max_steps(tmp_path, monkeypatch):
    """The script's model measured (cpuperf bench --compile): --torch_compile and --torch_compile_mode through the
    Trainer's own options where a whole-model mode pays back within --max_steps; the regional modes, which the
    Trainer has no option for, are not weighed; off, the not-added list says why with the figures."""
    from host_classes import TRAINER_SCRIPT

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "train.py").write_text(TRAINER_SCRIPT)
    env = {"CPUPERF_CACHE_DIR": str(tmp_path / "cache")}

    def plan(steps):
        argv = ["train", "--dry-run", "--auto", "--json", "--set", "dtype=bf16", "--", "python", "train.py",
                "--output_dir", "o", "--max_steps", str(steps)]  # the figures' dtype, on any host
        out = json.loads(run_cli(argv, env, cwd=str(tmp_path)).stdout)
        return {d["id"]: d for d in out["decisions"]}["compile"], out["hf_flags"], out["workload"]

    compile_d, _, wl = plan(100000)
    assert compile_d["value"] is False  # nothing measured: no gain assumed on a CPU
    model = f"L{wl['n_layer']}-d{wl['d_model']}-h{wl['n_head']}-T{wl['seq_len']}-V{wl['vocab']}"  # model_key
    _steady_cache(probe_host(use_cache=False), {
        f"{model} max-autotune": _entry("max-autotune", [1.2 * 1.01, 1.2, 1.2 / 1.01], 60.0),
        f"{model} regional": _entry("regional", [1.5 * 1.01, 1.5, 1.5 / 1.01], 10.0)})
    compile_d, flags, _ = plan(100000)
    assert compile_d["value"] is True and "max-autotune" in compile_d["reason"]
    added = flags["added"]
    assert "--torch_compile" in added and added[added.index("--torch_compile_mode") + 1] == "max-autotune"
    compile_d, flags, _ = plan(10)
    assert compile_d["value"] is False and "only 10" in compile_d["reason"]
    assert "--torch_compile" not in flags["added"]
    assert any(n["flag"] == "--torch_compile" and "only 10" in n["why"] for n in flags["not_added"])


def test_a_model_measured_in_any_mode_is_not_measured_again_by_a_long_run():
    from cpuperf.decide.recommend import compile_worth_measuring

    w = resolve_workload("gpt2-small", steps=100_000)
    assert compile_worth_measuring(w, Measurements(gemm_fp32_gflops=100.0), 2, TUNING, "bf16")
    done = Measurements(gemm_fp32_gflops=100.0, compile_by_model={compile_key(w, "regional"): _entry("regional", REGIONAL, 40.0)})
    assert not compile_worth_measuring(w, done, 2, TUNING, "bf16")  # the default mode failed there: the others stand
    assert compile_worth_measuring(w, done, 2, TUNING, "fp32")  # bf16's figures are not fp32's
