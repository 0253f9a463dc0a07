"""The probe on recorded hosts (real cpuinfo files, synthetic /sys trees) and on this host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hosts import CPUINFO, fixture_host, make_host, write

from cpuperf.knowledge.bf16 import bf16_native
from cpuperf.probe import parse, probe_host
from cpuperf.probe.facts import X86_ISA, HostFacts

# Named for the answer they must produce (archspec's habit).
FIXTURES = sorted(p.name for p in CPUINFO.iterdir() if p.name.startswith("linux-"))

AVX512 = ["avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "clwb"]
# Sapphire Rapids flags: Intel ISE reference (AMX-TILE/BF16/INT8, AVX512-FP16, AVX-VNNI) in Linux spelling.
SPR = AVX512 + ["avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni"]
ZEN4 = AVX512 + ["avx512_vnni", "avx512_bf16", "avx512vbmi", "vaes", "vpclmulqdq"]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_recorded_cpuinfo_gets_its_microarchitecture_and_isa(tmp_path, fixture):
    facts = probe_host(sysroot=str(fixture_host(tmp_path, fixture)))
    expected = fixture.split("-", 2)[2]
    assert facts.cpu.microarchitecture == expected
    assert facts.cpu.microarchitecture_source == "model"
    flags_line = next(l for l in (CPUINFO / fixture).read_text().splitlines()
                      if l.lower().startswith(("flags", "features")))
    listed = set(flags_line.split(":", 1)[1].split())
    for flag in X86_ISA:
        assert (flag in facts.cpu.isa) == (flag in listed), flag
    assert not {"avx512_bf16", "amx_bf16"} & set(facts.cpu.isa)
    assert facts.cpu.amx_supported is False
    # a snapshot cannot tell packages, GPUs or this process's affinity
    assert facts.software is None and facts.gpus is None


def test_arm_host_is_not_x86_and_its_bf16_is_not_x86_bf16(tmp_path):
    facts = probe_host(sysroot=str(fixture_host(tmp_path, "linux-amazon-neoverse_v1")))
    assert facts.cpu.arch == "aarch64"
    assert facts.cpu.implementer == 0x41 and facts.cpu.part == 0xd40
    assert "sve" in facts.cpu.isa and "bf16" in facts.cpu.isa
    assert not {"avx512_bf16", "amx_bf16"} & set(facts.cpu.isa)  # Arm's bf16 is its own extension, not avx512_bf16/AMX
    assert bf16_native(facts)  # which the owner counts (knowledge/bf16.py): the probe reports the flags only


def test_sapphire_rapids_has_native_bf16_and_amx(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, flags=SPR, model=143)))
    assert facts.cpu.microarchitecture == "sapphirerapids"
    assert {"avx512_bf16", "amx_bf16"} <= set(facts.cpu.isa) and facts.cpu.amx_supported
    assert facts.cpu.amx_usable is None  # permission is a fact of a live process


def test_cooperlake_is_named_by_stepping(tmp_path):
    flags = AVX512 + ["avx512_vnni", "avx512_bf16"]
    facts = probe_host(sysroot=str(make_host(tmp_path, flags=flags, model=85, stepping=11)))
    assert facts.cpu.microarchitecture == "cooperlake" and "avx512_bf16" in facts.cpu.isa


def test_zen4_and_zen5(tmp_path):
    zen4 = probe_host(sysroot=str(make_host(tmp_path / "a", vendor="AuthenticAMD", family=25, model=17, flags=ZEN4)))
    assert zen4.cpu.microarchitecture == "zen4" and "avx512_bf16" in zen4.cpu.isa and not zen4.cpu.amx_supported
    zen5 = probe_host(sysroot=str(make_host(tmp_path / "b", vendor="AuthenticAMD", family=26, model=2, flags=ZEN4)))
    assert zen5.cpu.microarchitecture == "zen5"


def test_unknown_model_falls_back_to_newest_generation_whose_features_are_present(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, flags=SPR, model=250)))
    assert facts.cpu.microarchitecture in ("sapphirerapids", "emeraldrapids")
    assert facts.cpu.microarchitecture_source == "features"
    # Granite/Emerald/Diamond Rapids print the same flags (Linux has no /proc/cpuinfo name for AMX-FP16):
    # an unknown model with them is named for the oldest generation that has them, not guessed newer.
    assert facts.cpu.microarchitecture == "sapphirerapids"


def test_power_and_unknown_architectures_never_crash(tmp_path):
    write(tmp_path / "p", "/proc/cpuinfo", "processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n"
                                          "clock\t\t: 3800MHz\nrevision\t: 2.2 (pvr 004e 1202)\n\n"
                                          "timebase\t: 512000000\nplatform\t: PowerNV\n")
    facts = probe_host(sysroot=str(tmp_path / "p"))
    assert facts.cpu.arch == "ppc64le" and facts.cpu.microarchitecture == "power9"
    write(tmp_path / "r", "/proc/cpuinfo", "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdc\nmmu\t\t: sv39\n")
    facts = probe_host(sysroot=str(tmp_path / "r"))
    assert facts.cpu.arch == "riscv64" and facts.cpu.microarchitecture == "unknown"
    write(tmp_path / "e", "/proc/cpuinfo", "")
    facts = probe_host(sysroot=str(tmp_path / "e"))
    assert facts.cpu.microarchitecture == "unknown"


def test_two_sockets_with_smt(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, cores_per_socket=8, threads_per_core=2)))
    topo = facts.topology
    assert (topo.sockets, topo.physical_cores, topo.logical_cpus, topo.threads_per_core) == (2, 16, 32, 2)
    assert [len(n.cpus) for n in topo.numa_nodes] == [16, 16]
    assert topo.source == "sysfs"


def test_sub_numa_clustering_and_ten_plus_nodes(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, cores_per_socket=24, nodes_per_socket=6)))
    topo = facts.topology
    assert len(topo.numa_nodes) == 12
    assert [n.id for n in topo.numa_nodes] == list(range(12))  # node10 sorts after node9
    assert topo.numa_nodes[10].cpus == tuple(range(40, 44))  # socket 1, its 5th cluster
    assert topo.sockets == 2 and topo.physical_cores == 48


def test_cpuless_node_counts(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=1, cores_per_socket=4, extra_cpuless_nodes=1)))
    nodes = facts.topology.numa_nodes
    assert len(nodes) == 2 and nodes[1].cpus == () and nodes[1].memory_bytes == 16 << 30


def test_older_kernels_cpumap_masks(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, cores_per_socket=20, threads_per_core=2,
                                             cpumap_only=True)))
    topo = facts.topology
    assert (topo.sockets, topo.physical_cores, topo.logical_cpus) == (2, 40, 80)
    assert topo.numa_nodes[1].cpus == tuple(list(range(20, 40)) + list(range(60, 80)))


def test_offline_cpus_are_not_counted(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, cores_per_socket=8, offline=(6, 7))))
    assert facts.topology.logical_cpus == 6 and facts.topology.offline_cpus == (6, 7)
    assert facts.topology.physical_cores == 6


def test_cpuinfo_only_topology(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, cores_per_socket=4, threads_per_core=2,
                                             with_sys=False)))
    topo = facts.topology
    assert topo.source == "cpuinfo"
    assert (topo.sockets, topo.physical_cores, topo.logical_cpus) == (2, 8, 16)


def test_cgroup_v2_quota_and_cpuset_excluding_cpu0(tmp_path):
    root = make_host(tmp_path, cores_per_socket=16, cgroup={"cpu.max": "400000 100000",
                                                            "cpuset.cpus.effective": "2-5"})
    facts = probe_host(sysroot=str(root))
    assert facts.topology.cpu_quota == 4.0
    assert facts.topology.cpuset == (2, 3, 4, 5)
    assert facts.topology.allowed_cpus == (2, 3, 4, 5)
    assert facts.usable_cpus() == (2, 3, 4, 5)
    assert facts.topology.cgroup_version == 2


def test_cgroup_v1_quota_and_memory_limit(tmp_path):
    root = make_host(tmp_path, cores_per_socket=16, cgroup_version=1,
                     cgroup={"cpu.cfs_quota_us": "250000", "cpu.cfs_period_us": "100000",
                             "memory.limit_in_bytes": str(8 << 30)})
    facts = probe_host(sysroot=str(root))
    assert facts.topology.cpu_quota == 2.5
    assert facts.limits.memory_limit_bytes == 8 << 30
    root2 = make_host(tmp_path / "nolimit", cgroup_version=1,
                      cgroup={"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000",
                              "memory.limit_in_bytes": "9223372036854771712"})
    facts2 = probe_host(sysroot=str(root2))
    assert facts2.topology.cpu_quota is None and facts2.limits.memory_limit_bytes is None


def test_hybrid_core_types(tmp_path):
    root = make_host(tmp_path, cores_per_socket=12, model=151, flags=["avx2", "fma", "avx_vnni", "gfni", "vaes", "serialize"],
                     hybrid_efficient=range(8, 12))
    facts = probe_host(sysroot=str(root))
    assert facts.topology.hybrid and facts.cpu.microarchitecture == "alderlake"
    types = {c.id: c.core_type for c in facts.topology.cpus}
    assert types[0] == "performance" and types[11] == "efficient"


def test_overrides_describe_another_host(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUPERF_OVERRIDE_ISA", "avx2,avx512f,avx512_bf16")
    monkeypatch.setenv("CPUPERF_OVERRIDE_CPU_QUOTA", "3")
    facts = probe_host(sysroot=str(make_host(tmp_path)))
    assert "avx512_bf16" in facts.cpu.isa and "avx512f" in facts.cpu.isa
    assert facts.topology.cpu_quota == 3.0
    assert "isa" in facts.overrides


def test_facts_round_trip_through_json(tmp_path):
    facts = probe_host(sysroot=str(make_host(tmp_path, sockets=2, flags=SPR)))
    again = HostFacts.loads(facts.dumps())
    assert again == facts


def test_parsers():
    assert parse.parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse.parse_cpulist("100-102") == (100, 101, 102)
    assert parse.parse_cpulist("0-8:4") == (0, 4, 8)
    assert parse.parse_cpumask("00000000,0000f00f") == (0, 1, 2, 3, 12, 13, 14, 15)
    assert parse.parse_cpumask("00000001,00000000") == (32,)
    assert parse.format_cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert parse.parse_cgroup_v2_cpu_max("max 100000") is None
    assert parse.parse_slurm_cpus_per_node("72(x2),36") == 72
    assert parse.parse_mpi_version("mpirun (Open MPI) 4.1.4\n\nReport bugs") == ("openmpi", "4.1.4")
    assert parse.parse_mpi_version("Intel(R) MPI Library for Linux* OS, Version 2021.13 Build 2024")[0] == "intelmpi"
    assert parse.parse_mpi_version("HYDRA build details:\n    Version:                                 4.0.2")[0] == "mpich"
    assert parse.cuda_from_local("cu121") == "12.1" and parse.cuda_from_local("cpu") is None


# -- the live host: the answer comes from the host itself, never a hard-coded CPU -----------

def _live_flags():
    text = Path("/proc/cpuinfo").read_text()
    line = next((l for l in text.splitlines() if l.lower().startswith(("flags", "features"))), "flags:")
    return set(line.split(":", 1)[1].split())


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc")
def test_live_host_matches_its_own_proc_and_sys():
    facts = probe_host()
    flags = _live_flags()
    for flag in X86_ISA:
        assert (flag in facts.cpu.isa) == (flag in flags)
    packages = set()
    for cpu in os.listdir("/sys/devices/system/cpu"):
        p = Path(f"/sys/devices/system/cpu/{cpu}/topology/physical_package_id")
        if p.exists():
            packages.add(p.read_text().strip())
    if packages:
        assert facts.topology.sockets == len(packages)
    nodes = [n for n in os.listdir("/sys/devices/system/node") if n.startswith("node") and n[4:].isdigit()]
    if nodes:
        assert len(facts.topology.numa_nodes) == len(nodes)
    assert facts.topology.logical_cpus == os.cpu_count()
    assert set(facts.usable_cpus()) == os.sched_getaffinity(0)
    assert facts.software is not None and facts.software.python.startswith("3.")


# -- bounded input: cpulists, overrides, --sysroot ----------------------------------------------------

@pytest.mark.parametrize("text", ["0-99999999", "65536", "0-65535," * 3, "zero", "3-1", "0-8:0", "1e9"])
def test_cpulist_refuses_huge_or_malformed_lists_quickly(text):
    import time

    from cpuperf.errors import UsageError

    started = time.monotonic()
    with pytest.raises(UsageError) as info:
        parse.parse_cpulist(text, origin="CPUPERF_OVERRIDE_ALLOWED_CPUS")
    assert time.monotonic() - started < 0.5
    assert "CPUPERF_OVERRIDE_ALLOWED_CPUS" in info.value.message
    assert parse.parse_cpulist("0-65535") == tuple(range(65536))


def test_cpumask_longer_than_any_cpu_id_is_unknown():
    assert parse.parse_cpumask("f" * 20000) is None
    assert parse.parse_cpumask("0000ff0f") == (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15)


@pytest.mark.parametrize("name,value", [("MEMORY_TOTAL", "lots"), ("MEMORY_TOTAL", "-5"), ("CPU_QUOTA", "nan"),
                                        ("CPU_QUOTA", "inf"), ("CPU_QUOTA", "-1"), ("ALLOWED_CPUS", "0-99999999")])
def test_bad_numeric_overrides_name_the_variable(tmp_path, name, value):
    from cpuperf.errors import UsageError

    root = make_host(tmp_path)
    with pytest.raises(UsageError) as info:
        probe_host(sysroot=str(root), software=False, use_cache=False,
                   environ={f"CPUPERF_OVERRIDE_{name}": value})
    assert f"CPUPERF_OVERRIDE_{name}" in info.value.message


def test_missing_empty_or_unusable_sysroot_is_a_usage_error(tmp_path):
    from cpuperf.errors import UsageError

    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for bad in (str(tmp_path / "nope"), str(tmp_path / "empty"), str(tmp_path / "file"), ""):
        with pytest.raises(UsageError):
            probe_host(sysroot=bad, software=False, use_cache=False)
    root = make_host(tmp_path / "ok")
    assert probe_host(sysroot=str(root), software=False, use_cache=False).topology.logical_cpus == 4


# -- hostfiles: linear, bounded, text only --------------------------------------------------------------

def test_hostfile_parsing_is_linear_and_capped(tmp_path):
    import time

    from cpuperf.errors import UsageError
    from cpuperf.probe.hosts import MAX_HOSTS, parse_hostfile_text, read_hostfile

    started = time.monotonic()  # the old duplicate check took minutes here (list.count per host)
    with pytest.raises(UsageError, match="more than once"):
        parse_hostfile_text("".join(f"node{i % 30000}\n" for i in range(60000)))
    assert len(parse_hostfile_text("# comment\n" * 10 ** 6 + "node1\n")) == 1
    with pytest.raises(UsageError, match=f"more than {MAX_HOSTS} hosts"):
        parse_hostfile_text("".join(f"node{i}\n" for i in range(10 ** 6)))
    assert time.monotonic() - started < 10
    for name, data, needle in (("bin", b"node1\n\x00\xff", "binary"), ("latin", "n\xf6de\n".encode("latin-1"), "UTF-8")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UsageError, match=needle):
            read_hostfile(str(tmp_path / name))


# -- the one resolver ----------------------------------------------------------------------------------

def test_resolver_answers_names_and_addresses():
    from cpuperf.probe.hosts import resolve, resolve_all

    assert resolve("127.0.0.1") == "127.0.0.1" and resolve("::1") == "::1"
    assert resolve("localhost") in ("127.0.0.1", "::1")
    assert resolve_all(["no-such-host.invalid", "localhost"], timeout=5)["no-such-host.invalid"] is None


def test_resolver_timeout_is_real_and_changes_no_socket_default(monkeypatch):
    """getaddrinfo ignores socket.setdefaulttimeout; a stuck lookup (faked at the OS edge: the one
    function that calls getaddrinfo) must cost the timeout, not the lookup's own time."""
    import socket
    import threading
    import time

    from cpuperf.errors import UnreachableError
    from cpuperf.probe import hosts as hostmod

    release = threading.Event()
    monkeypatch.setattr(hostmod, "_lookup", lambda name: release.wait(30) and None)
    started = time.monotonic()
    try:
        assert hostmod.resolve("stuck.example", timeout=0.3) is None
        with pytest.raises(UnreachableError) as info:
            hostmod.require_resolvable(hostmod.parse_hostfile_text("a1\na2\n10.0.0.1\n"), timeout=0.3)
    finally:
        release.set()
    assert time.monotonic() - started < 3
    assert "a1" in info.value.message and "a2" in info.value.message and "10.0.0.1" not in info.value.message
    assert socket.getdefaulttimeout() is None
