"""What a command costs before it does anything: typer's pydantic coercion is skipped where it would return the value
unchanged (an option not given, text given as text, a number at its default, a list of text), so pydantic is not
imported by the commonest commands; every other value is still coerced by typer. The shipped compat tables are read
through the remembered parse, and give the same matrix as a fresh parse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_util import cli_env, run_cli

ROOT = Path(__file__).resolve().parent.parent
_MODULES = ("import json, sys\nfrom cpuperf.entry import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('MODULES', json.dumps(sorted(sys.modules)), file=sys.stderr)\n")

# What planning a user's command never needs, each once imported at every start of `train`: hashlib (it loads
# OpenSSL; Python's own SHA-1 and SHA-256 give the same digests), the launcher and its watcher (a dry run starts
# nothing), the vendor environment (several nodes only), the host resolver and its socket (a hostfile only).
_NOT_FOR_A_PLAN = ("hashlib", "_hashlib", "cpuperf.run.launcher", "cpuperf.run.watch", "cpuperf.run.vendor_env",
                   "cpuperf.probe.hosts", "socket", "pydantic", "torch")
_NOT_FOR_A_RUN = ("hashlib", "_hashlib", "cpuperf.run.vendor_env", "pydantic", "torch")


def _modules(*args: str, cwd: Path) -> set:
    env = cli_env({"PYTHONPATH": str(ROOT), "CPUPERF_OVERRIDE_GPUS": "[]"})
    proc = subprocess.run([sys.executable, "-c", _MODULES, *args], capture_output=True, text=True, env=env,
                          cwd=str(cwd), timeout=300)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES ")]
    assert line, proc.stderr[-2000:]
    return set(json.loads(line[-1].split(" ", 1)[1]))


def _pydantic_imported(*args: str, cwd: Path) -> bool:
    return "pydantic" in _modules(*args, cwd=cwd)


def test_common_commands_start_without_pydantic(tmp_path):
    (tmp_path / "job.py").write_text("print('hi')\n")
    assert not _pydantic_imported("doctor", "--json", cwd=tmp_path)
    assert not _pydantic_imported("recommend", "--json", "--set", "dtype=fp32", cwd=tmp_path)
    assert not _pydantic_imported("train", "--auto", "--dry-run", "--out", str(tmp_path / "run"), "--", "python",
                                  "job.py", cwd=tmp_path)


def test_a_plan_of_your_command_imports_only_what_it_plans_with(tmp_path):
    """`train --auto --dry-run -- python job.py`, and the same run for real: the modules above stay out (a real run
    imports the launcher, and with it the resolver, to start the job)."""
    (tmp_path / "job.py").write_text("print('hi')\n")
    planned = _modules("train", "--auto", "--dry-run", "--out", str(tmp_path / "plan"), "--", "python", "job.py",
                       cwd=tmp_path)
    assert {"cpuperf.plan.build", "cpuperf.plan.user_script", "cpuperf.run.measure"} <= planned  # it planned
    assert not planned & set(_NOT_FOR_A_PLAN), sorted(planned & set(_NOT_FOR_A_PLAN))
    ran = _modules("train", "--auto", "--out", str(tmp_path / "run"), "--", "python", "job.py", cwd=tmp_path)
    assert "cpuperf.run.launcher" in ran and (tmp_path / "run" / "status.json").is_file()  # it ran
    assert not ran & set(_NOT_FOR_A_RUN), sorted(ran & set(_NOT_FOR_A_RUN))


def test_values_are_still_coerced_and_checked(tmp_path):
    bad = run_cli(["train", "--dry-run", "--nproc-per-node", "two", "--", "python", "job.py"], cwd=str(tmp_path))
    assert bad.returncode == 2 and "--nproc-per-node" in bad.stderr, bad.stderr
    got = run_cli(["recommend", "--json", "--nproc-per-node", "1", "--set", "dtype=fp32", "--set", "compile=false"],
                  extra_env={"CPUPERF_OVERRIDE_GPUS": "[]"})
    assert got.returncode == 0, got.stderr[-2000:]
    plan = json.loads(got.stdout)
    assert {"dtype", "compile", "nproc_per_node"} <= set(plan["overridden"])
    blank = run_cli(["train", "--dry-run", "--out", " ", "--", "python", "job.py"], cwd=str(tmp_path))
    assert blank.returncode == 2 and "an empty path" in blank.stderr  # a path option's own check still runs


def test_the_remembered_parse_of_the_shipped_tables_is_the_parse(tmp_path, monkeypatch):
    from cpuperf.data import load_toml
    from cpuperf.knowledge.matrix import load_matrix, shipped_dir

    monkeypatch.setenv("CPUPERF_CACHE_DIR", str(tmp_path / "cache"))
    load_toml.cache_clear()  # this process's parses forgotten: the first load parses and remembers
    fresh = load_matrix(base_dir=shipped_dir(), environ={})  # named: parsed here, as a $CPUPERF_COMPAT_DIR file is
    first, again = load_matrix(environ={}), load_matrix(environ={})  # the shipped tables: remembered, then read back
    assert first == fresh and again == fresh
    assert any((tmp_path / "cache").rglob("hf.toml-*.json")), "the parse of hf.toml is remembered"
    load_toml.cache_clear()
    assert load_matrix(environ={}) == fresh  # read back from the remembered parse


def test_a_launchers_version_is_run_once_per_binary(tmp_path):
    """`mpirun --version` ran at every start of every command: it is remembered per binary, and run again when the
    binary changes."""
    import os

    bindir, count = tmp_path / "bin", tmp_path / "runs"
    bindir.mkdir()
    fake = bindir / "mpirun"

    def write(version: str) -> None:
        fake.write_text(f"#!/bin/sh\necho x >> {count}\necho 'mpirun (Open MPI) {version}'\n")
        fake.chmod(0o755)

    write("4.1.4")
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "CPUPERF_CACHE_DIR": str(tmp_path / "cache"),
           "CPUPERF_OVERRIDE_GPUS": "[]"}

    def mpi() -> list:
        proc = run_cli(["doctor", "--json"], extra_env=env)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        return [m for m in json.loads(proc.stdout)["software"]["mpi"] if m["path"] == str(fake)]

    assert mpi()[0]["version"] == "4.1.4" and mpi()[0]["flavour"] == "openmpi"
    assert count.read_text().count("x") == 1  # the second probe read what the first one remembered
    write("5.0.10")  # a new binary: run again
    assert mpi()[0]["version"] == "5.0.10" and count.read_text().count("x") == 2


def test_sha256_without_hashlib_is_hashlib_s():
    """fsutil.sha256_hex (ccl-env's marker, the remembered parses' check, the measurement cache's and a command's
    keys) and sha1_hex (the rendezvous id) give hashlib's digest whichever module they take: Python's own where
    hashlib (OpenSSL) is not loaded yet, OpenSSL's where it is or the input is large."""
    import hashlib

    data = ["", "A=b", "x" * 70000, "\udcff é"]
    code = ("import json, sys\nfrom cpuperf.fsutil import sha1_hex, sha256_hex\n"
            "out = [sha256_hex(t.encode('utf-8', 'surrogateescape')) for t in json.loads(sys.argv[1])]\n"
            "one = [sha1_hex(t.encode('utf-8', 'surrogateescape')) for t in json.loads(sys.argv[1])]\n"
            "before = 'hashlib' in sys.modules\n"
            "big = sha256_hex(b'z' * (3 << 20))\n"
            "print(json.dumps([before, out, big, one]))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(data)], capture_output=True, text=True,
                          env=cli_env({"PYTHONPATH": str(ROOT)}), timeout=60)
    before, out, big, one = json.loads(proc.stdout)
    assert before is False  # the small digests above were Python's own modules'
    assert out == [hashlib.sha256(t.encode("utf-8", "surrogateescape")).hexdigest() for t in data]
    assert one == [hashlib.sha1(t.encode("utf-8", "surrogateescape")).hexdigest() for t in data]  # the rendezvous id
    assert big == hashlib.sha256(b"z" * (3 << 20)).hexdigest()


