"""`doctor --hostfile`: nodes as network namespaces reached through real mpirun (and the ssh transport),
a stack skew made on purpose, unreachable and unresolvable nodes, saved facts, the pure cluster rules."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_util import cli_env, run_cli
from hosts import make_host
from netns import namespace_nodes

from cpuperf.decide import cluster
from cpuperf.plan import nodes as plan
from cpuperf.probe import probe_host
from cpuperf.probe.node import NodeFacts, NodeResult, read_saved

TORCH = probe_host().software.packages["torch"]


def _doctor(nodes, args, timeout=150):
    argv = nodes.on_first([sys.executable, "-m", "cpuperf", "doctor", *args])
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=cli_env(nodes.env()))


@pytest.mark.full  # nodes as network namespaces
@pytest.mark.skipif(TORCH is None, reason="needs torch in the test interpreter (the skew is made against it)")
def test_a_node_with_another_torch_is_named_with_the_fix(tmp_path):
    other = "2.12.0+cpu" if not TORCH.version.startswith("2.12.0") else "2.11.0+cpu"
    with namespace_nodes(2, tmp_path) as nodes:
        nodes.set_env(1, {"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": other})})
        proc = _doctor(nodes, ["--hostfile", str(nodes.hostfile()), "--json"])
    assert proc.returncode == 14, (proc.stdout[-2000:], proc.stderr[-2000:])
    rep = json.loads(proc.stdout)
    assert rep["transport"] == "mpirun"
    rows = {r["name"]: r for r in rep["nodes"]}
    assert [r["status"] for r in rep["nodes"]] == ["ok", "ok"]
    assert rows["10.99.0.1"]["packages"]["torch"] == TORCH.version
    assert rows["10.99.0.2"]["packages"]["torch"] == other
    assert rows["10.99.0.2"]["hostname"] == nodes.names[1]  # its own probe ran there, not on node 1
    assert rows["10.99.0.1"]["rendezvous_ifname"] == f"{nodes.tag}v1"
    assert rows["10.99.0.2"]["rendezvous_ifname"] == f"{nodes.tag}v2"
    skew = next(f for f in rep["findings"] if f["id"] == "torch-differs")
    assert skew["severity"] == "error" and "10.99.0.2" in skew["message"]
    assert other in skew["message"] and TORCH.version in skew["message"]
    # a tie (one node each) goes to the first node, the one the job is launched from
    assert skew["nodes"] == ["10.99.0.2"] and f"torch=={TORCH.version}" in skew["fix"]
    assert rep["constraints"]["refusal"] and "10.99.0.2" in rep["constraints"]["refusal"]
    assert "Traceback" not in proc.stderr


@pytest.mark.full  # nodes as network namespaces
def test_unreachable_and_unresolvable_nodes_are_named_and_the_rest_reported(tmp_path):
    with namespace_nodes(2, tmp_path) as nodes:
        hostfile = nodes.hostfile(extra=["10.98.0.7", "no-such-node.invalid"])
        t0 = time.monotonic()
        proc = _doctor(nodes, ["--hostfile", str(hostfile), "--json", "--timeout", "20"])
        took = time.monotonic() - t0
        text = _doctor(nodes, ["--hostfile", str(hostfile), "--timeout", "20"])
    assert proc.returncode == 7, (proc.stdout[-2000:], proc.stderr[-2000:])
    rep = json.loads(proc.stdout)
    status = {r["name"]: r["status"] for r in rep["nodes"]}
    assert status == {"10.99.0.1": "ok", "10.99.0.2": "ok", "10.98.0.7": "unreachable",
                      "no-such-node.invalid": "unresolvable"}
    ids = {f["id"]: f for f in rep["findings"]}
    assert ids["node-unreachable"]["nodes"] == ["10.98.0.7"]
    assert ids["node-unresolvable"]["nodes"] == ["no-such-node.invalid"]
    assert took < 60, took
    assert text.returncode == 7 and "node-unreachable" in text.stdout and "10.98.0.7" in text.stdout
    assert "Traceback" not in text.stderr


@pytest.mark.full  # nodes as network namespaces
def test_nodes_that_agree_exit_0_over_ssh_too(tmp_path):
    with namespace_nodes(2, tmp_path) as nodes:
        proc = _doctor(nodes, ["--hostfile", str(nodes.hostfile()), "--launcher", "ssh", "--json"])
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    rep = json.loads(proc.stdout)
    assert rep["transport"] == "ssh" and [r["status"] for r in rep["nodes"]] == ["ok", "ok"]
    assert not [f for f in rep["findings"] if f["severity"] == "error"]


@pytest.mark.full  # nodes as network namespaces
def test_saved_facts_plan_without_reaching_the_nodes(tmp_path):
    with namespace_nodes(2, tmp_path) as nodes:
        nodes.set_env(1, {"CPUPERF_OVERRIDE_PYTHON": "3.10"})
        saved = tmp_path / "facts.json"
        live = _doctor(nodes, ["--hostfile", str(nodes.hostfile()), "--json", "--save-facts", str(saved)])
        per_node = tmp_path / "facts"
        _doctor(nodes, ["--hostfile", str(nodes.hostfile()), "--save-facts", f"{per_node}/"])
    assert live.returncode == 14, live.stderr[-2000:]
    # the namespaces are gone: nothing is reachable, yet the saved facts give the same answer
    again = run_cli(["doctor", "--facts", str(saved), "--json"])
    assert again.returncode == 14, again.stderr
    assert [f["id"] for f in json.loads(again.stdout)["findings"]] == [f["id"] for f in json.loads(live.stdout)["findings"]]
    assert "python-differs" in again.stdout
    assert sorted(p.name for p in per_node.iterdir()) == ["10.99.0.1.json", "10.99.0.2.json"]
    results = read_saved(str(per_node))
    hosts = cluster.hosts_of(results)
    assert hosts["10.99.0.2"].software.python == "3.10"
    bad = run_cli(["doctor", "--facts", str(tmp_path / "agent.sh")])
    assert bad.returncode == 2 and "not a cpuperf facts file" in bad.stderr



def _fake_ssh(root, per_host: str):
    """A stand-in ssh: skips its options, then runs `per_host` (shell lines reading $host), else the probe locally."""
    fake = root / "ssh"
    fake.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do [ "$1" = -o ] && shift; shift; done\n'
                    'host=$1; shift; [ "$1" = -- ] && shift\n' + per_host + 'exec sh -c "$*"\n')
    fake.chmod(0o755)
    return fake

def test_a_hung_node_costs_its_timeout_not_the_run(tmp_path):
    """A stand-in ssh that runs the probe locally for one node and hangs for the other."""
    fake = _fake_ssh(tmp_path, '[ "$host" = 127.0.0.2 ] && exec sleep 617\n')
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2\n")
    t0 = time.monotonic()
    proc = run_cli(["doctor", "--hostfile", str(hostfile), "--launcher", "ssh", "--timeout", "4", "--json"],
                   extra_env={"CPUPERF_SSH": str(fake)})
    took = time.monotonic() - t0
    assert proc.returncode == 7, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)["nodes"]}
    assert rows["127.0.0.1"]["status"] == "ok" and rows["127.0.0.2"]["status"] == "timeout"
    assert "within 4 s" in rows["127.0.0.2"]["error"]
    assert took < 30, took
    left = subprocess.run(["pgrep", "-f", "sleep 617"], capture_output=True, text=True)
    assert left.returncode == 1, left.stdout  # the hung node's process group was killed


def test_a_node_that_floods_or_leaves_its_pipes_open_is_one_failed_node(tmp_path):
    """One node prints without end (`yes`), one leaves a process outside its group holding the pipes past the
    timeout: each is one failed node, said, within its timeout; the third answers; cpuperf's memory stays small."""
    fake = _fake_ssh(tmp_path, '[ "$host" = 127.0.0.2 ] && exec yes cpuperf-flood\n'
                               '[ "$host" = 127.0.0.3 ] && { setsid sleep 621 & exec sleep 622; }\n')
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2\n127.0.0.3\n")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-m", "cpuperf", "doctor",
                               "--hostfile", str(hostfile), "--launcher", "ssh", "--timeout", "6", "--json"],
                              capture_output=True, text=True, timeout=120, env=cli_env({"CPUPERF_SSH": str(fake)}))
    finally:
        escaped = subprocess.run(["pgrep", "-f", "sleep 621"], capture_output=True, text=True).stdout.split()
        for pid in escaped:  # the test's own escaped process (cpuperf rightly cannot reach outside the group)
            os.kill(int(pid), 9)
    took = time.monotonic() - t0
    assert proc.returncode == 7, proc.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads(proc.stdout)["nodes"]}
    assert rows["127.0.0.1"]["status"] == "ok"
    assert rows["127.0.0.2"]["status"] == "probe-failed", rows["127.0.0.2"]
    assert "printed more than 4096 KiB on stdout" in rows["127.0.0.2"]["error"]
    assert rows["127.0.0.3"]["status"] == "timeout" and "within 6 s" in rows["127.0.0.3"]["error"]
    assert took < 60, took  # the escaped sleep holds the pipe for 621 s: the drain after the kill is bounded
    rss_kb = int(proc.stderr.rsplit("maxrss_kb=", 1)[1].split()[0])
    assert rss_kb < 400_000, rss_kb
    assert subprocess.run(["pgrep", "-f", "cpuperf-flood|sleep 622"], capture_output=True).returncode == 1


