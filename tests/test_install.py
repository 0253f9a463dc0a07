"""`cpuperf install`: real pip, real venvs, a PEP 503 index served over loopback with tiny wheels.

pip is isolated from this machine's configuration (PIP_CONFIG_FILE=/dev/null, no PIP_* variables,
a private cache), so nothing here can reach the public registry or pull a real torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict

import pytest
from cli_util import cli_env, run_cli
from pkgindex import REPO, cli, hermetic_env, pip_freeze, serve, torch_wheel, write_index

from cpuperf.plan import install as ip


@pytest.fixture
def used_env(torch26_venv):
    """A venv that already holds torch 2.6.0+cpu and another package (restored after each test; conftest.py)."""
    return torch26_venv


def ok_json(proc, rc=0):
    assert rc is None or proc.returncode == rc, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------- end to end


@pytest.mark.smoke("install")  # real pip into a new venv, from the loopback index
def test_fresh_venv_install_and_lock_round_trip(tmp_path, index, pip_home):
    venv = tmp_path / "new"
    lock = tmp_path / "cluster.lock.txt"
    proc = cli(["install", "--venv", str(venv), "--index-url", index.good, "--torch", "2.7.0",
                "--with", "ipex,oneccl", "--yes", "--json", "--write-lock", str(lock)], pip_home, process=True)
    data = ok_json(proc)
    assert data["schema"] == "cpuperf.install/1"
    assert data["result"]["status"] == "installed"
    names = {p["name"]: p["version"] for p in data["packages"]}
    assert names == {"torch": "2.7.0+cpu", "intel_extension_for_pytorch": "2.7.0", "oneccl_bind_pt": "2.7.0+cpu",
                     "cmeel-mimalloc": "3.4.3"}
    assert all(p["source"] == index.good for p in data["packages"])
    assert data["index_urls"] == [index.good]
    assert data["argv"][:3] == [str(venv / "bin" / "python"), "-m", "pip"]
    assert data["result"]["verify"]["ok"] is True
    freeze = pip_freeze(str(venv / "bin" / "python"), pip_home)
    assert "torch==2.7.0+cpu" in freeze and "oneccl-bind-pt==2.7.0+cpu" in freeze.replace("_", "-")

    # the lock pins the same set, with hashes; a second node plans exactly it
    text = lock.read_text()
    assert "torch==2.7.0+cpu" in text and "--hash=sha256:" in text
    other = tmp_path / "other"
    proc = cli(["install", "--venv", str(other), "--index-url", index.good, "--from-lock", str(lock),
                "--dry-run", "--json"], pip_home)
    again = ok_json(proc)
    assert {p["name"]: p["version"] for p in again["packages"]} == names
    assert "--no-deps" in again["argv"] and "--require-hashes" in again["argv"]
    assert not other.exists()  # a dry run creates nothing


@pytest.mark.full  # real pip
def test_a_fresh_venv_after_install_offers_an_allocator(tmp_path, index, pip_home):
    """No root: the allocator wheel lands in the venv's site-packages; the probe finds it there and
    `recommend` has it to measure (`cpuperf bench`) and preload."""
    venv = tmp_path / "fresh"
    data = ok_json(cli(["install", "--venv", str(venv), "--index-url", index.good, "--torch", "2.7.0", "--yes",
                        "--json"], pip_home))
    assert ("cmeel-mimalloc", "3.4.3") in [(p["name"], p["version"]) for p in data["packages"]]
    doctor = ok_json(cli(["doctor", "--json", "--python", str(venv / "bin" / "python")], pip_home), rc=None)
    libs = doctor["software"]["allocators"]["mimalloc"]
    assert libs and all(Path(p).is_file() and str(venv) in p for p in libs), libs
    assert any(p.endswith("cmeel.prefix/lib/libmimalloc.so") for p in libs)
    with open(libs[0], "rb") as fh:
        assert fh.read(4) == b"\x7fELF"  # a shared library the loader can preload
    # The README's `cpuperf install --yes` again: every package "keep", so no pip install runs (only pip's dry run
    # that finds out), nothing changes; it says so.
    before = pip_freeze(str(venv / "bin" / "python"), pip_home)
    again = ok_json(cli(["install", "--venv", str(venv), "--index-url", index.good, "--torch", "2.7.0", "--yes",
                         "--json"], pip_home))
    assert again["result"]["status"] == "unchanged" and {p["action"] for p in again["packages"]} == {"keep"}
    assert {p["name"] for p in again["packages"]} >= {"torch", "cmeel-mimalloc"}
    text = cli(["install", "--venv", str(venv), "--index-url", index.good, "--torch", "2.7.0", "--yes"], pip_home)
    assert text.returncode == 0 and text.stdout.startswith("nothing to do: "), text.stderr
    assert "installing with pip" not in text.stderr and "torch 2.7.0+cpu" in text.stdout
    assert pip_freeze(str(venv / "bin" / "python"), pip_home) == before


def test_no_allocator_wheel_where_no_source_offers_it(tmp_path, pip_home, index):
    """An index without the wheel still installs torch: the allocator is skipped with a note."""
    root = tmp_path / "www"
    write_index(root / "plain", [index.wheels / "torch-2.7.0+cpu-py3-none-any.whl"])
    server = serve(root)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/plain/simple"
        data = ok_json(cli(["install", "--venv", str(tmp_path / "v"), "--index-url", url, "--torch", "2.7.0",
                            "--dry-run", "--json"], pip_home))
    finally:
        server.shutdown()
    assert [p["name"] for p in data["packages"]] == ["torch"]
    assert any("cmeel-mimalloc" in n for n in data["notes"])


@pytest.mark.full  # pip asked 8 times
def test_cpu_dry_run_plans_cpu_build_without_nvidia(tmp_path, index, pip_home):
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", index.good, "--dry-run", "--json"],
               pip_home)
    data = ok_json(proc)
    # no --torch and nothing installed: the newest +cpu build the source really has
    assert [(p["name"], p["version"]) for p in data["packages"]] == [("torch", "2.7.0+cpu"), ("cmeel-mimalloc", "3.4.3")]
    assert data["device"] == "cpu"
    assert not any(p["name"].startswith("nvidia") for p in data["packages"])
    # human mode: the plan is the product on stdout, commentary on stderr
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", index.good, "--dry-run"], pip_home)
    assert proc.returncode == 0, proc.stderr
    assert "2.7.0+cpu" in proc.stdout and "pip: " in proc.stdout and "--index-url " + index.good in proc.stdout
    assert "asking pip" in proc.stderr and "asking pip" not in proc.stdout


@pytest.mark.full  # real pip
def test_install_says_the_python_is_past_its_end_of_life_before_it_plans(tmp_path, index, pip_home):
    """The same words as doctor's python-end-of-life finding, on stderr before pip is asked; the plan (stdout) is
    unchanged. A Python with nothing to say gets no line."""
    args = ["install", "--venv", str(tmp_path / "v"), "--index-url", index.good, "--dry-run"]
    proc = cli(args, pip_home, {"CPUPERF_OVERRIDE_PYTHON": "3.10", "CPUPERF_OVERRIDE_TODAY": "2026-11-28"})
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())  # the warning wrapped to COLUMNS, read as one line
    at = said.index("Python 3.10 reached its end of life on 2026-10-31 (PEP 619)")
    assert "the newest torch with a linux_x86_64 wheel for it is 2.14.1" in said
    assert at < said.index("asking pip")
    assert "end of life" not in proc.stdout and "2.7.0+cpu" in proc.stdout
    quiet = cli(args, pip_home, {"CPUPERF_OVERRIDE_PYTHON": "3.13", "CPUPERF_OVERRIDE_TODAY": "2026-11-28"})
    assert quiet.returncode == 0 and "end of life" not in quiet.stderr


def test_gpu_host_gets_the_cuda_build_for_its_driver(tmp_path, index, pip_home):
    gpus = json.dumps([{"name": "NVIDIA A100", "compute_capability": "8.0", "memory_bytes": 85899345920,
                        "driver_version": "550.54.15"}])
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", index.good, "--torch", "2.7.0",
                "--dry-run", "--json"], pip_home, {"CPUPERF_OVERRIDE_GPUS": gpus})
    data = ok_json(proc)
    # torch 2.7 comes as cu118, cu126, cu128; driver 550 runs CUDA 12.x by minor-version compatibility
    assert data["device"] == "cuda" and data["cuda"] == "cu128"
    assert data["requirements"] == ["torch==2.7.0+cu128"]
    # without --torch: the newest build the driver runs, from what the source offers
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", index.good, "--dry-run", "--json"],
               pip_home, {"CPUPERF_OVERRIDE_GPUS": gpus})
    assert ok_json(proc)["requirements"] == ["torch==2.7.0+cu128"]


@pytest.fixture(scope="module")
def cu13_index(tmp_path_factory):
    """torch as the real indexes serve it around 2.15.0: 2.15.0 built for CUDA 13.0/13.2 only (plus the registry's
    plain build), 2.14.1 also for CUDA 12.6."""
    base = tmp_path_factory.mktemp("cu13")
    wheels = base / "wheels"
    wheels.mkdir()
    built = [torch_wheel(wheels, v) for v in ("2.15.0+cu132", "2.15.0+cu130", "2.14.1+cu132", "2.14.1+cu126")]
    plain = wheels / "plain"
    plain.mkdir()
    built.append(torch_wheel(plain, "2.15.0"))
    write_index(base / "www" / "cu13", built)
    server = serve(base / "www")
    yield f"http://127.0.0.1:{server.server_address[1]}/cu13/simple"
    server.shutdown()


def _gpu_host(driver: str) -> Dict[str, str]:
    return {"CPUPERF_OVERRIDE_GPUS": json.dumps([{"name": "NVIDIA A100", "compute_capability": "8.0",
                                                  "memory_bytes": 85899345920, "driver_version": driver}])}


@pytest.mark.full  # pip asked 8 times
def test_a_driver_older_than_the_newest_torch_needs_gets_the_newest_torch_it_runs(tmp_path, cu13_index, pip_home):
    """The real data: torch 2.15.0 builds only cu130/cu132 (CUDA 13.x needs driver >= 580), 2.14.1 still cu126."""
    args = ["install", "--venv", str(tmp_path / "v"), "--index-url", cu13_index, "--dry-run", "--json"]
    data = ok_json(cli(args, pip_home, _gpu_host("570.86.10")))
    assert data["requirements"] == ["torch==2.14.1+cu126"]
    assert any("torch 2.15.0 builds only cu130, cu132" in n and "planning torch 2.14.1" in n for n in data["notes"])
    # a driver for CUDA 13: the newest torch, its newest CUDA
    assert ok_json(cli(args, pip_home, _gpu_host("580.65.06")))["requirements"] == ["torch==2.15.0+cu132"]
    # pinned to 2.15 on the old driver: refused, naming the release that has a build
    proc = cli([*args, "--torch", "2.15.0"], pip_home, _gpu_host("570.86.10"))
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert "580" in err["message"] and "--torch 2.14.1" in err["hint"]
    # a driver too old for every build the data lists: one line naming the newest release's need
    proc = cli(args, pip_home, _gpu_host("418.40"))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert "torch 2.15.0 builds cu130, cu132" in json.loads(proc.stdout)["error"]["message"]


@pytest.mark.full  # pip asked 8 times
def test_plan_pulling_nvidia_on_cpu_host_is_refused(tmp_path, index, pip_home):
    args = ["install", "--venv", str(tmp_path / "v"), "--index-url", index.cuda, "--torch", "2.7.0", "--dry-run",
            "--json"]
    proc = cli(args, pip_home)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert "nvidia-cublas-cu12" in err["message"] and "--allow-cuda-torch" in err["hint"]
    data = ok_json(cli([*args, "--allow-cuda-torch"], pip_home))
    assert {p["name"] for p in data["packages"]} == {"torch", "nvidia-cublas-cu12"}


def test_unreachable_index_fails_fast(tmp_path, pip_home):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/simple"
    start = time.monotonic()
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", url, "--dry-run", "--json"], pip_home)
    assert time.monotonic() - start < 10
    assert proc.returncode == 7, (proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert url in err["message"] and "--download" in err["hint"] and "--find-links" in err["hint"]
    assert "error: the index" in proc.stderr


def test_no_tty_and_no_yes_refuses_without_hanging(tmp_path, index, pip_home):
    proc = cli(["install", "--venv", str(tmp_path / "v"), "--index-url", index.good], pip_home, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "--yes" in proc.stderr
    assert not (tmp_path / "v").exists()


@pytest.mark.full  # real pip
def test_pip_failure_restores_the_environment(used_env, index, pip_home):
    before = pip_freeze(used_env, pip_home)
    proc = cli(["install", "--python", used_env, "--index-url", index.badinstall, "--torch", "2.7.0",
                "--with", "ipex", "--yes"], pip_home)
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    line = proc.stderr.split("error: ", 1)[1].splitlines()[0]
    # pip's real cause and what became of the environment, on the error line itself
    assert "the environment was restored to its previous state: " in line and "The wheel" in line, line
    assert "pip.log" in proc.stderr
    assert pip_freeze(used_env, pip_home) == before
    # torch 2.6.0+cpu is not on that index: the stash rebuilt its wheel from the installed files
    stashed = list((pip_home / "cache" / "cpuperf" / "installs").glob("*/stash/torch-2.6.0+cpu-*.whl"))
    assert stashed


@pytest.mark.full  # real pip
def test_verification_failure_restores_the_environment(used_env, index, pip_home):
    before = pip_freeze(used_env, pip_home)
    proc = cli(["install", "--python", used_env, "--index-url", index.badverify, "--torch", "2.7.0",
                "--with", "ipex", "--yes", "--json"], pip_home)
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert "verification failed" in err["message"] and "restored" in err["message"]
    assert "exit code 127" in err["message"]
    assert pip_freeze(used_env, pip_home) == before


@pytest.mark.full  # real pip, a real SIGINT
def test_ctrl_c_restores_the_environment(used_env, index, pip_home):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) after pip changed the env."""
    before = pip_freeze(used_env, pip_home)
    env = cli_env(hermetic_env(pip_home))
    env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    env.update({k: v for k, v in hermetic_env(pip_home).items() if k.startswith("PIP_")})
    proc = subprocess.Popen([sys.executable, "-m", "cpuperf", "install", "--python", used_env, "--index-url",
                             index.sleepy, "--torch", "2.7.0", "--with", "ipex", "--yes"], cwd=str(REPO), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("verifying"):
                time.sleep(1.0)  # the import of the add-on is under way (it sleeps)
                os.killpg(proc.pid, signal.SIGINT)
                break
        _rest_out, rest_err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(lines) + rest_err
    assert proc.returncode == 130, err
    assert "interrupted" in err and "restored" in err
    assert pip_freeze(used_env, pip_home) == before


@pytest.mark.full  # real pip
def test_download_then_air_gapped_install(tmp_path, index, pip_home):
    house = tmp_path / "house"
    data = ok_json(cli(["install", "--venv", str(tmp_path / "v"), "--index-url", index.good, "--torch", "2.7.0",
                        "--download", str(house), "--json"], pip_home))
    assert data["result"]["status"] == "downloaded"
    assert any(f.name.startswith("torch-2.7.0+cpu") for f in house.iterdir())
    lock = house / "cpuperf.lock.txt"
    data = ok_json(cli(["install", "--venv", str(tmp_path / "v"), "--find-links", str(house), "--from-lock",
                        str(lock), "--dry-run", "--json"], pip_home))
    assert "--no-index" in data["argv"] and data["find_links"] == [str(house)]
    assert [(p["name"], p["version"]) for p in data["packages"]] == [("torch", "2.7.0+cpu"), ("cmeel-mimalloc", "3.4.3")]


@pytest.mark.full  # real pip
@pytest.mark.skipif(not list(Path("/opt/wheels").glob("torch-*+cpu-*.whl")),
                    reason="this machine's pip configuration (find-links /opt/wheels) is not here")
def test_dry_run_on_this_host_uses_its_pip_configuration(tmp_path):
    """Not hermetic on purpose: the real pip configuration of this machine (CPU torch in find-links)."""
    proc = run_cli(["install", "--venv", str(tmp_path / "v"), "--dry-run", "--json"], timeout=180,
                   extra_env={"PYTHONPATH": str(REPO), "CPUPERF_OVERRIDE_GPUS": ""}, cwd=str(REPO))
    data = ok_json(proc)
    torch = [p for p in data["packages"] if p["name"] == "torch"]
    assert torch and torch[0]["version"].endswith("+cpu")
    assert not any(ip.is_cuda_payload(p["name"]) for p in data["packages"])


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CPUPERF_SLOW") != "1", reason="set CPUPERF_SLOW=1 (needs PyPI)")
def test_real_ipex_28_on_pypi_is_refused_on_a_cpu_host(tmp_path):
    """IPEX 2.8.0 on PyPI needs torch 2.8, whose PyPI Linux wheel is the CUDA build."""
    args = ["install", "--venv", str(tmp_path / "v"), "--torch", "2.8", "--with", "ipex", "--dry-run", "--json"]
    proc = run_cli(args, timeout=600, extra_env={"PYTHONPATH": str(REPO), "CPUPERF_OVERRIDE_GPUS": ""}, cwd=str(REPO))
    assert proc.returncode in (3, 7), (proc.stdout, proc.stderr)
    if proc.returncode == 3:
        assert "nvidia" in json.loads(proc.stdout)["error"]["message"]
    proc = run_cli([*args, "--allow-cuda-torch"], timeout=600,
                   extra_env={"PYTHONPATH": str(REPO), "CPUPERF_OVERRIDE_GPUS": ""}, cwd=str(REPO))
    data = ok_json(proc)
    assert any(p["name"].startswith("nvidia-") for p in data["packages"])


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CPUPERF_SLOW") != "1", reason="set CPUPERF_SLOW=1 (needs the package registry)")
def test_the_real_allocator_wheel_installs_without_root_and_preloads(tmp_path):
    """The registry's cmeel-mimalloc in a fresh venv: the probe finds its library, and a Python started
    with it in LD_PRELOAD runs with mimalloc mapped (what `--auto` does once a measurement favours it)."""
    from cpuperf.plan.install import allocator_wheel

    name, version = allocator_wheel()
    python = str(tmp_path / "v" / "bin" / "python")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "v")], check=True, timeout=300)
    subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", f"{name}=={version}"],
                   check=True, capture_output=True, timeout=600)
    doctor = json.loads(run_cli(["doctor", "--json", "--python", python], timeout=120,
                                extra_env={"PYTHONPATH": str(REPO)}, cwd=str(REPO)).stdout)
    libs = doctor["software"]["allocators"]["mimalloc"]
    assert libs and all(str(tmp_path) in p for p in libs)
    from cpuperf.decide.runtime_env import preloadable

    maps = subprocess.run([python, "-c", "print(open('/proc/self/maps').read())"], capture_output=True, text=True,
                          env={**os.environ, "LD_PRELOAD": preloadable(libs) or ""}, timeout=60)
    assert maps.returncode == 0 and "libmimalloc" in maps.stdout and "ERROR: ld.so" not in maps.stderr


