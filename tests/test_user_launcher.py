"""A user's own launcher under `cpuperf train --auto -- LAUNCHER ... script.py` (issue 23): the rank count is read
from the launcher's own arguments in every spelling, each rank gets disjoint cores and OMP_NUM_THREADS equal to
its share (read from inside the rank), and where cpuperf cannot place the ranks safely it leaves them alone."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from cli_util import run_cli
from command_util import split_launcher

from cpuperf.decide.placement import usable_cores
from cpuperf.plan.user_launcher import launcher_ranks, with_rank_step
from cpuperf.probe import probe_host

SCRIPT = str(Path(__file__).parent / "fixtures" / "scripts" / "rank_report.py")
PY = sys.executable
BIN = os.path.dirname(PY)


def _ranks(argv, cores=8, cpus=8, **kw):
    cmd = split_launcher(argv)
    assert cmd is not None
    return launcher_ranks(cmd, logical_cpus=cpus, physical_cores=cores, interpreter=PY, **kw)


# -- pure: the count in every spelling ------------------------------------------------------------------

@pytest.mark.parametrize("argv, count", [
    (["torchrun", "--nproc-per-node", "3", "t.py"], 3),
    (["torchrun", "--nproc_per_node=4", "--standalone", "t.py", "--lr", "1"], 4),
    (["/venv/bin/torchrun", "--nnodes", "1", "--nproc-per-node=2", "-m", "pkg.train"], 2),
    (["torchrun", "t.py"], 1),  # torchrun's default
    (["torchrun", "--nproc-per-node", "cpu", "t.py"], 8),  # os.cpu_count()
    (["torchrun", "--nproc-per-node=auto", "t.py"], 8),  # no GPU: os.cpu_count()
    (["python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"], 2),
    (["python", "-u", "-m", "torch.distributed.launch", "--nproc-per-node=2", "t.py"], 2),
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "t.py"], 2),
    (["accelerate", "launch", "--multi-gpu", "--num-processes=3", "--mixed_precision", "no", "t.py"], 3),
    (["accelerate", "launch", "--num_processes", "2", "t.py"], 1),  # no --multi_gpu: one process
    (["mpirun", "-np", "2", "python", "t.py"], 2),
    (["mpirun", "-n", "3", "--allow-run-as-root", "python", "t.py"], 3),
    (["mpirun", "--np", "2", "-x", "FOO=1", "python", "t.py"], 2),
    (["mpiexec", "-c", "2", "python", "t.py"], 2),
    (["mpirun", "--n=4", "python", "t.py"], 4),
    (["mpiexec.hydra", "-n", "4", "-ppn", "2", "python", "t.py"], 2),  # per node wins
    (["mpirun", "-N", "2", "--mca", "btl", "self,tcp", "python", "t.py"], 2),
    (["mpirun", "python", "t.py"], 8),  # Open MPI: one rank per core
])
def test_the_rank_count_comes_from_the_launchers_own_arguments(argv, count):
    ranks = _ranks(argv)
    assert ranks.count == count and ranks.place, ranks


@pytest.mark.parametrize("argv, count, nodes", [
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"], 2, 2),
    (["torchrun", "--nnodes=1:4", "--nproc-per-node", "1", "t.py"], 1, 4),
    # --num_processes is the job's: each of --num_machines starts its share (accelerate's prepare_multi_gpu_env)
    (["accelerate", "launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "4", "t.py"], 2, 2),
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "4", "t.py"], 4, 1),
])
def test_a_launcher_across_nodes_counts_this_nodes_ranks_and_the_nodes(argv, count, nodes):
    ranks = _ranks(argv)
    assert (ranks.count, ranks.nodes) == (count, nodes), ranks
    assert ranks.place == (nodes == 1), ranks  # the job's other nodes run without cpuperf: placement is theirs


@pytest.mark.parametrize("argv, why", [
    (["mpirun", "-np", "2", "--bind-to", "core", "python", "t.py"], "binds the ranks itself"),
    (["mpirun", "-np", "2", "--host", "a,b", "python", "t.py"], "names hosts"),
    (["mpirun", "-np", "2", "-hostfile", "h", "python", "t.py"], "names hosts"),
    (["torchrun", "--nproc-per-node", "2", "--numa-binding", "node", "t.py"], "binds the ranks itself"),
    (["mpirun", "--oversubscribe", "-np", "12", "python", "t.py"], "12 ranks on 8 usable physical core(s)"),
    (["taskset", "-c", "1", "torchrun", "--nproc-per-node", "2", "t.py"], "`taskset -c 1` in front of torchrun"),
    (["numactl", "--physcpubind=0-3", "torchrun", "--nproc-per-node", "2", "t.py"], "numactl --physcpubind=0-3"),
    (["env", "-i", "PATH=/bin", "torchrun", "--nproc-per-node", "2", "t.py"], "clears the environment"),
    (["mpirun", "-np", "2", "--weird-new-option", "python", "t.py"], "lacks --weird-new-option"),
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"], "spans several nodes"),
    (["accelerate", "launch", "--config_file", "c.yaml", "t.py"], "config file"),
    (["accelerate", "launch", "--multi_gpu", "t.py"], "--num_processes"),
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_cpu_threads_per_process", "3", "t.py"],
     "you set --num_cpu_threads_per_process 3"),
    (["srun", "-n", "2", "python", "t.py"], "srun places the tasks"),
])
def test_where_cpuperf_cannot_place_it_leaves_placement_to_the_launcher_and_says_why(argv, why):
    ranks = _ranks(argv)
    assert not ranks.place and why in ranks.why and "left to the launcher" in ranks.why, ranks


def test_binding_from_the_environment_is_the_users_too():
    ranks = _ranks(["mpirun", "-np", "2", "python", "t.py"], environ={"I_MPI_PIN_DOMAIN": "core"})
    assert not ranks.place and "I_MPI_PIN_DOMAIN" in ranks.why


def test_an_accelerate_default_config_is_not_guessed():
    ranks = _ranks(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "t.py"], has_default_config=True)
    assert not ranks.place and ranks.count is None


@pytest.mark.parametrize("argv, expected", [
    (["torchrun", "--nproc-per-node=2", "t.py", "--x"],
     ["torchrun", "--nproc-per-node=2", "--no-python", "STEP", PY, "-u", "t.py", "--x"]),
    (["torchrun", "--nproc-per-node", "2", "-m", "pkg.train", "--x"],
     ["torchrun", "--nproc-per-node", "2", "--no-python", "STEP", PY, "-u", "-m", "pkg.train", "--x"]),
    (["torchrun", "--no_python", "--nproc-per-node", "2", "./prog", "a"],
     ["torchrun", "--nproc-per-node", "2", "--no-python", "STEP", "./prog", "a"]),
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "t.py"],
     ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--no_python", "STEP", PY, "-u", "t.py"]),
    (["mpirun", "-np", "2", "python", "-u", "t.py"], ["mpirun", "-np", "2", "STEP", "python", "-u", "t.py"]),
])
def test_the_per_rank_step_runs_exactly_what_the_launcher_would_have_run(argv, expected):
    cmd = split_launcher(argv)
    step = ["/cpuperf/python", "-m", "cpuperf.run.rankexec", "--"]
    want = []
    for item in expected:
        want += step if item == "STEP" else [item]
    assert list(with_rank_step(cmd, "/cpuperf/python", PY)) == want


# -- real launchers, read from inside each rank -----------------------------------------------------------

def _cores():
    return len(usable_cores(probe_host()))


def _launch(tmp_path, launcher_argv, auto=True, extra=(), env=None):
    report = tmp_path / "ranks"
    report.mkdir(exist_ok=True)
    argv = ["train", *(["--auto"] if auto else []), "--out", str(tmp_path / "run"), *extra, "--json", "--",
            *launcher_argv]
    proc = run_cli(argv, extra_env={"RANK_REPORT_DIR": str(report), **(env or {})}, timeout=240)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    seen = [json.loads(p.read_text()) for p in sorted(report.glob("rank*.json"))]
    return json.loads(proc.stdout), seen


def _mpirun():
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("no mpirun (apt-get install openmpi-bin)")
    return [path, *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]


SPELLINGS = {
    "torchrun": lambda n: [os.path.join(BIN, "torchrun"), "--nproc-per-node", str(n), SCRIPT],
    "torchrun=": lambda n: [os.path.join(BIN, "torchrun"), f"--nproc_per_node={n}", "--standalone", SCRIPT],
    "torch.distributed.run": lambda n: [PY, "-m", "torch.distributed.run", f"--nproc-per-node={n}", SCRIPT],
    "accelerate": lambda n: [os.path.join(BIN, "accelerate"), "launch", "--multi_gpu", "--num_processes", str(n),
                             "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT],
    "mpirun -np": lambda n: [*_mpirun(), "-np", str(n), PY, SCRIPT],
    "mpirun -n": lambda n: [*_mpirun(), "-n", str(n), PY, SCRIPT],
}


@pytest.mark.full  # real launchers and ranks
@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_each_rank_gets_its_own_cores_and_threads_equal_to_its_share(tmp_path, spelling, monkeypatch):
    if spelling == "accelerate":
        pytest.importorskip("accelerate")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no default accelerate config of the machine's
    cores = _cores()
    if cores < 2:
        pytest.skip("needs 2 usable cores")
    n = 2
    result, seen = _launch(tmp_path, SPELLINGS[spelling](n))
    assert len(seen) == n, seen
    cpu_sets = [set(r["cpus"]) for r in seen]
    assert not cpu_sets[0] & cpu_sets[1]  # disjoint
    threads = [int(r["omp_num_threads"]) for r in seen]
    assert all(t == len(c) for t, c in zip(threads, cpu_sets)) and all(t >= 1 for t in threads)
    assert sum(threads) <= cores
    applied = result["applied"]
    assert applied["placement"]["placed_by_cpuperf"] and applied["placement"]["ranks"] == n
    planned = {r["local_rank"]: set(r["cpus"]) for r in applied["ranks"]}
    assert {r["local_rank"]: set(r["cpus"]) for r in seen} == planned  # what the plan said is what ran
    assert "from your launcher" in next(d["reason"] for d in result["decisions"] if d["id"] == "nproc_per_node") \
        or applied["placement"]["from"]


VM = {"CPUPERF_OVERRIDE_HYPERVISOR": "1"}


@pytest.mark.full  # real ranks
def test_on_a_virtual_machine_ranks_on_one_numa_node_get_their_threads_but_keep_every_cpu(tmp_path):
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    result, seen = _launch(tmp_path, SPELLINGS["torchrun"](2), env=VM)
    assert len(seen) == 2
    everything = set(_usable())
    assert all(set(r["cpus"]) == everything for r in seen), seen  # unpinned: the scheduler may move them
    assert [r["omp_num_threads"] for r in seen] == ["1", "1"]  # each its share of the 2 cores
    affinity = next(d for d in result["decisions"] if d["id"] == "affinity")
    assert affinity["value"] is None and "virtual machine" in affinity["reason"]
    applied = result["applied"]
    assert applied["placement"]["placed_by_cpuperf"] and all(r["cpus"] is None for r in applied["ranks"])
    assert "CPUs left as your launcher sets them" in applied["placement"]["why"]


@pytest.mark.full  # real ranks
def test_on_a_virtual_machine_affinity_auto_pins_the_ranks_anyway(tmp_path):
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    result, seen = _launch(tmp_path, SPELLINGS["torchrun"](2), extra=("--set", "affinity=auto"), env=VM)
    cpu_sets = [set(r["cpus"]) for r in seen]
    assert len(cpu_sets) == 2 and not cpu_sets[0] & cpu_sets[1]


def _usable():
    return probe_host().usable_cpus()


def test_more_ranks_than_cores_are_refused_unless_oversubscribing_is_allowed(tmp_path):
    cores = _cores()
    proc = run_cli(["train", "--auto", "--dry-run", "--", *SPELLINGS["torchrun"](cores + 1)])
    assert proc.returncode == 2 and f"this host has {cores} usable core(s)" in proc.stderr, proc.stderr


@pytest.mark.full  # real ranks
def test_more_ranks_than_cores_are_left_to_the_launcher(tmp_path):
    cores = _cores()
    n = cores + 1
    result, seen = _launch(tmp_path, SPELLINGS["torchrun"](n), extra=("--set", "oversubscribe=true"))
    assert len(seen) == n
    applied = result["applied"]
    assert not applied["placement"]["placed_by_cpuperf"] and "left to the launcher" in applied["placement"]["why"]
    assert "OMP_NUM_THREADS" not in applied["env"]
    everything = set(seen[0]["cpus"])
    assert all(set(r["cpus"]) == everything for r in seen)  # nobody pinned them
    assert {r["omp_num_threads"] for r in seen} == {"1"}  # torchrun's own default stands


def test_dry_run_shows_each_ranks_cpus_and_says_the_count_came_from_the_launcher(tmp_path):
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    proc = run_cli(["train", "--auto", "--dry-run", "--", *SPELLINGS["torchrun"](2)])
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "rank(s) from --nproc-per-node 2" in text and "from your launcher" in text
    assert "#   local rank 0: CPUs" in text and "#   local rank 1: CPUs" in text
    assert "unpinned" not in text  # one placement, stated once
    assert "applied: rank 1: CPUs" in text


@pytest.mark.full  # a real rank
def test_a_single_process_plan_equal_to_torchs_defaults_changes_nothing_but_says_so(tmp_path):
    """One rank: pinned to the usable cores with one thread per core, which is what torch does anyway."""
    result, seen = _launch(tmp_path, [PY, SCRIPT])
    assert len(seen) == 1
    assert set(seen[0]["cpus"]) >= {c.cpus[0] for c in usable_cores(probe_host())}
    assert result["applied"]["threads"] == len(usable_cores(probe_host()))


def test_an_oversubscribed_mpirun_is_planned_for_the_ranks_it_starts(tmp_path):
    """mpirun --oversubscribe -np 4 on fewer cores: every decision is made for 4 ranks, not 1 (issue 32)."""
    mpirun = _mpirun()
    n = _cores() * 2
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--", *mpirun, "--oversubscribe", "-np", str(n), PY,
                    SCRIPT])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    values = {d["id"]: d["value"] for d in result["decisions"]}
    assert values["nproc_per_node"] == n and values["ddp_backend"] == "gloo"
    assert values["threads_per_rank"] == 1  # shared cores: one thread per rank
    yours = result["launch"]["yours"]
    assert yours["ranks"] == n and yours["oversubscribed"] and not yours["placed_by_cpuperf"]
    assert "cpuperf.run.rankexec" in result["launch"]["argv"]  # every rank still dies with cpuperf


@pytest.mark.full  # real ranks
def test_a_users_own_thread_count_that_the_plan_keeps_is_what_every_rank_gets(tmp_path):
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    report = tmp_path / "ranks"
    report.mkdir()
    proc = run_cli(["train", "--auto", "--out", str(tmp_path / "run"), "--json", "--", *SPELLINGS["torchrun"](2)],
                   extra_env={"RANK_REPORT_DIR": str(report), "OMP_NUM_THREADS": "7"}, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads(p.read_text()) for p in sorted(report.glob("rank*.json"))]
    assert len(seen) == 2 and {r["omp_num_threads"] for r in seen} == {"7"}
    assert not set(seen[0]["cpus"]) & set(seen[1]["cpus"])  # still pinned apart
    result = json.loads(proc.stdout)
    text = json.dumps(result)
    assert "your OMP_NUM_THREADS=7 is kept: each rank runs 7 thread(s)" in text, text[-3000:]


# -- issue 41 item 6 / issue 42: the line's own variables and wrappers, seen from inside each rank -------------

@pytest.mark.full  # real mpirun ranks
def test_a_thread_count_on_the_mpirun_line_is_what_every_rank_runs_with(tmp_path):
    """`mpirun -np 2 -x OMP_NUM_THREADS=2 python x.py` ran each rank with 1 thread: the per-rank step overwrote it."""
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    result, seen = _launch(tmp_path, [*_mpirun(), "-np", "2", "-x", "OMP_NUM_THREADS=2", PY, SCRIPT],
                           env={"RANK_REPORT_TORCH": "1"})
    assert len(seen) == 2
    assert [r["omp_num_threads"] for r in seen] == ["2", "2"] and [r["torch_threads"] for r in seen] == [2, 2]
    text = json.dumps(result)
    assert "your OMP_NUM_THREADS=2 is kept" in text, text[-3000:]


@pytest.mark.full  # real mpirun ranks
def test_a_binding_variable_on_the_mpirun_line_reaches_the_ranks_and_cpuperf_places_nothing(tmp_path):
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    result, seen = _launch(tmp_path, [*_mpirun(), "-np", "2", "-x", "OMP_PROC_BIND=close", PY, SCRIPT])
    # Each rank runs where Open MPI itself puts it (its default binds 2 ranks to a core each), with the user's
    # binding and no thread count of cpuperf's.
    assert [(r["omp_proc_bind"], r["omp_num_threads"]) for r in seen] == [("close", None)] * 2
    assert result["launch"]["yours"]["placed_by_cpuperf"] is False
    assert "OMP_NUM_THREADS" not in result["launch"]["env"]
    assert "your launcher line binds the ranks itself (-x OMP_PROC_BIND=close)" in result["launch"]["yours"]["why"]


@pytest.mark.parametrize("wrap", [["timeout", "600"], ["bash", "-c"]])
def test_a_launcher_behind_timeout_or_a_shell_line_gets_its_ranks_placed(tmp_path, wrap):
    """`timeout 600 torchrun --nproc-per-node 2 x.py` was planned as one process: 2 ranks with the threads of one."""
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    line = SPELLINGS["torchrun"](2)
    argv = [*wrap, shlex.join(line)] if wrap[0] == "bash" else [*wrap, *line]
    result, seen = _launch(tmp_path, argv)
    assert len(seen) == 2
    assert result["launch"]["yours"]["ranks"] == 2 and result["launch"]["yours"]["placed_by_cpuperf"]
    threads = [int(r["omp_num_threads"]) for r in seen]
    assert sum(threads) <= _cores() and all(t >= 1 for t in threads)  # each its share, not the whole host


def test_a_launcher_hidden_in_a_shell_line_is_left_alone_and_the_plan_says_so(tmp_path):
    if _cores() < 2:
        pytest.skip("needs 2 usable cores")
    line = f"cd {shlex.quote(str(tmp_path))} && {shlex.join(SPELLINGS['torchrun'](2))}"
    result, seen = _launch(tmp_path, ["sh", "-c", line])
    assert len(seen) == 2
    everything = set(_usable())
    assert all(set(r["cpus"]) == everything for r in seen)  # nothing pinned by cpuperf
    assert [r["omp_num_threads"] for r in seen] == ["1", "1"]  # torchrun's own default for several workers
    yours = result["launch"]["yours"]
    assert yours["ranks"] is None and not yours["placed_by_cpuperf"]
    assert "does not read through" in yours["why"] and "placement is left to the launcher" in yours["why"]
    assert "cpuperf.run.rankexec" not in " ".join(result["launch"]["argv"])


# -- a launcher behind env, nice or taskset: the script's plan knows it is the launcher's --------------------

@pytest.mark.parametrize("wrap", [["env", "FOO=1"], ["nice", "-n", "5"]])
def test_a_launcher_behind_a_wrapper_is_the_users_launcher_in_the_applied_list(tmp_path, wrap):
    """`env FOO=1 torchrun --nproc-per-node 2 x.py`: the applied list said "launcher direct" and "1 thread(s) per
    process", as for one process, while the launch placed two ranks; the script's parse read torchrun only in front."""
    from command_util import parse_command
    from hosts import make_host

    cmd = parse_command([*wrap, "torchrun", "--nproc-per-node", "2", "t.py", "--lr", "1"])
    assert (cmd.launcher, cmd.nproc, cmd.script, cmd.script_args) == ("torchrun", 2, "t.py", ("--lr", "1"))
    assert cmd.rewrap([*cmd.argv, "--bf16"]) == (*wrap, "torchrun", "--nproc-per-node", "2", "t.py", "--lr", "1",
                                                  "--bf16")
    root = make_host(tmp_path / "host", cores_per_socket=4)
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(root), "--", *wrap, "torchrun",
                    "--nproc-per-node", "2", SCRIPT])
    assert proc.returncode == 0, proc.stderr[-2000:]
    applied = json.loads(proc.stdout)["applied"]
    assert applied["launcher"]["yours"] == "torchrun", applied["launcher"]
    assert [r["threads"] for r in applied["ranks"]] == [2, 2]