def test_the_bundle_runs_where_cpuperf_is_not_installed(tmp_path):
    """python -I from an empty directory: only the bundle's own files; the same facts as in-process."""
    from cpuperf.run.probe_bundle import bundle_code, probe_args

    argv = plan.python_command(bundle_code(), "/usr/bin/python3", probe_args("me", "127.0.0.1"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"]})
    from cpuperf.probe.node import read_output

    facts, error = read_output(proc.stdout)
    assert facts is not None and error is None, (proc.stdout[-1000:], proc.stderr[-2000:])
    here = probe_host()
    assert facts.host.cpu.microarchitecture == here.cpu.microarchitecture
    assert facts.host.topology.physical_cores == here.topology.physical_cores
    assert facts.interpreter == "/usr/bin/python3" and facts.interpreter_found
    assert not list(Path(tmp_path).iterdir())  # nothing left behind
    missing = plan.python_command(bundle_code(), "/nonexistent/bin/python", probe_args("me", "127.0.0.1"))
    facts, _ = read_output(subprocess.run(missing, capture_output=True, text=True, timeout=60).stdout)
    assert facts is not None and not facts.interpreter_found
    res = NodeResult("me", "127.0.0.1", "ok", facts, None, 1.0, "ssh")
    [f] = [f for f in cluster.check_reached([res]) if f.id == "interpreter-missing"]
    assert "/nonexistent/bin/python" in f.message and f.nodes == ("me",)


# -- transports (pure) ---------------------------------------------------------------------------

def test_ssh_argv_carries_the_command_intact():
    command = plan.python_command("print('it''s \"quoted\"')", "/opt/venv/bin/python", ["--name", "n 1"])
    argv = plan.node_argv("ssh", "node01", command, ssh=["ssh", "-p", "2222"])
    assert argv[:3] == ["ssh", "-p", "2222"] and "BatchMode=yes" in argv and argv[-3] == "node01"
    assert shlex.split(argv[-1]) == command


def test_transport_choice_and_launcher_argv():
    assert plan.choose_transport(None, True, ("/usr/bin/mpirun", "openmpi"), "/usr/bin/ssh")[0] == "srun"
    assert plan.choose_transport(None, False, ("/usr/bin/mpirun", "openmpi"), "/usr/bin/ssh")[0] == "mpirun"
    assert plan.choose_transport(None, False, None, "/usr/bin/ssh")[0] == "ssh"
    srun = plan.node_argv("srun", "cn07", ["true"])
    assert "--nodelist=cn07" in srun and "--ntasks=1" in srun and srun[-1] == "true"
    ompi = plan.node_argv("mpirun", "cn07", ["true"], mpirun=("/x/mpirun", "openmpi"), euid=0)
    assert ompi[:5] == ["/x/mpirun", "-np", "1", "--host", "cn07"] and "--allow-run-as-root" in ompi
    hydra = plan.node_argv("mpirun", "cn07", ["true"], mpirun=("/x/mpiexec.hydra", "intelmpi"))
    assert hydra == ["/x/mpiexec.hydra", "-n", "1", "-hosts", "cn07", "true"]
    from cpuperf.errors import UsageError

    with pytest.raises(UsageError):
        plan.choose_transport("rsh", False, None, None)


# -- the rules, over recorded hosts (pure) ------------------------------------------------------------

AVX512_BF16 = ("avx2", "fma", "avx512f", "avx512_bf16")


def _node(tmp_path, name, *, cores=4, flags=AVX512_BF16, env=None, cgroup=None):
    root = make_host(tmp_path / name, cores_per_socket=cores, flags=flags, cgroup=cgroup)
    environ = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.8.0+cpu"}), **(env or {})}
    host = probe_host(sysroot=str(root), environ=environ, use_cache=False)
    facts = NodeFacts(name=name, hostname=name, interfaces={"eth0": (f"10.0.0.{len(name)}",)}, master=None,
                      master_address=None, self_address=None, rendezvous_ifname="eth0", interpreter="/p",
                      interpreter_found=True, python="3.11.7", host=host)
    return NodeResult(name, None, "ok", facts, None, 0.1, "ssh")


def test_constraints_dtype_threads_and_refusal(tmp_path):
    a = _node(tmp_path, "node01", cores=8)
    b = _node(tmp_path, "node02", cores=4)
    same = cluster.constraints(cluster.hosts_of([a, b]))
    assert same.bf16 and same.refusal is None
    assert same.threads_per_node == {"node01": 8, "node02": 4}  # each node from its own cores
    same.require_one_stack()
    c = _node(tmp_path, "node03", flags=("avx2", "fma"), env={"CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.7.1+cpu"})})
    mixed = cluster.constraints(cluster.hosts_of([a, b, c]))
    assert not mixed.bf16 and "node03" in mixed.dtype_reason
    assert mixed.refusal is not None and "node03" in mixed.refusal and "node01" not in mixed.refusal.split("odd:")[1]
    from cpuperf.errors import ExitCode, NodesDifferError

    with pytest.raises(NodesDifferError) as err:
        mixed.require_one_stack()
    assert err.value.code == ExitCode.NODES_DIFFER and "2.8.0+cpu" in (err.value.hint or "")
    ids = {f.id: f for f in cluster.diagnose([a, b, c], "ssh")}
    assert ids["torch-differs"].nodes == ("node03",) and ids["torch-differs"].severity == "error"
    assert ids["bf16-on-some-nodes"].nodes == ("node03",)
    assert set(ids["fewer-cpus"].nodes) == {"node02", "node03"}


