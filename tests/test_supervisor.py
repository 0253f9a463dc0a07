"""cpuperf's own process costs nothing measurable while the job runs (issue 23, item 5).

Real jobs of several seconds (a user script that computes for a fixed time) under `cpuperf train --auto`:
run directly, under the user's own torchrun, and under cpuperf's torchrun with per-rank pid files. The
supervisor's CPU time (all its threads, from the child's start to its exit) is in train's --json.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from cli_util import run_cli

pytest.importorskip("torch")

PY = sys.executable
COMPUTE_S = 6.0

# The bound: 0.5% of one core. Measured on a busy 2-core host (load 5-10): 0.02-0.06% here, and
# 4.8-6.1% with the old supervisor, which parsed each rank's /proc/PID/maps 20 times a second.
MAX_SHARE = 0.005

SCRIPT = '''
import sys, time
import torch
torch.manual_seed(0)
a = torch.randn(192, 192)
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    a = torch.tanh(a @ a)
    n += 1
print("iterations", n, flush=True)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
'''


def _script(tmp_path):
    path = tmp_path / "compute.py"
    path.write_text(SCRIPT)
    return str(path)


def _train(tmp_path, cpuperf_args, user_argv, expect_rc=0):
    proc = run_cli(["train", "--auto", "--json", "--out", str(tmp_path / "run"), *cpuperf_args, "--", *user_argv],
                   timeout=300, extra_env={"PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")})
    assert proc.returncode == expect_rc, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return json.loads(proc.stdout)


@pytest.mark.full  # real runs
@pytest.mark.parametrize("how", ["direct", "user_torchrun", "cpuperf_torchrun"])
def test_supervisor_uses_a_negligible_share_of_a_core(tmp_path, how):
    script = _script(tmp_path)
    if how == "direct":
        args, argv = [], [PY, script, str(COMPUTE_S)]
    elif how == "user_torchrun":
        args, argv = [], [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script,
                          str(COMPUTE_S)]
    else:
        args, argv = ["--nproc-per-node", "2"], [PY, script, str(COMPUTE_S)]
    data = _train(tmp_path, args, argv)
    sup = data["supervisor"]
    assert sup["wall_s"] >= COMPUTE_S, sup
    assert sup["cpu_share"] == pytest.approx(sup["cpu_s"] / sup["wall_s"], abs=1e-4)
    assert sup["cpu_share"] <= MAX_SHARE, sup
    # the watcher still saw what each rank ran with, though it looked only a few times
    ranks = data["verification"]["ranks"]
    assert ranks and all(r["openmp"] for r in ranks), ranks
    if how == "cpuperf_torchrun":
        plan = {r["local_rank"]: r for r in data["launch"]["per_rank"]}
        assert {r["rank"] for r in ranks} == {0, 1}
        for seen in ranks:
            assert seen["allowed_cpus"] == plan[seen["rank"]]["cpus"]
            assert seen["omp_num_threads"] == str(plan[seen["rank"]]["threads"])


@pytest.mark.full  # a real run
def test_a_failed_run_reports_the_supervisor_too(tmp_path):
    data = _train(tmp_path, ["--nproc-per-node", "2"], [PY, _script(tmp_path), "0.5", "3"], expect_rc=3)
    assert "rank" in data["error"]["message"]
    sup = data["supervisor"]
    assert sup["wall_s"] > 0 and 0 <= sup["cpu_s"] and sup["cpu_share"] <= 1


# -- the watcher itself, on real processes -------------------------------------------------------------

def _plan(log_dir, nproc):
    from cpuperf.plan.launch import LaunchPlan, RankSpec

    return LaunchPlan(launcher="torchrun", flavour="torchrun", argv=("true",), env={}, env_reasons={},
                      per_rank=tuple(RankSpec(i, (), None) for i in range(nproc)), nproc_per_node=nproc, nnodes=1,
                      node_rank=0, hosts=(), master_addr=None, master_port=None, affinity=None,
                      log_dir=str(log_dir), rank_command=("true",))


@pytest.mark.parametrize("pidfds", [True, False])
def test_the_first_rank_to_die_is_known_and_the_log_is_echoed(tmp_path, pidfds):
    import io
    import signal
    import subprocess
    import time

    from cpuperf.run.watch import Watch

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text("from an earlier run\n")  # appended to: only this run's lines are echoed
    echo = io.StringIO()
    ranks = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    watch = Watch(_plan(logs, 3), None, echo, pidfds=pidfds)
    watch.start()
    try:
        for i, p in enumerate(ranks):
            (logs / f"rank{i}.pid").write_text(f"{p.pid}\n")
        with open(logs / "rank0.log", "a") as fh:
            fh.write("step 1\n")
        deadline = time.monotonic() + 10
        while len(watch.ranks) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(watch.ranks) == 3
        assert all((r.fd is not None) == pidfds for r in watch.ranks.values())
        ranks[2].send_signal(signal.SIGKILL)
        ranks[2].wait()  # reaped: a child of ours, like torchrun's ranks are torchrun's
        time.sleep(0.6)  # more than one fallback poll
        ranks[0].kill()
        ranks[0].wait()
    finally:
        for p in ranks:
            p.kill()
            p.wait()
        watch.finish()
    assert not watch.is_alive()
    assert watch.died_first == [2]
    assert all(r.dead for r in watch.ranks.values())
    assert echo.getvalue() == "step 1\n"


@pytest.mark.full  # a real run, its grace period
def test_a_job_that_ignores_sigterm_is_killed_when_the_grace_period_ends(tmp_path):
    """The main thread blocks in waitpid; the grace period is a timer that SIGKILLs the child's group."""
    import signal
    import subprocess
    import time

    from cli_util import cli_env

    from cpuperf.run.launcher import STOP_GRACE_S

    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "print('ready', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([PY, "-m", "cpuperf", "train", "--json", "--out", str(tmp_path / "run"), "--", PY,
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "ready" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()  # the script's stdout goes to cpuperf's stderr under --json
        assert "ready" in line
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=STOP_GRACE_S + 60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143  # SIGTERM: 128 + 15, as docs/exit-codes.md says
    assert STOP_GRACE_S - 1 <= took <= STOP_GRACE_S + 30, took
    data = json.loads(stdout)
    assert data["error"]["name"] == "terminated" and data["supervisor"]["wall_s"] >= STOP_GRACE_S - 1