def test_a_thread_count_of_yours_that_crowds_the_cores_is_kept_and_the_plan_says_what_fits(tmp_path):
    """`env OMP_NUM_THREADS=4 torchrun --nproc-per-node 2` on 2 cores: 8 compute threads take turns on 2 cores.
    The count stays the user's; the plan says so, and the lever report names their value, not 'not carried'."""
    from hosts import make_host

    root = make_host(tmp_path / "host", cores_per_socket=2)

    def plan(threads, env=None):
        argv = ["train", "--auto", "--dry-run", "--json", "--sysroot", str(root), "--"]
        line = ["torchrun", "--nproc-per-node", "2", SCRIPT]
        proc = run_cli([*argv, *(["env", f"OMP_NUM_THREADS={threads}"] if env is None else []), *line],
                       extra_env=env or {})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    for result in (plan(4), plan(4, env={"OMP_NUM_THREADS": "4"})):
        assert result["launch"]["env"]["OMP_NUM_THREADS"] == "4"  # theirs, kept
        notes = " ".join(result["launch"]["notes"])
        assert "OMP_NUM_THREADS=4 x 2 rank(s) = 8 compute threads on 2 physical core(s)" in notes, notes
        assert "OMP_NUM_THREADS=1 (cpuperf's plan)" in notes
        threads = [lv for lv in result["levers"]["not_applied"] if lv["id"] == "threads_per_rank"]
        assert threads and "your OMP_NUM_THREADS=4" in str(threads[0]), result["levers"]
    fits = plan(1)
    assert not any("compute threads on" in n for n in fits["launch"]["notes"])


