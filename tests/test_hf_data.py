"""compat/hf.toml against the releases themselves: Trainer flags at both edges of their ranges, accelerate
config keys accepted by accelerate's own loader, and nothing rendered for a release past the data."""

from __future__ import annotations

import json

import pytest
from cli_util import run_json
from hosts import make_host
from packaging.version import Version

from cpuperf.knowledge.accelerate import config_keys, launch_flag_ok
from cpuperf.knowledge.hf_flags import FLAG_ROWS, data_note, supported_flags
from cpuperf.knowledge.matrix import load_matrix

# Each TrainingArguments option cpuperf renders: (the last release without it, the first with it,
# the last with it, the first without it). Read from transformers/training_args.py in the PyPI wheel of
# every minor release 2.9.0 ... 5.23.0 (x.y.0, or the first x.y.z where x.y.0 has no wheel);
# 2.8.0 has no training_args.py at all. None = not (yet) removed.
TRAINER_RANGES = {
    "per_device_train_batch_size": ("2.10.0", "2.11.0", None, None),
    "gradient_accumulation_steps": ("2.8.0", "2.9.0", None, None),
    "fp16": ("2.8.0", "2.9.0", None, None),
    "bf16": ("4.12.0", "4.13.0", None, None),
    "tf32": ("4.12.0", "4.13.0", None, None),
    "half_precision_backend": ("4.12.0", "4.13.0", "4.57.6", "5.0.0"),
    "no_cuda": ("2.8.0", "2.9.0", "4.57.6", "5.0.0"),
    "use_cpu": ("4.31.0", "4.32.0", None, None),
    "use_ipex": ("4.19.0", "4.20.0", "4.56.2", "4.57.0"),
    "jit_mode_eval": ("4.19.0", "4.20.0", "4.57.6", "5.0.0"),
    "ddp_backend": ("4.28.0", "4.29.0", None, None),
    "ddp_backend=gloo": ("4.28.0", "4.29.0", None, None),
    "ddp_backend=ccl": ("4.28.0", "4.29.0", "5.0.0", "5.1.0"),
    "ddp_backend=xccl": ("5.0.0", "5.1.0", None, None),
    "dataloader_num_workers": ("3.2.0", "3.3.0", None, None),
    "dataloader_pin_memory": ("4.2.0", "4.3.0", None, None),
    "gradient_checkpointing": ("4.10.0", "4.11.0", None, None),
    "optim": ("4.15.0", "4.16.0", None, None),
    "optim=adamw_torch": ("4.15.0", "4.16.0", None, None),
    "optim=adafactor": ("4.15.0", "4.16.0", None, None),
    "optim=adamw_bnb_8bit": ("4.18.0", "4.19.0", None, None),
    "optim=adamw_torch_fused": ("4.26.0", "4.27.0", None, None),
    "torch_compile": ("4.25.1", "4.26.0", None, None),
}

# accelerate config-file keys: the dataclass fields of BaseConfig/ClusterConfig in
# src/accelerate/commands/config/config_args.py at every tag v0.2.0 ... v1.14.0 (and the 1.15.0 wheel):
# (last release without, first with, last with, first without).
ACCELERATE_KEYS = {
    "compute_environment": (None, "0.2.0", None, None),
    "distributed_type": (None, "0.2.0", None, None),
    "num_processes": (None, "0.2.0", None, None),
    "mixed_precision": ("0.5.1", "0.6.0", None, None),
    "use_cpu": ("0.5.1", "0.6.0", None, None),
    "rdzv_backend": ("0.12.0", "0.13.0", None, None),
    "same_network": ("0.12.0", "0.13.0", None, None),
    "dynamo_config": ("0.16.0", "0.17.0", None, None),
    "ipex_config": ("0.18.0", "0.19.0", "1.12.0", "1.13.0"),
    "enable_cpu_affinity": ("0.28.0", "0.29.0", None, None),
}

NEWEST_TRANSFORMERS = "5.23.0"
NEWEST_ACCELERATE = "1.15.0"
SPR = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
       "amx_tile", "amx_bf16", "amx_int8"]


