"""Several nodes: a hostfile over two network namespaces joined by a veth pair (root only), Slurm, bad hostfiles.

Only namespace-local test addresses (10.99.0.1/24, 10.99.0.2/24) are used; the namespaces and the veth
pair are removed in a finally.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from cli_util import cli_env, run_cli

MICRO = ["--model", "micro", "--set", "eval_every=0", "--max-steps", "10"]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def two_namespaces():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip"):
        pytest.skip("no ip tool (apt-get install iproute2)")
    tag = uuid.uuid4().hex[:6]
    ns = [f"cpt{tag}a", f"cpt{tag}b"]
    veth = [f"cv{tag}a", f"cv{tag}b"]
    try:
        steps = [("netns", "add", ns[0]), ("netns", "add", ns[1]),
                 ("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]),
                 ("link", "set", veth[0], "netns", ns[0]), ("link", "set", veth[1], "netns", ns[1]),
                 ("-n", ns[0], "addr", "add", "10.99.0.1/24", "dev", veth[0]),
                 ("-n", ns[1], "addr", "add", "10.99.0.2/24", "dev", veth[1])]
        for i in (0, 1):
            steps += [("-n", ns[i], "link", "set", "lo", "up"), ("-n", ns[i], "link", "set", veth[i], "up")]
        for step in steps:
            proc = _ip(*step)
            if proc.returncode != 0:
                pytest.skip(f"ip {' '.join(step)} failed: {proc.stderr.strip()}")
        yield ns, veth
    finally:
        for name in ns:
            _ip("netns", "del", name)  # deleting a namespace removes its end of the veth pair, and the pair


def _in_ns(ns: str, args, tmp_out: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "cpuperf", "train", *args,
                             "--out", tmp_out, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env())


@pytest.mark.full  # two network namespaces, real ranks
def test_two_nodes_over_a_veth_pair(two_namespaces, tmp_path):
    ns, veth = two_namespaces
    hostfile = tmp_path / "hosts"
    hostfile.write_text("10.99.0.1\n10.99.0.2\n")
    args = ["--auto", *MICRO, "--hostfile", str(hostfile), "--master-port", "29561"]
    procs = [_in_ns(ns[i], args, str(tmp_path / f"node{i}")) for i in (0, 1)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=150))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, (stdout[-2000:], stderr[-3000:])
    node0, node1 = (json.loads(o[0]) for o in outs)
    assert node0["world_size"] == 2 and node0["steps"] == 10
    assert node0["param_checksums"][0] == node0["param_checksums"][1]
    for i, data in enumerate((node0, node1)):
        launch = data["launch"]
        assert launch["node_rank"] == i  # found from the namespace's own address
        assert launch["master_addr"] == "10.99.0.1"  # the first host of the hostfile
        assert launch["env"]["GLOO_SOCKET_IFNAME"] == veth[i]
        assert "--rdzv-endpoint=10.99.0.1:29561" in launch["argv"]
        assert f"--local-addr=10.99.0.{i + 1}" in launch["argv"]


@pytest.mark.full  # network namespaces
def test_unreachable_host_is_one_line_exit_7(two_namespaces, tmp_path):
    ns, _ = two_namespaces
    hostfile = tmp_path / "hosts"
    hostfile.write_text("10.99.0.1\n10.98.0.7\n")  # no route to 10.98.0.0/24 inside the namespace
    p = _in_ns(ns[0], ["--auto", *MICRO, "--hostfile", str(hostfile)], str(tmp_path / "run"))
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 7, stderr
    assert json.loads(stdout)["error"]["name"] == "unreachable"
    assert "10.98.0.7" in stderr and "Traceback" not in stderr


def test_malformed_hostfile_is_exit_2(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node01 slots=two\n")
    proc = run_cli(["train", "--auto", *MICRO, "--hostfile", str(hostfile), "--out", str(tmp_path / "r")])
    assert proc.returncode == 2
    assert "hosts:1" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == 1


def test_slurm_allocation_dry_run_plans_srun(tmp_path):
    env = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "cn[01-02]"}
    proc = run_cli(["train", "--auto", *MICRO, "--dry-run", "--json", "--out", str(tmp_path / "r")], extra_env=env)
    assert proc.returncode == 0, proc.stderr
    launch = json.loads(proc.stdout)["launch"]
    assert launch["launcher"] == "srun" and launch["nnodes"] == 2
    assert launch["env"]["MASTER_ADDR"] == "cn01"
    assert launch["argv"][0] == "srun" and "--cpu-bind=none" in launch["argv"]


def test_dry_run_shows_plan_and_runs_nothing(tmp_path):
    proc = run_cli(["train", "--auto", *MICRO, "--dry-run", "--out", str(tmp_path / "r")])
    assert proc.returncode == 0, proc.stderr
    assert "cpuperf.train.worker" in proc.stdout and "# dtype =" in proc.stdout
    assert not (tmp_path / "r").exists()


@pytest.mark.full  # torchrun
def test_rendezvous_without_the_second_node_fails_in_bounded_time(tmp_path):
    """Node 0 of a two-node hostfile whose node 1 never starts: a bounded wait, then one line naming it."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2\n")
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = run_cli(["train", *MICRO, "--hostfile", str(hostfile), "--node-rank", "0", "--rdzv-timeout", "3",
                    "--master-port", str(_free_port()), "--out", str(out), "--json"], timeout=90)
    took = time.monotonic() - t0
    assert proc.returncode == 7, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert took < 45, took  # 3 s of rendezvous plus start-up, not torchrun's default 600 s
    err = json.loads(proc.stdout)["error"]
    assert "127.0.0.2" in err["message"] and "within 3 s" in err["message"]
    assert "--rdzv-timeout" in err["hint"]
    assert "Traceback" not in proc.stderr and "checkpoint" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "RendezvousTimeoutError" in (out / "logs" / "launcher.log").read_text()  # the full story is kept


def test_rdzv_timeout_reaches_torchrun_and_the_ranks(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("10.99.0.1\n10.99.0.2\n")
    proc = run_cli(["train", *MICRO, "--hostfile", str(hostfile), "--node-rank", "0", "--rdzv-timeout", "42",
                    "--dry-run", "--json", "--out", str(tmp_path / "r")])
    assert proc.returncode == 0, proc.stderr
    launch = json.loads(proc.stdout)["launch"]
    assert "--rdzv-conf=is_host=true,join_timeout=42" in launch["argv"]
    assert launch["env"]["CPUPERF_RDZV_TIMEOUT"] == "42"
    for bad in ("nan", "0", "-5", "inf"):
        proc = run_cli(["train", *MICRO, "--hostfile", str(hostfile), "--node-rank", "0", "--rdzv-timeout", bad,
                        "--dry-run", "--out", str(tmp_path / "r")])
        assert proc.returncode == 2 and "--rdzv-timeout" in proc.stderr and "Traceback" not in proc.stderr, bad


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