def test_on_a_gpu_host_your_launchers_count_is_the_plans(tmp_path):
    """`torchrun --nproc-per-node 1` on a host with 2 GPUs starts one rank: the plan said 2 ("one rank per visible
    GPU"), reported "your torchrun starts 2 rank(s)", laid out 2 rank slots and added --ddp_backend nccl."""
    from hosts import make_host

    root = make_host(tmp_path / "host", cores_per_socket=8)
    gpus = (Path(__file__).parent / "fixtures" / "gpus" / "h100-80gb-hbm3.json").read_text()
    env = {"CPUPERF_OVERRIDE_GPUS": gpus,
           "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cu128", "transformers": "4.57.0"})}
    trainer = str(Path(__file__).parent / "fixtures" / "scripts" / "hf_parser.py")
    for count in (1, 2):
        proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(root), "--", "torchrun",
                        "--nproc-per-node", str(count), trainer], extra_env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        plan = json.loads(proc.stdout)
        decided = {d["id"]: d for d in plan["decisions"]}
        assert decided["device"]["value"] == "cuda"
        assert decided["nproc_per_node"]["value"] == count, decided["nproc_per_node"]
        assert len(plan["launch"]["per_rank"]) == count
        applied = {i["id"]: i["how"] for i in plan["levers"]["applied"]}
        assert applied["nproc_per_node"] == f"your torchrun starts {count} rank(s) per node"
        assert ("--ddp_backend" in plan["launch"]["argv"]) == (count > 1), plan["launch"]["argv"]