def test_a_tighter_quota_is_a_straggler(tmp_path):
    a = _node(tmp_path, "node01")
    b = _node(tmp_path, "node02", cgroup={"cpu.max": "200000 100000"})
    hosts = cluster.hosts_of([a, b])
    assert cluster.threads_per_node(hosts) == {"node01": 4, "node02": 2}
    [f] = [f for f in cluster.diagnose([a, b], "ssh") if f.id == "fewer-cpus"]
    assert f.nodes == ("node02",) and "quota" in f.fix


def test_names_resolving_to_the_wrong_address(tmp_path):
    a, b = _node(tmp_path, "node01"), _node(tmp_path, "node02")
    import dataclasses

    a = dataclasses.replace(a, address="10.0.0.6", facts=dataclasses.replace(
        a.facts, master="node01", master_address="10.0.0.6", interfaces={"eth0": ("10.0.0.6",), "lo": ("127.0.0.1",)}))
    wrong_here = dataclasses.replace(b, address="10.0.0.99")
    loop = dataclasses.replace(wrong_here, facts=dataclasses.replace(b.facts, master="node01", master_address="127.0.1.1"))
    ids = {f.id: f for f in cluster.check_names([a, loop])}
    assert ids["name-wrong-address"].nodes == ("node02",) and "10.0.0.99" in ids["name-wrong-address"].message
    assert ids["master-wrong-address"].nodes == ("node02",) and "127.0.1.1" in ids["master-wrong-address"].message


