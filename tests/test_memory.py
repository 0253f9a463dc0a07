"""The memory plan: one computation, plans that agree with themselves, exit 3 when nothing fits."""

from __future__ import annotations

import json

import pytest
from cli_util import run_cli
from hosts import make_host

from cpuperf.decide.recommend import RecommendRequest, recommend
from cpuperf.decide.workload import resolve_workload
from cpuperf.errors import IncompatibleHostError
from cpuperf.probe import probe_host

NEW_TORCH = json.dumps({"torch": "2.13.0+cpu"})


def _host(tmp_path, monkeypatch, gib, **kw):
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", NEW_TORCH)
    # make_host writes MemAvailable = half of MemTotal; plans use MemTotal (what is free now is volatile).
    return probe_host(sysroot=str(make_host(tmp_path, node_mem_bytes=gib << 30, **kw)))


@pytest.mark.parametrize("params", ["50M", "350M", "1B", "2B"])
def test_every_plan_fits_its_own_budget_and_checkpoints_only_when_it_must(tmp_path, monkeypatch, params):
    facts = _host(tmp_path, monkeypatch, 48)
    rec = recommend(facts, resolve_workload(params=params, batch_size=32))
    ev = rec.levers.batch_size.evidence
    batch, ck = rec.levers.batch_size.value, rec.levers.grad_checkpointing.value
    assert ev["weights_grads_optimizer_bytes"] + batch * ev["activation_bytes_per_sample"] <= ev["budget_bytes"]
    assert ev["per_rank_bytes"] <= ev["budget_bytes"]
    if ck:  # checkpointing is chosen only where one sample without it does not fit
        assert ev["weights_grads_optimizer_bytes"] + ev["activation_bytes_per_sample_no_checkpointing"] > ev["budget_bytes"]
    accum = rec.levers.grad_accum_steps.value
    assert 0 <= batch * accum - 32 < accum  # near-equal micro-batches reach the global batch
    assert rec.levers.zero.value is None


def test_too_big_for_the_host_exits_3_with_the_figures(tmp_path, monkeypatch):
    facts = _host(tmp_path, monkeypatch, 48)  # 24 GiB available
    with pytest.raises(IncompatibleHostError) as err:
        recommend(facts, resolve_workload(params="7B"))
    msg = err.value.message
    assert "weights 26.1 GiB" in msg and "GiB usable per rank" in msg and "offload does not apply" in msg
    assert "--nnodes" in (err.value.hint or "")


def test_cpu_ranks_shard_and_never_offload(tmp_path, monkeypatch):
    # 4 nodes x 1 rank, 24 GiB installed each: 3B with AdamW (48 GB of state) fits only sharded (12 GB a rank).
    facts = _host(tmp_path, monkeypatch, 24)
    rec = recommend(facts, resolve_workload(params="3B"), RecommendRequest(nnodes=4))
    assert rec.levers.sharding.value == "fsdp" and rec.levers.offload.value is False
    assert rec.levers.optimizer.value in ("adamw", "adamw_fused")  # the family is kept: sharding comes first
    assert rec.levers.zero.value is None  # no DeepSpeed plan unless you choose ZeRO-3
    with pytest.raises(IncompatibleHostError):
        recommend(facts, resolve_workload(params="3B"))  # one node alone cannot


def test_the_optimizer_family_changes_only_when_you_ask(tmp_path, monkeypatch):
    """A model whose AdamW state does not fit, while Adafactor's would: exit 3 naming Adafactor, never Adafactor run."""
    facts = _host(tmp_path, monkeypatch, 48)  # 40.8 GiB usable: 3B x 16 B = 44.7 GiB does not fit, x 9 B would
    w = resolve_workload(params="3B", batch_size=4)
    with pytest.raises(IncompatibleHostError) as err:
        recommend(facts, w)
    hint = err.value.hint or ""
    assert "--set optimizer=adafactor" in hint and "--nnodes" in hint
    rec = recommend(facts, w, RecommendRequest(overrides={"optimizer": "adafactor"}))
    assert rec.levers.optimizer.value == "adafactor" and rec.levers.optimizer.overridden
    ev = rec.levers.batch_size.evidence
    assert ev["per_rank_bytes"] <= ev["budget_bytes"]


@pytest.mark.parametrize("global_batch, world, micro, accum", [(100, 1, 100, 1), (100, 4, 25, 1), (12, 1, 12, 1)])
def test_the_global_batch_is_kept_exactly(tmp_path, monkeypatch, global_batch, world, micro, accum):
    facts = _host(tmp_path, monkeypatch, 48, sockets=world, cores_per_socket=1)
    rec = recommend(facts, resolve_workload("micro", batch_size=global_batch), RecommendRequest(nproc_per_node=world))
    lv = rec.levers
    assert lv.batch_size.value * lv.grad_accum_steps.value * world == global_batch
    assert (lv.batch_size.value, lv.grad_accum_steps.value) == (micro, accum)


def test_an_optimizer_whose_package_is_missing_is_refused(tmp_path, monkeypatch):
    from cpuperf.errors import UsageError

    facts = _host(tmp_path, monkeypatch, 48)  # torch only: no bitsandbytes
    with pytest.raises(UsageError, match="bitsandbytes"):
        recommend(facts, resolve_workload("micro"), RecommendRequest(overrides={"optimizer": "adamw_8bit"}))
    with pytest.raises(UsageError, match="DeepSpeed"):
        recommend(facts, resolve_workload("micro"), RecommendRequest(overrides={"sharding": "zero3"}))


@pytest.mark.parametrize("params", ["7B", "13B", "70B"])
def test_big_models_on_this_host_coherent_plan_or_exit_3(params):
    proc = run_cli(["recommend", "--params", params, "--json"], {"CPUPERF_LOAD_WINDOW": "0"})
    assert proc.returncode in (0, 3), proc.stderr
    data = json.loads(proc.stdout)
    assert "offload_" not in proc.stdout and "ZeRO-3 with CPU offload" not in proc.stdout
    if proc.returncode == 3:
        assert data["error"]["name"] == "incompatible_host" and "GiB" in data["error"]["message"]
        assert "Traceback" not in proc.stderr
        return
    ev = next(d for d in data["decisions"] if d["id"] == "batch_size")["evidence"]
    assert ev["per_rank_bytes"] <= ev["budget_bytes"]
