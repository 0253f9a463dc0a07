"""tools/regen_compat.py: the committed compat/ data equals what the recorded primary inputs give, the
extractors read the real installed sources the same way, and a drift or a new kernel model is reported.
The live mode (network) is never run here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from tools import regen_compat as rc

ROOT = Path(__file__).resolve().parent.parent


def test_committed_data_equals_the_recorded_inputs():
    report = rc.check()
    assert report.changes == [], "\n".join(report.lines())
    assert report.missing == [], "\n".join(report.lines())


def test_the_check_command_exits_0_on_the_committed_data():
    for extra in ([], ["--check"]):  # tests/run.sh (CI) runs the --check form
        proc = subprocess.run([sys.executable, "-m", "tools.regen_compat", *extra], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "equals what the recorded inputs give" in proc.stderr


def test_check_fails_on_a_drifted_row_and_on_a_row_the_data_lacks(tmp_path):
    fixtures = tmp_path / "fx"
    shutil.copytree(rc.FIXTURES, fixtures)
    wheels = fixtures / "torch_wheels.txt"
    wheels.write_text(wheels.read_text() + "\ntorch-9.9.0-cp311-cp311-manylinux_2_28_x86_64.whl\n")
    proc = subprocess.run([sys.executable, "-m", "tools.regen_compat", "--check", "--fixtures", str(fixtures)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "not in the data: torch 9.9.0" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "tools.regen_compat", "--check", "--write"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--check compares only" in proc.stderr


def _copy(tmp_path):
    compat = tmp_path / "compat"
    shutil.copytree(ROOT / "compat", compat)
    return compat


def test_a_drifted_row_is_reported_and_rewritten(tmp_path):
    compat = _copy(tmp_path)
    hf = compat / "hf.toml"
    text = hf.read_text()
    drifted = text.replace('name = "bf16"\nkind = "trainer-arg"\nintroduced = "4.13.0"',
                           'name = "bf16"\nkind = "trainer-arg"\nintroduced = "4.10.0"')
    assert drifted != text
    hf.write_text(drifted)
    (compat / "microarch.toml").write_text((compat / "microarch.toml").read_text().replace("models = [213]",
                                                                                        "models = [212]"))
    texts, report = rc.regenerate(compat, rc.FIXTURES)
    fields = {(c.file, c.field, c.old, c.new) for c in report.changes}
    assert ("hf.toml", "introduced", '"4.10.0"', '"4.13.0"') in fields
    assert ("microarch.toml", "models", "[212]", "[213]") in fields
    assert texts["hf.toml"] == text  # the rewrite restores exactly the committed text


def test_a_new_kernel_model_is_reported(tmp_path):
    fixtures = tmp_path / "fx"
    shutil.copytree(rc.FIXTURES, fixtures)
    header = fixtures / "intel-family.h"
    header.write_text(header.read_text().replace("/* \"Small Core\"",
                                                 "#define INTEL_RAZORLAKE\t\t\tIFM(18, 0x05)\n\n/* \"Small Core\"", 1))
    report = rc.check(ROOT / "compat", fixtures)
    assert any("INTEL_RAZORLAKE IFM(18, 0x05)" in m for m in report.missing)


def test_every_intel_define_is_mapped_or_deliberately_ignored():
    _, unknown = rc.intel_models((rc.FIXTURES / "intel-family.h").read_text())
    assert unknown == []
    parsed = rc.parse_intel_family((rc.FIXTURES / "intel-family.h").read_text())
    assert ("NOVALAKE", 18, 0x01) in parsed and ("DIAMONDRAPIDS_X", 19, 0x01) in parsed


def test_amd_switch_parses_to_the_kernel_generations():
    ranges = rc.amd_ranges((rc.FIXTURES / "amd-zen.c").read_text())
    assert ranges[("zen", 0x17)] == [[0x00, 0x2f], [0x50, 0x5f]]
    assert ranges[("zen6", 0x1a)] == [[0x50, 0x5f], [0x80, 0xaf], [0xc0, 0xcf]]
    assert set(ranges) == {("zen", 0x17), ("zen2", 0x17), ("zen3", 0x19), ("zen4", 0x19), ("zen5", 0x1a),
                           ("zen6", 0x1a)}


def _records(name):
    return json.loads((rc.FIXTURES / name).read_text())["releases"]


def test_the_installed_transformers_reads_as_recorded():
    transformers = pytest.importorskip("transformers")
    import importlib.metadata

    version = importlib.metadata.version("transformers")
    records = _records("transformers_training_args.json")
    if version not in records:
        pytest.skip(f"transformers {version} is not a recorded release")
    source = Path(transformers.__file__).with_name("training_args.py").read_text()
    assert rc.extract_training_args(source, rc._tracked()) == records[version]


def test_the_installed_accelerate_reads_as_recorded():
    pytest.importorskip("accelerate")
    import importlib.metadata
    import importlib.util

    version = importlib.metadata.version("accelerate")
    records = _records("accelerate_config_args.json")
    if version not in records:
        pytest.skip(f"accelerate {version} is not a recorded release")
    spec = importlib.util.find_spec("accelerate.commands.config.config_args")
    assert spec is not None and spec.origin is not None
    assert rc.extract_config_keys(Path(spec.origin).read_text()) == records[version]


def test_deprecations_are_read_from_the_sources():
    records = _records("transformers_training_args.json")
    assert "gradient_checkpointing" in records["5.23.0"]["deprecated"]
    assert "activation_checkpointing" in records["5.23.0"]["present"]
    assert "activation_checkpointing" not in records["5.22.2"]["present"]
    assert "no_cuda" in records["4.32.0"]["deprecated"] and "no_cuda" not in records["4.31.0"]["deprecated"]
    assert "use_ipex" in records["4.53.0"]["deprecated"] and "use_ipex" not in records["4.57.0"]["present"]


def test_derive_ranges_edges():
    recs = {"1.0.0": {"present": []}, "1.1.0": {"present": ["a"]}, "1.2.0": {"present": ["a"], "deprecated": ["a"]},
            "1.10.0": {"present": []}}
    assert rc.derive_ranges(recs, "a") == ("1.1.0", "1.2.0", "1.10.0")  # versions sort as versions, not text
    assert rc.derive_ranges(recs, "b") == (None, None, None)


def test_torch_wheel_names_give_python_tags():
    names = ["torch-1.10.0-cp36-cp36m-manylinux1_x86_64.whl", "torch-2.9.0-cp314-cp314t-manylinux_2_28_aarch64.whl",
             "torch-2.9.0-cp313-cp313-manylinux_2_28_x86_64.whl", "torch-2.9.0-cp313-cp313-win_amd64.whl"]
    got = rc.torch_pythons(names)
    assert got["1.10.0"] == {"linux_x86_64": ["3.6"]}
    assert got["2.9.0"] == {"linux_aarch64": ["3.14t"], "linux_x86_64": ["3.13"]}
    assert Version("2.9.0") in {Version(v) for v in got}


def _newest_and_next_minor():
    newest = max(_records("transformers_training_args.json"), key=Version)
    v = Version(newest)
    return newest, f"{v.major}.{v.minor + 1}.0"


def test_a_newer_recorded_release_moves_the_data_end(tmp_path):
    newest, later = _newest_and_next_minor()
    fixtures = tmp_path / "fx"
    shutil.copytree(rc.FIXTURES, fixtures)
    path = fixtures / "transformers_training_args.json"
    data = json.loads(path.read_text())
    data["releases"][later] = data["releases"][newest]
    path.write_text(json.dumps(data))
    report = rc.check(ROOT / "compat", fixtures)
    assert any(c.field == "through" and c.new == f'"{later}"' for c in report.changes), report.lines()


def test_the_hf_data_end_is_the_newest_recorded_transformers():
    from cpuperf.knowledge.matrix import load_matrix

    newest, _ = _newest_and_next_minor()
    assert Version(newest) >= Version("5.24.0")  # issue 63: 5.24.0 recorded
    ends = {str(d.package): str(d.through) for d in load_matrix(environ={}).hf_data}
    assert ends["transformers"] == newest


def test_an_installed_release_is_recorded_as_its_minor(tmp_path):
    pytest.importorskip("transformers")
    _, source = rc.installed_wheel_file("transformers", "transformers/training_args.py")
    _, later = _newest_and_next_minor()
    fixtures = tmp_path / "fx"
    shutil.copytree(rc.FIXTURES, fixtures)
    rc.record_transformers_release(fixtures, Version(later), source, rc._tracked(), "a test")
    args = json.loads((fixtures / "transformers_training_args.json").read_text())["releases"]
    optims = json.loads((fixtures / "transformers_default_optim.json").read_text())
    assert args[later] == rc.extract_training_args(source, rc._tracked())
    assert optims["releases"][later] == rc.extract_default_optim(source) and optims["source"].endswith(f"{later} a test")
    assert list(args) == sorted(args, key=Version)  # kept in release order, as --live writes them
    assert set(args) - {later} == set(_records("transformers_training_args.json"))  # nothing else moved
    report = rc.check(ROOT / "compat", fixtures)
    assert any(c.field == "through" and c.new == f'"{later}"' for c in report.changes), report.lines()
    for not_first in (f"{Version(later).major}.{Version(later).minor}.1", f"{later}rc1", f"{later}+local"):
        with pytest.raises(rc.NotAWheelRelease, match="x.y.0"):
            rc.record_transformers_release(fixtures, Version(not_first), source, rc._tracked(), "a test")


def _fake_dist(site: Path, body: bytes, record_hash: str | None) -> Path:
    import base64
    import hashlib

    (site / "fakepkg").mkdir(parents=True)
    target = site / "fakepkg" / "mod.py"
    target.write_bytes(body)
    info = site / "fakepkg-1.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.2.0\n")
    digest = record_hash if record_hash is not None else \
        "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"fakepkg/mod.py,{digest},{len(body)}\nfakepkg-1.2.0.dist-info/RECORD,,\n")
    return target


def test_only_the_wheels_own_file_is_recorded(tmp_path):
    target = _fake_dist(tmp_path / "site", b"x = 1\n", None)
    assert rc.installed_wheel_file("fakepkg", "fakepkg/mod.py", [str(tmp_path / "site")]) == (Version("1.2.0"), "x = 1\n")
    target.write_bytes(b"x = 2\n")  # edited after installing
    with pytest.raises(rc.NotAWheelRelease, match="differs from the wheel"):
        rc.installed_wheel_file("fakepkg", "fakepkg/mod.py", [str(tmp_path / "site")])
    _fake_dist(tmp_path / "bare", b"x = 1\n", "")  # no hash: not from a wheel
    with pytest.raises(rc.NotAWheelRelease, match="no sha256"):
        rc.installed_wheel_file("fakepkg", "fakepkg/mod.py", [str(tmp_path / "bare")])
    with pytest.raises(ImportError):
        rc.installed_wheel_file("fakepkg", "fakepkg/mod.py", [str(tmp_path / "nowhere")])


def test_the_installed_transformers_option_refuses_to_combine_with_check():
    proc = subprocess.run([sys.executable, "-m", "tools.regen_compat", "--check", "--installed-transformers"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--installed-transformers" in proc.stderr


def test_the_fused_adamw_default_is_derived_from_the_recorded_releases(tmp_path):
    records = _records("transformers_default_optim.json")
    assert records["4.53.0"]["fused_with_torch"] is None and records["4.54.0"]["fused_with_torch"] == "2.8"
    assert rc.derive_fused_default(records) == ("4.54", "2.8")
    # The edge must sit between two adjacent recorded minors, else it is not derived.
    assert rc.derive_fused_default({k: v for k, v in records.items() if k != "4.53.0"}) == (None, None)
    compat = _copy(tmp_path)
    tuning = compat / "tuning.toml"
    text = tuning.read_text()
    tuning.write_text(text.replace('default_fused_min_transformers = "4.54"', 'default_fused_min_transformers = "5.0"'))
    texts, report = rc.regenerate(compat, rc.FIXTURES)
    assert ("tuning.toml", "default_fused_min_transformers", '"5.0"', '"4.54"') in {
        (c.file, c.field, c.old, c.new) for c in report.changes}
    assert texts["tuning.toml"] == text


def test_the_installed_transformers_default_optim_reads_as_recorded():
    transformers = pytest.importorskip("transformers")
    import importlib.metadata

    version = importlib.metadata.version("transformers")
    records = _records("transformers_default_optim.json")
    if version not in records:
        pytest.skip(f"transformers {version} is not a recorded release")
    source = Path(transformers.__file__).with_name("training_args.py").read_text()
    assert rc.extract_default_optim(source) == records[version]


def test_check_upstream_names_newer_inputs_and_what_the_data_would_change(tmp_path):
    newest, later = _newest_and_next_minor()

    def newer_transformers(scratch):  # stands in for the network recorder: the next minor appears upstream
        path = scratch / "transformers_training_args.json"
        data = json.loads(path.read_text())
        data["releases"][later] = data["releases"][newest]
        path.write_text(json.dumps(data))

    report, moved = rc.check_upstream(rc.FIXTURES, [newer_transformers])
    assert moved == ["transformers_training_args.json"]
    assert any(c.field == "through" and c.new == f'"{later}"' for c in report.changes), report.lines()
    assert rc._print_upstream(report, moved) == 1
    report, moved = rc.check_upstream(rc.FIXTURES, [])
    assert moved == [] and report.changes == [] and rc._print_upstream(report, moved) == 0
    assert later not in _records("transformers_training_args.json")  # scratch only


def test_oneccl_rows_are_the_release_tags_of_torch_ccl(tmp_path):
    releases = rc.ccl_releases((rc.FIXTURES / "torch_ccl_tags.txt").read_text().splitlines())
    assert releases[("2.5.0", "xpu")] == "+xpu" and ("2.5.1", "xpu") not in releases
    assert releases[("1.13.200", "xpu")] == "+gpu" and releases[("2.4.0", "cpu")] == ""  # 2.4.0: only an rc0 tag
    assert ("1.2.0", "cpu") not in releases  # before the names the data covers
    # The old rows are what the check would have caught: a 2.5.1 XPU row, no 1.13.200 row.
    compat = _copy(tmp_path)
    oneccl = compat / "oneccl.toml"
    text = oneccl.read_text()
    start = text.index('[[oneccl]]\nversion = "1.13.200"')
    old = text[:start] + text[text.index("[[oneccl]]", start + 1):]
    oneccl.write_text(old.replace('version = "2.5.0"\ndevice = "xpu"', 'version = "2.5.1"\ndevice = "xpu"'))
    report = rc.check(compat, rc.FIXTURES)
    assert "oneccl.toml 2.5.1 (xpu): no release tag of intel/torch-ccl" in report.missing
    assert "intel/torch-ccl v1.13.200 (xpu): a release tag oneccl.toml has no row for" in report.missing
    assert "intel/torch-ccl v2.5.0 (xpu): a release tag oneccl.toml has no row for" in report.missing


def test_torch_ccl_tags_are_recorded_from_a_real_clone(tmp_path):
    repo = tmp_path / "torch-ccl"
    repo.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env, timeout=60)

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "r")
    for tag in ("v2.7.0+cpu", "v2.8.0+xpu", "v2.9.0+xpu+rc0"):
        git("tag", tag)
    fixtures = tmp_path / "fx"
    fixtures.mkdir()
    rc.record_torch_ccl(fixtures, repo)
    lines = (fixtures / "torch_ccl_tags.txt").read_text().splitlines()
    assert lines[0].startswith("# Recorded input") and [ln.split("\t")[0] for ln in lines[2:]] == \
        ["v2.7.0+cpu", "v2.8.0+xpu", "v2.9.0+xpu+rc0"]
    assert rc.ccl_releases(lines) == {("2.7.0", "cpu"): "", ("2.8.0", "xpu"): "+xpu", ("2.9.0", "xpu"): "+xpu"}


def test_ipex_registry_state_is_derived_from_the_recorded_files(tmp_path):
    wheels = rc.ipex_wheels((rc.FIXTURES / "ipex_wheels.txt").read_text().splitlines())
    assert wheels["2.8.0"].yanked is False and "3.13" in wheels["2.8.0"].python
    assert wheels["1.11.0"].yanked is True
    compat = _copy(tmp_path)
    ipex = compat / "ipex.toml"
    text = ipex.read_text()
    start = text.index('version = "2.8.0"')
    drifted = text[:start] + text[start:].replace("pypi_yanked = false", "pypi_yanked = true", 1)
    drifted = drifted.replace('python = ["3.9", "3.10", "3.11", "3.12", "3.13"]\npypi = true\npypi_yanked = true',
                              'python = ["3.9", "3.10", "3.11", "3.12"]\npypi = true\npypi_yanked = true', 1)
    ipex.write_text(drifted)
    texts, report = rc.regenerate(compat, rc.FIXTURES)
    assert ("ipex.toml", "[[ipex]] \"2.8.0\"", "pypi_yanked", "true", "false") in {
        (c.file, c.row, c.field, c.old, c.new) for c in report.changes}, report.lines()
    assert "ipex.toml 2.8.0: the registry has a CPython 3.13 wheel the row lacks" in report.missing


def test_ipex_wheel_lines_parse_with_and_without_the_yanked_mark():
    lines = ["# header", "intel_extension_for_pytorch-2.8.0-cp313-cp313-manylinux_2_28_x86_64.whl",
             "intel_extension_for_pytorch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl\tyanked",
             "intel_extension_for_pytorch-2.7.0-cp311-cp311-win_amd64.whl"]
    assert rc.ipex_wheels(lines) == {"2.8.0": rc.IpexFiles(["3.12", "3.13"], False)}


def test_accelerate_launch_flags_and_backend_values_are_derived():
    records = _records("accelerate_options.json")
    assert rc.derive_ranges(records, "ccl") == ("0.4.0", None, "1.13.0")  # never warned about, removed in 1.13
    assert rc.derive_ranges(records, "--ipex") == ("0.20.0", "1.8.0", "1.10.0")  # launch.py warns from 1.8.0
    launch = ('p.add_argument("--ipex", action="store_true", help="use IPEX")\n'
              'if args.ipex is not None:\n    logger.warning("ipex flag is deprecated, will be removed")\n')
    state = 'if backend in (None, "ccl"):\n    backend = "ccl"\n'
    assert rc.extract_accelerate_options(launch, state, ["--ipex", "ccl", "--gone"]) == \
        {"present": ["--ipex", "ccl"], "deprecated": ["--ipex"]}
    assert rc.extract_accelerate_options("", 'backend = "nccl"\n', ["ccl"])["present"] == []


def test_the_installed_accelerate_options_read_as_recorded():
    pytest.importorskip("accelerate")
    import importlib.metadata
    import importlib.util

    version = importlib.metadata.version("accelerate")
    records = _records("accelerate_options.json")
    if version not in records:
        pytest.skip(f"accelerate {version} is not a recorded release")
    spec = importlib.util.find_spec("accelerate")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    got = rc.extract_accelerate_options((root / "commands" / "launch.py").read_text(), (root / "state.py").read_text(),
                                        rc._tracked_accelerate())
    assert got == records[version]
