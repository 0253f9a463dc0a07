"""compat/hf.toml against the releases themselves: Trainer flags at both edges of their ranges, accelerate
config keys accepted by accelerate's own loader, and nothing rendered for a release past the data."""

from __future__ import annotations

import json

import pytest
from cli_util import run_json
from hosts import make_host
from levers_util import levers
from packaging.version import Version

from cpuperf.knowledge.accelerate import config_keys, launch_flag_ok
from cpuperf.knowledge.hf_flags import FLAG_ROWS, data_note, renamed_to, supported_flags
from cpuperf.knowledge.matrix import load_matrix
from cpuperf.knowledge.tuning import tuning
from cpuperf.plan.user_script import FlagContext, speed_flags

TUNING = tuning()

# Each TrainingArguments option cpuperf renders: (the last release without it, the first with it,
# the last with it, the first without it). Read from transformers/training_args.py in the PyPI wheel of
# every minor release 2.9.0 ... 5.24.0 (x.y.0, or the first x.y.z where x.y.0 has no wheel);
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
    "gradient_checkpointing": ("4.10.0", "4.11.0", None, None),  # deprecated alias from 5.23.0
    "activation_checkpointing": ("5.22.0", "5.23.0", None, None),
    "optim": ("4.15.0", "4.16.0", None, None),
    "optim=adamw_torch": ("4.15.0", "4.16.0", None, None),
    "optim=adafactor": ("4.15.0", "4.16.0", None, None),
    "optim=adamw_bnb_8bit": ("4.18.0", "4.19.0", None, None),
    "optim=adamw_torch_fused": ("4.26.0", "4.27.0", None, None),
    "torch_compile": ("4.25.1", "4.26.0", None, None),
    "torch_compile_mode": ("4.25.1", "4.26.0", None, None),  # pull request 20634 (compat/hf.toml)
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

NEWEST_TRANSFORMERS = "5.24.0"
NEWEST_ACCELERATE = "1.15.0"
SPR = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
       "amx_tile", "amx_bf16", "amx_int8"]


@pytest.fixture(scope="module")
def m():
    return load_matrix(environ={})


def _flag_id(name):
    return next(k for k, v in FLAG_ROWS.items() if v == name)


@pytest.mark.parametrize("name", sorted(TRAINER_RANGES))
def test_trainer_option_exists_exactly_inside_its_range(m, name):
    before, first, last, gone = TRAINER_RANGES[name]
    row = next(r for r in m.hf if r.package == "transformers" and r.name == name)
    assert not row.valid_in(Version(before)) and row.valid_in(Version(first)), name
    if last is not None:
        assert row.valid_in(Version(last)) and not row.valid_in(Version(gone)), name
    else:
        assert row.valid_in(Version(NEWEST_TRANSFORMERS)), name


@pytest.mark.parametrize("name", sorted(TRAINER_RANGES))
def test_trainer_flag_is_offered_inside_its_range_until_deprecated(m, name):
    before, first, last, gone = TRAINER_RANGES[name]
    flag = _flag_id(name)
    row = next(r for r in m.hf if r.package == "transformers" and r.name == name)
    assert flag not in supported_flags(before, m), (name, before)
    if row.deprecated is not None and row.deprecated <= Version(first):
        return
    assert flag in supported_flags(first, m), (name, first)
    if row.deprecated is not None:  # offered up to the release before the deprecation, never from it on
        assert flag not in supported_flags(str(row.deprecated), m), (name, row.deprecated)
    elif last is not None:
        assert flag in supported_flags(last, m), (name, last)
    if gone is not None:
        assert flag not in supported_flags(gone, m), (name, gone)
    if row.deprecated is None and last is None:
        assert flag in supported_flags(NEWEST_TRANSFORMERS, m)


def test_every_rendered_transformers_option_has_a_verified_row_and_a_range_here(m):
    rows = {r.name: r for r in m.hf if r.package == "transformers"}
    for name in FLAG_ROWS.values():
        assert name in rows, name
        assert rows[name].verified and "training_args.py" in rows[name].source, name
        assert name in TRAINER_RANGES or name in ("ddp_backend=nccl", "ddp_backend=mpi")


# --------------------------------------------------------------------------- releases past the data


