"""Placement: ranks per node, threads per rank, pinning, on recorded hosts."""

from __future__ import annotations

import pytest
from hosts import make_host

from cpuperf.decide.placement import plan_placement
from cpuperf.errors import UsageError
from cpuperf.probe import probe_host
from cpuperf.probe.hosts import parse_hostfile_text, valid_host


def test_two_sockets_get_two_ranks_with_per_socket_physical_cores(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, cores_per_socket=8, threads_per_core=2)))
    p = plan_placement(facts)
    assert p.nproc_per_node == 2 and p.threads_per_rank == 8
    assert p.slots[0].cpus == tuple(range(0, 8)) and p.slots[1].cpus == tuple(range(8, 16))
    assert p.slots[1].socket == 1


def test_numa_unit_on_snc(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, cores_per_socket=8, nodes_per_socket=2)))
    p = plan_placement(facts, unit="numa")
    assert p.nproc_per_node == 4 and [s.node for s in p.slots] == [0, 1, 2, 3]
    assert p.threads_per_rank == 4
    p2 = plan_placement(facts, nproc_per_node=2, unit="numa")  # 4 nodes folded into 2 ranks
    assert [len(s.cpus) for s in p2.slots] == [8, 8]


def test_quota_caps_threads(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, cores_per_socket=16, cgroup={"cpu.max": "400000 100000"})))
    p = plan_placement(facts)
    assert p.nproc_per_node == 1 and p.threads_per_rank == 4 and p.cpu_budget == 4


def test_cpuset_excluding_cpu0(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, cores_per_socket=16, cgroup={"cpuset.cpus.effective": "4-7"})))
    p = plan_placement(facts)
    assert p.slots[0].cpus == (4, 5, 6, 7) and p.threads_per_rank == 4


def test_ccl_workers_come_out_of_compute_threads(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, cores_per_socket=32)))
    p = plan_placement(facts, ccl=True)
    assert p.ccl_workers == 4
    assert p.slots[0].ccl_worker_cpus == (0, 1, 2, 3) and p.slots[0].threads == 28
    assert p.slots[1].ccl_worker_cpus == (32, 33, 34, 35)


def test_hybrid_uses_performance_cores(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, cores_per_socket=12, model=151, hybrid_efficient=range(8, 12))))
    p = plan_placement(facts)
    assert p.slots[0].cpus == tuple(range(8)) and p.threads_per_rank == 8


def test_too_many_ranks_is_a_usage_error(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, cores_per_socket=2)))
    with pytest.raises(UsageError):
        plan_placement(facts, nproc_per_node=3)


def test_hostfile_formats_and_errors():
    hosts = parse_hostfile_text("# nodes\nnode01 slots=2\nnode02:4\n10.0.0.3\n")
    assert [(h.name, h.slots) for h in hosts] == [("node01", 2), ("node02", 4), ("10.0.0.3", None)]
    for bad in ("node01 slots=x\n", "$(reboot)\n", "node01:0\n", "a b c\n", "", "n1\nn1\n", "`id`:2\n"):
        with pytest.raises(UsageError):
            parse_hostfile_text(bad)
    assert valid_host("fe80::1") and not valid_host("-bad") and not valid_host("a;b")


def test_ccl_worker_reserved_for_one_rank_per_node_across_nodes(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=1, cores_per_socket=16)))
    assert plan_placement(facts, ccl=True).ccl_workers == 0  # a single rank has no collectives
    p = plan_placement(facts, ccl=True, nnodes=4)
    assert p.ccl_workers == 4 and p.threads_per_rank == 12
