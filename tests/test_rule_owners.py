"""One owner per rule (issue 54): the allocator rule is read from compat/tuning.toml [allocator] in
cpuperf/decide/allocator.py only, and a rank's thread count is computed in cpuperf/decide/threads.py only."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

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


# -- every command follows the owner's data: a rule changed there changes every command ---------------------------

def _recorded_host(root: Path, allocator_libs: List[str]) -> Path:
    """A recorded Sapphire Rapids-class host (tests/hosts.py) whose only bf16 unit is AMX (so AMX's permission decides
    bf16), its stack (torch 2.13.0+cpu, mimalloc at `allocator_libs`) and its measurement beside the tree: bf16 GEMM
    2.4x fp32; mimalloc 0.98x the default on the fp32 LM, 1.05x under bf16 autocast."""
    import json
    import time

    from host_classes import SAPPHIRE
    from hosts import make_host

    make_host(root, cores_per_socket=4, flags=[f for f in SAPPHIRE if f != "avx512_bf16"], model=143)
    package = {"local": None, "build": None, "cuda": None, "location": "VENV/lib/python3.11/site-packages"}
    stack = {"schema": "cpuperf.snapshot-stack/1", "gpus": [], "software": {
        "python": "3.11.9", "python_abi": "cp311", "executable": "python3", "prefix": "VENV", "mpi": [], "numactl": None,
        "packages": {"torch": {**package, "version": "2.13.0+cpu", "local": "cpu", "build": "cpu"},
                     "transformers": {**package, "version": "5.23.0"}, "accelerate": {**package, "version": "1.15.0"}},
        "openmp": {"gomp": [], "iomp": [], "omp": []},
        "allocators": {"tcmalloc": [], "jemalloc": [], "mimalloc": allocator_libs}}}
    measured = {"schema": "cpuperf.measurement/2", "host_id": "recorded", "measured_at": int(time.time()),
                "torch_build": {"version": "2.13.0+cpu", "local": "cpu", "git": None}, "method": "side-by-side/2",
                "ratios": {}, "undecided": {}, "threads": 4, "torch": "2.13.0+cpu",
                "gemm_fp32_gflops": 100.0, "gemm_bf16_gflops": 240.0,
                "allocator_speedup": {"mimalloc": 1.01, "mimalloc_by_workload": {"lm": 0.98, "lm-bf16": 1.05}}}
    (root / ".cpuperf").mkdir()
    (root / ".cpuperf" / "stack.json").write_text(json.dumps(stack))
    (root / ".cpuperf" / "measurements.json").write_text(json.dumps(measured))
    return root


def _every_command(root: Path, script: Path, env: Dict[str, str]) -> Dict[str, Tuple[object, object, object]]:
    """(dtype, allocator, LD_PRELOAD) as each command plans them, each a real `python -m cpuperf` process."""
    import json

    from cli_util import run_cli

    def run(*args: str) -> Dict[str, Any]:
        proc = run_cli([args[0], "--json", *args[1:]], env, process=True)
        assert proc.returncode == 0, (args, proc.stdout[-1500:], proc.stderr[-1500:])
        return json.loads(proc.stdout)

    def decided(out: Dict[str, Any], lever: str) -> object:
        return next(d["value"] for d in out["decisions"] if d["id"] == lever)

    seen: Dict[str, Tuple[object, object, object]] = {}
    rec = run("recommend", "--sysroot", str(root))
    seen["recommend"] = (decided(rec, "dtype"), decided(rec, "allocator"), rec["env"].get("LD_PRELOAD"))
    for name, tail in (("train (built-in)", ()), ("train -- python script.py", ("--", "python", str(script)))):
        out = run("train", "--auto", "--dry-run", "--sysroot", str(root), *tail)
        seen[name] = (decided(out, "dtype"), decided(out, "allocator"), out["launch"]["env"].get("LD_PRELOAD"))
    ccl = run("ccl-env", "--preload", "--sysroot", str(root))
    levers = {d["id"]: d["value"] for part in ("applied", "not_applied") for d in ccl["levers"][part]}
    seen["ccl-env --preload"] = (levers["dtype"], levers["allocator"], ccl["env"].get("LD_PRELOAD"))
    return seen


@pytest.mark.full  # 16 real cpuperf processes
def test_every_command_follows_the_owners_data_when_it_changes(tmp_path):
    """The allocator rule (compat/tuning.toml [allocator], decide/allocator.py) and the bf16 rule (knowledge/bf16.py
    from the ISA and AMX's permission; [dtype]'s floor on the measured ratio) changed where they live, in data (a
    tuning.toml in CPUPERF_COMPAT_DIR, laid over the shipped one) or in their inputs (CPUPERF_OVERRIDE_AMX_USABLE):
    recommend, train's built-in and script plans and ccl-env all follow. A command that derived either rule on its
    own would keep the shipped answer."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    libs = sorted(str(p) for p in (site / "cmeel.prefix" / "lib").glob("libmimalloc.so*"))
    if not libs:
        pytest.skip("the test venv has no cmeel-mimalloc wheel (tests/run.sh installs it)")
    root = _recorded_host(tmp_path / "host", libs)
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    preloaded = min(libs, key=lambda p: (Path(p).name.count("."), p))  # decide.allocator.first_library's choice

    def overlaid(name: str, text: str) -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tuning.toml").write_text(text)
        return str(folder)

    base = {"CPUPERF_CACHE_DIR": str(tmp_path / "cache"), "CPUPERF_OVERRIDE_AMX_USABLE": "1"}
    cases = [
        # AMX usable: bf16; mimalloc 1.05x under bf16 autocast >= min_speedup 1.02: preloaded everywhere
        ({}, ("bf16", "mimalloc", preloaded)),
        # AMX not permitted by the OS: no bf16 unit left, fp32; mimalloc 0.98x on the fp32 LM: the default kept
        ({"CPUPERF_OVERRIDE_AMX_USABLE": "0"}, ("fp32", None, None)),
        # the allocator rule's threshold raised over the measured 1.05x: the default kept by every command
        ({"CPUPERF_COMPAT_DIR": overlaid("alloc", "[allocator]\nmin_speedup = 1.10\n")}, ("bf16", None, None)),
        # the bf16 floor raised over the measured 2.4x: fp32, so the fp32 figure decides the allocator too
        ({"CPUPERF_COMPAT_DIR": overlaid("dtype", "[dtype]\nmin_bf16_over_fp32_gemm = 3.0\n")}, ("fp32", None, None)),
    ]
    for extra, want in cases:
        seen = _every_command(root, script, {**base, **extra})
        assert set(seen.values()) == {want}, (extra, seen)