# --------------------------------------------------------------------------- pure functions


def test_parse_pip_config_list_env_wins():
    text = ("global.find-links='/opt/wheels'\nglobal.extra-index-url='file:///a file:///b'\n"
            ":env:.index-url='https://mirror.example/simple'\nglobal.index-url='https://other/simple'\n")
    cfg = ip.parse_pip_config_list(text)
    assert cfg["index-url"] == "https://mirror.example/simple"
    srcs = ip.sources_from_config(cfg)
    assert [(s.kind, s.location, s.origin) for s in srcs] == [
        ("index-url", "https://mirror.example/simple", "env"),
        ("extra-index-url", "file:///a", "pip-config"), ("extra-index-url", "file:///b", "pip-config"),
        ("find-links", "/opt/wheels", "pip-config")]


def test_unreachable_default_is_dropped_from_argv():
    srcs = ip.SourceSet((ip.Source("find-links", "/opt/wheels", "pip-config", True),)).with_defaults(
        [ip.Source("extra-index-url", ip.TORCH_CPU_INDEX, "default", False, error="no DNS")])
    assert srcs.pip_args() == []
    assert [s.location for s in srcs.skipped()] == [ip.TORCH_CPU_INDEX]
    user = ip.user_sources(None, ["/house"]).with_defaults([ip.Source("extra-index-url", "https://x", "default")])
    assert user.pip_args() == ["--no-index", "--find-links", "/house"]


