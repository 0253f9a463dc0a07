"""A closed or broken stdout or stderr is one outcome for every command (issue 62, class 2; docs/exit-codes.md):
what cannot be shown is dropped and the command exits with its own code (the code it gives with both streams
open), never "internal error" or a traceback; a stream that fails otherwise (stdout on a full disk) is exit 10
naming it, and the error a command meets keeps its own code when its message cannot be said.

Real `python -m cpuperf` processes, as a shell starts them: `>&-` (descriptor 1 or 2 closed before exec), a pipe
whose reader is gone before the first byte (what `| head -c1` does to the rest of the output, deterministically),
/dev/full. The code to expect is the same command's in-process run with both streams open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest
from cli_util import cli_env, run_cli
from hosts import make_host

from cpuperf.errors import ExitCode

SPR = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"]


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> str:
    return str(make_host(tmp_path_factory.mktemp("host"), sockets=2, cores_per_socket=8, flags=SPR, model=143))


COMMANDS = {  # name -> argv (HOST: the recorded tree)
    "recommend": ["recommend", "--sysroot", "HOST"],
    "recommend-json": ["recommend", "--sysroot", "HOST", "--json"],
    "ccl-env": ["ccl-env"],
    "ccl-env-json": ["ccl-env", "--format", "json"],
    "version": ["--version"],
    "doctor": ["doctor", "--sysroot", "HOST"],
    "doctor-json": ["doctor", "--sysroot", "HOST", "--json"],
    "compat-json": ["compat", "--json"],
    "train-dry-run": ["train", "--dry-run", "--max-steps", "2"],
    "train-dry-run-json": ["train", "--dry-run", "--max-steps", "2", "--json"],
    "bad-option": ["recommend", "--no-such-option"],
    "bad-option-json": ["recommend", "--no-such-option", "--json"],
    "bad-value": ["recommend", "--sysroot", "HOST", "--batch-size", "0"],
    "help": ["recommend", "--help"],
}


def _argv(name: str, host: str) -> List[str]:
    return [host if a == "HOST" else a for a in COMMANDS[name]]


def _run(args: List[str], tmp_path: Path, *, close: Optional[int] = None, stdout: object = subprocess.PIPE,
         stderr: object = subprocess.PIPE) -> subprocess.CompletedProcess:
    """`python -m cpuperf ARGS` with descriptor `close` closed (as `>&-` / `2>&-` leave it) and the given streams."""
    def closing() -> None:
        if close is not None:
            os.close(close)
    return subprocess.run([sys.executable, "-m", "cpuperf", *args], stdout=stdout, stderr=stderr, text=True,
                          env=cli_env(), cwd=str(tmp_path), timeout=120, preexec_fn=closing)


def _expected(args: List[str], tmp_path: Path) -> int:
    return run_cli(args, cwd=str(tmp_path)).returncode


def _clean(stderr: Optional[str]) -> None:
    text = stderr or ""
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_closed_stdout_is_the_commands_own_outcome(name, host, tmp_path):
    """`cpuperf recommend >&-`, `ccl-env >&-`, `--version >&-`, `train --dry-run >&-`: "internal error:
    AttributeError: 'NoneType' object has no attribute 'write'", exit 1; with --json a traceback."""
    args = _argv(name, host)
    want = _expected(args, tmp_path)
    proc = _run(args, tmp_path, close=1, stdout=subprocess.DEVNULL)
    assert proc.returncode == want, (want, proc.stderr[-2000:])
    _clean(proc.stderr)
    assert os.listdir(tmp_path) == [] or name.startswith("train")  # the product went into no file
    if name.startswith("bad"):  # the error is still said where it can be
        assert "error:" in proc.stderr and proc.stderr.count("\n") <= 3


@pytest.mark.parametrize("name", ["recommend", "doctor", "doctor-json", "ccl-env", "version", "bad-option-json",
                                  "help"])
def test_a_reader_gone_is_the_commands_own_outcome(name, host, tmp_path):
    """`cpuperf doctor | head -c1`: exit 1 and silent (rich's own broken-pipe exit). The pipe's reader is gone before
    the first byte here, so the very first write meets EPIPE."""
    args = _argv(name, host)
    want = _expected(args, tmp_path)
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _run(args, tmp_path, stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == want, (want, proc.stderr[-2000:])
    _clean(proc.stderr)
    assert "Exception ignored" not in proc.stderr and "BrokenPipe" not in proc.stderr


@pytest.mark.parametrize("name", ["bad-option", "bad-value", "recommend", "doctor"])
def test_closed_or_broken_stderr_keeps_the_code(name, host, tmp_path):
    """`cpuperf recommend --bogus 2>&-` exited 1, not 2: the message is dropped, never the code."""
    args = _argv(name, host)
    want = _expected(args, tmp_path)
    proc = _run(args, tmp_path, close=2, stderr=subprocess.DEVNULL)
    assert proc.returncode == want
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _run(args, tmp_path, stderr=write)
    finally:
        os.close(write)
    assert proc.returncode == want


@pytest.mark.parametrize("name", ["recommend", "recommend-json", "doctor", "version", "ccl-env"])
def test_stdout_on_a_full_disk_is_exit_10_naming_it(name, host, tmp_path):
    """`cpuperf recommend > FILE` on a full disk must not end as a success with the product cut short."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        proc = _run(_argv(name, host), tmp_path, stdout=full)
    assert proc.returncode == ExitCode.FILESYSTEM, proc.stderr[-2000:]
    assert "cannot write stdout: No space left on device" in proc.stderr
    _clean(proc.stderr)


def test_an_error_said_on_a_full_stderr_keeps_its_code(host, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        usage = _run(_argv("bad-option", host), tmp_path, stderr=full)
        json_usage = _run(_argv("bad-value", host) + ["--json"], tmp_path, stdout=full)
    assert usage.returncode == ExitCode.USAGE
    assert json_usage.returncode == ExitCode.USAGE and "--batch-size" in json_usage.stderr


@pytest.mark.full  # a real training run
def test_a_real_run_with_stdout_closed_trains_and_writes_its_product_nowhere(tmp_path):
    """`cpuperf train >&-` ended after training with "internal error: AttributeError" (exit 1). Now exit 0, the run
    on disk, and no file of the run (the lock took descriptor 1 in a process whose stdout was closed) holds the
    product."""
    out = tmp_path / "out"
    proc = _run(["train", "--out", str(out), "--max-steps", "2", "--json"], tmp_path, close=1,
                stdout=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _clean(proc.stderr)
    assert (out / "checkpoint.pt").is_file() and (out / "metrics.jsonl").stat().st_size > 0
    assert (out / ".lock").read_bytes() == b""  # released, and never the summary
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # only the worker's records: no product line mixed in


def test_a_terminal_still_gets_the_table_drawn_for_it(tmp_path):
    """Tables are drawn into a buffer and written by cpuperf.output: on a terminal (a pty of no size, as `script`
    gives) the table still has rich's width and borders, not nothing."""
    import pty

    env = {k: v for k, v in cli_env().items() if k not in ("NO_COLOR", "COLUMNS")}
    pid, fd = pty.fork()
    if pid == 0:  # the child: cpuperf on the pty
        os.chdir(str(tmp_path))
        os.execve(sys.executable, [sys.executable, "-m", "cpuperf", "compat"], env)
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert "IPEX" in text and "┃" in text and "\x1b[" in text  # drawn, bordered, in colour
