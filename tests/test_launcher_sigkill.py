"""No rank outlives cpuperf, whoever places the ranks (issue 32): `cpuperf train -- LAUNCHER ...` is killed with
SIGKILL while its ranks run, and within a few seconds no process of the job is left. Real launchers (torchrun,
Open MPI's mpirun), real processes; the ranks record their pids from inside."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_util import cli_env

SCRIPT = str(Path(__file__).parent / "fixtures" / "scripts" / "rank_sleep.py")
PY = sys.executable
BIN = os.path.dirname(PY)


def _mpirun():
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("no mpirun (apt-get install openmpi-bin)")
    return [path, *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]


def _accelerate():
    pytest.importorskip("accelerate")
    return [os.path.join(BIN, "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT]


SPELLINGS = {
    "torchrun": lambda: [os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", SCRIPT],
    "python -m torch.distributed.run": lambda: [PY, "-m", "torch.distributed.run", "--nproc_per_node=2", SCRIPT],
    "accelerate launch": _accelerate,
    "mpirun -np 2": lambda: [*_mpirun(), "-np", "2", PY, SCRIPT],
    "mpirun --oversubscribe -np 4": lambda: [*_mpirun(), "--oversubscribe", "-np", "4", PY, SCRIPT],
    "mpirun --bind-to core -np 2": lambda: [*_mpirun(), "--bind-to", "core", "-np", "2", PY, SCRIPT],
    # wrappers cpuperf reads through: the launcher in a session of its own, behind a timeout, inside a shell line
    "setsid torchrun": lambda: ["setsid", os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", SCRIPT],
    "timeout 600 torchrun": lambda: ["timeout", "600", os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", SCRIPT],
    "sh -c 'torchrun ...'": lambda: ["sh", "-c", shlex.join([os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", SCRIPT])],
}
EXPECTED = {"torchrun": 2, "python -m torch.distributed.run": 2, "accelerate launch": 2, "mpirun -np 2": 2,
            "mpirun --oversubscribe -np 4": 4, "mpirun --bind-to core -np 2": 2, "setsid torchrun": 2,
            "timeout 600 torchrun": 2, "sh -c 'torchrun ...'": 2}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _job(marker: str):
    """Every process whose environment carries this test's marker (the ranks, the launcher, its helpers)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(name))
            except OSError:
                pass
    return [p for p in found if _alive(p)]


@pytest.mark.full  # real launches, SIGKILL
@pytest.mark.parametrize("auto", [True, False], ids=["auto", "plain"])
@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_sigkill_of_cpuperf_leaves_no_rank_running(tmp_path, spelling, auto):
    if EXPECTED[spelling] == 2 and (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs")
    pids = tmp_path / "pids"
    pids.mkdir()
    marker = f"CPUPERF_TEST_JOB={tmp_path.name}"
    argv = [PY, "-m", "cpuperf", "train", *(["--auto"] if auto else []), "--out", str(tmp_path / "run"), "--",
            *SPELLINGS[spelling]()]
    env = cli_env({"RANK_PID_DIR": str(pids), "CPUPERF_TEST_JOB": tmp_path.name, "HF_HOME": str(tmp_path / "hf")})
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(pids)) < EXPECTED[spelling]:
            if proc.poll() is not None:
                pytest.fail(f"cpuperf ended first ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        ranks = [int(p) for p in os.listdir(pids)]
        assert all(_alive(p) for p in ranks)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        deadline = killed + 8
        while _job(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _job(marker)
        print(f"{spelling} ({'auto' if auto else 'plain'}): job gone {time.monotonic() - killed:.1f} s after SIGKILL")
        assert not left, f"still running after SIGKILL of cpuperf: {left} (ranks {ranks})"
    finally:
        for pid in _job(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()


@pytest.mark.full  # real launches, SIGKILL
def test_a_process_the_launcher_orphaned_in_a_session_of_its_own_is_ended_with_the_run(tmp_path):
    """The launcher exits and leaves a 'rank' behind in a new session (setsid): cpuperf train ends it."""
    pids = tmp_path / "pids"
    pids.mkdir()
    marker = f"CPUPERF_TEST_JOB={tmp_path.name}"
    orphan = f"setsid {PY} {SCRIPT} & while [ -z \"$(ls {pids})\" ]; do sleep 0.1; done"
    try:
        proc = subprocess.run([PY, "-m", "cpuperf", "train", "--out", str(tmp_path / "run"), "--", "sh", "-c", orphan],
                              env=cli_env({"RANK_PID_DIR": str(pids), "CPUPERF_TEST_JOB": tmp_path.name}),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        left = [int(p) for p in os.listdir(pids)]
        assert left and not [p for p in left if _alive(p)], "the orphan outlived the run"
    finally:
        for pid in _job(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.full  # a real run
def test_a_command_behind_setsid_is_the_run_not_a_fork_that_ends_it_at_once(tmp_path):
    """setsid(1) forks when it leads a process group and its parent exits 0 at once: started so, the run ended as it
    began and its job was ended with it. cpuperf runs the command as setsid's own process, in its own session."""
    code = "import os, sys, time; time.sleep(1); print('own session', os.getsid(0) == os.getpid()); sys.exit(3)"
    proc = subprocess.run([PY, "-m", "cpuperf", "train", "--out", str(tmp_path / "run"), "--", "setsid", PY, "-c", code],
                          env=cli_env({}), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]  # the command's own exit code, after its second of work
    assert "own session True" in proc.stdout

    forked = subprocess.run([PY, "-m", "cpuperf", "train", "--out", str(tmp_path / "run2"), "--", "setsid", "--fork", PY,
                             "-c", code], env=cli_env({}), capture_output=True, text=True, timeout=120)
    assert forked.returncode == 2 and "`setsid --fork` detaches your command from cpuperf" in forked.stderr, forked.stderr
    assert "own session" not in forked.stdout
    # --dry-run refuses it the same way, --json included: a plan that could not run is no plan.
    for extra in ([], ["--json"]):
        dry = subprocess.run([PY, "-m", "cpuperf", "train", "--dry-run", *extra, "--", "env", "A=1", "setsid", "-f", PY,
                              "-c", code], env=cli_env({}), capture_output=True, text=True, timeout=120)
        assert dry.returncode == 2 and "`setsid --fork`" in dry.stdout + dry.stderr, (dry.stdout, dry.stderr)
