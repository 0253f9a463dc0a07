"""The benchmark sweep: every lever the host has, the product of their values, and pruning that says why."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hosts import make_host

from benchmarks import sweep
from cpuperf.probe import probe_host


def _facts(tmp_path, monkeypatch, allocators=None, **host):
    monkeypatch.setenv("CPUPERF_OVERRIDE_PACKAGES", json.dumps({"torch": "2.13.0+cpu"}))
    facts = probe_host(sysroot=str(make_host(tmp_path, **host)))
    return replace(facts, software=replace(facts.software, allocators=allocators or {}))


def test_a_four_core_host_without_bf16_sweeps_layouts_pinning_compile_and_prunes_the_rest(tmp_path, monkeypatch):
    facts = _facts(tmp_path, monkeypatch, cores_per_socket=4, flags=("avx2", "fma"), vendor="AuthenticAMD",
                   family=25, model=1)
    found = sweep.levers(facts, full=False)
    assert found["dtype"].values == ["fp32"] and "no native bf16" in found["dtype"].pruned
    assert found["allocator"].values == [None] and "cpuperf install" in found["allocator"].pruned
    assert found["layout"].values == [(1, 4), (2, 2), (4, 1)] and found["layout"].pruned is None
    assert found["pinning"].values == [False, True]
    # torch 2.13 has AdamW's fused CPU kernel: swept beside torch's default, and named in the point.
    assert found["optimizer"].values == [None, "adamw_fused"] and found["optimizer"].pruned is None
    points = sweep.product(facts, found)
    compiles = len(found["compile"].values)
    assert len(points) == 1 * compiles * 2 * 1 * 3 * 2 and len({p["name"] for p in points}) == len(points)
    fused = [p for p in points if p["point"]["optimizer"] == "adamw_fused"]
    assert len(fused) == len(points) // 2 and all(p["settings"]["optimizer"] == "adamw_fused" for p in fused)
    assert all("adamw_fused" in p["name"] for p in fused)
    two_by_two = next(p for p in points if p["point"]["ranks"] == 2 and p["point"]["pinned"])
    # Pinned ranks get disjoint cores; each rank's thread count matches its CPUs.
    slots = two_by_two["settings"]["cpus_per_rank"]
    assert len(slots) == 2 and not set(slots[0]) & set(slots[1]) and all(len(s) == 2 for s in slots)
    assert two_by_two["env"]["OMP_NUM_THREADS"] == "2"
    # --full sweeps emulated bf16 too, saying it is emulated.
    full = sweep.levers(facts, full=True)
    assert full["dtype"].values == ["fp32", "bf16"] and full["dtype"].pruned is None and full["dtype"].notes


def test_installed_allocators_are_swept_with_what_preloading_sets(tmp_path, monkeypatch):
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"\x7fELF")
    mi = tmp_path / "libmimalloc.so"
    mi.write_bytes(b"\x7fELF")
    facts = _facts(tmp_path / "h", monkeypatch, cores_per_socket=1,
                   allocators={"jemalloc": (str(lib),), "mimalloc": (str(mi),), "tcmalloc": ()})
    found = sweep.levers(facts, full=False)
    assert found["allocator"].values == [None, "jemalloc", "mimalloc"] and found["allocator"].pruned is None
    assert "one rank" in found["layout"].pruned  # one core: a single layout
    points = {p["point"]["allocator"]: p for p in sweep.product(facts, found, with_compile=False)
              if not p["point"]["pinned"]}
    assert points["jemalloc"]["env"]["LD_PRELOAD"] == str(lib) and "MALLOC_CONF" in points["jemalloc"]["env"]
    assert points["mimalloc"]["env"]["LD_PRELOAD"] == str(mi) and "LD_PRELOAD" not in points[None]["env"]


def test_a_torch_without_fused_cpu_adamw_prunes_the_optimizer_lever_and_says_why(tmp_path, monkeypatch):
    facts = _facts(tmp_path, monkeypatch, cores_per_socket=2)
    facts = replace(facts, software=replace(facts.software, packages={
        **facts.software.packages, "torch": replace(facts.software.packages["torch"], version="2.3.1+cpu")}))
    found = sweep.levers(facts, full=False)
    assert found["optimizer"].values == [None] and "2.3.1+cpu has no fused AdamW on CPU (since 2.4)" in found["optimizer"].pruned


def test_a_failed_run_is_recorded_with_the_line_that_says_why():
    from benchmarks.suite import _failure_line

    torchrun = ("terminate called without an active exception\nTraceback (most recent call last):\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                "=======================================================\ncpuperf.train.bench FAILED\n"
                "  traceback : Signal 6 (SIGABRT) received by PID 22397\n"
                "=======================================================\n")
    assert _failure_line(torchrun) == "traceback : Signal 6 (SIGABRT) received by PID 22397"
    assert _failure_line("loading\nValueError: bad shape\n") == "ValueError: bad shape"
    assert _failure_line("just this\n") == "just this" and _failure_line("") == "?"


def test_full_leaves_out_what_the_host_cannot_win_and_says_why(tmp_path, monkeypatch):
    mi = tmp_path / "libmimalloc.so"
    mi.write_bytes(b"\x7fELF")
    # a 2-core Zen 3 (no native bf16), as issue 47 measured it
    facts = _facts(tmp_path / "h", monkeypatch, cores_per_socket=2, flags=("avx2", "fma"), vendor="AuthenticAMD",
                   family=25, model=1, allocators={"mimalloc": (str(mi),)})
    found = sweep.levers(facts, full=True)
    found["compile"].values = [False, True]  # as on a host with a C compiler
    points = sweep.product(facts, found)
    assert len(points) == 2 * 2 * 2 * 2 * 2 * 2
    auto = {"dtype": "fp32", "compile": False, "optimizer": "adamw_fused", "allocator": "mimalloc", "ranks": 1,
            "threads_per_rank": 2, "pinned": True}
    kept, left = sweep.winnable(facts, points, auto, {"fp32": 180.0, "bf16": 9.0}, ("mimalloc",))
    why = {e["rule"]: e for e in left}
    assert "measured bf16 9 against fp32 180 GFLOP/s (20x slower)" in why["bf16 emulated"]["why"]
    assert all(p["point"]["dtype"] == "fp32" for p in kept) and why["bf16 emulated"]["points"] == 32
    # one rank pinned to both CPUs is the unpinned run; mimalloc never goes into two ranks; compile only at auto's point
    assert not any(p["point"]["ranks"] == 1 and p["point"]["pinned"] for p in kept)
    assert not any(p["point"]["ranks"] == 2 and p["point"]["allocator"] == "mimalloc" for p in kept)
    compiled = [p for p in kept if p["point"]["compile"]]
    assert [p["point"] for p in compiled] == [{**auto, "compile": True, "pinned": False}]
    assert len(kept) == 2 * (1 + 2 + 1) + 1  # optimizer x (default 1x2, default 2x1 x2 pinnings, mimalloc 1x2) + twin
    assert sum(e["points"] for e in left) + len(kept) == len(points)
    # with bf16 as fast as fp32 (or not measured), emulated bf16 stays in the sweep
    kept2, left2 = sweep.winnable(facts, points, auto, None, ("mimalloc",))
    assert "bf16 emulated" not in {e["rule"] for e in left2} and any(p["point"]["dtype"] == "bf16" for p in kept2)


# -- runtime levers: variables and thread counts tried at auto's own point --------------------------------------

def _runtime_host(**kw):
    base = dict(openmp={"gomp": ("/x/torch/lib/libgomp.so.1",), "iomp": ()}, thp="madvise", glibc=(2, 36),
                allocators={"mimalloc": "/x/libmimalloc.so"}, torch="2.13.0+cpu")
    return sweep.RuntimeHost(**{**base, **kw})


def test_a_zen4_like_host_tries_gnu_openmp_huge_pages_and_one_thread_and_says_what_it_cannot(tmp_path):
    points, pruned = sweep.runtime_points(_runtime_host(), None, 2)
    assert [(p.lever, p.label, p.against) for p in points] == [
        ("openmp", "OMP_WAIT_POLICY=PASSIVE", "auto"), ("openmp", "OMP_WAIT_POLICY=ACTIVE", "auto"),
        ("openmp", "GOMP_SPINCOUNT=10000", "auto"),
        # mimalloc is not auto's allocator: it is judged against auto, and its huge pages against mimalloc
        ("allocator", "mimalloc", "auto"), ("thp", "THP_MEM_ALLOC_ENABLE=1", "auto"),
        ("thp", "mimalloc MIMALLOC_ALLOW_LARGE_OS_PAGES=1", "auto + mimalloc"),
        ("thp", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1", "auto"), ("threads", "1 thread(s)", "auto")]
    assert "no libiomp5" in pruned["openmp: Intel"] and "GNU's libgomp" in pruned["openmp: Intel"]
    assert "jemalloc is not installed" in pruned["thp: jemalloc"]
    assert set(pruned) == {"openmp: Intel", "thp: jemalloc", "allocator: tcmalloc", "allocator: jemalloc"}


def test_each_lever_is_pruned_with_why_where_the_host_lacks_it():
    points, pruned = sweep.runtime_points(_runtime_host(openmp={}, thp="never", allocators={}), None, 1)
    assert points == [] and "no libgomp" in pruned["openmp: GNU"] and "never" in pruned["thp"]
    assert "no fewer to try" in pruned["threads"]
    old, pruned = sweep.runtime_points(_runtime_host(glibc=(2, 31), torch="2.1.2", allocators={}), None, 8)
    assert "glibc 2.31 has no glibc.malloc.hugetlb" in pruned["thp: glibc"]
    assert "torch 2.1.2 has no THP_MEM_ALLOC_ENABLE" in pruned["thp: torch"]
    assert [p.threads for p in old if p.lever == "threads"] == [7, 4]  # cores - 1, and half
    assert sweep._thp_mode("[always] madvise never\n") == "always" and sweep._thp_mode("") is None


def test_auto_s_own_allocator_gets_its_huge_page_switch_and_libiomp5_goes_first_in_the_preload():
    host = _runtime_host(openmp={"gomp": ("/g",), "iomp": ("/i/libiomp5.so",)},
                         allocators={"jemalloc": "/j/libjemalloc.so.2"})
    points, pruned = sweep.runtime_points(host, "jemalloc", 2)
    by = {p.label: p for p in points}
    je = next(p for p in points if p.label.startswith("MALLOC_CONF="))
    conf = dict(je.env)["MALLOC_CONF"]
    assert je.against == "auto" and conf.endswith("thp:always,metadata_thp:auto") and conf.count("metadata_thp") == 1
    # auto has an allocator: glibc's huge pages are judged against glibc's malloc, not against auto
    assert by["glibc malloc GLIBC_TUNABLES=glibc.malloc.hugetlb=1"].against == "auto + glibc malloc"
    auto = {"name": "auto", "env": {"OMP_NUM_THREADS": "2", "LD_PRELOAD": "/j/libjemalloc.so.2", "MALLOC_CONF": "x"},
            "ranks": 1, "settings": {"dtype": "bf16", "threads_per_rank": 2, "cpus_per_rank": [[0, 1]]},
            "decisions": {"dtype": "bf16", "allocator": "jemalloc", "threads_per_rank": 2, "affinity": "auto"}}
    iomp = sweep.runtime_config(auto, by["libiomp5 KMP_BLOCKTIME=1"], host.allocators)
    assert iomp["env"]["LD_PRELOAD"] == "/i/libiomp5.so:/j/libjemalloc.so.2" and iomp["env"]["KMP_BLOCKTIME"] == "1"
    glibc = sweep.runtime_config(auto, by["glibc malloc"], host.allocators)
    assert "LD_PRELOAD" not in glibc["env"] and "MALLOC_CONF" not in glibc["env"] and glibc["point"]["allocator"] is None
    one = sweep.runtime_config(auto, sweep.RuntimePoint("threads", "1 thread(s)", (("OMP_NUM_THREADS", "1"),), 1),
                               host.allocators)
    assert one["settings"]["cpus_per_rank"] == [[0]] and one["env"]["OMP_NUM_THREADS"] == "1"
    assert one["point"]["threads_per_rank"] == 1 and one["against"] == "auto" and auto["settings"]["threads_per_rank"] == 2
    from benchmarks.checks import expected

    assert expected(one) == {"ranks": 1, "allocator": "jemalloc", "dtype": "bf16", "compile": False,
                             "optimizer": "adamw", "threads": 1, "cpus": [[0]]}


def test_a_host_with_libiomp5_and_every_allocator_tries_each_blocktime_and_each_allocator_against_its_rival():
    host = _runtime_host(openmp={"gomp": ("/g/libgomp.so.1",), "iomp": ("/l/libiomp5.so",)},
                         allocators={"tcmalloc": "/l/libtcmalloc.so.4", "jemalloc": "/l/libjemalloc.so.2",
                                     "mimalloc": "/m/libmimalloc.so"})
    points, pruned = sweep.runtime_points(host, None, 2)
    by = {p.label: p for p in points}
    passive = "auto + OMP_WAIT_POLICY=PASSIVE"
    # libiomp5 alone runs Intel's default blocktime (200 ms); 0 and [kmp]'s 1 beside it; [kmp]'s pair as --preload sets it
    assert [(p.label, dict(p.env).get("KMP_BLOCKTIME"), p.also) for p in points if p.label.startswith("libiomp5")] == [
        ("libiomp5", None, (passive,)),
        ("libiomp5 KMP_BLOCKTIME=0", "0", ("auto + libiomp5", passive)),
        ("libiomp5 KMP_BLOCKTIME=1", "1", ("auto + libiomp5", passive)),
        ("libiomp5 KMP_BLOCKTIME=1 KMP_AFFINITY=granularity=fine,compact,1,0", "1",
         ("auto + libiomp5 KMP_BLOCKTIME=1", passive))]
    assert all(dict(p.env)["LD_PRELOAD"] == "/l/libiomp5.so" for p in points if p.label.startswith("libiomp5"))
    # each allocator in the default's place, against auto; tcmalloc and jemalloc also against the wheel's mimalloc
    assert [(p.label, p.allocator, p.against, p.also) for p in points if p.lever == "allocator"] == [
        ("tcmalloc", "tcmalloc", "auto", ("auto + mimalloc",)), ("jemalloc", "jemalloc", "auto", ("auto + mimalloc",)),
        ("mimalloc", "mimalloc", "auto", ())]
    je = next(p for p in points if p.label.startswith("jemalloc MALLOC_CONF="))
    assert je.against == "auto + jemalloc" and dict(je.env)["MALLOC_CONF"].endswith(sweep.JEMALLOC_THP)
    assert "no switch for transparent huge pages" in pruned["thp: tcmalloc"] and not any(
        k.startswith("allocator") for k in pruned)
    auto = {"name": "auto", "env": {"OMP_NUM_THREADS": "2"}, "ranks": 1,
            "settings": {"dtype": "bf16", "threads_per_rank": 2, "cpus_per_rank": [[0, 1]]},
            "decisions": {"dtype": "bf16", "allocator": None, "threads_per_rank": 2, "affinity": "auto"}}
    tc = sweep.runtime_config(auto, by["tcmalloc"], host.allocators)
    assert tc["env"]["LD_PRELOAD"] == "/l/libtcmalloc.so.4" and tc["also"] == ["auto + mimalloc"]
    jc = sweep.runtime_config(auto, by["jemalloc"], host.allocators)
    assert jc["env"]["MALLOC_CONF"] == "oversize_threshold:1,background_thread:true,metadata_thp:auto"
    from benchmarks.checks import expected, mismatches

    iomp = sweep.runtime_config(auto, by["libiomp5 KMP_BLOCKTIME=0"], host.allocators)
    want = expected(iomp)
    assert want["openmp"] == "intel" and "openmp" not in expected(tc)
    ran = {"allocator": None, "threads": 2, "cpus": [0, 1], "dtype": "bf16", "optimizer": "adamw", "compile": False}
    # a preload of libiomp5 that did not map it is no figure for its name
    assert mismatches(want, [{**ran, "openmp": ["gnu"]}]) == ["OpenMP: planned intel, ran gnu"]
    assert mismatches(want, [{**ran, "openmp": ["gnu", "intel"]}]) == []


def test_only_the_points_asked_for_run_with_every_point_they_are_judged_against():
    host = _runtime_host(openmp={"gomp": ("/g/libgomp.so.1",), "iomp": ("/l/libiomp5.so",)},
                         allocators={"jemalloc": "/l/libjemalloc.so.2", "mimalloc": "/m/libmimalloc.so"})
    points, _ = sweep.runtime_points(host, None, 2)
    assert sweep.select_points(points, []) == points
    got = [p.label for p in sweep.select_points(points, ["KMP_AFFINITY", "jemalloc MALLOC_CONF"])]
    assert got == ["OMP_WAIT_POLICY=PASSIVE", "libiomp5", "libiomp5 KMP_BLOCKTIME=1",
                   "libiomp5 KMP_BLOCKTIME=1 KMP_AFFINITY=granularity=fine,compact,1,0", "jemalloc", "mimalloc",
                   "jemalloc MALLOC_CONF=oversize_threshold:1,background_thread:true," + sweep.JEMALLOC_THP]


def test_each_point_is_judged_against_its_own_baseline_over_the_rounds():
    cfgs = [{"name": "auto"}, {"name": "a", "lever": "openmp", "against": "auto", "point": {"runtime": "A"}},
            {"name": "b", "lever": "thp", "against": "auto", "point": {"runtime": "B"}},
            {"name": "c", "lever": "thp", "against": "auto", "point": {"runtime": "C"}},
            {"name": "base", "lever": "thp", "against": None, "point": {"runtime": "base"}}]
    auto = [100, 90, 110, 95, 105, 100]
    rounds = [{"auto": {"samples_per_s": x}, "a": {"samples_per_s": x * 1.3}, "b": {"samples_per_s": x * 0.7},
               "c": {"samples_per_s": x * (1.3 if i % 2 else 0.75)}, "base": {"samples_per_s": x}}
              for i, x in enumerate(auto)]
    rounds[0]["a"]["disturbed"] = True  # a run left out by the checks is no pair
    cfgs[2]["also"] = ["a", "not run"]  # judged against its rival too, where that ran
    verdicts = sweep.lever_verdicts(cfgs, rounds, 0.90, 0.02)
    assert [(v["point"], v["against"]) for v in verdicts] == [("A", "auto"), ("B", "auto"), ("B", "a"), ("C", "auto")]
    assert verdicts[2]["outcome"] == "lost" and abs(verdicts[2]["verdict"]["ratio"] - 0.7 / 1.3) < 1e-3
    got = {v["point"]: v for v in verdicts if v["against"] == "auto"}
    assert set(got) == {"A", "B", "C"}
    assert got["A"]["outcome"] == "won" and got["A"]["verdict"]["n"] == 5 and abs(got["A"]["verdict"]["ratio"] - 1.3) < 1e-6
    assert got["B"]["outcome"] == "lost" and got["C"]["outcome"] == "undecided"


def test_the_host_s_huge_page_mode_is_read_under_its_sysroot(tmp_path, monkeypatch):
    facts = _facts(tmp_path, monkeypatch, cores_per_socket=2)
    assert sweep.runtime_host(facts).thp is None  # not in the recorded tree: unknown, and the lever says so
    thp = tmp_path / "sys/kernel/mm/transparent_hugepage/enabled"
    thp.parent.mkdir(parents=True, exist_ok=True)
    thp.write_text("always [madvise] never\n")
    host = sweep.runtime_host(facts)
    assert host.thp == "madvise" and host.torch == "2.13.0+cpu"


def test_the_summary_says_each_runtime_lever_s_verdict_and_what_was_not_tried():
    from benchmarks.report import runtime_lines

    r = {"workload": "mlp-small", "runtime_levers": {"thp_mode": "madvise", "pruned": {"openmp: Intel": "no libiomp5"},
         "verdicts": [{"point": "OMP_WAIT_POLICY=PASSIVE", "outcome": "won", "against": "auto",
                       "verdict": {"ratio": 3.05, "low": 2.26, "high": 4.12, "n": 6}}]}}
    lines = runtime_lines(r)
    assert "OMP_WAIT_POLICY=PASSIVE won (3.05x auto, 2.26-4.12 over 6 round(s))" in lines[0] and "THP madvise" in lines[0]
    assert lines[1] == "- mlp-small runtime lever not tried: openmp: Intel: no libiomp5."
    assert runtime_lines({"workload": "x"}) == []


def test_the_suite_adds_this_host_s_runtime_points_beside_auto_and_logs_what_it_cannot_try():
    from benchmarks.checks import expected
    from benchmarks.suite import runtime_configs

    auto = {"name": "auto", "env": {"OMP_NUM_THREADS": "2"}, "ranks": 1,
            "settings": {"dtype": "fp32", "threads_per_rank": 2, "compile": False},
            "decisions": {"dtype": "fp32", "allocator": None, "threads_per_rank": 2, "nproc_per_node": 1}}
    said = []
    got = runtime_configs(auto, said.append)
    assert [c["name"] for c in got["configs"]] == got["points"]
    assert len(said) == len(got["pruned"]) and all(line.startswith("runtime lever not tried: ") for line in said)
    for c in got["configs"]:
        assert c["sweep"] and c["name"].startswith("auto + ") and c["against"] in (None, "auto") or \
            c["against"].startswith("auto + ")
        assert expected(c)["dtype"] == "fp32"  # checked as any sweep point


@pytest.mark.torch
@pytest.mark.full  # a real timed run of the worker
def test_a_runtime_point_runs_in_the_real_worker_as_it_is_named():
    """One short real run of the one-thread point: the worker reads back 1 thread on the first CPU, and the checks
    find nothing that ran otherwise."""
    from benchmarks import checks
    from benchmarks.suite import run_config

    facts = probe_host()
    cpus = sorted(facts.usable_cpus())
    if len(cpus) < 2:
        pytest.skip("needs 2 usable CPUs")
    auto = {"name": "auto", "env": {"OMP_NUM_THREADS": "2"}, "ranks": 1,
            "settings": {"dtype": "fp32", "threads_per_rank": 2, "compile": False, "cpus_per_rank": [cpus[:2]]},
            "decisions": {"dtype": "fp32", "allocator": None, "threads_per_rank": 2, "affinity": "auto"}}
    one = sweep.runtime_config(auto, sweep.RuntimePoint("threads", "1 thread(s)", (("OMP_NUM_THREADS", "1"),), 1), {})
    res = run_config({**one, "env": {**one["env"], "OMP_WAIT_POLICY": "PASSIVE"}}, "mlp", "small", 0.3)
    assert res.get("samples_per_s"), res
    assert checks.mismatches(checks.expected(one), res.get("ran")) == []
    assert res["ran"][0]["threads"] == 1 and res["ran"][0]["cpus"] == cpus[:1]


def test_kmp_affinity_binds_each_thread_so_the_main_thread_reads_back_one_of_the_rank_s_cpus():
    from benchmarks.checks import expected, mismatches

    host = _runtime_host(openmp={"gomp": ("/g/libgomp.so.1",), "iomp": ("/l/libiomp5.so",)})
    points, _ = sweep.runtime_points(host, None, 2)
    auto = {"name": "auto", "env": {"OMP_NUM_THREADS": "2"}, "ranks": 1,
            "settings": {"dtype": "bf16", "threads_per_rank": 2, "cpus_per_rank": [[0, 1]]},
            "decisions": {"dtype": "bf16", "allocator": None, "threads_per_rank": 2, "affinity": "auto"}}
    by = {p.label: sweep.runtime_config(auto, p, host.allocators) for p in points}
    ran = {"allocator": None, "threads": 2, "dtype": "bf16", "optimizer": "adamw", "compile": False,
           "openmp": ["intel", "gnu"]}
    pinned = expected(by["libiomp5 KMP_BLOCKTIME=1 KMP_AFFINITY=granularity=fine,compact,1,0"])
    assert mismatches(pinned, [{**ran, "cpus": [0]}]) == []  # measured here: libiomp5 bound the main thread to CPU 0
    assert mismatches(pinned, [{**ran, "cpus": [2]}]) == ["CPUs: planned 0-1, ran on 2"]
    plain = expected(by["libiomp5 KMP_BLOCKTIME=1"])  # without KMP_AFFINITY the rank's CPUs stay whole
    assert mismatches(plain, [{**ran, "cpus": [0]}]) == ["CPUs: planned 0-1, ran on 0"]
