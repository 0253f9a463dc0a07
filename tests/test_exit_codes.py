"""Every exit code in the table of docs/exit-codes.md is true: each is produced here by a real `cpuperf` process (the
cheap ones), or named with the test that produces it with real pip, real signals or a full disk. A code
added to the table without a producer fails this test."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
from cli_util import run_cli

from cpuperf.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent


def documented_codes() -> List[int]:
    """The codes of the table in docs/exit-codes.md."""
    text = (ROOT / "docs" / "exit-codes.md").read_text()
    table = text.split("## The codes", 1)[1].split("\n\n", 2)[1]
    return [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", table, re.M)]


def _busy(tmp: Path) -> Tuple[List[str], Dict[str, str], Callable[[], object]]:
    from cpuperf.fsutil import acquire_dir_lock

    run = tmp / "held"
    run.mkdir()
    lock = acquire_dir_lock(str(run), token="held-by-this-test")  # another live run, as far as cpuperf can tell
    return ["train", "--model", "micro", "--max-steps", "1", "--out", str(run)], {}, lock.release


def _compat_dir(tmp: Path) -> Tuple[List[str], Dict[str, str], Callable[[], object]]:
    bad = tmp / "compat"
    bad.mkdir()
    (bad / "ipex-bad.toml").write_text("[[ipex]\nversion = ")
    return ["compat"], {"CPUPERF_COMPAT_DIR": str(bad)}, lambda: None


def _plain(args: List[str], env: Dict[str, str] | None = None):
    return lambda tmp: ([a.replace("{tmp}", str(tmp)) for a in args], env or {}, lambda: None)


# code -> how to produce it here (argv, env, cleanup)
PRODUCED_HERE = {
    0: _plain(["compat", "--python", "3.11", "--torch", "2.7.0"]),
    1: _plain(["compat", "--why-not", "oneccl_bind_pt==1.12.0", "--python", "3.10", "--torch", "1.12.1"]),
    2: _plain(["train", "--dry-run", "--nproc-per-node", "0"]),
    3: _plain(["ccl-env", "--require-ccl"], {"CPUPERF_OVERRIDE_PACKAGES": '{"oneccl_bind_pt": null}'}),
    6: _compat_dir,
    7: _plain(["install", "--index-url", "http://127.0.0.1:9/simple", "--dry-run", "--yes"]),
    8: _plain(["train", "--launcher", "srun", "--nproc-per-node", "2", "--model", "micro", "--max-steps", "1",
                "--out", "{tmp}/r8"], {"PATH": "/nonexistent"}),
    9: _plain(["install", "--dry-run", "--yes"], {"CPUPERF_OVERRIDE_PLATFORM": "darwin"}),
    10: _plain(["train", "--model", "micro", "--max-steps", "1", "--out", "{tmp}/a-file/run"]),
    12: _busy,
}
# code -> (test file, test function) that produces it with real pip, real signals or a full disk
PRODUCED_ELSEWHERE = {
    4: ("test_install_transaction.py", "test_full_disk_names_the_path_and_restores"),
    5: ("test_cclenv.py", "test_failing_script_is_one_line_error_and_nothing_on_stdout"),
    11: ("test_install_transaction.py", "test_sigkill_leaves_a_journal_that_recover_restores"),
    13: ("test_saved_plan.py", "test_a_plan_for_another_stack_is_refused_naming_the_difference"),
    14: ("test_doctor_cluster.py", "test_a_node_with_another_torch_is_named_with_the_fix"),
    129: ("test_run_dir.py", "test_no_rank_outlives_cpuperf"),
    130: ("test_launch_run.py", "test_signal_exits_128_plus_n_ranks_stopped_checkpoint_kept"),
    143: ("test_install_transaction.py", "test_stop_signal_kills_pip_group_and_restores"),
}


def test_every_documented_code_is_an_exit_code_and_has_a_producer():
    codes = documented_codes()
    assert codes == sorted(codes) and len(codes) >= 16, codes
    assert set(codes) == {int(c) for c in ExitCode}, set(codes) ^ {int(c) for c in ExitCode}
    assert set(codes) == set(PRODUCED_HERE) | set(PRODUCED_ELSEWHERE)
    for code, (name, func) in PRODUCED_ELSEWHERE.items():
        source = (ROOT / "tests" / name).read_text()
        tree = ast.parse(source)
        assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body), (code, name, func)
        body = source.split(f"def {func}(", 1)[1].split("\ndef ", 1)[0]
        near = source.split(f"def {func}(", 1)[0][-400:]  # its parametrize line
        assert str(code) in body + near, (code, func)


def test_each_stop_signal_has_its_documented_code():
    """The signal-to-exit-code map every stop path uses (install, train, the worker): 128 + the signal's number, as
    the table says; the real signals are sent once per mechanism (PRODUCED_ELSEWHERE)."""
    import signal

    from cpuperf.errors import STOP_SIGNALS, exit_code_for_signal

    rows = (ROOT / "docs" / "exit-codes.md").read_text()
    for name in STOP_SIGNALS:
        code = exit_code_for_signal(name)
        assert code == 128 + getattr(signal, name), (name, code)
        assert re.search(rf"^\| {int(code)} \|[^\n]*{name}", rows, re.M), (name, code)
    assert exit_code_for_signal(None) == exit_code_for_signal("SIGUSR1") == ExitCode.INTERRUPTED == 130


@pytest.mark.smoke("exit codes")
@pytest.mark.parametrize("code", sorted(PRODUCED_HERE))
def test_code_is_produced(code, tmp_path):
    (tmp_path / "a-file").write_text("x")
    args, env, cleanup = PRODUCED_HERE[code](tmp_path)
    env = {"HOME": str(tmp_path), "CPUPERF_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    try:
        proc = run_cli([*args, "--json"], extra_env=env, cwd=str(tmp_path), timeout=180, process=True)
    finally:
        cleanup()
    assert proc.returncode == code, (code, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    if code not in (0, 1):
        err = json.loads(proc.stdout)["error"]
        assert err["code"] == code and err["message"] and "\n" not in err["message"], err
        assert err["name"] == ExitCode(code).name.lower(), err
    else:
        assert json.loads(proc.stdout)  # the product, as JSON
