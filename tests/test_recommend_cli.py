"""`cpuperf recommend` end to end: JSON shape, renderings, overrides, errors."""

from __future__ import annotations

import json

import pytest
from cli_util import run_cli, run_json
from hosts import make_host

SPR = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
       "amx_tile", "amx_bf16", "amx_int8"]


@pytest.mark.smoke("recommend")
def test_json_shape_on_this_host():
    rep, _ = run_json(["recommend"], process=True)
    assert rep["schema"] == "cpuperf.recommend/1"
    ids = [d["id"] for d in rep["decisions"]]
    for required in ("dtype", "tf32", "nproc_per_node", "threads_per_rank", "ddp_backend", "ipex", "compile",
                     "allocator", "batch_size", "grad_accum_steps", "grad_checkpointing", "optimizer",
                     "dataloader_workers"):
        assert required in ids
    for d in rep["decisions"]:
        assert set(d) >= {"id", "value", "reason", "evidence"}
    assert "env" in rep and "launch" in rep and "hf_args" in rep


def test_two_ranks_here_use_gloo_and_render_torchrun():
    rep, _ = run_json(["recommend", "--nproc-per-node", "2"])
    values = {d["id"]: d["value"] for d in rep["decisions"]}
    assert values["ddp_backend"] in ("gloo", "ccl")
    assert rep["launch"]["argv"][0] == "torchrun" and "--nproc-per-node=2" in rep["launch"]["argv"]
    assert rep["env"]["MASTER_PORT"] == "29500"


def test_sysroot_spr_with_legacy_flags_for_old_transformers(tmp_path):
    root = make_host(tmp_path, sockets=2, cores_per_socket=32, flags=SPR, model=143)
    pk = json.dumps({"torch": "2.3.1+cpu", "intel_extension_for_pytorch": "2.3.100", "transformers": "4.40.0"})
    rep, _ = run_json(["recommend", "--sysroot", str(root)], {"CPUPERF_OVERRIDE_PACKAGES": pk})
    values = {d["id"]: d["value"] for d in rep["decisions"]}
    assert values["dtype"] == "bf16" and values["ipex"] is True and values["nproc_per_node"] == 2
    assert "--use_ipex" in rep["hf_args"] and "--bf16" in rep["hf_args"] and "--use_cpu" in rep["hf_args"]
    pk5 = json.dumps({"torch": "2.8.0+cpu", "intel_extension_for_pytorch": "2.8.0", "transformers": "5.0.0"})
    rep, _ = run_json(["recommend", "--sysroot", str(root)], {"CPUPERF_OVERRIDE_PACKAGES": pk5})
    assert "--use_ipex" not in rep["hf_args"] and "--no_cuda" not in rep["hf_args"]


def test_set_and_config_overrides_are_reported(tmp_path):
    cfg = tmp_path / "settings.toml"
    cfg.write_text('compile = false\nthreads_per_rank = 1\n')
    rep, _ = run_json(["recommend", "--config", str(cfg), "--set", "dtype=fp32"])
    assert set(rep["overridden"]) == {"compile", "threads_per_rank", "dtype"}
    assert rep["env"]["OMP_NUM_THREADS"] == "1"


def test_bad_inputs_are_one_line_errors(tmp_path):
    for args in (["recommend", "--set", "dtype=fp8"], ["recommend", "--set", "nope"],
                 ["recommend", "--model", "no/such-model"], ["recommend", "--params", "lots"],
                 ["recommend", "--format", "xml"]):
        proc = run_cli(args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    bad = tmp_path / "hosts"
    bad.write_text("node1 slots=two\n")
    proc = run_cli(["recommend", "--hostfile", str(bad), "--json"])
    assert proc.returncode == 2 and "hosts:1" in json.loads(proc.stdout)["error"]["message"]


def test_hf_config_workload(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                               "n_positions": 1024, "vocab_size": 50257}))
    rep, _ = run_json(["recommend", "--model", str(cfg)])
    assert 100e6 < rep["workload"]["params"] < 170e6 and rep["workload"]["n_layer"] == 12


def _cached_model(root, model_id, n_layer):
    snap = root / ("models--" + model_id.replace("/", "--")) / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": n_layer, "n_embd": 256,
                                                  "n_head": 4, "n_positions": 512, "vocab_size": 1000}))


def test_a_model_id_is_found_where_huggingface_hub_keeps_it(tmp_path):
    """HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub (huggingface_hub's own order)."""
    import subprocess
    import sys

    from cli_util import cli_env

    xdg, home, hub = tmp_path / "xdg", tmp_path / "home", tmp_path / "hub"
    _cached_model(xdg / "huggingface" / "hub", "acme/small", 3)
    _cached_model(home / "hub", "acme/small", 5)
    _cached_model(hub, "acme/small", 7)
    for extra, layers in (({"XDG_CACHE_HOME": str(xdg)}, 3), ({"XDG_CACHE_HOME": str(xdg), "HF_HOME": str(home)}, 5),
                          ({"XDG_CACHE_HOME": str(xdg), "HF_HOME": str(home), "HF_HUB_CACHE": str(hub)}, 7)):
        env = {k: v for k, v in cli_env(extra).items()
               if k not in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE") or k in extra}
        proc = subprocess.run([sys.executable, "-m", "cpuperf", "recommend", "--model", "acme/small", "--json"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, (extra, proc.stderr)
        assert json.loads(proc.stdout)["workload"]["n_layer"] == layers, extra


def test_probe_nodes_reaches_a_hostfiles_nodes_without_srun_even_inside_slurm(tmp_path):
    """srun starts steps on the allocation's own nodes only (doctor's rule): a hostfile's nodes are reached by
    mpirun or ssh. Stand-ins for all three (no Slurm here) log their argv and fail, so no node answers (exit 7)."""
    import os

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("srun", "mpirun", "mpiexec", "ssh"):  # one line per start; the probe's `--version` is no start
        (bindir / tool).write_text(f'#!/bin/sh\n[ "$1" = --version ] || echo start >> {tmp_path / tool}.log\nexit 1\n')
        (bindir / tool).chmod(0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2\n")
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
           "PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = run_cli(["recommend", "--hostfile", str(hostfile), "--probe-nodes"], extra_env=env)
    assert proc.returncode == 7, proc.stderr
    assert not (tmp_path / "srun.log").exists(), (tmp_path / "srun.log").read_text()
    starts = [line for tool in ("mpirun", "mpiexec", "ssh") if (tmp_path / f"{tool}.log").exists()
              for line in (tmp_path / f"{tool}.log").read_text().splitlines()]
    assert starts, proc.stderr  # the nodes were tried through mpirun or ssh