def test_a_patch_release_past_the_data_inherits_its_minor(m):
    newest = supported_flags(NEWEST_TRANSFORMERS, m)
    assert {"use_cpu", "bf16", "activation_checkpointing"} <= newest
    for patch in ("5.24.1", "5.24.17", "5.24.1+local", "5.24.1.post1"):
        assert supported_flags(patch, m) == newest, patch
    assert "patch release" in data_note("transformers", "5.24.1", m)


def test_a_newer_minor_inherits_every_flag_not_deprecated_or_removed(m):
    rows = {r.name: r for r in m.hf if r.package == "transformers"}
    flags = supported_flags("5.25.0", m)
    assert {"use_cpu", "bf16", "activation_checkpointing", "ddp_backend", "optim_fused"} <= flags
    for flag in supported_flags(NEWEST_TRANSFORMERS, m):
        row = rows[FLAG_ROWS[flag]]
        assert (flag in flags) is (row.deprecated is None and row.removed is None), flag
    assert "gradient_checkpointing" not in flags and "no_cuda" not in flags
    assert supported_flags("5.99.3", m) == flags
    note = data_note("transformers", "5.25.0", m)
    assert note is not None and f"data ends at transformers {NEWEST_TRANSFORMERS}" in note
    assert "carried over" in note


def test_only_a_new_major_is_conservative(m):
    assert supported_flags("6.0.0", m) == frozenset() == supported_flags("6.0.0rc1", m)
    assert "new major" in data_note("transformers", "6.0.0", m)
    assert supported_flags("not-a-version", m) == frozenset()
    assert data_note("transformers", "4.57.7", m) is None  # a patch inside the data is simply known
    assert supported_flags("4.57.7", m) == supported_flags("4.57.1", m)


@pytest.mark.parametrize("version,keys", [("1.15.2", True), ("1.16.0", True), ("1.99.0", True), ("2.0.0", False)])
def test_accelerate_past_the_data(m, version, keys):
    got = config_keys(version, m)
    assert bool(got) is keys
    if keys:
        assert {"use_cpu", "num_processes", "mixed_precision", "enable_cpu_affinity"} <= got
        assert "ipex_config" not in got
        assert launch_flag_ok("--num_cpu_threads_per_process", version, m)


# --------------------------------------------------------------------------- deprecations


def test_every_deprecated_row_names_its_replacement_and_renames_point_at_rows(m):
    names = {(r.package, r.name) for r in m.hf}
    for r in m.hf:
        if r.deprecated is not None:
            assert r.replacement, r.name
        new = renamed_to(r)
        if new is not None:
            assert (r.package, new) in names, (r.name, new)


def test_no_release_is_offered_a_deprecated_flag(m):
    rows = {r.name: r for r in m.hf if r.package == "transformers"}
    releases = sorted({str(v) for r in rows.values() for v in (r.introduced, r.deprecated, r.removed) if v} |
                      {"5.23.4", "5.24.3", "5.25.0", NEWEST_TRANSFORMERS})
    for release in releases:
        for flag in supported_flags(release, m):
            row = rows[FLAG_ROWS[flag]]
            assert row.deprecated is None or Version(release) < row.deprecated, (release, flag, row.deprecated)


@pytest.mark.parametrize("release,spelling", [("5.22.0", "--gradient_checkpointing"),
                                              ("5.23.0", "--activation_checkpointing"),
                                              ("5.23.2", "--activation_checkpointing"),
                                              ("5.24.0", "--activation_checkpointing"),
                                              ("5.25.0", "--activation_checkpointing"),
                                              ("4.11.0", "--gradient_checkpointing")])
def test_the_current_spelling_is_emitted(release, spelling):
    values = {"device": "cpu", "dtype": "fp32", "grad_checkpointing": True, "compile": False, "ipex": False}
    flags, _ = speed_flags(levers(values, {"grad_checkpointing"}), FlagContext(release, "2.13.0", 1, TUNING))
    args = [a for f in flags for a in f.args]
    assert spelling in args
    assert not ({"--gradient_checkpointing", "--activation_checkpointing"} - {spelling}) & set(args)