# -- collectives ------------------------------------------------------------------------------------

@pytest.mark.full  # a real allreduce across namespace nodes
@pytest.mark.skipif(TORCH is None, reason="the allreduce needs torch")
def test_allreduce_across_the_nodes_is_measured_and_cached(tmp_path):
    cache = tmp_path / "cache"
    with namespace_nodes(2, tmp_path) as nodes:
        argv = nodes.on_first([sys.executable, "-m", "cpuperf", "doctor", "--hostfile", str(nodes.hostfile()),
                               "--collectives", "--bucket-mb", "4", "--json"])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                              env=cli_env({**nodes.env(), "CPUPERF_CACHE_DIR": str(cache)}))
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    col = json.loads(proc.stdout)["collectives"]
    assert col["world"] == 2 and col["nodes"] == ["10.99.0.1", "10.99.0.2"] and not col["failed"]
    gloo = col["backends"]["gloo"]
    assert gloo["bucket_bytes"] == 4 << 20 and gloo["seconds"] > 0 and gloo["busbw_gbps"] > 0 and gloo["latency_us"] > 0
    for other in ("mpi", "ccl"):  # measured when every node has it, else the reason
        assert "seconds" in col["backends"][other] or col["backends"][other]["skipped"]
    assert col["choice"]["backend"] in col["backends"] and col["choice"]["bucket_cap_mb"] >= 4
    os.environ["CPUPERF_CACHE_DIR"] = str(cache)
    try:
        from cpuperf.run.collectives import read_cached

        assert read_cached(["10.99.0.1", "10.99.0.2"])["backends"]["gloo"] == gloo
    finally:
        del os.environ["CPUPERF_CACHE_DIR"]


