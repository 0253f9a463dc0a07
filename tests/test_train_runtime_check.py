"""runtime_check: OpenMP runtime and allocator from /proc/<pid>/maps text."""

from __future__ import annotations

from cpuperf.train.runtime_check import compact_cpus, native_bf16, parse_maps, runtime_report

_GOMP = """\
7f1c2a000000-7f1c2a021000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b000000-7f1c2b021000 r-xp 00000000 08:01 124 /venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1
7f1c2b021000-7f1c2b022000 r--p 00021000 08:01 124 /venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1
7ffd5e9f0000-7ffd5ea11000 rw-p 00000000 00:00 0                          [stack]
"""
_IOMP_TCMALLOC = """\
7f0000000000-7f0000100000 r-xp 00000000 08:01 1 /opt/conda/lib/libiomp5.so
7f0000200000-7f0000300000 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4.5.9
7f0000400000-7f0000500000 r-xp 00000000 08:01 3 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1
"""
_JEMALLOC_LLVM = """\
7f0000000000-7f0000100000 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
7f0000200000-7f0000300000 r-xp 00000000 08:01 2 /usr/lib/llvm-17/lib/libomp.so.5
"""


def test_stock_torch_wheel_uses_gnu_openmp_and_glibc_malloc() -> None:
    libs = parse_maps(_GOMP)
    assert (libs.openmp, libs.allocator) == (["gnu"], "glibc")
    assert len(libs.paths) == 1


def test_preloaded_iomp_and_tcmalloc() -> None:
    libs = parse_maps(_IOMP_TCMALLOC)
    assert (libs.openmp, libs.allocator) == (["intel", "gnu"], "tcmalloc")


def test_jemalloc_and_llvm_openmp() -> None:
    libs = parse_maps(_JEMALLOC_LLVM)
    assert (libs.openmp, libs.allocator) == (["llvm"], "jemalloc")


def test_compact_cpus() -> None:
    assert compact_cpus([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert compact_cpus([3]) == "3"


def test_report_with_injected_facts() -> None:
    rep = runtime_report(maps_text=_IOMP_TCMALLOC, affinity=[0, 1, 2, 3],
                         environ={"OMP_NUM_THREADS": "4", "HOME": "/root"})
    assert rep["allowed_cpus"] == "0-3" and rep["n_allowed_cpus"] == 4
    assert rep["openmp"] == ["intel", "gnu"] and rep["allocator"] == "tcmalloc"
    assert rep["env"] == {"OMP_NUM_THREADS": "4"}


def test_report_on_this_process() -> None:
    rep = runtime_report()
    assert rep["n_allowed_cpus"] and rep["n_allowed_cpus"] >= 1


def test_native_bf16_from_cpuinfo_flags() -> None:
    assert native_bf16("processor: 0\nflags\t\t: fpu avx2 fma\n") is False
    assert native_bf16("flags : avx512f avx512_bf16 amx_tile\n") is True
    assert native_bf16("flags : amx_bf16 amx_tile\n") is True
    assert native_bf16("Features: fp asimd\n") is None
