"""The plan agrees with itself: a rendezvous other nodes can reach, "no pinning" reaching Intel MPI, and a lever
whose package is missing refused like every other knob."""

from __future__ import annotations

import json

import pytest
from cli_util import run_cli
from hosts import make_host

from cpuperf.decide import runtime_env as envplan
from cpuperf.decide.recommend import RecommendRequest, recommend
from cpuperf.decide.workload import PRESETS
from cpuperf.plan.environment import EnvRequest, decisions_from_json, decisions_of, decisions_to_json, plan_env
from cpuperf.probe import probe_host


@pytest.mark.parametrize("fmt", ["env", "launch", "accelerate"])
def test_several_nodes_never_meet_at_loopback(fmt):
    proc = run_cli(["recommend", "--nnodes", "2", "--format", fmt])
    assert proc.returncode == 2, proc.stdout
    assert "--master-addr" in proc.stderr and "127.0.0.1" not in proc.stdout


def test_the_rendezvous_is_the_one_given_or_the_hostfiles_first(tmp_path):
    proc = run_cli(["recommend", "--nnodes", "2", "--format", "env", "--master-addr", "node0"])
    assert proc.returncode == 0, proc.stderr
    assert "export MASTER_ADDR='node0'" in proc.stdout
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nodeA\nnodeB\n")
    proc = run_cli(["recommend", "--hostfile", str(hostfile), "--format", "launch"])
    assert proc.returncode == 0, proc.stderr
    assert "--rdzv-endpoint=nodeA:" in proc.stdout


def test_no_pinning_reaches_intel_mpi(tmp_path, monkeypatch):
    """A VM whose two ranks share one NUMA node: the plan leaves them unpinned, and Intel MPI (which pins by
    default) is told so: I_MPI_PIN=0, no pin domains."""
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    monkeypatch.setenv("CPUPERF_OVERRIDE_HYPERVISOR", "1")  # a virtual machine (the suite's default is bare metal)
    root = make_host(tmp_path / "vm", sockets=1, cores_per_socket=4, flags=("avx2", "fma", "hypervisor"))
    facts = probe_host(sysroot=str(root))
    rec = recommend(facts, PRESETS["micro"], RecommendRequest(nproc_per_node=2, device="cpu"))
    assert rec.levers.affinity.value is None, rec.levers.affinity.reason
    decided = decisions_of(facts, rec)
    assert decided.pin is False and decisions_from_json(decisions_to_json(decided)).pin is False
    request = EnvRequest(None, 1, None, None, False, "intelmpi", envplan.Libraries(), None)
    env, _ = plan_env(facts, decided, request, {})
    names = {v.name: v.value for v in env}
    assert names.get("I_MPI_PIN") == "0" and "I_MPI_PIN_DOMAIN" not in names
    pinned = envplan.runtime_env(facts, rec.placement, envplan.RuntimeEnvRequest(backend="gloo", mpi="intelmpi", environ={}))
    assert "I_MPI_PIN_DOMAIN" in {v.name for v in pinned.vars}  # the same ranks, pinned where the plan pins


@pytest.mark.parametrize("sets, package", [(["optimizer=adamw_8bit"], "bitsandbytes"), (["sharding=zero3"], "DeepSpeed")])
def test_a_lever_whose_package_is_missing_is_refused(sets, package):
    env = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cpu", "transformers": "5.23.0"})}
    for command in (["recommend"], ["train", "--auto", "--dry-run", "--", "python", "x.py"]):
        proc = run_cli([*command[:1], "--set", sets[0], *command[1:]], env)
        assert proc.returncode == 2, (command, proc.stdout[-500:], proc.stderr[-500:])
        assert package in proc.stderr


def test_a_scripts_own_batch_is_reported_as_applied(tmp_path):
    """The lever report says a script's own --per_device_train_batch_size carries the batch lever (nothing to add)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64,
                                                             "n_head": 2, "n_positions": 64, "vocab_size": 512}))
    (tmp_path / "s.py").write_text("from transformers import HfArgumentParser, TrainingArguments\n"
                                   "HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()\n")
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--", "python", "s.py", "--model_name_or_path", "m",
                    "--per-device-train-batch-size", "4", "--output_dir", "o"], {"CPUPERF_OVERRIDE_GPUS": "[]"},
                   cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    levers = json.loads(proc.stdout)["levers"]
    batch = next(x for x in levers["applied"] if x["id"] == "batch_size")
    assert batch["value"] == 4 and "--per_device_train_batch_size 4" in batch["how"]
    accum = next(x for x in levers["applied"] if x["id"] == "grad_accum_steps")
    assert accum["value"] == 1 and "default" in accum["how"]


def test_a_levers_own_variables_are_remembered_and_sit_before_the_rendezvous(tmp_path, monkeypatch):
    """A lever its variable carries (a knob row marked `env`): ccl-env's remembered decision keeps its variables, and
    they come before the launch's rendezvous, where a saved plan's own put them (the same environment, same order).
    None of the shipped levers is one yet: the remembered JSON without them is what it was."""
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    root = make_host(tmp_path / "h", sockets=1, cores_per_socket=4, flags=("avx2", "fma"))
    facts = probe_host(sysroot=str(root))
    rec = recommend(facts, PRESETS["micro"], RecommendRequest(nproc_per_node=2, device="cpu"))
    plain = decisions_of(facts, rec)
    assert plain.lever_vars == () and "lever_vars" not in decisions_to_json(plain)
    decided = plain._replace(lever_vars=(("MALLOC_ARENA_MAX", "2", "one arena per thread"),))
    again = decisions_from_json(json.loads(json.dumps(decisions_to_json(decided))))
    assert again.lever_vars == decided.lever_vars
    env, _ = plan_env(facts, again, EnvRequest(None, 1, None, None, False, None, envplan.Libraries(), None), {})
    names = [v.name for v in env]
    assert "MASTER_ADDR" in names and names.index("MALLOC_ARENA_MAX") < names.index("MASTER_ADDR"), names
