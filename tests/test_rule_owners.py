"""One owner per rule (issue 54): the allocator rule is read from compat/tuning.toml [allocator] in
cpuperf/decide/allocator.py only, and a rank's thread count is computed in cpuperf/decide/threads.py only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cpuperf.decide.allocator import allocator_rule, not_with_ranks, preload_env
from cpuperf.decide.threads import threads_on

PKG = Path(__file__).resolve().parent.parent / "cpuperf"
# Reads of the allocator row's keys; the install plan reads the wheel's name and version (plan/install.py).
ALLOCATOR_KEYS = re.compile(r"""\[["'](min_speedup|not_with_ranks|not_with_ranks_source|jemalloc_malloc_conf|wheel|"""
                            r"""wheel_version|wheel_platforms|system_install)["']\]|\(["']tuning\.toml["']\)\[["']allocator["']\]""")


def test_the_allocator_rule_is_read_in_one_module():
    readers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if ALLOCATOR_KEYS.search(p.read_text()))
    assert readers == ["decide/allocator.py"]  # read once, into AllocatorRule
    assert allocator_rule().min_speedup > 1.0
    assert "mimalloc" in allocator_rule().not_with_ranks


def test_the_allocator_rule_answers_every_caller():
    assert not_with_ranks(["mimalloc", "tcmalloc"], 1) == []
    assert not_with_ranks(["mimalloc", "tcmalloc"], 2) == ["mimalloc"]
    assert preload_env("tcmalloc", "/l/libtcmalloc.so") == {"LD_PRELOAD": "/l/libtcmalloc.so"}
    assert preload_env("jemalloc", "/l/libjemalloc.so")["MALLOC_CONF"] == allocator_rule().jemalloc_malloc_conf


def test_threads_are_counted_in_one_function():
    assert threads_on(4) == 4
    assert threads_on(4, 2) == 2
    assert threads_on(0) == 1 and threads_on(3, 0) == 1  # no rank runs without a thread
    counted = re.compile(r"max\(1, min\(.*threads")
    assert sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if counted.search(p.read_text())) == []


OS_READS = re.compile(r"os\.environ|os\.getenv|os\.path\.(exists|isdir|isfile)|os\.access|os\.listdir|\bopen\(|read_capped|"
                      r"\.read_text\(|\.read_bytes\(|\.is_file\(|\.is_dir\(|\.iterdir\(")


def test_decide_knowledge_and_plan_read_no_os():
    # The environment and files are read in probe/ (or at a command's edge) and passed in. knowledge/matrix.py reads
    # the compat data directories (CPUPERF_COMPAT_DIR) and is the one left (docs/architecture.md, Known exceptions).
    readers = sorted(str(p.relative_to(PKG)) for layer in ("decide", "knowledge", "plan") for p in (PKG / layer).glob("*.py")
                     if OS_READS.search(p.read_text()))
    assert readers == ["knowledge/matrix.py"]


def _parameters(fn: ast.FunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return len(names[1:] if names[:1] in (["self"], ["cls"]) else names) + bool(a.vararg) + bool(a.kwarg)


def test_no_function_of_the_planners_takes_more_than_8_parameters():
    # A request record per entry point (RecommendRequest, RuntimeEnvRequest, LaunchSpec, Search, FlagContext, ...):
    # a long keyword list is copied by hand from caller to callee and drifts.
    wide = [f"{p.relative_to(PKG)}:{fn.name} ({_parameters(fn)})" for layer in ("plan", "decide")
            for p in sorted((PKG / layer).glob("*.py")) for fn in ast.walk(ast.parse(p.read_text()))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(fn) > 8]
    assert wide == []


def test_allocator_names_and_their_order_are_asked_of_the_allocator_module():
    """The probe names the files it looks for (probe/facts.py ALLOCATOR_LIBS, read by the probes and the vendor-env
    scan); every name list, order and library stem beyond them is decide/allocator.py's."""
    from cpuperf.decide.allocator import ALLOCATORS, allocator_names, library_stem, preload_choice

    files = {"tcmalloc": ["/l/libtcmalloc.so"], "jemalloc": ["/l/libjemalloc.so"], "mimalloc": ["/l/libmimalloc.so"]}
    assert preload_choice(None, files, 1) == ALLOCATORS[0]  # the order a preload without a decision falls back to
    assert allocator_names() == ", ".join(ALLOCATORS[:-1]) + " or " + ALLOCATORS[-1]
    assert all(library_stem(n) == "lib" + n for n in ALLOCATORS)
    readers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                     if re.search(r"\bALLOCATOR_LIBS\b", p.read_text()) and not str(p.relative_to(PKG)).startswith("probe/"))
    assert readers == ["decide/allocator.py", "run/vendor_env.py"]
    spelled = re.compile(r"""["']tcmalloc["']\s*:\s*["']libtcmalloc|\(\s*["']tcmalloc["'],\s*["']jemalloc["'],\s*["']mimalloc""")
    # The knob vocabulary sits below decide/ in the layers and spells its choices; they are the allocator module's.
    assert sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if spelled.search(p.read_text())) == [
        "knowledge/knobs.py"]
    from cpuperf.knowledge.knobs import BY_ID

    assert tuple(c for c in BY_ID["allocator"].choices if c is not None) == ALLOCATORS