def test_only_the_command_lines_own_process_is_left_to_the_os_at_its_end():
    """`cpuperf ...` and `python -m cpuperf ...` (main() reads sys.argv): what the command holds is frozen as it
    returns, so Python's shutdown does not walk it for cycles between the job's last line and the prompt; a caller
    that goes on (main(argv)) keeps its collector as it was."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('FROZEN', gc.get_freeze_count() > 0, file=sys.stderr))\n"
            "from cpuperf.entry import main\n"
            "own = sys.argv[1] == 'own'\nsys.argv = ['cpuperf', '--version']\n"
            "sys.exit(main() if own else main(['--version']))\n")
    for who, frozen in (("own", True), ("caller", False)):
        proc = subprocess.run([sys.executable, "-c", code, who], capture_output=True, text=True,
                              env=cli_env({"PYTHONPATH": str(ROOT)}), timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith("cpuperf "), proc.stderr[-2000:]
        assert f"FROZEN {frozen}" in proc.stderr, (who, proc.stderr[-2000:])


def test_train_plans_with_the_collector_paused_and_runs_the_job_with_it(tmp_path):
    """The collector is paused while `train` plans (its passes over the imports' and the plan's objects, all alive to
    the end, were CPU of every start), on again before the job starts (cpuperf waits on it, for hours maybe), and as
    it was when the command returns: on where it ran, off where the caller had turned it off."""
    (tmp_path / "job.py").write_text("print('hi')\n")
    code = ("import gc, json, sys\nimport cpuperf.run.launcher as launcher\nseen = []\nreal = launcher.execute\n"
            "def execute(*a, **k):\n    seen.append(gc.isenabled())\n    return real(*a, **k)\n"
            "launcher.execute = execute\nfrom cpuperf.entry import main\n"
            "was = sys.argv[1] == 'on'\nif not was:\n    gc.disable()\n"
            "code = main(sys.argv[2:])\nprint('SEEN', json.dumps([code, seen, gc.isenabled()]), file=sys.stderr)\n")
    env = cli_env({"PYTHONPATH": str(ROOT), "CPUPERF_OVERRIDE_GPUS": "[]"})
    for state, after in (("on", True), ("off", False)):
        for dry in (True, False):
            args = ["train", "--auto", *(["--dry-run"] if dry else []), "--out", str(tmp_path / f"{state}{dry}"), "--",
                    "python", "job.py"]
            proc = subprocess.run([sys.executable, "-c", code, state, *args], capture_output=True, text=True, env=env,
                                  cwd=str(tmp_path), timeout=300)
            line = [ln for ln in proc.stderr.splitlines() if ln.startswith("SEEN ")]
            assert line, proc.stderr[-2000:]
            rc, seen, enabled = json.loads(line[-1].split(" ", 1)[1])
            assert rc == 0 and enabled is after, (state, dry, proc.stderr[-2000:])
            assert seen == ([] if dry else [after]), (state, dry, seen)  # the job started with the collector as it was
