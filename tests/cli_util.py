"""Run cpuperf as users do: a clean, fixed environment, exit code, stdout and stderr.

`run_cli` calls the CLI's own entry point in this process (cpuperf.entry.main, what `python -m cpuperf` runs)
with the environment, working directory, stdin and file descriptors 1 and 2 of a child: what cpuperf and the
processes it starts write is captured at the descriptor, as from a pipe. It saves the interpreter's start and
cpuperf's imports (a third of a second to a second each, hundreds of times in the suite). `process=True` starts a
real `python -m cpuperf` child instead: for what only a process shows (its imports, signals, a timeout, a pipe
closed early); each command keeps one such smoke test (docs/testing.md). CPUPERF_TEST_CLI=process runs every
call as a child, as the suite did before, to check that both ways agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List, Optional

SUITE_TODAY = "2026-11-28"


def cli_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CPUPERF_", "SLURM_")) and k not in ("NO_COLOR",)}
    # CPUPERF_MEASURE=0: `train --auto` would otherwise measure allocators once per host, which makes
    # test timings depend on the cache; the measuring path has its own tests.
    # CPUPERF_OVERRIDE_HYPERVISOR=0: the live host is bare metal unless a test names the virtual-machine class
    # (whether the machine running the suite is a VM changes where ranks are pinned).
    # CPUPERF_OVERRIDE_TODAY: the day the suite describes, so date-dependent findings (a Python past its end of life)
    # never change with the day the tests run.
    env.update({"NO_COLOR": "1", "COLUMNS": "120", "PYTHONDONTWRITEBYTECODE": "1", "CPUPERF_MEASURE": "0",
                "CPUPERF_OVERRIDE_HYPERVISOR": "0", "CPUPERF_OVERRIDE_TODAY": SUITE_TODAY})
    if os.environ.get("CPUPERF_CACHE_DIR"):  # the suite's own cache (tests/conftest.py), not this machine's
        env["CPUPERF_CACHE_DIR"] = os.environ["CPUPERF_CACHE_DIR"]
    env.update(extra or {})
    return env


def run_cli(args: List[str], extra_env: Optional[Dict[str, str]] = None, timeout: float = 120,
            input_text: Optional[str] = None, cwd: Optional[str] = None,
            process: bool = False) -> subprocess.CompletedProcess:
    """cpuperf `args` (in this process unless `process`; `timeout` bounds a child process only)."""
    if process or os.environ.get("CPUPERF_TEST_CLI") == "process":
        return subprocess.run([sys.executable, "-m", "cpuperf", *args], capture_output=True, text=True,
                              env=cli_env(extra_env), timeout=timeout, input=input_text, cwd=cwd)
    return run_in_process(args, cli_env(extra_env), input_text=input_text, cwd=cwd)


def run_in_process(args: List[str], env: Dict[str, str], input_text: Optional[str] = None,
                   cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """entry.main(args) as a child would run it: exactly `env`, `cwd`, stdin, descriptors 0-2 (then put back)."""
    from cpuperf import entry
    from cpuperf.probe import _CACHE

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    for stream in saved_streams[1:]:
        stream.flush()
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin.write((input_text or "").encode())
        stdin.seek(0)
        for fd, f in zip((0, 1, 2), (stdin, out, err)):
            os.dup2(f.fileno(), fd)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, errors="backslashreplace")
        os.environ.clear()
        os.environ.update(env)
        _CACHE.clear()  # a probe of the host before this call is not this call's (a child starts empty)
        try:
            if cwd is not None:
                os.chdir(cwd)
            try:
                code = entry.main(list(args))
            except SystemExit as exc:  # what `raise SystemExit(main())` and a stray sys.exit give a shell
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            _CACHE.clear()
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((0, 1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
        stdout, stderr = (_text(f) for f in (out, err))
    return subprocess.CompletedProcess(["cpuperf", *args], int(code or 0), stdout, stderr)


def _text(f) -> str:
    """A pipe read in text mode: UTF-8, universal newlines (as subprocess.run(text=True) reads it)."""
    f.seek(0)
    return f.read().decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def run_json(args: List[str], extra_env: Optional[Dict[str, str]] = None, expect_rc: Optional[int] = 0,
             process: bool = False):
    proc = run_cli([*args, "--json"], extra_env, process=process)
    if expect_rc is not None:
        assert proc.returncode == expect_rc, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout), proc


def without_dac_override() -> Optional[Callable[[], None]]:
    """Root reads and writes everything: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the child's
    bounding set (prctl PR_CAPBSET_DROP), so after exec mode bits bind it as they bind any user."""
    if os.geteuid() != 0:
        return None  # not root: permissions already apply

    def drop() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (linux/capability.h)
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                os._exit(97)
    return drop