def test_the_gpus_your_command_sees_are_the_ones_planned_for(tmp_path):
    """`env CUDA_VISIBLE_DEVICES=0 python x.py` on a host with 2 GPUs: cpuperf planned 2 ranks from the GPUs
    it saw itself, and its torchrun would have started both on GPU 0. The command's own assignments count."""
    from hosts import make_host

    root = make_host(tmp_path / "host", cores_per_socket=8)
    gpus = (Path(__file__).parent / "fixtures" / "gpus" / "h100-80gb-hbm3.json").read_text()
    env = {"CPUPERF_OVERRIDE_GPUS": gpus, "CPUPERF_OVERRIDE_PACKAGES": json.dumps({"torch": "2.13.0+cu128"})}
    trainer = str(Path(__file__).parent / "fixtures" / "scripts" / "hf_parser.py")

    def plan(*command):
        return run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(root), "--", *command],
                       extra_env=env)

    for command, ranks, device in ((["python", trainer], 2, "cuda"),
                                   (["env", "CUDA_VISIBLE_DEVICES=1", "python", trainer], 1, "cuda"),
                                   (["bash", "-c", f"CUDA_VISIBLE_DEVICES=0 exec python {trainer}"], 1, "cuda"),
                                   (["env", "CUDA_VISIBLE_DEVICES=", "python", trainer], 1, "cpu")):
        proc = plan(*command)
        assert proc.returncode == 0, proc.stderr[-2000:]
        decided = {d["id"]: d["value"] for d in json.loads(proc.stdout)["decisions"]}
        assert (decided["nproc_per_node"], decided["device"]) == (ranks, device), (command, decided)
    refused = plan("env", "CUDA_VISIBLE_DEVICES=0", "torchrun", "--nproc-per-node", "2", trainer)
    assert refused.returncode == 2 and "2 rank(s) from your launcher: --nproc-per-node 2 but 1 GPU(s)" in \
        refused.stderr, refused.stderr