def test_ddp_choice_from_a_measurement():
    fast_latency = {"world": 4, "backends": {
        "gloo": {"bucket_bytes": 25 << 20, "seconds": 0.20, "algbw_gbps": 0.13, "latency_us": 300.0},
        "ccl": {"bucket_bytes": 25 << 20, "seconds": 0.05, "algbw_gbps": 0.52, "latency_us": 40.0},
        "mpi": {"skipped": "torch was built without MPI"}}}
    choice = cluster.choose_ddp(fast_latency)
    assert choice.backend == "ccl" and choice.bucket_cap_mb == 25 and "gloo" in choice.reason
    slow_latency = {"world": 2, "backends": {
        "gloo": {"bucket_bytes": 25 << 20, "seconds": 0.025, "algbw_gbps": 1.05, "latency_us": 5000.0}}}
    choice = cluster.choose_ddp(slow_latency)
    # latency 5 ms at ~1 GB/s: a bucket must be >= 9 x 5 ms x 1 GB/s ~ 45 MB for latency to stay under 10%
    assert choice.backend == "gloo" and 40 <= choice.bucket_cap_mb <= 50
    assert cluster.choose_ddp({"backends": {"gloo": {"skipped": "x"}}}) is None


@pytest.mark.full  # srun
def test_inside_a_slurm_allocation_doctor_probes_its_nodes_through_srun(tmp_path):
    """A stand-in srun (no Slurm here) that runs the step on this host: doctor's argv and node list are real."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "srun.log"
    (bindir / "srun").write_text(f'#!/bin/sh\necho "$1 $2 $3" >> {log}\n'
                                 'while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bindir / "srun").chmod(0o755)
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
           "PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = run_cli(["doctor", "--json"], extra_env=env)
    assert proc.returncode == 14, proc.stderr
    rep = json.loads(proc.stdout)
    # the one skew: a loopback rendezvous address, which no other node could reach
    assert [f["id"] for f in rep["findings"] if f["severity"] == "error"] == ["master-wrong-address"]
    assert rep["transport"] == "srun" and [r["name"] for r in rep["nodes"]] == ["127.0.0.1", "127.0.0.2"]
    assert [r["status"] for r in rep["nodes"]] == ["ok", "ok"]
    lines = log.read_text().splitlines()
    assert sorted(line.split()[2] for line in lines) == ["--nodelist=127.0.0.1", "--nodelist=127.0.0.2"]
    this = run_cli(["doctor", "--this-node", "--json"], extra_env=env)
    assert this.returncode in (0, 1) and "nodes" not in json.loads(this.stdout)


def test_amx_usable_on_some_nodes_only(tmp_path):
    amx = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    a = _node(tmp_path, "node01", flags=amx, env={"CPUPERF_OVERRIDE_AMX_USABLE": "1"})
    b = _node(tmp_path, "node02", flags=amx, env={"CPUPERF_OVERRIDE_AMX_USABLE": "0"})
    assert a.facts.host.cpu.amx_usable and b.facts.host.cpu.amx_usable is False
    [f] = [f for f in cluster.diagnose([a, b], "ssh") if f.id == "amx-on-some-nodes"]
    assert f.nodes == ("node02",) and f.severity == "warning" and "kernel >= 5.16" in f.fix
    assert cluster.constraints(cluster.hosts_of([a, b])).bf16  # avx512_bf16 everywhere: bf16 stays native


def test_a_plan_from_saved_node_facts_is_the_plan_made_live(tmp_path):
    """The bundle's facts, saved and read back, give the recommendation the live probe gives."""
    import dataclasses

    from cpuperf.decide.recommend import recommend
    from cpuperf.decide.workload import resolve_workload
    from cpuperf.probe.node import parse_saved, read_output, saved_json
    from cpuperf.run.probe_bundle import bundle_code, probe_args

    argv = plan.python_command(bundle_code(), sys.executable, probe_args("me", "127.0.0.1"))
    facts, error = read_output(subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout)
    assert facts is not None and error is None
    saved = json.dumps(saved_json([NodeResult("me", "127.0.0.1", "ok", facts, None, 1.0, "ssh")], "ssh"))
    [back] = parse_saved(saved, "saved")
    assert back.facts == facts  # the facts survive the file whole
    workload = resolve_workload(params="10M", batch_size=8)
    # load is a finding of the moment, not a fact to plan from; memory available moves between probes
    steady = lambda h: dataclasses.replace(h, load=None, memory=dataclasses.replace(h.memory, available_bytes=None))
    live = recommend(steady(probe_host(use_cache=False)), workload)
    from_saved = recommend(steady(back.facts.host), workload)
    assert [d.value for d in from_saved.decisions] == [d.value for d in live.decisions]
    assert from_saved.placement == live.placement


