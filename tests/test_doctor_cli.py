"""`cpuperf doctor` and the CLI conventions every command follows."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_util import cli_env, run_cli, run_json
from hosts import fixture_host, make_host

SPR = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
       "amx_tile", "amx_bf16", "amx_int8"]


@pytest.mark.smoke("doctor")
def test_doctor_json_shape_on_this_host():
    rep, proc = run_json(["doctor"], expect_rc=None, process=True)
    assert proc.returncode in (0, 1)
    assert rep["schema"] == "cpuperf.doctor/1"
    cpu = rep["host"]["cpu"]
    for key in ("arch", "vendor", "model_name", "microarchitecture", "isa", "bf16_native", "amx"):
        assert key in cpu
    assert set(cpu["amx"]) >= {"supported", "usable"}
    topo = rep["host"]["topology"]
    for key in ("sockets", "physical_cores", "logical_cpus", "numa_nodes", "allowed_cpus", "cpu_quota"):
        assert key in topo
    assert rep["host"]["gpus"] == []  # no NVIDIA GPU on CI: a normal answer, not an error
    sw = rep["software"]
    for key in ("python", "packages", "mpi", "openmp", "allocators"):
        assert key in sw
    for f in rep["findings"]:
        assert set(f) == {"id", "severity", "message", "fix"}
    # exit code 1 exactly when there is an error finding
    assert (proc.returncode == 1) == any(f["severity"] == "error" for f in rep["findings"])


def test_doctor_sysroot_recorded_host(tmp_path):
    root = make_host(tmp_path, sockets=2, cores_per_socket=8, threads_per_core=2, flags=SPR, model=143)
    rep, _ = run_json(["doctor", "--sysroot", str(root)])
    assert rep["host"]["cpu"]["microarchitecture"] == "sapphirerapids"
    assert rep["host"]["cpu"]["amx"] == {"supported": True, "usable": None}
    assert rep["host"]["topology"]["sockets"] == 2
    assert rep["host"]["gpus"] is None and rep["software"] is None  # unknown for a snapshot


def test_doctor_human_output_has_sections_and_findings(tmp_path):
    root = fixture_host(tmp_path, "linux-ubuntu20.04-zen3")
    proc = run_cli(["doctor", "--sysroot", str(root)])
    assert proc.returncode == 0, proc.stderr
    for title in ("CPU", "Topology", "GPUs", "Software", "Findings"):
        assert title in proc.stdout
    assert "zen3" in proc.stdout and "bf16-not-native" in proc.stdout
    assert "\x1b[" not in proc.stdout  # no colour off a terminal / with NO_COLOR


def test_gpu_override_ampere_vs_turing_and_ampere_altra_cpu(tmp_path):
    gpus = [{"name": "Tesla T4", "compute_capability": "7.5", "memory_bytes": 16 << 30},
            {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_bytes": 80 << 30}]
    rep, _ = run_json(["doctor"], {"CPUPERF_OVERRIDE_GPUS": json.dumps(gpus)}, expect_rc=None)
    t4, a100 = rep["host"]["gpus"]
    assert (t4["bf16"], t4["tf32"]) == (False, False)
    assert (a100["bf16"], a100["tf32"]) == (True, True)
    # an Arm CPU made by Ampere Computing is not an NVIDIA Ampere GPU
    from hosts import write

    write(tmp_path, "/proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\n"
                                     "CPU implementer\t: 0xc0\nCPU architecture: 8\nCPU variant\t: 0x0\n"
                                     "CPU part\t: 0xac3\nCPU revision\t: 0\n")
    rep, _ = run_json(["doctor", "--sysroot", str(tmp_path)], {"CPUPERF_OVERRIDE_GPUS": "[]"})
    assert rep["host"]["cpu"]["microarchitecture"] == "ampere1"
    assert rep["host"]["cpu"]["vendor"] == "Ampere" and rep["host"]["gpus"] == []


def test_recorded_nvml_answer_h100():
    # What NVML reported on an H100 80GB HBM3 (compute capability 9.0).
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_bytes": 85520809984,
             "driver_version": "580.159.04"}]
    rep, _ = run_json(["doctor"], {"CPUPERF_OVERRIDE_GPUS": json.dumps(gpus)}, expect_rc=None)
    (h100,) = rep["host"]["gpus"]
    assert h100["bf16"] and h100["tf32"] and h100["driver_version"] == "580.159.04"


def test_bad_gpu_override_is_a_one_line_usage_error():
    proc = run_cli(["doctor"], {"CPUPERF_OVERRIDE_GPUS": "{not json"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "CPUPERF_OVERRIDE_GPUS" in proc.stderr
    proc = run_cli(["doctor", "--json"], {"CPUPERF_OVERRIDE_GPUS": "{not json"})
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == 2


def test_save_snapshot_then_read_it_back(tmp_path):
    source = make_host(tmp_path / "src", sockets=2, cores_per_socket=4, threads_per_core=2, flags=SPR,
                       cgroup={"cpu.max": "300000 100000"})
    snap = tmp_path / "snap"
    proc = run_cli(["doctor", "--sysroot", str(source), "--save-snapshot", str(snap), "--json"])
    assert proc.returncode == 0, proc.stderr
    original = json.loads(proc.stdout)["host"]
    again, _ = run_json(["doctor", "--sysroot", str(snap)])
    for key in ("cpu", "topology"):
        a, b = dict(original[key]), dict(again["host"][key])
        assert a == b


def test_usage_errors_and_version():
    proc = run_cli(["doctor", "--no-such-flag"])
    assert proc.returncode == 2 and proc.stdout == ""
    proc = run_cli(["--version"])
    assert proc.returncode == 0 and proc.stdout.startswith("cpuperf ")


def test_missing_sysroot_is_a_usage_error_not_a_host_with_no_cores(tmp_path):
    proc = run_cli(["doctor", "--sysroot", str(tmp_path / "nothing-here"), "--json"])
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == 2 and "nothing-here" in err["message"]


def test_doctor_and_help_never_import_torch():
    code = ("import sys; from cpuperf.cli import main; "
            "rc = main(['doctor', '--json']); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "main(['--help']) if False else None; sys.exit(0 if rc in (0, 1) else rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- numpy beside torch: torch warns in every process without it; doctor names it, from metadata only ----------

def test_doctor_names_a_missing_numpy_beside_torch_with_the_exact_fix():
    from dataclasses import replace

    from cpuperf.decide.doctor import check_torch
    from cpuperf.probe import probe_host
    from cpuperf.probe.facts import PackageInfo

    facts = probe_host(use_cache=False)
    sw = facts.software
    assert sw is not None
    torch = PackageInfo(version="2.13.0+cpu", local="cpu", build="cpu")
    without = replace(facts, software=replace(sw, executable="/opt/my venv/bin/python",
                                              packages={**sw.packages, "torch": torch, "numpy": None}))
    found = [f for f in check_torch(without) if f.id == "no-numpy"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert "Failed to initialize NumPy: No module named 'numpy'" in found[0].message
    assert found[0].fix == "'/opt/my venv/bin/python' -m pip install numpy"
    numpy = PackageInfo(version="2.4.6", local=None, build=None)
    with_numpy = replace(without, software=replace(without.software, packages={**without.software.packages,
                                                                                "numpy": numpy}))
    assert not [f for f in check_torch(with_numpy) if f.id == "no-numpy"]
    # a stack described by CPUPERF_OVERRIDE_PACKAGES alone (no interpreter) says nothing about numpy
    described = replace(without, software=replace(without.software, executable=""))
    assert not [f for f in check_torch(described) if f.id == "no-numpy"]


@pytest.mark.full  # imports torch once, in the venv without numpy, to show the warning doctor names is real
def test_doctor_in_a_venv_without_numpy_names_it_and_never_imports_torch(tmp_path):
    from host_classes import linked_venv

    python = linked_venv(tmp_path / "nonumpy", ("numpy",))
    warned = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, timeout=300,
                            env=cli_env({"PYTHONWARNINGS": "default"}))
    assert "Failed to initialize NumPy" in warned.stderr or "No module named 'numpy'" in warned.stderr, warned.stderr
    env = cli_env()
    probe = ("import runpy, sys\nsys.argv = ['cpuperf', 'doctor', '--json']\ntry:\n runpy.run_module('cpuperf', "
             "run_name='__main__')\nexcept SystemExit:\n pass\nprint('torch imported' if 'torch' in sys.modules "
             "else 'torch not imported', file=sys.stderr)")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert "torch not imported" in proc.stderr, proc.stderr
    rep = json.loads(proc.stdout)
    found = [f for f in rep["findings"] if f["id"] == "no-numpy"]
    assert len(found) == 1, rep["findings"]
    assert found[0]["fix"] == f"{python} -m pip install numpy"
