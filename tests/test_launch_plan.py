"""plan_launch() on recorded hosts: launchers, argv per MPI flavour, pinning, Slurm, hostfiles; HF flag merging."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hosts import make_host

from cpuperf.decide.recommend import RecommendRequest, recommend
from cpuperf.decide.threads import rank_threads
from cpuperf.decide.workload import PRESETS
from cpuperf.errors import UsageError
from cpuperf.plan.launch import (
    LaunchSpec,
    RankObservation,
    check_observations,
    parse_failure,
)
from cpuperf.plan.launch import plan_launch as _plan_launch
from cpuperf.probe import probe_host
from cpuperf.probe.facts import MpiLauncher
from cpuperf.probe.hosts import parse_hostfile_text
from cpuperf.probe.slurm import expand_nodelist, slurm_facts
from cpuperf.probe.software import mpi_flavour

CMD = ["python", "-m", "cpuperf.train.worker", "--config", "{}"]


def plan_launch(facts, placement, **spec):
    """plan_launch with the LaunchSpec's fields as keywords (the tests name only what each one varies), and the MPI
    launcher the edge finds in these facts (cpuperf.run.edge.gather asks the same function)."""
    return _plan_launch(facts, placement, LaunchSpec(**spec), mpi=mpi_flavour(facts))


def facts_for(tmp_path, monkeypatch, mpi=None, **host):
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    facts = probe_host(sysroot=str(make_host(tmp_path, **host)))
    if mpi:
        sw = dataclasses.replace(facts.software, mpi=(MpiLauncher("mpirun", f"/opt/{mpi}/bin/mpirun", mpi, "1.0"),))
        facts = dataclasses.replace(facts, software=sw)
    return facts


def test_two_socket_host_gets_two_torchrun_ranks_with_per_socket_cpus(tmp_path, monkeypatch):
    facts = facts_for(tmp_path, monkeypatch, sockets=2, cores_per_socket=4, threads_per_core=2)
    rec = recommend(facts, PRESETS["micro"])
    plan = plan_launch(facts, rec.placement, rank_command=CMD, log_dir="/r/logs", python="py",
                       threads=rank_threads(rec.levers, True))
    assert plan.launcher == "torchrun" and plan.world_size == 2
    assert "--standalone" in plan.argv and "--nproc-per-node=2" in plan.argv
    assert plan.argv[plan.argv.index("-m", 3):][:3] == ("-m", "cpuperf.run.rankexec", "--")
    assert [s.cpus for s in plan.per_rank] == [(0, 1, 2, 3), (4, 5, 6, 7)]  # no SMT siblings (8-15)
    assert [s.threads for s in plan.per_rank] == [4, 4]
    slots = json.loads(plan.env["CPUPERF_RANK_SLOTS"])
    assert slots == [{"cpus": [0, 1, 2, 3], "threads": 4}, {"cpus": [4, 5, 6, 7], "threads": 4}]


def test_one_rank_runs_directly_pinned(tmp_path, monkeypatch):
    facts = facts_for(tmp_path, monkeypatch, sockets=1, cores_per_socket=4, threads_per_core=2)
    rec = recommend(facts, PRESETS["micro"])
    plan = plan_launch(facts, rec.placement, rank_command=CMD, threads=rank_threads(rec.levers, True))
    assert plan.launcher == "direct" and tuple(plan.argv) == tuple(CMD)
    assert plan.affinity == (0, 1, 2, 3) and plan.env["OMP_NUM_THREADS"] == "4"
    plain = plan_launch(facts, rec.placement, rank_command=CMD, pin=False)
    assert plain.affinity is None and "OMP_NUM_THREADS" not in plain.env


def test_open_mpi_and_intel_mpi_argv_differ(tmp_path, monkeypatch):
    env = [_v("OMP_NUM_THREADS", "4")]
    ompi = facts_for(tmp_path / "o", monkeypatch, mpi="openmpi", sockets=2, cores_per_socket=4)
    rec = recommend(ompi, PRESETS["micro"])
    p = plan_launch(ompi, rec.placement, rank_command=CMD, launcher="mpirun", env_vars=env, euid=0)
    assert p.flavour == "openmpi"
    assert p.argv[:8] == ("/opt/openmpi/bin/mpirun", "-np", "2", "--bind-to", "none", "--map-by", "slot",
                          "--allow-run-as-root")
    assert "-x" in p.argv and "OMP_NUM_THREADS=4" in p.argv and "-genv" not in p.argv
    user = plan_launch(ompi, rec.placement, rank_command=CMD, launcher="mpirun", env_vars=env, euid=1000)
    assert "--allow-run-as-root" not in user.argv
    impi = facts_for(tmp_path / "i", monkeypatch, mpi="intelmpi", sockets=2, cores_per_socket=4)
    p2 = plan_launch(impi, rec.placement, rank_command=CMD, launcher="mpirun", env_vars=env, euid=0)
    assert p2.argv[:5] == ("/opt/intelmpi/bin/mpirun", "-n", "2", "-ppn", "2")
    i = p2.argv.index("-genv")
    assert p2.argv[i:i + 3] == ("-genv", "OMP_NUM_THREADS", "4") and "-x" not in p2.argv
    assert "--allow-run-as-root" not in p2.argv


def test_more_ranks_than_cores_oversubscribes_open_mpi(tmp_path, monkeypatch):
    facts = facts_for(tmp_path, monkeypatch, mpi="openmpi", sockets=1, cores_per_socket=2)
    rec = recommend(facts, PRESETS["micro"], RecommendRequest(nproc_per_node=2))
    p = plan_launch(facts, rec.placement, rank_command=CMD, launcher="mpirun", euid=0)
    assert "--oversubscribe" not in p.argv
    from cpuperf.decide.placement import Placement

    squeezed = dataclasses.replace(rec.placement, cpu_budget=1)
    assert isinstance(squeezed, Placement)
    assert "--oversubscribe" in plan_launch(facts, squeezed, rank_command=CMD, launcher="mpirun").argv


def test_mpirun_without_mpi_is_a_launch_error(tmp_path, monkeypatch):
    from cpuperf.commands.flags import with_flags
    from cpuperf.errors import CpuperfError, ExitCode

    facts = facts_for(tmp_path, monkeypatch, sockets=2, cores_per_socket=2)
    rec = recommend(facts, PRESETS["micro"])
    with pytest.raises(CpuperfError) as refused:
        plan_launch(facts, rec.placement, rank_command=CMD, launcher="mpirun")
    said = with_flags(refused.value)  # as the error boundary says it
    assert said.code == ExitCode.LAUNCH_FAILED
    assert said.message == "--launcher mpirun, but no Open MPI, Intel MPI or MPICH mpirun was found"
    assert said.hint == "apt-get install openmpi-bin, or use --launcher torchrun"


def test_slurm_allocation_uses_srun_and_first_node_as_master(tmp_path, monkeypatch):
    facts = facts_for(tmp_path, monkeypatch, sockets=2, cores_per_socket=4)
    rec = recommend(facts, PRESETS["micro"], RecommendRequest(nnodes=2))
    environ = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "cn[007-008]"}
    p = plan_launch(facts, rec.placement, rank_command=CMD, environ=environ, python="py", nnodes=2,
                    slurm=slurm_facts(environ))
    assert p.launcher == "srun" and p.nnodes == 2 and p.world_size == 4
    assert p.argv[:4] == ("srun", "--nodes=2", "--ntasks-per-node=2", "--ntasks=4")
    assert p.env["MASTER_ADDR"] == "cn007" and p.master_addr == "cn007"
    # inside a job step (srun already ran us) there is no second srun
    step_environ = {**environ, "SLURM_STEP_ID": "0"}
    step = plan_launch(facts, rec.placement, rank_command=CMD, environ=step_environ, nnodes=1,
                       slurm=slurm_facts(step_environ))
    assert step.launcher == "torchrun"


def test_nodelist_expansion():
    assert expand_nodelist("cn[007-009,12],gpu1") == ["cn007", "cn008", "cn009", "cn12", "gpu1"]


def test_hostfile_torchrun_multi_node_uses_first_host_as_rendezvous(tmp_path, monkeypatch):
    facts = facts_for(tmp_path, monkeypatch, sockets=1, cores_per_socket=4)
    hosts = parse_hostfile_text("10.99.0.1 slots=1\n10.99.0.2 slots=1\n")
    rec = recommend(facts, PRESETS["micro"], RecommendRequest(nnodes=2))
    env = [_v("MASTER_ADDR", "10.99.0.1"), _v("MASTER_PORT", "29555")]
    p = plan_launch(facts, rec.placement, rank_command=CMD, hosts=hosts, nnodes=2, node_rank=1, env_vars=env,
                    local_addr="10.99.0.2", python="py")
    assert p.launcher == "torchrun" and p.master_addr == "10.99.0.1"
    for arg in ("--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.99.0.1:29555",
                "--local-addr=10.99.0.2", "--rdzv-conf=is_host=false,join_timeout=300"):
        assert arg in p.argv
    mpi_facts = facts_for(tmp_path / "m", monkeypatch, mpi="openmpi", sockets=1, cores_per_socket=4)
    m = plan_launch(mpi_facts, rec.placement, rank_command=CMD, hosts=hosts, nnodes=2, launcher="mpirun",
                    env_vars=env)
    assert "--host" in m.argv and m.argv[m.argv.index("--host") + 1] == "10.99.0.1:1,10.99.0.2:1"
    assert m.env["MASTER_ADDR"] == "10.99.0.1" and "-np" in m.argv and m.argv[m.argv.index("-np") + 1] == "2"


def test_node_rank_out_of_range(tmp_path, monkeypatch):
    facts = facts_for(tmp_path, monkeypatch, sockets=1, cores_per_socket=2)
    hosts = parse_hostfile_text("a\nb\n")
    rec = recommend(facts, PRESETS["micro"], RecommendRequest(nnodes=2))
    with pytest.raises(UsageError):
        plan_launch(facts, rec.placement, rank_command=CMD, hosts=hosts, nnodes=2, node_rank=2,
                    env_vars=[_v("MASTER_ADDR", "a")])


def test_failure_reports_are_parsed():
    torchrun = ("Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : h\n"
                "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 15148)\n")
    assert parse_failure(torchrun) == (1, 137)
    ompi = ("mpirun detected that one or more processes exited with non-zero status ...\n\n"
            "  Process name: [[4242,1],1]\n  Exit code:    3\n")
    assert parse_failure(ompi) == (1, 3)
    assert parse_failure("mpirun noticed that process rank 0 with PID 0 on node h exited on signal 9 (Killed).") == (0, 137)
    assert parse_failure("all good") is None


def test_observations_that_differ_from_the_plan_warn(tmp_path, monkeypatch):
    facts = facts_for(tmp_path, monkeypatch, sockets=2, cores_per_socket=2)
    rec = recommend(facts, PRESETS["micro"])
    plan = plan_launch(facts, rec.placement, rank_command=CMD, python="py", threads=rank_threads(rec.levers, True))
    good = [RankObservation(0, 10, (0, 1), 3, "2", ["gnu"], "glibc"), RankObservation(1, 11, (2, 3), 3, "2", ["gnu"], "glibc")]
    assert check_observations(plan, good) == []
    bad = [RankObservation(1, 11, (0, 1, 2, 3), 3, "4", ["gnu"], "glibc")]
    warnings = check_observations(plan, bad, {"torch": {"num_threads": 4}})
    assert any("rank 1 ran on CPUs 0-3, planned 2-3" in w for w in warnings)
    assert any("OMP_NUM_THREADS=4" in w for w in warnings)
    assert any("rank 0's torch used 4 threads, planned 2" in w for w in warnings)


def test_rankexec_reads_each_launchers_local_rank():
    from cpuperf.run.rankexec import slot_for

    slots = json.dumps([{"cpus": [0], "threads": 1}, {"cpus": [1], "threads": 1}])
    for env in ({"LOCAL_RANK": "1", "RANK": "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_RANK": "3"},
                {"MPI_LOCALRANKID": "1", "PMI_RANK": "3"}, {"SLURM_LOCALID": "1", "SLURM_PROCID": "3"}):
        rank, local, slot = slot_for({**env, "CPUPERF_RANK_SLOTS": slots})
        assert (rank, local, slot) == (3, 1, {"cpus": [1], "threads": 1})


class _v:
    def __init__(self, name, value):
        self.name, self.value, self.reason = name, value, "test"


TORCHRUN_TWO_FAILURES = """
Failures:
[1]:
  time      : 2026-11-22_07:20:51
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 15147)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_07:20:51
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 15147)
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 15148)
"""


def test_the_signalled_rank_is_the_cause_when_peers_fail_at_once():
    from cpuperf.plan.launch import first_failure, parse_failures

    assert parse_failures(TORCHRUN_TWO_FAILURES) == {0: 1, 1: 137}
    assert first_failure(TORCHRUN_TWO_FAILURES, [0, 1]) == (1, 137)  # both gone within one poll
    assert first_failure(TORCHRUN_TWO_FAILURES, [0]) == (0, 1)  # rank 0 was seen gone first
    assert first_failure(TORCHRUN_TWO_FAILURES, []) == (1, 137)


def test_hosts_are_checked_from_the_one_resolver_which_names_every_unresolvable_host():
    import socket

    from cpuperf.errors import UnreachableError
    from cpuperf.probe.hosts import check_hosts, local_node_rank, require_resolvable

    hosts = parse_hostfile_text("localhost slots=1\n127.0.0.1 slots=1\n")
    found = check_hosts(hosts, require_resolvable(hosts), ssh=False)
    assert found["127.0.0.1"] == "127.0.0.1" and found["localhost"] in ("127.0.0.1", "::1")
    assert local_node_rank(hosts, found) == 0
    with pytest.raises(UnreachableError) as info:
        require_resolvable(parse_hostfile_text("localhost\nnope-1.invalid\nnope-2.invalid\n"))
    assert info.value.code == 7 and "nope-1.invalid" in info.value.message and "nope-2.invalid" in info.value.message
    assert socket.getdefaulttimeout() is None  # no process-wide socket state


@pytest.mark.parametrize("text, said", [
    ("a slots=99999999999999999999\n", "slots must be a whole number in 1..8192"),
    ("a:99999999999999999999\n", "in 1..8192"),
    ("a:8193\n", "in 1..8192"),
    ("a slots=0\n", "in 1..8192"),
    ("a max_slots=-1\n", "max_slots must be a whole number"),
    ("a:\u0663\n", "must be a whole number"),  # an Arabic-Indic digit: isdigit(), not a count MPI reads
    ("a:" + "9" * 5000 + "\n", "must be a whole number"),
])
def test_a_hostfile_slot_count_is_bounded_by_what_a_host_can_run(text, said):
    with pytest.raises(UsageError) as err:
        parse_hostfile_text(text)
    assert said in err.value.message and len(err.value.message) < 300
    assert parse_hostfile_text("a:8192\nb slots=2 max_slots=4\n")[0].slots == 8192


def test_the_plan_says_which_launch_opens_its_own_session(tmp_path, monkeypatch):
    """`setsid CMD` run directly is started in no session of cpuperf's (setsid would fork, the run end at once);
    under a launcher, setsid runs inside each rank. The executor reads this from the plan, not from argv."""
    facts = facts_for(tmp_path, monkeypatch, sockets=2, cores_per_socket=4, threads_per_core=1)
    rec = recommend(facts, PRESETS["micro"])
    words = ("setsid", "python", "t.py")
    one = dataclasses.replace(rec.placement, nproc_per_node=1, slots=rec.placement.slots[:1])
    direct = plan_launch(facts, one, rank_command=words, opens_session=True)
    assert direct.launcher == "direct" and direct.own_session
    assert "own_session" not in direct.to_json()  # how it is started, not a fact of the plan's JSON
    torchrun = plan_launch(facts, rec.placement, rank_command=words, launcher="torchrun", opens_session=True)
    assert torchrun.launcher == "torchrun" and not torchrun.own_session
    assert not plan_launch(facts, one, rank_command=("python", "t.py")).own_session
