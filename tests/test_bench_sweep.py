"""The benchmark sweep: every lever the host has, the product of their values, and pruning that says why."""

from __future__ import annotations

import json
from dataclasses import replace

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