@pytest.fixture(scope="module")
def m():
    return load_matrix(environ={})


def _flag_id(name):
    return next(k for k, v in FLAG_ROWS.items() if v == name)


@pytest.mark.parametrize("name", sorted(TRAINER_RANGES))
def test_trainer_flag_is_offered_exactly_inside_its_range(m, name):
    before, first, last, gone = TRAINER_RANGES[name]
    flag = _flag_id(name)
    if flag == "no_cuda":  # offered only where use_cpu is not: check the option's own range instead
        row = next(r for r in m.hf if r.name == name)
        assert row.valid_in(Version(first))
        assert not row.valid_in(Version(gone))
        assert "no_cuda" in supported_flags("4.31.0", m) and "no_cuda" not in supported_flags("4.32.0", m)
        return
    assert flag not in supported_flags(before, m), (name, before)
    assert flag in supported_flags(first, m), (name, first)
    if last is not None:
        assert flag in supported_flags(last, m), (name, last)
        assert flag not in supported_flags(gone, m), (name, gone)
    else:
        assert flag in supported_flags(NEWEST_TRANSFORMERS, m)


def test_every_rendered_transformers_option_has_a_verified_row_and_a_range_here(m):
    rows = {r.name: r for r in m.hf if r.package == "transformers"}
    for name in FLAG_ROWS.values():
        assert name in rows, name
        assert rows[name].verified and "training_args.py" in rows[name].source, name
        assert name in TRAINER_RANGES or name in ("ddp_backend=nccl", "ddp_backend=mpi")


def test_an_unverified_row_is_never_rendered(tmp_path, m):
    extra = tmp_path / "compat"
    extra.mkdir()
    (extra / "hf-local.toml").write_text(
        '[[hf]]\npackage = "transformers"\nname = "bf16"\nkind = "trainer-arg"\nintroduced = "4.0.0"\n'
        'source = "someone remembers"\nreason = "unverified"\n')
    mine = load_matrix(extra, environ={})
    assert "bf16" not in supported_flags("4.40.0", mine)
    assert "bf16" in supported_flags("4.40.0", m)


def test_a_newer_transformers_than_the_data_gets_no_flags_and_a_note(m):
    assert supported_flags("9.0.0", m) == frozenset()
    note = data_note("transformers", "9.0.0", m)
    assert note is not None and f"data ends at transformers {NEWEST_TRANSFORMERS}" in note
    assert "CPUPERF_COMPAT_DIR" in note
    assert data_note("transformers", NEWEST_TRANSFORMERS, m) is None
    assert supported_flags(NEWEST_TRANSFORMERS, m)  # the newest checked release still gets its flags


def test_recommend_json_for_an_unknown_newer_transformers(tmp_path):
    root = make_host(tmp_path, sockets=1, cores_per_socket=8, flags=SPR, model=143)
    pk = json.dumps({"torch": "2.13.0+cpu", "transformers": "9.0.0"})
    rep, _ = run_json(["recommend", "--sysroot", str(root)], {"CPUPERF_OVERRIDE_PACKAGES": pk})
    assert rep["hf_args"] == []
    assert any("data ends at transformers 5.23.0" in n and "CPUPERF_COMPAT_DIR" in n for n in rep["notes"])


@pytest.mark.parametrize("transformers,has_bf16", [("4.12.0", False), ("4.13.0", True)])
def test_recommend_json_renders_bf16_only_where_the_release_has_it(tmp_path, transformers, has_bf16):
    root = make_host(tmp_path, sockets=1, cores_per_socket=8, flags=SPR, model=143)
    pk = json.dumps({"torch": "2.13.0+cpu", "transformers": transformers})
    rep, _ = run_json(["recommend", "--sysroot", str(root), "--set", "dtype=bf16"],
                      {"CPUPERF_OVERRIDE_PACKAGES": pk})
    assert ("--bf16" in rep["hf_args"]) is has_bf16
    assert "--use_cpu" not in rep["hf_args"] and "--no_cuda" in rep["hf_args"]