def test_the_environment_of_a_command_follows_env_as_env_does():
    from command_util import command_environ

    here = {"CUDA_VISIBLE_DEVICES": "0", "A": "1"}
    assert command_environ(["python", "x.py"], here) == here
    assert command_environ(["env", "-u", "CUDA_VISIBLE_DEVICES", "python", "x.py"], here) == {"A": "1"}
    assert command_environ(["env", "--unset=A", "B=2", "torchrun", "x.py"], here) == {"CUDA_VISIBLE_DEVICES": "0",
                                                                                    "B": "2"}
    assert command_environ(["env", "-i", "B=2", "python", "x.py"], here) == {"B": "2"}
    assert command_environ(["nice", "-n", "5", "env", "CUDA_VISIBLE_DEVICES=1", "python", "x.py"], here)[
        "CUDA_VISIBLE_DEVICES"] == "1"
    assert command_environ(["sh", "-c", "CUDA_VISIBLE_DEVICES= exec python x.py"], here)["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("nnodes, nodes", [("2", 2), ("1:3", 3)])
def test_your_torchrun_across_nodes_is_planned_as_a_job_of_several_ranks(tmp_path, nnodes, nodes):
    """`torchrun --nnodes 2 --nproc-per-node 1` starts one rank here and one on another node: a process group of
    2. The plan said "nnodes=1 applied", "ddp_backend none: one rank", and preloaded an allocator the tuning
    table keeps out of jobs of several ranks. Its own rendezvous stands: cpuperf asks for no address."""
    from hosts import make_host

    root = make_host(tmp_path / "host", cores_per_socket=4)
    trainer = str(Path(__file__).parent / "fixtures" / "scripts" / "hf_parser.py")
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(root), "--", "torchrun", "--nnodes",
                    nnodes, "--nproc-per-node", "1", "--rdzv-endpoint", "node1:29500", trainer])
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    decided = {d["id"]: d["value"] for d in plan["decisions"]}
    assert decided["nnodes"] == nodes and decided["nproc_per_node"] == 1 and decided["ddp_backend"] is not None
    applied = {i["id"]: i["how"] for i in plan["levers"]["applied"]}
    assert applied["nnodes"] == f"the launch spans {nodes} node(s)"
    assert "--ddp_backend" in plan["launch"]["argv"]
    assert not any(k in plan["launch"]["env"] for k in ("MASTER_ADDR", "MASTER_PORT"))  # torchrun's rendezvous
