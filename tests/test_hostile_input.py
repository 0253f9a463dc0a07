"""Hostile input, table-driven, through the real CLI (`python -m cpuperf` in a child process).

For each bad input: the documented exit code, exactly one error line on stderr (plus an optional
`hint:` line), a JSON error object on stdout with --json, never a traceback or `internal error`,
and an answer within seconds. Only the OS edge is synthetic: files on disk, env vars, --sysroot trees.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import pytest
from cli_util import cli_env, without_dac_override
from hosts import make_host

from cpuperf.errors import ExitCode

USAGE, BAD_DATA, UNREACHABLE, FILESYSTEM = (int(ExitCode.USAGE), int(ExitCode.BAD_DATA),
                                            int(ExitCode.UNREACHABLE), int(ExitCode.FILESYSTEM))
# Nested far past any parser's recursion limit, and past cpuperf's own depth cap.
DEEP_TOML = "x = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_JSON = "[" * 100000 + "]" * 100000


# Garbage in a recorded host's files: each is refused with the file and the value named (issue 25).
GARBAGE_SYSROOT = [
    ("meminfo", "proc/meminfo", "MemTotal: lots kB\n"),
    ("cpu-max", "sys/fs/cgroup/cpu.max", "nan 100000\n"),
    ("cpu-max-negative", "sys/fs/cgroup/cpu.max", "-200000 100000\n"),
    ("cpuset", "sys/fs/cgroup/cpuset.cpus.effective", "all of them\n"),
    ("memory-max", "sys/fs/cgroup/memory.max", "-1\n"),
    ("core-id", "sys/devices/system/cpu/cpu0/topology/core_id", "zero\n"),
    ("present", "sys/devices/system/cpu/present", "0-3,x\n"),
]


class Case(NamedTuple):
    name: str
    args: List[str]
    code: int
    env: Dict[str, str] = {}
    unprivileged: bool = False  # permission cases: run without root's override of mode bits
    seconds: float = 8.0
    needle: Optional[str] = None  # a word the error line must contain (the path, the variable)


def _files(tmp: Path) -> Dict[str, str]:
    """Every file and directory the cases refer to, as {NAME: path} for str.format."""
    tmp.chmod(0o755)
    f: Dict[str, Path] = {}

    def put(name: str, data: bytes, mode: int = 0o644) -> None:
        path = tmp / name
        path.write_bytes(data)
        path.chmod(mode)
        f[name.replace(".", "_").replace("-", "_")] = path

    put("binary.hosts", b"node01\n\x00\x01\x02\xff\n")
    put("latin1.hosts", "n\xf6de01\n".encode("latin-1"))
    put("unresolvable.hosts", b"no-such-host.invalid\n")
    put("dupes.hosts", b"".join(b"node%d\n" % (i % 50000) for i in range(10 ** 6)))
    put("deep.toml", DEEP_TOML.encode())
    put("deep.json", DEEP_JSON.encode())
    put("binary.toml", b"dtype = \x00\xff\n")
    put("latin1.toml", 'dtype = "f\xf6o"\n'.encode("latin-1"))
    put("secret.toml", b'dtype = "fp32"\n', mode=0o000)
    put("plainfile", b"x\n")
    sysroot = make_host(tmp / "sysroot")
    for d in (sysroot,):
        for path in [d, *d.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    f["sysroot"] = sysroot
    huge = make_host(tmp / "huge-sysroot")
    (huge / "sys/devices/system/cpu/online").write_text("0-99999999\n")
    f["huge_sysroot"] = huge
    (tmp / "empty-dir").mkdir()
    f["empty_dir"] = tmp / "empty-dir"
    closed = tmp / "closed-dir"
    make_host(closed)
    closed.chmod(0o000)
    f["closed_dir"] = closed
    bad_compat = tmp / "bad-compat"
    bad_compat.mkdir()
    (bad_compat / "ipex-bad.toml").write_text("[[ipex]\nversion = ")
    f["bad_compat"] = bad_compat
    deep_compat = tmp / "deep-compat"
    deep_compat.mkdir()
    (deep_compat / "torch-deep.toml").write_text(DEEP_TOML)
    f["deep_compat"] = deep_compat
    closed_compat = tmp / "closed-compat"
    closed_compat.mkdir()
    (closed_compat / "ipex-x.toml").write_text("")
    closed_compat.chmod(0o000)
    f["closed_compat"] = closed_compat
    for name, rel, text in GARBAGE_SYSROOT:  # one recorded host per garbage file
        root = make_host(tmp / f"garbage-{name}")
        (root / "proc/self").mkdir(parents=True, exist_ok=True)
        (root / "proc/self/cgroup").write_text("0::/\n")
        (root / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
        (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpu cpuset memory\n")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        f["garbage_" + name.replace("-", "_")] = root
    fifo = tmp / "pipe.json"  # a FIFO with no writer: a blocking open would hang forever
    os.mkfifo(fifo)
    f["fifo"] = fifo
    sparse = tmp / "huge.json"  # 64 MiB of holes: over every input cap
    with open(sparse, "wb") as fh:
        fh.truncate(64 * 1024 * 1024)
    f["huge_json"] = sparse
    put("nan-config.json", b'{"n_layer": 2, "n_embd": NaN, "n_head": 2, "vocab_size": 64, "n_positions": 32}')
    put("nan-measurements.json", b'{"schema": "cpuperf.measurements/1", "gemm_fp32_gflops": NaN}')
    (tmp / "a-dir").mkdir()
    f["a_dir"] = tmp / "a-dir"
    put("not-python", b"#!/bin/sh\necho 3.11\n", mode=0o755)
    put("hangs-python", b"#!/bin/sh\nsleep 600\n", mode=0o755)
    readonly = tmp / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    f["readonly"] = readonly
    return {k: str(v) for k, v in f.items()}


CASES = [
    # hostfiles: binary, not UTF-8, unresolvable (exit 7, never a local run), quadratic duplicates
    Case("hostfile-binary", ["ccl-env", "--hostfile", "{binary_hosts}"], USAGE, needle="binary"),
    Case("hostfile-latin1", ["recommend", "--hostfile", "{latin1_hosts}"], USAGE, needle="UTF-8"),
    Case("hostfile-unresolvable-train", ["train", "--hostfile", "{unresolvable_hosts}", "--max-steps", "1",
                                         "--out", "{tmp}/never"], UNREACHABLE, needle="no-such-host.invalid"),
    Case("hostfile-1e6-lines", ["recommend", "--hostfile", "{dupes_hosts}"], USAGE, seconds=15),
    Case("hostfile-missing", ["recommend", "--hostfile", "{tmp}/nope.hosts"], USAGE, needle="nope.hosts"),
    # --sysroot: missing, empty, unreadable, a file, a hostile cpulist
    Case("sysroot-missing", ["recommend", "--sysroot", "{tmp}/no-such-root"], USAGE, needle="no-such-root"),
    Case("sysroot-empty-dir", ["doctor", "--sysroot", "{empty_dir}"], USAGE, needle="empty-dir"),
    Case("sysroot-empty-string", ["ccl-env", "--sysroot", ""], USAGE),
    Case("sysroot-a-file", ["recommend", "--sysroot", "{plainfile}"], USAGE),
    Case("sysroot-unreadable", ["recommend", "--sysroot", "{closed_dir}"], USAGE, unprivileged=True),
    Case("sysroot-huge-cpulist", ["recommend", "--sysroot", "{huge_sysroot}"], USAGE, needle="99999999"),
    # overrides: huge or malformed cpulists, non-numeric numbers
    Case("override-cpus-huge", ["recommend", "--sysroot", "{sysroot}"], USAGE,
         env={"CPUPERF_OVERRIDE_ALLOWED_CPUS": "0-99999999"}, needle="CPUPERF_OVERRIDE_ALLOWED_CPUS"),
    Case("override-cpus-garbage", ["ccl-env", "--sysroot", "{sysroot}"], USAGE,
         env={"CPUPERF_OVERRIDE_ALLOWED_CPUS": "zero-three"}, needle="CPUPERF_OVERRIDE_ALLOWED_CPUS"),
    Case("override-memory-text", ["recommend", "--sysroot", "{sysroot}"], USAGE,
         env={"CPUPERF_OVERRIDE_MEMORY_TOTAL": "lots"}, needle="CPUPERF_OVERRIDE_MEMORY_TOTAL"),
    Case("override-quota-nan", ["recommend", "--sysroot", "{sysroot}"], USAGE,
         env={"CPUPERF_OVERRIDE_CPU_QUOTA": "nan"}, needle="CPUPERF_OVERRIDE_CPU_QUOTA"),
    Case("override-gpus-deep", ["doctor", "--sysroot", "{sysroot}"], USAGE,
         env={"CPUPERF_OVERRIDE_GPUS": "[" * 50000 + "]" * 50000}, needle="CPUPERF_OVERRIDE_GPUS"),
    Case("override-packages-version", ["doctor"], USAGE, env={"CPUPERF_OVERRIDE_PACKAGES": '{"torch": "abc"}'},
         needle="CPUPERF_OVERRIDE_PACKAGES"),
    Case("override-packages-deep", ["recommend"], USAGE, env={"CPUPERF_OVERRIDE_PACKAGES": "[" * 50000 + "]" * 50000},
         needle="CPUPERF_OVERRIDE_PACKAGES"),
    Case("override-python-text", ["doctor"], USAGE, env={"CPUPERF_OVERRIDE_PYTHON": "three"},
         needle="CPUPERF_OVERRIDE_PYTHON"),
    # counts and durations
    Case("bench-threads-huge", ["bench", "--threads", "100000"], USAGE, needle="usable CPU"),
    Case("bench-seconds-nan", ["bench", "--seconds", "nan"], USAGE, needle="--seconds"),
    Case("bench-seconds-inf", ["bench", "--seconds", "inf"], USAGE, needle="--seconds"),
    Case("train-threads-huge", ["train", "--dry-run", "--set", "threads_per_rank=100000"], USAGE,
         needle="usable CPU"),
    Case("train-auto-threads-huge", ["train", "--auto", "--dry-run", "--set", "threads_per_rank=100000"], USAGE,
         needle="usable CPU"),
    Case("recommend-ranks-huge", ["recommend", "--sysroot", "{sysroot}", "--set", "nproc_per_node=100000"],
         USAGE, needle="usable CPU"),
    Case("train-time-budget-nan", ["train", "--dry-run", "--time-budget", "nan"], USAGE, needle="--time-budget"),
    Case("train-time-budget-inf", ["train", "--dry-run", "--time-budget", "inf"], USAGE, needle="--time-budget"),
    Case("train-time-budget-negative", ["train", "--dry-run", "--time-budget", "-5"], USAGE),
    Case("train-lr-overflow", ["train", "--dry-run", "--set", "lr=1e999"], USAGE, needle="lr"),
    Case("recommend-params-inf", ["recommend", "--sysroot", "{sysroot}", "--params", "1e999"], USAGE, needle="--params"),
    Case("recommend-params-nan", ["recommend", "--sysroot", "{sysroot}", "--params", "nan"], USAGE, needle="--params"),
    Case("train-bad-port", ["train", "--dry-run", "--master-port", "0"], USAGE),
    # configs: nested too deep, binary, not UTF-8, unreadable
    Case("config-deep-toml", ["recommend", "--sysroot", "{sysroot}", "--config", "{deep_toml}"], USAGE),
    Case("config-deep-json", ["recommend", "--sysroot", "{sysroot}", "--config", "{deep_json}"], USAGE),
    Case("config-binary", ["recommend", "--sysroot", "{sysroot}", "--config", "{binary_toml}"], USAGE),
    Case("config-latin1", ["recommend", "--sysroot", "{sysroot}", "--config", "{latin1_toml}"], USAGE),
    Case("config-unreadable", ["recommend", "--sysroot", "{sysroot}", "--config", "{secret_toml}"], USAGE,
         unprivileged=True, needle="secret.toml"),
    Case("measurements-deep", ["recommend", "--sysroot", "{sysroot}", "--measurements", "{deep_json}"], USAGE),
    # CPUPERF_COMPAT_DIR: malformed, too deep, unreadable, under every command that reads it
    *[Case(f"compat-dir-malformed-{cmd[0]}", cmd, BAD_DATA, env={"CPUPERF_COMPAT_DIR": "{bad_compat}"},
           needle="ipex-bad.toml")
      for cmd in (["recommend", "--sysroot", "{sysroot}"], ["compat"], ["doctor", "--sysroot", "{sysroot}"],
                  ["install", "--dry-run", "--yes"], ["train", "--auto", "--dry-run"], ["ccl-env"],
                  ["bench", "--threads", "1"])],
    Case("compat-dir-deep", ["compat"], BAD_DATA, env={"CPUPERF_COMPAT_DIR": "{deep_compat}"}),
    Case("compat-dir-unreadable", ["compat"], BAD_DATA, env={"CPUPERF_COMPAT_DIR": "{closed_compat}"},
         unprivileged=True, needle="closed-compat"),
    Case("compat-dir-unreadable-recommend", ["recommend", "--sysroot", "{sysroot}"], BAD_DATA,
         env={"CPUPERF_COMPAT_DIR": "{closed_compat}"}, unprivileged=True, needle="closed-compat"),
    # paths that cannot be written
    Case("out-under-a-file", ["train", "--max-steps", "1", "--out", "{plainfile}/run"], FILESYSTEM,
         needle="plainfile"),
    Case("out-read-only-dir", ["train", "--max-steps", "1", "--out", "{readonly}/run"], FILESYSTEM,
         unprivileged=True, needle="readonly"),
    *([Case("home-under-a-file", ["bench", "--threads", "1", "--size", "64", "--seconds", "0.1", "--no-allocators"],
            FILESYSTEM, env={"HOME": "{plainfile}", "CPUPERF_CACHE_DIR": ""}, seconds=40,
            needle="plainfile")] if importlib.util.find_spec("torch") else []),
    Case("cache-read-only", ["bench", "--threads", "1", "--size", "64", "--seconds", "0.1", "--no-allocators"],
         FILESYSTEM, env={"CPUPERF_CACHE_DIR": "{readonly}/cache"}, unprivileged=True, seconds=40,
         needle="readonly") if importlib.util.find_spec("torch") else None,
    *[Case(f"sysroot-garbage-{name}", ["recommend", "--sysroot", "{garbage_" + name.replace("-", "_") + "}"], USAGE,
           needle=rel.rsplit("/", 1)[1]) for name, rel, _ in GARBAGE_SYSROOT],
    # reads that must be bounded and never block: devices, FIFOs, sparse huge files (issue 25)
    *[Case(f"{what}-{name}", [*args, path], USAGE, needle=needle, seconds=20 if what == "lock" else 8.0)
      for name, path, needle in (("dev-zero", "/dev/zero", "character device"), ("fifo", "{fifo}", "FIFO"),
                                 ("huge", "{huge_json}", "larger than"), ("dir", "{a_dir}", "directory"))
      for what, args in (("model", ["train", "--dry-run", "--model"]), ("recommend-model", ["recommend", "--model"]),
                         ("hostfile", ["ccl-env", "--hostfile"]), ("config", ["recommend", "--config"]),
                         ("measurements", ["recommend", "--measurements"]),
                         ("lock", ["install", "--dry-run", "--yes", "--from-lock"]))
      if not (name == "dir" and what in ("model", "recommend-model"))],  # a directory is a HF cache dir there
    Case("model-nan", ["train", "--dry-run", "--model", "{nan_config_json}"], USAGE, needle="NaN"),
    Case("measurements-nan", ["recommend", "--measurements", "{nan_measurements_json}"], USAGE,
         needle="gemm_fp32_gflops"),
    # --python that is not a Python: one line, exit 2, within the check's timeout
    *[Case(f"python-{name}-{cmd[0]}", [*cmd, "--python", path], USAGE, needle="Python", seconds=25)
      for name, path in (("a-script", "{not_python}"), ("true", "/bin/true"), ("a-dir", "{a_dir}"),
                         ("hangs", "{hangs_python}"))
      for cmd in (["doctor"], ["ccl-env"])],
    # typed values: empty names, rank counts of 0, unknown or malformed overrides, garbage in env vars
    Case("with-empty", ["compat", "--with", ""], USAGE, needle="empty add-on"),
    Case("with-trailing-comma", ["install", "--dry-run", "--yes", "--with", "ipex,"], USAGE, needle="empty add-on"),
    Case("with-not-a-name", ["compat", "--with", "ipex,$(id)"], USAGE, needle="not a package name"),
    Case("platform-empty", ["compat", "--platform", ""], USAGE, needle="--platform"),
    Case("ranks-zero", ["train", "--dry-run", "--nproc-per-node", "0"], USAGE),
    Case("ranks-zero-set", ["recommend", "--set", "nproc_per_node=0"], USAGE, needle="nproc_per_node"),
    Case("ranks-zero-ccl-env", ["ccl-env", "--nproc-per-node", "0"], USAGE),
    Case("override-unknown", ["doctor"], USAGE, env={"CPUPERF_OVERRIDE_CPU_COUNT": "4"},
         needle="CPUPERF_OVERRIDE_CPU_COUNT"),
    Case("override-isa-shell", ["recommend"], USAGE, env={"CPUPERF_OVERRIDE_ISA": "avx2;reboot"},
         needle="CPUPERF_OVERRIDE_ISA"),
    Case("override-microarch-subst", ["ccl-env"], USAGE, env={"CPUPERF_OVERRIDE_MICROARCH": "$(id)"},
         needle="CPUPERF_OVERRIDE_MICROARCH"),
    Case("override-amx-maybe", ["doctor"], USAGE, env={"CPUPERF_OVERRIDE_AMX_USABLE": "maybe"},
         needle="CPUPERF_OVERRIDE_AMX_USABLE"),
    Case("override-packages-empty-name", ["recommend"], USAGE, env={"CPUPERF_OVERRIDE_PACKAGES": '{"": "1.0"}'},
         needle="CPUPERF_OVERRIDE_PACKAGES"),
    Case("slurm-garbage", ["recommend"], USAGE, env={"SLURM_CPUS_PER_TASK": "four"}, needle="SLURM_CPUS_PER_TASK"),
    Case("slurm-zero", ["ccl-env"], USAGE, env={"SLURM_NTASKS": "0"}, needle="SLURM_NTASKS"),
    Case("load-window-nan", ["recommend", "--adapt-to-load"], USAGE, env={"CPUPERF_LOAD_WINDOW": "nan"},
         needle="CPUPERF_LOAD_WINDOW"),
    Case("measure-switch-garbage", ["train", "--auto", "--max-steps", "1", "--out", "{tmp}/never2"], USAGE,
         env={"CPUPERF_MEASURE": "maybe"}, needle="CPUPERF_MEASURE"),
    # output paths of the wrong kind, refused before any work
    Case("write-lock-a-dir", ["install", "--dry-run", "--yes", "--write-lock", "{a_dir}"], FILESYSTEM,
         needle="a-dir"),
    Case("download-a-file", ["install", "--yes", "--download", "{plainfile}"], FILESYSTEM, needle="plainfile"),
    Case("snapshot-a-file", ["doctor", "--save-snapshot", "{plainfile}"], FILESYSTEM, needle="plainfile"),
    # ccl-env's own options
    Case("ccl-env-unknown-shell", ["ccl-env", "--shell", "csh"], USAGE, needle="csh"),
    Case("ccl-env-bad-count", ["ccl-env", "--nproc-per-node", "many"], USAGE),
]


def _fill(text: str, files: Dict[str, str], tmp: Path) -> str:
    """{name} -> the file's path; other braces (JSON values) stay as they are."""
    for key, value in {**files, "tmp": str(tmp)}.items():
        text = text.replace("{" + key + "}", value)
    return text