# --------------------------------------------------------------------------- accelerate


@pytest.mark.parametrize("key", sorted(ACCELERATE_KEYS))
def test_accelerate_config_key_at_both_edges(m, key):
    before, first, last, gone = ACCELERATE_KEYS[key]
    if before is not None:
        assert key not in config_keys(before, m)
    assert key in config_keys(first, m)
    if last is not None:
        assert key in config_keys(last, m) and key not in config_keys(gone, m)
    else:
        assert key in config_keys(NEWEST_ACCELERATE, m)


def test_num_cpu_threads_per_process_is_a_launch_flag_not_a_config_key(m):
    assert "num_cpu_threads_per_process" not in config_keys(NEWEST_ACCELERATE, m)
    assert launch_flag_ok("--num_cpu_threads_per_process", "0.9.0", m)
    assert not launch_flag_ok("--num_cpu_threads_per_process", "0.8.0", m)
    assert not launch_flag_ok("--num_cpu_threads_per_process", "9.0.0", m)  # past the data: not guessed


def test_accelerate_data_matches_the_installed_accelerate(m):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    import importlib.metadata

    version = importlib.metadata.version("accelerate")
    fields = set(config_args.ClusterConfig.__dataclass_fields__)
    listed = {r.name for r in m.hf if r.package == "accelerate" and r.kind == "config-key"}
    valid = config_keys(version, m)
    assert valid, f"accelerate {version} is past the data ({data_note('accelerate', version, m)})"
    assert valid <= fields  # nothing the loader would reject as 'unknown keys'
    assert (listed - valid).isdisjoint(fields)  # keys the data calls removed are really gone


def _recommend(tmp_path, accelerate, nproc="2"):
    root = make_host(tmp_path, sockets=2, cores_per_socket=8, flags=SPR, model=143)
    pk = json.dumps({"torch": "2.8.0+cpu", "intel_extension_for_pytorch": "2.8.0", "accelerate": accelerate})
    rep, _ = run_json(["recommend", "--sysroot", str(root), "--nproc-per-node", nproc, "--set", "ipex=true",
                       "--set", "compile=true"], {"CPUPERF_OVERRIDE_PACKAGES": pk})
    return rep


def test_rendered_config_loads_with_the_installed_accelerate(tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    import importlib.metadata

    version = importlib.metadata.version("accelerate")
    rep = _recommend(tmp_path, version)
    path = tmp_path / "accelerate.yaml"
    path.write_text(rep["accelerate_config"])
    cfg = config_args.load_config_from_file(str(path))  # raises ValueError on unknown keys
    threads = next(d["value"] for d in rep["decisions"] if d["id"] == "threads_per_rank")
    assert cfg.num_processes == 2 and cfg.use_cpu is True
    assert str(cfg.distributed_type).endswith("MULTI_CPU")
    assert cfg.dynamo_config.get("dynamo_backend") == "INDUCTOR"
    assert "ipex_config" not in rep["accelerate_config"]  # removed in accelerate 1.13.0
    assert rep["accelerate_launch_args"] == ["--num_cpu_threads_per_process", str(threads)]
    assert f"--num_cpu_threads_per_process {threads}" in rep["accelerate_config"]  # as a comment
    # the same setting as a config key is what the loader rejects: that is why it is a launch flag
    bad = tmp_path / "bad.yaml"
    bad.write_text(rep["accelerate_config"] + f"num_cpu_threads_per_process: {threads}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        config_args.load_config_from_file(str(bad))


def test_old_accelerate_keeps_ipex_config_and_a_newer_one_gets_none(tmp_path):
    old = _recommend(tmp_path / "a", "1.12.0")
    assert "ipex_config:" in old["accelerate_config"]
    new = _recommend(tmp_path / "b", "9.0.0")
    assert new["accelerate_config"].startswith("#") and "data ends at accelerate 1.15.0" in new["accelerate_config"]
    assert new["accelerate_launch_args"] == []
    assert any("data ends at accelerate" in n for n in new["notes"])
