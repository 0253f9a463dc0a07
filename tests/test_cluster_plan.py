"""One plan over several nodes from each node's own facts (issues 23 and 24): facts saved by `doctor --hostfile
--save-facts` on a login node; bf16 only if every node runs it natively, threads from each node's cores, a
refusal naming the node whose stack differs; `train --plan` on a node runs that node's part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_util import run_cli, run_json

from cpuperf.decide.placement import usable_cores
from cpuperf.errors import ExitCode
from cpuperf.probe import probe_host

FAKE_SSH = '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do [ "$1" = -o ] && shift; shift; done\n' \
           'host=$1; shift; [ "$1" = -- ] && shift\nexec sh -c "$*"\n'


@pytest.fixture
def node_facts(tmp_path):
    """Two nodes' facts, probed for real (a stand-in ssh runs the probe here) and saved as a login node would."""
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2\n")
    facts = tmp_path / "facts"
    proc = run_cli(["doctor", "--hostfile", str(hostfile), "--launcher", "ssh", "--save-facts", f"{facts}/"],
                   {"CPUPERF_SSH": str(ssh)}, timeout=180)
    assert sorted(p.name for p in facts.iterdir()) == ["127.0.0.1.json", "127.0.0.2.json"], proc.stderr[-2000:]
    return hostfile, facts


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data["facts"]["host"])
    path.write_text(json.dumps(data))


def test_each_node_is_planned_from_its_own_facts(tmp_path, node_facts):
    hostfile, facts = node_facts

    def native_bf16(host):
        host["cpu"]["isa"].append("avx512_bf16")

    def one_cpu(host):  # and no native bf16, whatever CPU runs the suite
        host["topology"]["allowed_cpus"] = [host["topology"]["allowed_cpus"][0]]
        host["cpu"]["amx_supported"] = host["cpu"]["amx_usable"] = False
        host["cpu"]["isa"] = [f for f in host["cpu"]["isa"] if f not in ("avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")]

    _edit(facts / "127.0.0.1.json", native_bf16)
    _edit(facts / "127.0.0.2.json", one_cpu)
    plan = tmp_path / "plan.json"
    rec, _ = run_json(["recommend", "--hostfile", str(hostfile), "--node-facts", f"{facts}/", "--save", str(plan)])
    saved = json.loads(plan.read_text())
    nodes = saved["nodes"]
    assert list(nodes) == ["127.0.0.1", "127.0.0.2"]

    def decided(sub, knob):
        return next(d for d in sub["decisions"] if d["id"] == knob)

    for sub in nodes.values():  # bf16 only if every node runs it natively
        dtype = decided(sub, "dtype")
        assert dtype["value"] == "fp32" and "127.0.0.2" in dtype["reason"] and not dtype["overridden"]
    here = len(usable_cores(probe_host()))
    assert decided(nodes["127.0.0.1"], "threads_per_rank")["value"] == here  # each node's own cores
    assert decided(nodes["127.0.0.2"], "threads_per_rank")["value"] == 1
    assert rec["nodes"]["127.0.0.2"]["threads_per_rank"] == 1
    # This machine is not the one-CPU node: its part of the plan is refused here, naming the node.
    proc = run_cli(["train", "--plan", str(plan), "--hostfile", str(hostfile), "--node-rank", "1", "--dry-run"])
    assert proc.returncode == ExitCode.PLAN_MISMATCH and "node 127.0.0.2: usable cpus" in proc.stderr, proc.stderr


def test_a_node_with_this_hosts_facts_runs_its_part(tmp_path, node_facts):
    hostfile, facts = node_facts
    plan = tmp_path / "plan.json"
    run_json(["recommend", "--hostfile", str(hostfile), "--node-facts", f"{facts}/", "--save", str(plan)])
    data, _ = run_json(["train", "--plan", str(plan), "--hostfile", str(hostfile), "--node-rank", "1", "--dry-run"])
    part = json.loads(plan.read_text())["nodes"]["127.0.0.2"]
    assert data["launch"]["per_rank"][0]["cpus"] == part["placement"]["slots"][0]["compute_cpus"]


def test_a_node_with_another_stack_is_refused_by_name(tmp_path, node_facts):
    hostfile, facts = node_facts

    def old_torch(host):
        host["software"]["packages"]["torch"]["version"] = "2.7.0"

    _edit(facts / "127.0.0.2.json", old_torch)
    proc = run_cli(["recommend", "--hostfile", str(hostfile), "--node-facts", f"{facts}/"])
    assert proc.returncode == ExitCode.NODES_DIFFER and "127.0.0.2" in proc.stderr, proc.stderr


def test_a_measured_allreduce_across_the_nodes_picks_the_backend_with_its_figure(tmp_path, node_facts, monkeypatch):
    from cpuperf.run.collectives import cache_path

    hostfile, facts = node_facts
    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path / "cache"))
    path = cache_path(["127.0.0.1", "127.0.0.2"])
    path.parent.mkdir(parents=True)
    mib = 25 * 2**20
    path.write_text(json.dumps({"world": 2, "measured_at": 1, "backends": {
        "gloo": {"seconds": 0.1, "latency_us": 900.0, "bucket_bytes": mib, "algbw_gbps": 0.26}}}))
    rec, _ = run_json(["recommend", "--hostfile", str(hostfile), "--node-facts", f"{facts}/"],
                      {"CPUPERF_CACHE_DIR": str(tmp_path / "cache")})
    ddp = next(d for d in rec["decisions"] if d["id"] == "ddp_backend")
    assert ddp["value"] == "gloo" and "0.26 GB/s" in ddp["reason"] and ddp["evidence"]["bucket_cap_mb"] >= 25
