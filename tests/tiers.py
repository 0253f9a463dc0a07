"""The suite's two tiers (docs/testing.md), and the guard that keeps the fast one fast without timing anything.

`bash tests/run.sh` runs every test. `bash tests/run.sh --fast` (pytest `--fast`) leaves out the tests marked
`full` (or `slow`, the registry tests behind CPUPERF_SLOW=1), on the test, its class or its module
(`pytestmark = pytest.mark.full`). An unmarked test is a fast one: the planner and knowledge with injected facts
and recorded trees, the CLI called in-process (tests/cli_util.py), real shells, small files.

What makes a test slow here is the processes it starts: an interpreter and cpuperf's imports, torch's, a venv, pip,
torchrun. So the guard counts and names them (an audit hook sees every process the test, its fixtures and the
in-process CLI start), in every run, whatever the tier: a fast test that starts a heavy one (HEAVY_PROGRAMS,
HEAVY_MODULES, a Python child importing torch, transformers or accelerate, a real `cpuperf train`, `bench` or
`install`) or more than FAST_PYTHON_CHILDREN Python children fails, naming what it started and the two ways
out (call the CLI in-process, or mark the test `full`). `smoke(command)` marks the one real-process test per
command that the fast tier keeps; the guard lets it start what it needs, and two smoke tests of one command are
refused at collection.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Sequence

FULL_MARKERS = ("full", "slow")
MARKERS = [
    "full: only in the full suite (bash tests/run.sh), not in --fast: the test starts heavy processes "
    "(venvs, pip, torch, torchrun, mpirun, network namespaces) or many interpreters (docs/testing.md)",
    "slow: needs the package registry and takes minutes; skipped unless CPUPERF_SLOW=1 (full suite only)",
    "smoke(command): the one real-process smoke test of a command kept in the fast tier (may start what it needs)",
    "torch: needs torch installed in the test interpreter",
]
FAST_PYTHON_CHILDREN = 6  # a fast test may start this many Python interpreters (each ~0.1-1 s here)
HEAVY_PROGRAMS = {"pip", "pip3", "torchrun", "mpirun", "mpiexec", "orterun", "accelerate", "deepspeed", "srun",
                  "unshare", "nsenter", "mount", "debootstrap"}
HEAVY_MODULES = {"pip", "venv", "ensurepip", "torch.distributed.run", "accelerate.commands.launch",
                 "cpuperf.train.worker", "cpuperf.train.bench"}
HEAVY_IMPORTS = ("import torch", "from torch", "import transformers", "from transformers", "import accelerate",
                 "from accelerate")
REAL_WORK_COMMANDS = {"train", "bench", "install"}  # without --dry-run: a training, a measurement, pip

_spawned: Optional[List[List[str]]] = None  # the current test's processes (argv), while one runs


def _audit(event: str, args: tuple) -> None:
    if _spawned is None:
        return
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        if isinstance(argv, (str, bytes, os.PathLike)):
            argv = [argv]
        argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]
        if executable is not None and argv:
            argv[0] = os.fsdecode(executable) if not isinstance(executable, str) else executable
        _spawned.append(argv)
    elif event == "os.posix_spawn":
        _spawned.append([os.fsdecode(a) for a in args[1]])
    elif event == "os.system":
        _spawned.append(["sh", "-c", os.fsdecode(args[0])])


sys.addaudithook(_audit)


def begin() -> None:
    global _spawned
    _spawned = []


def spawned() -> List[List[str]]:
    """What the current test has started so far."""
    return list(_spawned or [])


def end() -> List[List[str]]:
    global _spawned
    seen, _spawned = _spawned or [], None
    return seen


def is_full(item) -> bool:
    return any(item.get_closest_marker(m) for m in FULL_MARKERS)


def _python(prog: str) -> bool:
    return prog.startswith("python") or prog == os.path.basename(sys.executable)


def _script_imports_heavy(argv: Sequence[str]) -> bool:
    """Its -c code or script file (read, bounded) imports torch, transformers or accelerate."""
    if "-c" in argv[1:-1]:
        code = argv[argv.index("-c") + 1]
    else:
        script = next((a for a in argv[1:] if not a.startswith("-")), None)
        if script is None or not script.endswith(".py") or not os.path.isfile(script):
            return False
        with open(script, "rb") as fh:
            code = fh.read(65536).decode("utf-8", "replace")
    return any(what in code for what in HEAVY_IMPORTS)


def _pip_reads_only(args: Sequence[str]) -> bool:
    """pip that reads (its configuration, what is installed) or plans (`install --dry-run`), changing nothing."""
    command = next((a for a in args if not a.startswith("-")), "")
    return command in ("config", "list", "freeze", "show", "index", "inspect") or command == "install" and "--dry-run" in args


def heavy(argv: Sequence[str]) -> Optional[str]:
    """Why starting `argv` is more than a fast test may do, or None."""
    if not argv or set(argv[1:]) & {"--version", "-V", "--help", "-h"} and len(argv) <= 4:
        return None  # a probe of what is installed (`mpirun --version`), not a launch
    prog = os.path.basename(argv[0])
    if prog in ("pip", "pip3"):
        return None if _pip_reads_only(argv[1:]) else prog
    if prog in HEAVY_PROGRAMS:
        return prog
    if prog == "ip" and "netns" in argv:
        return "ip netns"
    if not _python(prog):
        return None
    if "-m" in argv[1:-1]:
        # every `-m MODULE` of the line: `python -m cpuperf.run.rankexec -- python -m cpuperf.train.worker` is a rank
        for at in (i for i, a in enumerate(argv[:-1]) if a == "-m"):
            module, rest = argv[at + 1], argv[at + 2:]
            if module == "pip" and _pip_reads_only(rest):
                continue
            if module in HEAVY_MODULES and not (module == "venv" and "--without-pip" in argv):
                return f"python -m {module}"  # (a venv without pip is a few directories and links)
            if module == "cpuperf" and rest[:1] and rest[0] in REAL_WORK_COMMANDS \
                    and not {"--dry-run", "--help", "-h"} & set(rest):
                return f"a real `cpuperf {rest[0]}` (no --dry-run)"
        return None
    if _script_imports_heavy(argv):
        return "a Python child importing torch, transformers or accelerate"
    return None


def verdict(spawned: List[List[str]]) -> Optional[str]:
    """What is wrong with a fast test that started `spawned`, or None."""
    heavies = [(why, argv) for argv in spawned for why in [heavy(argv)] if why]
    # cpuperf's own probes run isolated (`python -I -c ...`, a few milliseconds): not counted
    pythons = [argv for argv in spawned if argv and _python(os.path.basename(argv[0])) and argv[1:2] != ["-I"]]
    if heavies:
        why, argv = heavies[0]
        problem = f"started {why}: {' '.join(argv)[:200]}" + (f" (and {len(heavies) - 1} more)" if len(heavies) > 1 else "")
    elif len(pythons) > FAST_PYTHON_CHILDREN:
        problem = (f"started {len(pythons)} Python interpreters (a fast test may start {FAST_PYTHON_CHILDREN}), "
                   f"e.g. {' '.join(pythons[0])[:160]}")
    else:
        return None
    return (f"misclassified: an unmarked test belongs to the fast tier, and this one {problem}. Call the CLI "
            "in-process (tests/cli_util.run_cli), or mark the test `@pytest.mark.full` (docs/testing.md, tests/tiers.py)")


def smoke_owners(items) -> Dict[str, List[str]]:
    """command -> the smoke tests that claim it (one each is allowed)."""
    owners: Dict[str, List[str]] = {}
    for item in items:
        mark = item.get_closest_marker("smoke")
        if mark is not None:
            test = item.nodeid.split("[")[0]  # a parametrized test is one test
            for command in mark.args or ("",):
                if test not in owners.setdefault(command, []):
                    owners[command].append(test)
    return owners
