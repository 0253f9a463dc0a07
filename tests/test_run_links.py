"""No link followed in a run directory (issue 62, class 1): every file cpuperf writes or appends to in place there (the
lock, metrics.jsonl, logs/ with the rank logs, pid files and launcher.log) and the checkpoint `--resume` reads back is
refused with exit 10 naming the link when a symbolic link stands there, before anything is read or written; the link's
target (a victim outside the run directory) keeps its bytes, and a dangling link's target is never created. Files
replaced as a whole (the checkpoint of a fresh run, plot.svg, the tokenizer cache) replace a link, as before
(tests/test_own_files.py). Real `cpuperf train` and rankexec processes; links in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_util import cli_env, run_cli

from cpuperf.errors import ExitCode, FilesystemError
from cpuperf.fsutil import LinkRefused, acquire_dir_lock, append_nofollow, ensure_dir
from cpuperf.train.rundir import claim

VICTIM = b"the user's own bytes\n"


def _setup(tmp_path: Path, name: str, dangling: bool, victim_dir: bool = False) -> tuple[Path, Path]:
    """out/NAME a link to a victim outside the run directory (a file, a directory, or nothing yet)."""
    out = tmp_path / "out"
    (out / os.path.dirname(name) if os.path.dirname(name) else out).mkdir(parents=True, exist_ok=True)
    victim = tmp_path / ("not-yet" if dangling else "victim")
    if not dangling:
        if victim_dir:
            victim.mkdir()
            (victim / "keep").write_bytes(VICTIM)
        else:
            victim.write_bytes(VICTIM)
    (out / name).symlink_to(victim)
    return out, victim


def _unchanged(tmp_path: Path, victim: Path, dangling: bool, victim_dir: bool = False) -> None:
    if dangling:
        assert not victim.exists(), f"{victim} was created through the link"
    elif victim_dir:
        assert sorted(os.listdir(victim)) == ["keep"] and (victim / "keep").read_bytes() == VICTIM
    else:
        assert victim.read_bytes() == VICTIM


CASES = [  # (name in the run directory, a link to a directory, with --resume)
    (".lock", False, False), ("metrics.jsonl", False, False), ("metrics.jsonl", False, True),
    ("logs", True, False), ("logs/rank0.log", False, False), ("logs/rank0.pid", False, False),
    ("checkpoint.pt", False, True),
]


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("name,victim_dir,resume", CASES, ids=[f"{n}{'-resume' if r else ''}" for n, _, r in CASES])
def test_train_refuses_a_link_in_its_run_directory(tmp_path, name, victim_dir, resume, dangling):
    """`ln -s VICTIM out/.lock` emptied the victim (exit 0); a dangling metrics.jsonl made its target; a link named
    logs got the rank logs; a linked checkpoint on --resume ended in torch's weights-only message. Now: exit 10,
    the link named, nothing written through it, and no rank started (the refusal comes before the launch)."""
    out, victim = _setup(tmp_path, name, dangling, victim_dir and not dangling)
    args = ["train", "--out", str(out), "--max-steps", "1"] + (["--resume"] if resume else [])
    proc = run_cli(args)
    assert proc.returncode == ExitCode.FILESYSTEM, proc.stderr[-1500:]
    assert f"{out / name} is a symbolic link" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    _unchanged(tmp_path, victim, dangling, victim_dir and not dangling)
    assert (out / name).is_symlink()  # the user's link is left as it was
    assert not (out / "checkpoint.pt").is_file() or name == "checkpoint.pt"  # nothing trained


@pytest.mark.full  # a real `cpuperf train` process (the refusal comes before any rank, so it is quick)
def test_a_linked_lock_through_a_real_process(tmp_path):
    out, victim = _setup(tmp_path, ".lock", dangling=False)
    proc = run_cli(["train", "--out", str(out), "--max-steps", "1"], process=True, timeout=120)
    assert proc.returncode == ExitCode.FILESYSTEM, proc.stderr[-1500:]
    assert f"{out / '.lock'} is a symbolic link" in proc.stderr and victim.read_bytes() == VICTIM


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoint.pt"])
@pytest.mark.parametrize("dangling", [False, True])
def test_the_worker_claims_no_run_directory_with_a_link(tmp_path, name, dangling):
    """The worker's own claim (a user starting `python -m cpuperf.train.worker` itself): the same rule, the lock
    released after the refusal so the next run is not told the directory is busy."""
    out, victim = _setup(tmp_path, name, dangling)
    with pytest.raises(LinkRefused) as err:
        claim(str(out), resume=True, environ={})
    assert err.value.code == ExitCode.FILESYSTEM and str(out / name) in err.value.message
    _unchanged(tmp_path, victim, dangling)
    os.unlink(out / name)
    lock = claim(str(out), resume=True, environ={})  # taken again: the refused claim let go of it
    assert lock is not None
    lock.release()


def test_a_fresh_run_replaces_a_dangling_checkpoint_link_as_before(tmp_path):
    """Held: without --resume a checkpoint is never read, and it is replaced as a whole (atomic_writer), so a link
    there is no reason to refuse the run."""
    out, victim = _setup(tmp_path, "checkpoint.pt", dangling=True)
    lock = claim(str(out), resume=False, environ={})
    assert lock is not None
    lock.release()
    assert not victim.exists()


@pytest.mark.parametrize("kind", ["link-to-file", "dangling", "fifo"])
def test_the_lock_file_is_never_opened_through_a_link_or_a_fifo(tmp_path, kind):
    victim = tmp_path / "victim"
    out = tmp_path / "out"
    out.mkdir()
    if kind == "link-to-file":
        victim.write_bytes(VICTIM)
        (out / ".lock").symlink_to(victim)
    elif kind == "dangling":
        (out / ".lock").symlink_to(victim)
    else:
        os.mkfifo(out / ".lock")
    with pytest.raises(FilesystemError) as err:
        acquire_dir_lock(out)
    assert str(out / ".lock") in err.value.message and err.value.code == ExitCode.FILESYSTEM
    if kind == "link-to-file":
        assert victim.read_bytes() == VICTIM
    else:
        assert not victim.exists()


def test_ensure_dir_and_append_refuse_links_and_keep_real_files(tmp_path):
    real = tmp_path / "logs"
    ensure_dir(real)
    ensure_dir(real)  # there already: fine
    fd = append_nofollow(real / "rank0.log")
    os.write(fd, b"one\n")
    os.close(fd)
    fd = append_nofollow(real / "rank0.log")  # appended, never truncated
    os.write(fd, b"two\n")
    os.close(fd)
    assert (real / "rank0.log").read_bytes() == b"one\ntwo\n"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LinkRefused):
        ensure_dir(tmp_path / "linked")
    (real / "rank1.log").symlink_to(tmp_path / "elsewhere" / "made")
    with pytest.raises(LinkRefused):
        append_nofollow(real / "rank1.log")
    assert os.listdir(tmp_path / "elsewhere") == []


@pytest.mark.parametrize("name,var", [("rank0.log", "CPUPERF_RANK_LOGDIR"), ("rank0.pid", "CPUPERF_RANK_LOGDIR"),
                                      ("rank0.pid", "CPUPERF_RANK_PIDDIR"), ("", "CPUPERF_RANK_LOGDIR")])
def test_a_rank_never_writes_through_a_link(tmp_path, name, var):
    """rankexec, as a launcher starts it: a link where its pid file or log goes (or logs/ itself a link) ends the
    rank with exit 10 and the link named on its stderr; the command never runs, the victim keeps its bytes."""
    logs = tmp_path / "logs"
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    if name:
        logs.mkdir()
        (logs / name).symlink_to(victim)
        linked = logs / name
    else:
        (tmp_path / "vdir").mkdir()
        logs.symlink_to(tmp_path / "vdir")
        linked = logs
    marker = tmp_path / "ran"
    env = cli_env({var: str(logs), "LOCAL_RANK": "0", "RANK": "0"})
    proc = subprocess.run([sys.executable, "-m", "cpuperf.run.rankexec", "--", sys.executable, "-c",
                           f"open({str(marker)!r}, 'w').close()"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == ExitCode.FILESYSTEM, proc.stderr
    assert f"{linked} is a symbolic link" in proc.stderr
    assert victim.read_bytes() == VICTIM and not marker.exists()
    if not name:
        assert os.listdir(tmp_path / "vdir") == []


def test_a_rank_writes_its_log_and_pid_into_a_real_directory(tmp_path):
    """The ordinary case still holds: the log appended, the pid recorded, the command run."""
    logs = tmp_path / "logs"
    env = cli_env({"CPUPERF_RANK_LOGDIR": str(logs), "LOCAL_RANK": "0", "RANK": "0"})
    for word in ("first", "second"):
        proc = subprocess.run([sys.executable, "-m", "cpuperf.run.rankexec", "--", sys.executable, "-c",
                               f"print({word!r})"], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert (logs / "rank0.log").read_text() == "first\nsecond\n"
    assert (logs / "rank0.pid").read_text().strip().isdigit()