def test_newest_build_respects_host_and_constraints():
    offered = ["2.15.0", "2.14.1", "2.13.0+cpu", "2.13.0", "2.12.0+cpu", "2.14.1+cu126"]
    assert ip.newest_build(offered, "cpu") == "2.13.0+cpu"
    assert ip.newest_build(offered, "cpu", specifiers=["<=2.12.9"]) == "2.12.0+cpu"
    assert ip.newest_build(offered, "cuda", "cu126") == "2.14.1+cu126"
    assert ip.newest_build(offered, "cpu", allow_plain=True, specifiers=["<=2.14.1"]) == "2.14.1"
    assert ip.constraint_specs("# cap\ntorch<=2.14.1\ntorchvision<=0.29.1\n", "torch") == ["<=2.14.1"]


def test_cuda_tag_for_driver_uses_minor_version_compatibility():
    from cpuperf.commands.install import load_matrix_for_install

    m = load_matrix_for_install()
    offered = ("cu118", "cu126", "cu128")
    assert ip.cuda_tag_for_driver("570.86.10", offered, m.cuda)[0] == "cu128"
    tag, why = ip.cuda_tag_for_driver("535.104.05", offered, m.cuda)
    assert tag == "cu128" and "PTX" in why
    assert ip.cuda_tag_for_driver("470.57.02", offered, m.cuda)[0] == "cu118"
    assert ip.cuda_tag_for_driver("418.0", offered, m.cuda)[0] is None
    assert ip.cuda_tag_for_driver(None, offered, m.cuda)[0] is None