@pytest.mark.parametrize("release,emitted", [("4.52.1", True), ("4.53.0", False), ("4.56.2", False), ("4.57.0", False)])
def test_use_ipex_is_not_emitted_once_deprecated_and_the_notice_says_why(release, emitted):
    values = {"device": "cpu", "dtype": "fp32", "compile": False, "ipex": True}
    flags, skipped = speed_flags(levers(values, set()), FlagContext(release, "2.8.0", 1, TUNING))
    assert ("--use_ipex" in [a for f in flags for a in f.args]) is emitted
    if not emitted:
        why = dict(skipped)["--use_ipex"]
        assert ("deprecated since transformers 4.53.0" in why or "removed in transformers 4.57.0" in why), why
        assert "torch_compile" in why


def test_recommend_json_emits_the_renamed_flag(tmp_path):
    root = make_host(tmp_path, sockets=1, cores_per_socket=8, flags=SPR, model=143)
    for release, want, not_want in (("5.23.0", "--activation_checkpointing", "--gradient_checkpointing"),
                                    ("5.22.0", "--gradient_checkpointing", "--activation_checkpointing")):
        pk = json.dumps({"torch": "2.13.0+cpu", "transformers": release})
        rep, _ = run_json(["recommend", "--sysroot", str(root), "--set", "grad_checkpointing=true"],
                          {"CPUPERF_OVERRIDE_PACKAGES": pk})
        assert want in rep["hf_args"] and not_want not in rep["hf_args"], (release, rep["hf_args"])


def test_an_unverified_row_is_never_rendered(tmp_path, m):
    extra = tmp_path / "compat"
    extra.mkdir()
    (extra / "hf-local.toml").write_text(
        '[[hf]]\npackage = "transformers"\nname = "bf16"\nkind = "trainer-arg"\nintroduced = "4.0.0"\n'
        'source = "someone remembers"\nreason = "unverified"\n')
    mine = load_matrix(extra, environ={})
    assert "bf16" not in supported_flags("4.40.0", mine)
    assert "bf16" in supported_flags("4.40.0", m)


def test_a_new_major_transformers_gets_no_flags_and_a_note(m):
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
    assert any(f"data ends at transformers {NEWEST_TRANSFORMERS}" in n and "CPUPERF_COMPAT_DIR" in n for n in rep["notes"])


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


# --------------------------------------------------------------------------- doctor: data older than the install


def _doctor(tmp_path, packages):
    root = make_host(tmp_path, sockets=1, cores_per_socket=4, flags=SPR, model=143)
    rep, _ = run_json(["doctor", "--sysroot", str(root)], {"CPUPERF_OVERRIDE_PACKAGES": json.dumps(packages)},
                      expect_rc=None)
    return {f["id"]: f for f in rep["findings"]}


def test_doctor_says_nothing_when_the_data_covers_the_install(tmp_path):
    found = _doctor(tmp_path, {"torch": "2.13.0+cpu", "transformers": NEWEST_TRANSFORMERS,
                               "accelerate": NEWEST_ACCELERATE})
    assert not [k for k in found if "than-data" in k or "outside-data" in k]


def test_doctor_says_when_the_install_is_newer_than_the_data_and_what_cpuperf_does(tmp_path, m):
    newest_torch = m.torch[-1].version
    newer_torch = f"{newest_torch.major}.{newest_torch.minor + 1}.0+cpu"
    found = _doctor(tmp_path, {"torch": newer_torch, "transformers": "5.25.0", "accelerate": "2.0.0"})
    torch = found["torch-newer-than-data"]
    assert f"data ends at torch {newest_torch}" in torch["message"] and newer_torch in torch["message"]
    tf = found["transformers-newer-than-data"]
    assert tf["severity"] == "info" and f"data ends at transformers {NEWEST_TRANSFORMERS}" in tf["message"]
    assert "carried over" in tf["message"] and "deprecated or removed" in tf["message"]
    acc = found["accelerate-newer-than-data"]
    assert acc["severity"] == "warning" and "new major" in acc["message"] and "renders no" in acc["message"]
    assert all("regen_compat" in f["fix"] and "CPUPERF_COMPAT_DIR" in f["fix"] for f in (torch, tf, acc))


def test_doctor_on_a_patch_release_past_the_data(tmp_path):
    found = _doctor(tmp_path, {"torch": "2.13.0+cpu", "transformers": "5.24.2"})
    f = found["transformers-newer-than-data"]
    assert "patch release" in f["message"] and "used as they are" in f["message"]