def _run(case: Case, files: Dict[str, str], tmp: Path, json_out: bool) -> subprocess.CompletedProcess:
    args = [_fill(a, files, tmp) for a in case.args] + (["--json"] if json_out else [])
    env = cli_env({"HOME": str(tmp / "home"), "CPUPERF_CACHE_DIR": str(tmp / "cache"), "PYTHONPATH": os.getcwd()})
    env.pop("XDG_CACHE_HOME", None)
    env.update({k: _fill(v, files, tmp) for k, v in case.env.items()})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cpuperf", *args], capture_output=True, text=True, env=env,
                          timeout=60, cwd=str(tmp), preexec_fn=without_dac_override() if case.unprivileged else None)
    elapsed = time.monotonic() - started
    assert elapsed < case.seconds, f"{case.name}: took {elapsed:.1f} s"
    return proc


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Dict[str, str]:
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "home").mkdir()
    (tmp / "cache").mkdir()
    for d in (tmp / "home", tmp / "cache"):
        d.chmod(0o777)
    found = _files(tmp)
    found["__tmp__"] = str(tmp)
    return found


def _check_stderr(case: Case, stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and "internal error" not in stderr, (case.name, stderr)
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, (case.name, stderr)
    # Allowed besides: notes, warnings, and train's one progress line said before it touches --out; each of those
    # wrapped to the width (COLUMNS) goes on in lines indented by two spaces. The error and its hint stay one line.
    others = [line for line in lines
              if not line.startswith(("error: ", "  hint: ", "note: ", "warning: ", "cpuperf train: ", "  "))]
    assert others == [], (case.name, stderr)
    assert len([line for line in lines if line.startswith("  hint: ")]) <= 1, (case.name, stderr)
    return errors[0]


CASES = [c for c in CASES if c is not None]


@pytest.mark.full  # a real process per case, with its time bound
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_gets_its_exit_code_and_one_line(case: Case, files: Dict[str, str]) -> None:
    tmp = Path(files["__tmp__"])
    proc = _run(case, files, tmp, json_out=False)
    assert proc.returncode == case.code, (case.name, proc.returncode, proc.stderr[-1500:])
    line = _check_stderr(case, proc.stderr)
    if case.needle:
        assert _fill(case.needle, files, Path(files["__tmp__"])) in line, (case.name, line)
    assert proc.stdout == "", (case.name, proc.stdout[:500])

    proc = _run(case, files, tmp, json_out=True)
    assert proc.returncode == case.code, (case.name, proc.returncode, proc.stderr[-1500:])
    _check_stderr(case, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == case.code and err["message"] and "\n" not in err["message"], (case.name, err)


@pytest.mark.full  # a real train process
def test_unresolvable_hostfile_never_trains_locally(files: Dict[str, str]) -> None:
    tmp = Path(files["__tmp__"])
    case = next(c for c in CASES if c.name == "hostfile-unresolvable-train")
    proc = _run(case, files, tmp, json_out=False)
    assert proc.returncode == UNREACHABLE
    assert not (tmp / "never").exists()  # nothing started: no run directory, no metrics


@pytest.mark.full  # real processes
def test_corrupt_measurement_cache_is_named_and_planning_goes_on_without_it(tmp_path: Path) -> None:
    env = cli_env({"CPUPERF_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path)})
    host_id = subprocess.run(
        [sys.executable, "-c", "from cpuperf.probe import probe_host; from cpuperf.run.measure import host_id; "
                               "print(host_id(probe_host()))"],
        capture_output=True, text=True, env=env, timeout=60, check=True).stdout.strip()
    cache = tmp_path / "measurements" / f"{host_id}.json"
    for junk in (b"{not json", b"\xff\xfe\x00binary", b'{"gemm_fp32_gflops": "fast"}', DEEP_JSON.encode()):
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(junk)
        proc = subprocess.run([sys.executable, "-m", "cpuperf", "recommend", "--json"], capture_output=True,
                              text=True, env=env, timeout=60)
        assert proc.returncode == 0, (junk[:20], proc.stderr)
        assert str(cache) in proc.stderr and "ignoring the measurement cache" in proc.stderr, proc.stderr
        assert cache.read_bytes() == junk  # never removed: the next bench or --auto run writes it anew
        json.loads(proc.stdout)


def test_json_never_prints_nan_or_infinity() -> None:
    """--json output is strict JSON even if a non-finite number slipped through (printed as null)."""
    script = ("from cpuperf.output import Output; "
              "Output(json_mode=True).json({'a': float('inf'), 'b': [float('nan'), 1.5], 'c': {'d': -float('inf')}})")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == \
        {"a": None, "b": [None, 1.5], "c": {"d": None}}


@pytest.mark.smoke("bench")
def test_bench_size_and_seconds_are_used(tmp_path: Path) -> None:
    """`bench --size/--seconds` reach the GEMM measurement (they were once parsed and dropped)."""
    pytest.importorskip("torch")
    env = cli_env({"CPUPERF_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path)})
    proc = subprocess.run([sys.executable, "-m", "cpuperf", "bench", "--size", "64", "--seconds", "0.1",
                           "--no-allocators", "--threads", "1", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["gemm_size"] == 64 and result["gemm_seconds"] == 0.1
    assert result["gemm_fp32_gflops"] > 0
    cached = json.loads(Path(result["cache"]).read_text())
    assert cached["gemm_size"] == 64


def test_multi_line_third_party_errors_are_one_line_unless_debug(monkeypatch, capsys) -> None:
    """A library's multi-line error (a traceback text, a compiler dump) is summarised in one line."""
    from cpuperf import cli
    from cpuperf.commands import compat

    def boom(*args, **kwargs):
        raise RuntimeError("Traceback (most recent call last):\n  File x, line 1\nValueError: deep inside")

    monkeypatch.setattr(compat, "run", boom)
    monkeypatch.delenv("CPUPERF_DEBUG", raising=False)
    assert cli.main(["compat"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if line.startswith("error: ")]) == 1 and len(err) <= 2, err
    assert "ValueError: deep inside" in err[0] and "+2 more line(s)" in err[0] and "CPUPERF_DEBUG=1" in err[0]
    monkeypatch.setenv("CPUPERF_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(["compat"])
