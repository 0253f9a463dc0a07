"""Recorded plans: `recommend`, `ccl-env` and `train --dry-run` give byte-identical output for the same facts.

The guard for reworking the planner (one planner, issue "One planner, one owner per fact"): for every host class
of test_host_classes.py and a few requests per class, the real CLI (`python -m cpuperf ...`, a child process)
plans from a recorded tree (--sysroot) and a fixed stack, and its stdout is compared byte for byte with the file
recorded under tests/fixtures/plans/<class>/<command>--<request>.<ext>.

The inputs are fixed, so a plan is a pure function of them: the class's tree and its overrides (x86 and GPU
classes, as test_host_classes applies them), CPUPERF_OVERRIDE_PACKAGES (torch 2.13.0+cpu, or the GPU class's
CUDA build; transformers 5.23.0; accelerate 1.15.0), CPUPERF_OVERRIDE_PYTHON, an empty CPUPERF_CACHE_DIR and
HF_HOME, CPUPERF_MEASURE=0, and a Trainer script written here. Only what depends on where the test runs is
replaced before comparing: the temporary directory (trees, cache, run directory) by <TMP> and this interpreter's
path by <PYTHON> (its prefix, which ccl-env reports, by <PREFIX>). Nothing else is masked: a time, a load or a live fact leaking through --sysroot fails here.

A recorded file missing is a failure. After a change that is meant to change plans, rewrite them with
    CPUPERF_UPDATE_GOLDEN=1 python -m pytest tests/test_plan_golden.py
and review the diff of tests/fixtures/plans/ before committing it.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from host_classes import CLASSES, TRAINER_SCRIPT, HostClass
from host_classes import planning_env as _env

from cpuperf.plan.peak_report import HOOK_DIR

GOLDEN = Path(__file__).parent / "fixtures" / "plans"
UPDATE = os.environ.get("CPUPERF_UPDATE_GOLDEN") == "1"
# The requests, by name: (the options, which commands take them). ccl-env has no --set or --model.
COMMANDS = {  # name -> (argv before the request's options, file extension)
    "recommend": (["recommend", "--json"], "json"),
    "ccl-env-json": (["ccl-env", "--json"], "json"),
    "ccl-env-sh": (["ccl-env"], "sh"),
    "train-dry-run": (["train", "--auto", "--dry-run", "--json"], "json"),
}
ALL, PLANNERS = tuple(COMMANDS), ("recommend", "train-dry-run")
REQUESTS: Dict[str, Tuple[List[str], Tuple[str, ...]]] = {
    "default": ([], ALL),
    "nproc2": (["--nproc-per-node", "2"], ALL),
    "set-bf16": (["--set", "dtype=bf16"], PLANNERS),  # x86 classes only (see _cases)
    "model-micro": (["--model", "micro"], PLANNERS),
    "trainer-script": (["--", "python", "train.py", "--output_dir", "o"], ("train-dry-run",)),
}


def _x86(cls: HostClass) -> bool:
    return cls.cpuinfo is None  # the x86 trees are built from flags; Arm and POWER record their own cpuinfo


def _cases(cls: HostClass) -> List[Tuple[str, str]]:
    """(command, request) pairs planned for a class."""
    return [(command, request) for request, (_, commands) in REQUESTS.items()
            if request != "set-bf16" or _x86(cls) for command in commands]


def _golden(cls: HostClass, command: str, request: str) -> Path:
    return GOLDEN / cls.name / f"{command}--{request}.{COMMANDS[command][1]}"


def _normalise(text: str, root: Path) -> str:
    """Replace what depends on where the test runs (its temporary directory, this interpreter, this checkout), nothing
    else."""
    places = {str(root): "<TMP>", os.path.realpath(root): "<TMP>", sys.executable: "<PYTHON>",
              os.path.realpath(sys.executable): "<PYTHON>", HOOK_DIR: "<CPUPERF>/rank_hook",
              json.dumps(sys.prefix): '"<PREFIX>"'}  # whole JSON strings only: a prefix may be as short as /usr
    for place in sorted(places, key=len, reverse=True):
        text = text.replace(place, places[place])
    return text


def _plan(cls: HostClass, command: str, request: str, root: Path) -> str:
    argv, _ = COMMANDS[command]
    options, _ = REQUESTS[request]
    tree = cls.tree(root / f"tree-{cls.name}")
    script = options[options.index("--"):] if "--" in options else []
    options = options[:len(options) - len(script)]
    args = [sys.executable, "-m", "cpuperf", *argv, *options, "--sysroot", str(tree), *script]
    proc = subprocess.run(args, capture_output=True, timeout=120, env=_env(cls, root), cwd=str(root / "run"))
    out, err = proc.stdout.decode(), proc.stderr.decode(errors="replace")  # bytes: no newline translation
    where = f"{cls.name}: cpuperf {' '.join(args[3:])}"
    assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{out[-2000:]}\n{err[-2000:]}"
    assert "Traceback" not in err, f"{where}\n{err[-2000:]}"
    return _normalise(out, root)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> Dict[Tuple[str, str, str], str]:
    """Every (class, command, request) planned once, 2 to 4 child processes at a time (each ~0.2-0.4 s of CPU)."""
    root = tmp_path_factory.mktemp("plans")
    (root / "run").mkdir()
    (root / "home").mkdir()
    (root / "run" / "train.py").write_text(TRAINER_SCRIPT)
    for cls in CLASSES:  # built here, before the threads, so that no two build the same tree
        cls.tree(root / f"tree-{cls.name}")
    keys = [(cls, command, request) for cls in CLASSES for command, request in _cases(cls)]
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        outputs = list(pool.map(lambda key: _plan(*key, root), keys))
    assert not any((root / "run").glob("runs")), "a dry run created its run directory"
    return {(cls.name, command, request): out for (cls, command, request), out in zip(keys, outputs)}


def _diff(path: Path, want: str, got: str) -> str:
    lines = difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"{path.name} (recorded)",
                                 f"{path.name} (now)", n=2)
    return "".join(list(lines)[:60])


@pytest.mark.smoke("golden plans")  # ~100 real `python -m cpuperf` children, 2-4 at a time
@pytest.mark.parametrize("cls", CLASSES, ids=[c.name for c in CLASSES])
def test_plans_match_the_recorded_ones(plans, cls: HostClass):
    recorded = {_golden(cls, command, request) for command, request in _cases(cls)}
    if UPDATE:
        (GOLDEN / cls.name).mkdir(parents=True, exist_ok=True)
        for stale in set((GOLDEN / cls.name).iterdir()) - recorded:
            stale.unlink()
    problems = []
    for command, request in _cases(cls):
        path, got = _golden(cls, command, request), plans[(cls.name, command, request)]
        if UPDATE:
            path.write_bytes(got.encode())
        elif not path.exists():
            problems.append(f"{path}: not recorded (CPUPERF_UPDATE_GOLDEN=1 records it)")
        elif path.read_bytes() != got.encode():
            problems.append(_diff(path, path.read_bytes().decode(errors="replace"), got))
    stale = sorted(set((GOLDEN / cls.name).glob("*")) - recorded) if (GOLDEN / cls.name).is_dir() else []
    problems += [f"{path}: recorded for no request (CPUPERF_UPDATE_GOLDEN=1 removes it)" for path in stale]
    assert not problems, f"{len(problems)} plan(s) of {cls.name} differ from tests/fixtures/plans:\n" + "\n".join(problems)