def test_the_installed_transformers_accepts_every_rendered_flag_without_a_deprecation_warning(tmp_path):
    transformers = pytest.importorskip("transformers")
    import importlib.metadata
    import warnings

    version = importlib.metadata.version("transformers")
    values = {"device": "cpu", "dtype": "bf16", "grad_checkpointing": True, "compile": True, "ipex": False,
              "batch_size": 4, "grad_accum_steps": 2, "dataloader_workers": 2, "optimizer": "adamw_fused"}
    overridden = {"dtype", "grad_checkpointing", "compile", "batch_size", "grad_accum_steps", "optimizer"}
    flags, _ = speed_flags(levers(values, overridden), FlagContext(version, "2.13.0+cpu", 1, TUNING))
    args = [a for f in flags for a in f.args]
    assert args, f"nothing rendered for transformers {version}"
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated spelling warns at parse time
        (parsed,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), *args])
    if "--activation_checkpointing" in args:
        assert parsed.activation_checkpointing is True
    elif "--gradient_checkpointing" in args:
        assert parsed.gradient_checkpointing is True
    else:
        raise AssertionError(f"no checkpointing flag rendered: {args}")


def test_a_newer_accelerate_minor_gets_the_carried_over_config_with_the_note(tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    rep = _recommend(tmp_path, "1.16.0")
    text = rep["accelerate_config"]
    assert text.startswith("# accelerate 1.16.0 is newer than cpuperf's data (data ends at accelerate 1.15.0")
    assert "use_cpu: true" in text and "ipex_config" not in text
    assert rep["accelerate_launch_args"][0] == "--num_cpu_threads_per_process"
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    assert config_args.load_config_from_file(str(path)).use_cpu is True  # the installed loader takes it


def test_a_rename_recorded_in_extra_data_is_followed_even_to_an_option_cpuperf_has_no_id_for(tmp_path):
    extra = tmp_path / "compat"
    extra.mkdir()
    (extra / "hf-local.toml").write_text(
        '[[hf]]\npackage = "transformers"\nname = "use_cpu"\nkind = "trainer-arg"\nintroduced = "4.32.0"\n'
        'deprecated = "5.23.0"\nreplacement = "--cpu_only"\nverified = true\nsource = "a local release note"\n\n'
        '[[hf]]\npackage = "transformers"\nname = "cpu_only"\nkind = "trainer-arg"\nintroduced = "5.23.0"\n'
        'verified = true\nsource = "a local release note"\n')
    root = make_host(tmp_path / "host", sockets=1, cores_per_socket=4, flags=SPR, model=143)
    for release, want, not_want in (("5.23.0", "--cpu_only", "--use_cpu"), ("5.22.0", "--use_cpu", "--cpu_only"),
                                    ("5.24.0", "--cpu_only", "--use_cpu")):
        pk = json.dumps({"torch": "2.13.0+cpu", "transformers": release})
        rep, _ = run_json(["recommend", "--sysroot", str(root)],
                          {"CPUPERF_OVERRIDE_PACKAGES": pk, "CPUPERF_COMPAT_DIR": str(extra)})
        assert want in rep["hf_args"] and not_want not in rep["hf_args"], (release, rep["hf_args"])


@pytest.mark.parametrize("release,rendered", [("5.23.0", True), ("5.24.0", True), ("5.24.1", True), ("5.25.0", True),
                                              ("5.30.2", True),
                                              ("6.0.0", False)])
def test_recommend_json_keeps_the_speed_flags_for_a_release_just_past_the_data(tmp_path, release, rendered):
    root = make_host(tmp_path, sockets=1, cores_per_socket=8, flags=SPR, model=143)
    pk = json.dumps({"torch": "2.13.0+cpu", "transformers": release})
    rep, _ = run_json(["recommend", "--sysroot", str(root), "--set", "dtype=bf16"], {"CPUPERF_OVERRIDE_PACKAGES": pk})
    assert ("--use_cpu" in rep["hf_args"] and "--bf16" in rep["hf_args"]) is rendered, rep["hf_args"]
    if not rendered:
        assert rep["hf_args"] == []
    notes = [n for n in rep["notes"] if f"data ends at transformers {NEWEST_TRANSFORMERS}" in n]
    assert bool(notes) is (Version(release) > Version(NEWEST_TRANSFORMERS))