@pytest.mark.full  # nodes as network namespaces
def test_a_name_that_resolves_to_the_wrong_address_on_one_node(tmp_path):
    """Hostfile by name; node 2's /etc/hosts maps node 1 to Debian's 127.0.1.1: doctor names node 2."""
    with namespace_nodes(2, tmp_path) as nodes:
        table = nodes.name_table()
        nodes.set_hosts(0, table)
        nodes.set_hosts(1, {**table, nodes.names[0]: "127.0.1.1"})
        hostfile = tmp_path / "names"
        hostfile.write_text("\n".join(nodes.names) + "\n")
        proc = _doctor(nodes, ["--hostfile", str(hostfile), "--json"])
    assert proc.returncode == 14, (proc.stdout[-2000:], proc.stderr[-2000:])
    rep = json.loads(proc.stdout)
    assert [r["status"] for r in rep["nodes"]] == ["ok", "ok"]
    [f] = [f for f in rep["findings"] if f["id"] == "master-wrong-address"]
    assert f["nodes"] == [nodes.names[1]] and "127.0.1.1" in f["message"] and "/etc/hosts" in f["fix"]


def test_the_bundle_reads_its_data_without_a_toml_parser(tmp_path):
    """Python 3.9/3.10 without tomli: the data travels as JSON too, and the probe names the CPU alike."""
    from cpuperf.probe.node import read_output
    from cpuperf.run.probe_bundle import bundle_code, probe_args

    hide = ("import sys, importlib.machinery\nsys.modules['tomllib'] = None\n"
            "class Hide:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        spec = importlib.machinery.PathFinder.find_spec(name, path) if name == 'tomli' else None\n"
            "        if spec and 'cpuperf-probe-' not in (spec.origin or ''):\n"
            "            raise ImportError('an installed tomli is hidden')\n"
            "sys.meta_path.insert(0, Hide())\n")
    no_toml = hide + bundle_code()
    argv = plan.python_command(no_toml, sys.executable, probe_args("me", "127.0.0.1"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    facts, error = read_output(proc.stdout)
    assert facts is not None and error is None, (proc.stdout[-1000:], proc.stderr[-2000:])
    assert facts.host.cpu.microarchitecture == probe_host().cpu.microarchitecture


def test_ctrl_c_kills_every_node_launch(tmp_path):
    import signal

    fake = tmp_path / "ssh"
    fake.write_text("#!/bin/sh\nexec sleep 618\n")
    fake.chmod(0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2\n127.0.0.3\n")
    # As from a terminal: Ctrl-C's default action. A suite started in the background by a non-interactive
    # shell hands its children SIGINT ignored, and cpuperf rightly keeps an inherited ignore (nohup's way).
    proc = subprocess.Popen([sys.executable, "-m", "cpuperf", "doctor", "--hostfile", str(hostfile), "--launcher", "ssh"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env({"CPUPERF_SSH": str(fake)}),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for _ in range(100):  # until all three launches are running
        if len(subprocess.run(["pgrep", "-f", "sleep 618"], capture_output=True, text=True).stdout.split()) == 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "sleep 618"], capture_output=True, text=True)
    assert left.returncode == 1, left.stdout


def test_the_nodes_table_fits_80_columns(tmp_path):
    """At 80 columns the 13-column table broke every cell into one letter per line: a block per node instead."""
    import re

    saved = tmp_path / "facts.json"
    assert run_cli(["doctor", "--save-facts", str(saved)]).returncode in (0, 1)
    narrow = run_cli(["doctor", "--facts", str(saved)], {"COLUMNS": "80"})
    lines = narrow.stdout.splitlines()
    assert narrow.returncode in (0, 1, 14), narrow.stderr
    assert lines and all(len(ln) <= 80 for ln in lines)
    assert any(re.match(r"torch\s+\d+\.\d+", ln) for ln in lines) and any(re.match(r"node\s+\S{2,}", ln) for ln in lines)
    wide = run_cli(["doctor", "--facts", str(saved)], {"COLUMNS": "160"})
    assert any(re.match(r"\s*node\s+status\s+CPU\s+ISA", ln) for ln in wide.stdout.splitlines())  # one row per node
