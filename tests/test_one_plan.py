"""One vocabulary, one plan: every knob a user can set is honoured end to end or refused (exit 2), and
recommend, ccl-env and train --dry-run render the same plan (backend, ranks, threads, runtime env)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
from cli_util import run_cli, run_json
from hosts import make_host

from cpuperf.commands.train import TrainOptions, build_plan, train_request
from cpuperf.errors import CpuperfError, ExitCode, UsageError
from cpuperf.knowledge.knobs import KNOBS, MODEL_KEYS
from cpuperf.plan.request import PlanRequest
from cpuperf.probe import probe_host

STACK = json.dumps({"torch": "2.13.0+cpu"})


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> str:
    """Two sockets of 8 cores with SMT: room for the ranks and threads the table asks for."""
    return str(make_host(tmp_path_factory.mktemp("h") / "host", sockets=2, cores_per_socket=8, threads_per_core=2,
                         flags=("avx2", "fma", "avx512f")))


def _plan(host: str, sets: List[str], auto: bool) -> Dict[str, Any]:
    facts = probe_host(sysroot=host, environ={"CPUPERF_OVERRIDE_PACKAGES": STACK}, use_cache=False)
    request = train_request(PlanRequest(auto=auto, dry_run=True, model="micro", out_dir="/tmp/cpuperf-one-plan"),
                            TrainOptions(sets=tuple(sets)))
    jp = build_plan(request, facts=facts, environ={})
    launch = jp.launch
    return {"settings": jp.settings.to_dict() if jp.settings is not None else {}, "decisions": {d.id: d.to_json() for d in jp.decisions},
            "world": launch.world_size, "nproc": launch.nproc_per_node, "env": dict(launch.env),
            "per_rank": [(r.cpus, r.threads) for r in launch.per_rank], "memory": jp.memory}


def _setting(key: str, value: Any) -> Callable[[Dict[str, Any]], bool]:
    return lambda p: p["settings"].get(key) == value


def _decided(key: str, value: Any) -> Callable[[Dict[str, Any]], bool]:
    return lambda p: p["decisions"][key]["value"] == value and p["decisions"][key]["overridden"]


def _threads(n: int) -> Callable[[Dict[str, Any]], bool]:
    return lambda p: (p["env"].get("OMP_NUM_THREADS") == str(n) and p["settings"]["threads_per_rank"] == n
                      and all(t == n and len(c) in (0, n) for c, t in p["per_rank"]))


REFUSED = None  # the value cannot be honoured on this host or by the built-in loop: exit 2
# (knob, value, how the plan shows it in force, or REFUSED). Every knob of the vocabulary appears.
CASES = [
    ("device", "cpu", _setting("device", "cpu")),
    ("device", "cuda", REFUSED),
    ("dtype", "bf16", _setting("dtype", "bf16")),
    ("dtype", "fp16", REFUSED),  # fp16 autocast needs CUDA in the built-in loop
    ("tf32", "true", REFUSED),
    ("tf32", "false", _setting("tf32", False)),
    ("fp32_math_mode", "bf16", _setting("fp32_math_mode", "bf16")),
    ("nproc_per_node", "2", lambda p: p["world"] == 2 and p["nproc"] == 2 and len(p["per_rank"]) == 2),
    ("nproc_per_node", "17", REFUSED),  # more ranks than the 16 physical cores, without oversubscribe
    ("nnodes", "2", REFUSED),  # two nodes need a hostfile or a rendezvous address
    ("threads_per_rank", "3", _threads(3)),
    ("threads_per_rank", "33", REFUSED),  # more than the 32 logical CPUs
    ("affinity", "none", lambda p: all(c == () for c, _ in p["per_rank"])),
    ("ddp_backend", "gloo", lambda p: _decided("ddp_backend", "gloo")(p) and (p["world"] == 1 or p["settings"]["ddp_backend"] == "gloo")),
    ("ddp_backend", "nccl", REFUSED),
    ("ipex", "true", REFUSED),  # not installed
    ("ipex", "false", _setting("ipex", False)),
    ("compile", "true", _setting("compile", True)),
    ("compile_mode", "regional", _setting("compile_mode", "regional")),
    ("compile_mode", "fastest", REFUSED),  # not one of torch.compile's modes cpuperf knows
    ("allocator", "tcmalloc", REFUSED),  # not installed on the recorded host
    ("allocator", "none", _decided("allocator", None)),
    ("attention", "sdpa", _decided("attention", "sdpa")),
    ("attention", "math", REFUSED),
    ("batch_size", "4", _setting("batch_size", 4)),
    ("grad_accum_steps", "3", _setting("grad_accum_steps", 3)),
    ("grad_checkpointing", "true", _setting("grad_checkpointing", True)),
    ("optimizer", "adamw_fused", _setting("optimizer", "adamw_fused")),
    ("optimizer", "adafactor", REFUSED),  # the built-in loop has AdamW only
    ("dataloader_workers", "1", _setting("dataloader_workers", 1)),
    ("pin_memory", "true", REFUSED),
    ("pin_memory", "false", _decided("pin_memory", False)),
    ("zero", "none", _decided("zero", None)),
    ("sharding", "fsdp", REFUSED),  # the built-in loop has no sharding
    ("sharding", "zero3", REFUSED),  # DeepSpeed is not installed
    ("sharding", "none", _decided("sharding", None)),
    ("offload", "true", REFUSED),
    ("offload", "false", _decided("offload", False)),
    ("oversubscribe", "true", lambda p: p["world"] >= 1),
    ("numa_memory", "none", lambda p: p["memory"] is None),
    # one process over the two sockets' nodes interleaves; a rank per socket has nothing to interleave
    ("numa_memory", "interleave", lambda p: (p["memory"] is not None) == (p["world"] == 1)),
    ("preset", "tiny", _setting("preset", "tiny")),
    ("lr", "0.005", _setting("lr", 0.005)),
    ("min_lr_ratio", "0.2", _setting("min_lr_ratio", 0.2)),
    ("weight_decay", "0.05", _setting("weight_decay", 0.05)),
    ("grad_clip", "0.5", _setting("grad_clip", 0.5)),
    ("warmup", "7", _setting("warmup", 7)),
    ("max_steps", "9", _setting("max_steps", 9)),
    ("time_budget_s", "30", _setting("time_budget_s", 30.0)),
    ("eval_every", "5", _setting("eval_every", 5)),
    ("eval_batches", "2", _setting("eval_batches", 2)),
    ("ckpt_every", "4", _setting("ckpt_every", 4)),
    ("log_every", "3", _setting("log_every", 3)),
    ("seed", "7", _setting("seed", 7)),
    ("progress", "off", lambda p: p["settings"]["progress"] in ("off", "plain")),
    ("bpe_merges", "64", _setting("bpe_merges", 64)),
    ("peak_tflops", "1.5", _setting("peak_tflops", 1.5)),
    ("confirm_batch", "false", _setting("confirm_batch", False)),
    ("tokenizer_cache", "/tmp/cpuperf-tok", _setting("tokenizer_cache", "/tmp/cpuperf-tok")),
    ("model.n_layer", "3", lambda p: p["settings"]["model"]["n_layer"] == 3),
    ("lr", "1e999", REFUSED),
    ("colour", "blue", REFUSED),
]


def test_the_table_covers_every_knob():
    covered = {key.split(".")[0] for key, _, _ in CASES}
    assert {k.id for k in KNOBS} <= covered, sorted({k.id for k in KNOBS} - covered)
    assert "n_layer" in MODEL_KEYS


@pytest.mark.parametrize("auto", [True, False], ids=["auto", "plain"])
@pytest.mark.parametrize("key,value,shows", CASES, ids=[f"{k}={v}" for k, v, _ in CASES])
def test_set_is_honoured_or_refused(host, auto, key, value, shows):
    if shows is REFUSED:
        with pytest.raises(CpuperfError) as info:
            _plan(host, [f"{key}={value}"], auto)
        assert info.value.code == ExitCode.USAGE, info.value.message
        assert "\n" not in info.value.message
        return
    plan = _plan(host, [f"{key}={value}"], auto)
    assert shows(plan), (key, value, plan)


@pytest.mark.parametrize("auto", [True, False], ids=["auto", "plain"])
def test_a_setting_the_workers_schema_refuses_is_refused_by_the_plan(host, auto):
    """The plan checks the worker's settings with the worker's own schema (cpuperf.worker_settings), and says so
    in one line with its hint (exit 2), before anything starts."""
    with pytest.raises(UsageError) as info:
        _plan(host, ["dtype=fp16"], auto)
    assert (info.value.message, info.value.hint) == (
        "training settings: dtype fp16 needs device cuda (fp16 autocast + GradScaler)", "use dtype bf16 or fp32 on CPU")
    assert info.value.code == ExitCode.USAGE


def test_user_ranks_and_threads_shape_placement_memory_and_env(host):
    plan = _plan(host, ["nproc_per_node=4", "threads_per_rank=2", "batch_size=3"], auto=True)
    assert plan["world"] == 4 and plan["env"]["OMP_NUM_THREADS"] == "2"
    assert [len(c) for c, _ in plan["per_rank"]] == [2, 2, 2, 2]
    cpus = [cpu for c, _ in plan["per_rank"] for cpu in c]
    assert len(cpus) == len(set(cpus)), "ranks must not share CPUs"
    assert plan["settings"]["batch_size"] == 3 and plan["settings"]["threads_per_rank"] == 2
    accum = plan["decisions"]["grad_accum_steps"]
    assert accum["value"] >= 1 and not accum["overridden"]  # derived from the user's batch, not patched later


def test_plain_mode_keeps_the_nproc_option(host):
    facts = probe_host(sysroot=host, environ={"CPUPERF_OVERRIDE_PACKAGES": STACK}, use_cache=False)
    request = train_request(PlanRequest(dry_run=True, model="micro", out_dir="/tmp/cpuperf-one-plan"),
                            TrainOptions(nproc_per_node=2))
    jp = build_plan(request, facts=facts, environ={})
    assert jp.launch.world_size == 2 and jp.settings is not None and jp.settings.dtype == "fp32"
    assert [d.id for d in jp.decisions] == ["plain", "nproc_per_node"]  # the user's own option


def test_oversubscribe_lets_ranks_share_cores(host):
    plan = _plan(host, ["nproc_per_node=20", "oversubscribe=true"], auto=True)
    assert plan["world"] == 20


def test_plain_mode_is_the_baseline_plus_exactly_the_users_keys(host):
    base = _plan(host, [], auto=False)
    assert base["settings"]["dtype"] == "fp32" and base["settings"]["threads_per_rank"] is None
    assert "OMP_NUM_THREADS" not in base["env"] and all(c == () for c, _ in base["per_rank"])
    one = _plan(host, ["threads_per_rank=2"], auto=False)
    assert one["env"]["OMP_NUM_THREADS"] == "2" and one["settings"]["dtype"] == "fp32"
    assert [d for d in one["decisions"] if d != "plain"] == ["threads_per_rank"]


# -- one plan, three renderings ----------------------------------------------------------------------

FIXTURE_HOSTS = {
    "2s16c": dict(sockets=2, cores_per_socket=8),
    "1s4c-quota": dict(sockets=1, cores_per_socket=8, cgroup={"cpu.max": "400000 100000"}),
    "4numa": dict(sockets=2, cores_per_socket=8, nodes_per_socket=2),
}
STACKS = {
    "native": {"torch": "2.13.0+cpu"},
    "legacy-ccl": {"torch": "2.7.0+cpu", "oneccl_bind_pt": "2.7.0+cpu"},
}


@pytest.mark.parametrize("stack", sorted(STACKS))
@pytest.mark.parametrize("name", sorted(FIXTURE_HOSTS))
def test_recommend_ccl_env_and_train_dry_run_agree(tmp_path, name, stack):
    host = str(make_host(tmp_path / name, **FIXTURE_HOSTS[name]))
    env = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps(STACKS[stack])}
    rec, _ = run_json(["recommend", "--sysroot", host], env)
    ccl, _ = run_json(["ccl-env", "--sysroot", host], env)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", host, "--model", "micro"], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    train = json.loads(proc.stdout)
    decisions = {d["id"]: d["value"] for d in rec["decisions"]}
    tdec = {d["id"]: d["value"] for d in train["decisions"]}
    assert decisions["nproc_per_node"] == ccl["nproc_per_node"] == train["launch"]["nproc_per_node"]
    assert str(decisions["threads_per_rank"]) == ccl["env"]["OMP_NUM_THREADS"] == rec["env"]["OMP_NUM_THREADS"]
    assert {k: v for k, v in decisions.items()} == tdec
    backend = decisions["ddp_backend"] or ccl["backend"]
    assert ccl["backend"] == backend == (tdec["ddp_backend"] or ccl["backend"])
    assert ccl["backend"] == ("ccl" if stack == "legacy-ccl" else "gloo")
    shared = set(rec["env"]) & set(ccl["env"]) & set(train["launch"]["env"])
    assert "OMP_NUM_THREADS" in shared
    for var in shared:
        assert rec["env"][var] == ccl["env"][var] == train["launch"]["env"][var], var


def test_ccl_env_follows_the_package_override(tmp_path):
    host = str(make_host(tmp_path / "h", sockets=2, cores_per_socket=8))
    legacy = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps(STACKS["legacy-ccl"])}
    assert run_json(["ccl-env", "--sysroot", host], legacy)[0]["backend"] == "ccl"
    native = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps(STACKS["native"])}
    assert run_json(["ccl-env", "--sysroot", host], native)[0]["backend"] == "gloo"


def test_cli_refuses_what_it_cannot_honour_with_one_line(tmp_path):
    host = str(make_host(tmp_path / "h", sockets=1, cores_per_socket=2))
    for args in (["--set", "nproc_per_node=3"], ["--set", "optimizer=adafactor"], ["--set", "dtype=fp8"]):
        proc = run_cli(["train", "--auto", "--dry-run", "--sysroot", host, "--model", "micro", *args])
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_config_file_and_set_use_the_same_ids(tmp_path):
    host = str(make_host(tmp_path / "h", sockets=2, cores_per_socket=8))
    cfg = _write(tmp_path / "c.toml", 'dtype = "bf16"\nthreads_per_rank = 2\n')
    rec, _ = run_json(["recommend", "--sysroot", host, "--config", cfg, "--set", "threads_per_rank=3"],
                      {"CPUPERF_OVERRIDE_PACKAGES": STACK})
    d = {x["id"]: x for x in rec["decisions"]}
    assert d["dtype"]["value"] == "bf16" and d["threads_per_rank"]["value"] == 3
    assert rec["env"]["OMP_NUM_THREADS"] == "3"


@pytest.mark.parametrize("asked, nodes", [([], 2), (["--nnodes", "1"], 1)])
def test_inside_a_slurm_allocation_every_command_plans_the_same_nodes(asked, nodes):
    """One node-count rule (--nnodes, else a hostfile, else the Slurm allocation, else 1) and one rendezvous (the
    allocation's first node) in recommend, ccl-env and train."""
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "cn[07-08]"}
    rec, _ = run_json(["recommend", *asked], env)
    ccl, _ = run_json(["ccl-env", *asked], env)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--model", "micro", *asked], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    train = json.loads(proc.stdout)["launch"]
    assert {d["id"]: d["value"] for d in rec["decisions"]}["nnodes"] == ccl["nnodes"] == train["nnodes"] == nodes
    if nodes > 1:
        assert rec["env"]["MASTER_ADDR"] == ccl["env"]["MASTER_ADDR"] == train["env"]["MASTER_ADDR"] == "cn07"
        # ... and says why: the allocation's first node, not an address the user gave
        assert "first node of the Slurm allocation" in train["env_reasons"]["MASTER_ADDR"]
        assert rec["launch"]["argv"][0] == train["argv"][0] == "srun"
