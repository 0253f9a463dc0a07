"""benchmarks/gpu.py: its pure parts on recorded cards and recorded runs (no GPU needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hosts import FIXTURES, make_host

from benchmarks import gpu as bench
from cpuperf.decide.recommend import RecommendRequest, recommend
from cpuperf.decide.workload import resolve_workload
from cpuperf.probe import probe_host

ROOT = Path(__file__).resolve().parent.parent


def recorded_facts(tmp_path, monkeypatch, card: str, torch: str = "2.5.1+cu121"):
    monkeypatch.setenv("CPUPERF_OVERRIDE_GPUS", (FIXTURES / "gpus" / card).read_text())
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": torch}))
    return probe_host(sysroot=str(make_host(tmp_path, cores_per_socket=16)))


def test_card_slug() -> None:
    assert bench.card_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert bench.card_slug("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb"
    assert bench.card_slug("Tesla T4") == "t4"
    assert bench.card_slug("   ") == "gpu"


def _values(tmp_path, monkeypatch, card: str) -> dict:
    facts = recorded_facts(tmp_path, monkeypatch, card)
    w = resolve_workload(bench.WORKLOAD, steps=30, batch_size=64)
    return {d.id: d.value for d in recommend(facts, w, RecommendRequest(nproc_per_node=1)).decisions}


def test_configs_for_an_h100_sweep_the_decided_knobs(tmp_path, monkeypatch) -> None:
    configs = bench.build_configs(_values(tmp_path, monkeypatch, "h100-80gb-hbm3.json"), 8, 64)
    by = {c["name"]: c for c in configs}
    default, auto = by["default"]["settings"], by["auto"]["settings"]
    assert (default["dtype"], default["tf32"], default["compile"]) == ("fp32", False, False)
    assert default["batch_size"] * default["grad_accum_steps"] == 64
    assert (auto["dtype"], auto["tf32"], auto["confirm_batch"]) == ("bf16", True, True)
    assert auto["batch_size"] * auto["grad_accum_steps"] >= 64
    sweep = [c["name"] for c in configs if c.get("sweep")]
    assert sweep[:3] == ["dtype=bf16", "tf32", "compile"] and "adamw_fused" in sweep
    for c in configs:  # a sweep entry differs from the default in one knob (batch with its accumulation)
        if c.get("sweep"):
            diff = {k for k in c["settings"] if c["settings"][k] != default.get(k)}
            assert diff <= {"batch_size", "grad_accum_steps"} or len(diff) == 1, (c["name"], diff)


def test_configs_for_a_t4_use_fp16(tmp_path, monkeypatch) -> None:
    configs = bench.build_configs(_values(tmp_path, monkeypatch, "t4.json"), 8, 64)
    auto = next(c for c in configs if c["name"] == "auto")["settings"]
    assert auto["dtype"] == "fp16" and auto["tf32"] is False
    assert "dtype=fp16" in [c["name"] for c in configs]


CONFIGS = [{"name": "default", "settings": {}}, {"name": "auto", "settings": {}},
           {"name": "dtype=bf16", "settings": {}, "sweep": True}, {"name": "tf32", "settings": {}, "sweep": True}]
ROUNDS = [
    {"default": {"tokens_per_s": 10000.0, "mfu": 0.05}, "auto": {"tokens_per_s": 40000.0, "mfu": 0.31},
     "dtype=bf16": {"tokens_per_s": 30000.0, "mfu": 0.23}, "tf32": {"tokens_per_s": 20000.0, "mfu": 0.15}},
    {"default": {"tokens_per_s": 12000.0, "mfu": 0.06}, "auto": {"tokens_per_s": 42000.0, "mfu": 0.33},
     "dtype=bf16": {"tokens_per_s": 33000.0, "mfu": 0.25}, "tf32": {"error": "exit 1: CUDA error"}},
    {"default": {"tokens_per_s": 11000.0, "mfu": 0.055}, "auto": {"tokens_per_s": 44000.0, "mfu": 0.34},
     "dtype=bf16": {"tokens_per_s": 31000.0, "mfu": 0.24}, "tf32": {"tokens_per_s": 21000.0, "mfu": 0.16}},
]


def test_summarise_round_by_round() -> None:
    s = bench.summarise(CONFIGS, ROUNDS)
    assert s["medians_tokens_per_s"]["auto"] == 42000.0 and s["best_sweep"] == "dtype=bf16"
    r = s["ratios"]["auto_vs_default"]
    assert r["median"] == 4.0 and r["min"] == 42000 / 12000 and r["max"] == 4.0
    assert s["ratios"]["auto_vs_best_sweep"]["median"] == 40000 / 30000 * 1  # round 1: 1.333
    assert s["mfu"]["auto"] == 0.33 and s["errors"] == {"tf32": ["exit 1: CUDA error"]}
    assert s["ratios"]["tf32_vs_default"]["median"] == (2.0 + 21000 / 11000) / 2


def test_summarise_with_every_run_failed() -> None:
    s = bench.summarise(CONFIGS, [{n["name"]: {"error": "x"} for n in CONFIGS}])
    assert s["ratios"]["auto_vs_default"]["median"] is None and s["medians_tokens_per_s"]["auto"] is None


def test_main_with_recorded_runs_writes_the_card_file(tmp_path, monkeypatch) -> None:
    facts = recorded_facts(tmp_path / "host", monkeypatch, "h100-80gb-hbm3.json")
    seen = []

    def runner(settings, out_dir):
        seen.append(settings)
        fast = settings["dtype"] != "fp32"
        return {"tokens_per_s": 40000.0 if fast else 10000.0, "mfu": 0.3 if fast else 0.05,
                "attention_kernel": {"kernel": "flash" if fast else "mem_efficient"}, "batch_trial": None}

    code = bench.main(rounds=2, steps=5, out=tmp_path / "res", log=lambda m: None, facts=facts, runner=runner)
    assert code == 0
    rec = json.loads((tmp_path / "res" / "gpu-h100-80gb-hbm3.json").read_text())
    assert rec["schema"] == bench.SCHEMA and rec["card"]["compute_capability"] == "9.0"
    assert rec["ratios"]["auto_vs_default"] == 4.0 and rec["mfu"]["auto"] == 0.3
    assert all(s["max_steps"] == 5 for s in seen) and len(seen) == 2 * len(rec["configs"])
    # alternating rounds: every configuration once per round, in the same order
    names = [c["name"] for c in rec["configs"]]
    assert [s["dtype"] for s in seen[:len(names)]] == [s["dtype"] for s in seen[len(names):]]
    assert rec["configs"][1]["attention_kernel"] == {"kernel": "flash"}


def test_no_gpu_says_so_in_one_line_and_exits_0() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CPUPERF_OVERRIDE_GPUS": "[]"}
    p = subprocess.run([sys.executable, "-m", "benchmarks", "--gpu"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 1 and "no NVIDIA GPU" in p.stdout and p.stderr == ""


def test_cpu_only_torch_is_named(tmp_path, monkeypatch) -> None:
    facts = recorded_facts(tmp_path, monkeypatch, "t4.json", torch="2.5.1+cpu")
    assert "CPU-only build" in bench.no_gpu_reason(facts)
    assert bench.main(facts=facts, out=tmp_path / "r", runner=lambda s, o: {}) == 0
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ the joint sweep (--joint)

def test_the_joint_sweep_is_the_product_of_the_decided_levers(tmp_path, monkeypatch) -> None:
    values = _values(tmp_path, monkeypatch, "h100-80gb-hbm3.json")
    configs, pruned = bench.joint_configs(values, 8, 64)
    default, auto = configs[0]["settings"], configs[1]["settings"]
    points = [c for c in configs if c.get("joint")]
    names = [c["name"] for c in points]
    assert len(set(names)) == len(names) and "default" not in names
    # dtype, tf32, compile, batch, optimizer: 2^5 combinations; TF32 under bf16 autocast is the point without it
    assert len(points) == 2 ** 5 - 2 ** 3 - 1 and pruned == [bench.TF32_UNDER_AUTOCAST]
    assert not any(c["settings"]["dtype"] == "bf16" and c["settings"]["tf32"] for c in points)
    for c in points:  # every point is the default with some decided levers at auto's values, the same global batch
        s = c["settings"]
        assert s["batch_size"] * s["grad_accum_steps"] == default["batch_size"] * default["grad_accum_steps"] or \
            (s["batch_size"], s["grad_accum_steps"]) == (auto["batch_size"], auto["grad_accum_steps"])
        for key in ("dtype", "compile", "optimizer"):
            assert s[key] in (default[key], auto[key], True)
    bf16_all = f"bf16+compile+batch={auto['batch_size']}+adamw_fused"
    assert bf16_all in names and "tf32" in names and "compile" in names


def test_head_to_head_decides_by_every_pair_against_the_target() -> None:
    same = bench.head_to_head([100.0, 99.0, 102.0], [100.0, 100.0, 100.0])
    assert same["verdict"] == "auto at the best" and same["min"] == 0.99 and same["median"] == 1.0
    worse = bench.head_to_head([90.0, 92.0, 91.0], [100.0, 100.0, 100.0])
    assert worse["verdict"] == "the best beats auto" and worse["max"] == 0.92
    noisy = bench.head_to_head([95.0, 100.0, 99.0], [100.0, 100.0, 100.0])
    assert noisy["verdict"] == "undecided" and "range 0.950x-1.000x" in noisy["why"]
    few = bench.head_to_head([100.0, None, 100.0], [100.0, 100.0, None])  # a failed run leaves its pair out
    assert few["verdict"] == "undecided" and few["ratios"] == [1.0]


def test_main_joint_runs_three_rounds_then_auto_against_the_best_in_alternating_pairs(tmp_path, monkeypatch) -> None:
    facts = recorded_facts(tmp_path / "host", monkeypatch, "h100-80gb-hbm3.json")
    seen = []

    def runner(settings, out_dir):
        seen.append(dict(settings))
        rate = 10000.0 * (4 if settings["dtype"] != "fp32" else 1) * (1.2 if settings["compile"] else 1)
        return {"tokens_per_s": rate, "mfu": rate / 130000}

    code = bench.main(rounds=2, steps=5, out=tmp_path / "res", log=lambda m: None, facts=facts, runner=runner,
                      joint=True, pairs=3)
    assert code == 0
    rec = json.loads((tmp_path / "res" / "gpu-h100-80gb-hbm3-joint.json").read_text())
    assert rec["rounds"] == 3  # 2 asked: the joint sweep runs at least 3
    joint = rec["joint"]
    assert joint["best"].startswith("bf16+compile") and joint["best_settings"]["compile"] is True
    assert joint["head_to_head"]["verdict"] == "the best beats auto"  # auto left compile off for 5 steps
    assert joint["head_to_head"]["ratios"] == [1 / 1.2] * 3
    n = len(rec["configs"])
    tail = seen[3 * n:]
    assert len(tail) == 6 and [s["compile"] for s in tail] == [False, True, True, False, False, True]