def test_restore_steps_and_error_digest():
    before = ip.parse_freeze("torch==2.6.0+cpu\nhelper-pkg==1.0\npip==23.2.1\n")
    now = ip.parse_freeze("torch==2.7.0+cpu\nhelper_pkg==1.0\npip==23.2.1\nintel-extension-for-pytorch==2.7.0\n")
    steps = ip.restore_steps(before, now)
    assert steps.uninstall == ("intel-extension-for-pytorch",)
    assert steps.reinstall == (("torch", "2.6.0+cpu"),)
    err = "Collecting x\nERROR: Could not install packages due to an OSError.\n  detail line\nother\n"
    assert ip.error_digest(err) == ["ERROR: Could not install packages due to an OSError.", "  detail line"]


def test_lock_round_trip_both_formats():
    pkgs = (ip.PlannedPackage("torch", "2.7.0+cpu", "https://download.pytorch.org/whl/cpu", "cpu", sha256="ab" * 32),
            ip.PlannedPackage("filelock", "3.16.1", "https://pypi.org/simple", "dependency", sha256="cd" * 32))
    lock = ip.Lock("3.11.7", "linux_x86_64", "cpu", pkgs, ("https://download.pytorch.org/whl/cpu",), ())
    for fmt in ("json", "requirements"):
        back = ip.parse_lock(ip.render_lock(lock, fmt))
        assert [(p.name, p.version, p.sha256) for p in back.packages] == [(p.name, p.version, p.sha256) for p in pkgs]
        assert back.python == "3.11.7" and back.device == "cpu"
        assert back.index_urls == lock.index_urls
    with pytest.raises(ip.PlanError):
        ip.parse_lock("torch>=2\n")