def test_a_tuning_toml_in_the_compat_dir_is_laid_over_the_shipped_rules(tmp_path, monkeypatch):
    """knowledge/tuning.py's seam: a table's keys replace the shipped ones, the rest of the file stays; a value the
    record refuses is exit 6 naming the file laid over it."""
    from cpuperf.errors import BadDataError
    from cpuperf.knowledge.tuning import overlay, tuning

    shipped = tuning()
    assert overlay({"a": {"x": 1, "y": 2}, "b": [1]}, {"a": {"y": 3}, "b": [2]}) == {"a": {"x": 1, "y": 3}, "b": [2]}
    (tmp_path / "tuning.toml").write_text("[allocator]\nmin_speedup = 1.5\n")
    monkeypatch.setenv("CPUPERF_COMPAT_DIR", str(tmp_path))
    laid = tuning()
    assert laid.allocator.min_speedup == 1.5 and allocator_rule().min_speedup == 1.5
    assert laid.allocator.not_with_ranks == shipped.allocator.not_with_ranks and laid.dtype == shipped.dtype
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tuning.toml").write_text("[allocator]\nmin_speedup = 'fast'\n")
    monkeypatch.setenv("CPUPERF_COMPAT_DIR", str(tmp_path / "bad"))
    with pytest.raises(BadDataError) as err:
        tuning()
    assert "[allocator] min_speedup" in err.value.message and str(tmp_path / "bad" / "tuning.toml") in err.value.message
    monkeypatch.delenv("CPUPERF_COMPAT_DIR")
    assert tuning() == shipped


def test_a_preload_adds_no_allocator_where_the_rule_kept_the_default():
    """ccl-env --preload with an allocator decision that measured (or you set) the default: nothing falls back."""
    from cpuperf.decide.allocator import keeps_the_default, preload_choice
    from cpuperf.decide.records import Decision

    files = {"tcmalloc": ["/l/libtcmalloc.so"]}
    measured = Decision("allocator", None, "none beats it", {"measured": {"tcmalloc": 0.9}})
    unmeasured = Decision("allocator", None, "installed but unmeasured", {"available": ["tcmalloc"]})
    yours = Decision("allocator", None, "set by you", {}, overridden=True)
    assert keeps_the_default(measured) and keeps_the_default(yours) and not keeps_the_default(unmeasured)
    assert preload_choice(None, files, 1, kept=True) is None
    assert preload_choice(None, files, 1, kept=keeps_the_default(unmeasured)) == "tcmalloc"
    assert preload_choice("tcmalloc", files, 1, kept=False) == "tcmalloc"