def test_plan_install_pins_cpu_build_and_skips_dead_default():
    from cpuperf.commands.install import load_matrix_for_install
    from cpuperf.knowledge.resolve import resolve

    m = load_matrix_for_install()
    facts = SimpleNamespace(gpus=(), software=None)
    res = resolve("3.11", "2.7.0", {"ipex"}, matrix=m)
    srcs = ip.SourceSet((ip.Source("find-links", "/opt/wheels", "pip-config", True),)).with_defaults(
        [ip.Source("extra-index-url", ip.TORCH_CPU_INDEX, "default", False, error="no DNS")])
    plan = ip.plan_install(facts, res, srcs, ip.Target("/venv/bin/python", "3.11.7"), ip.InstallChoices(environ={"PYTHONPATH": "x"}))
    assert [p.requirement() for p in plan.requirements] == ["torch==2.7.0+cpu", "intel-extension-for-pytorch==2.7.0"]
    assert plan.argv()[-2:] == ["torch==2.7.0+cpu", "intel-extension-for-pytorch==2.7.0"]
    assert "PYTHONPATH" not in plan.env and plan.env["PIP_NO_INPUT"] == "1"
    assert any("skipped https://download.pytorch.org/whl/cpu" in w for w in plan.warnings)


def test_dead_pypi_is_replaced_by_an_index_that_answers():
    srcs = ip.SourceSet((ip.Source("extra-index-url", "file:///opt/pypi/simple", "pip-config", True),
                         ip.Source("find-links", "/opt/wheels", "pip-config", True))).with_pypi()
    assert srcs.pip_args() == []
    dead = ip.SourceSet(tuple(dataclasses.replace(s, reachable=False, error="timed out")
                              if s.origin == "pip-default" else s for s in srcs.sources))
    assert dead.pip_args() == ["--index-url", "file:///opt/pypi/simple"]
    only_links = ip.SourceSet((ip.Source("find-links", "/house", "pip-config", True),
                               ip.Source("index-url", ip.PYPI_INDEX, "pip-default", False)))
    assert only_links.pip_args() == ["--no-index"] and only_links.has_index()
    nothing = ip.SourceSet((ip.Source("index-url", ip.PYPI_INDEX, "pip-default", False),))
    assert not nothing.has_index()
