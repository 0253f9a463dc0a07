"""Launcher lines read exactly as each launcher reads them (issue 32, the launchers.toml half of issue 35).

The table holds lines in the shape the launchers' own documentation gives them (torch's torchrun docs and
run.py docstring, accelerate's launch docs, Open MPI's mpirun(1), MPICH's Using_the_Hydra_Process_Manager,
Intel MPI's Global Hydra Options, Slurm's srun(1)), each with the rank count and the program that launcher
itself would start, on a host of 8 cores / 8 CPUs and no GPU. Pure and fast: nothing is started."""

from __future__ import annotations

import json
import shlex

import pytest
from cli_util import run_cli
from command_util import split_launcher

from cpuperf.data import load_builtin
from cpuperf.errors import UsageError
from cpuperf.plan.user_launcher import launcher_ranks, with_rank_step

PY = "/usr/bin/python3"

# (the line, the launcher, ranks it starts on this node, the program each rank runs)
LINES = [
    # torchrun / torch.distributed.run (torch docs "torchrun (Elastic Launch)", run.py docstring)
    ("torchrun --standalone --nnodes=1 --nproc-per-node=4 train.py --arg1 x", "torchrun", 4, "train.py --arg1 x"),
    ("torchrun --nnodes=2 --nproc-per-node=4 --max-restarts=3 --rdzv-id=7 --rdzv-backend=c10d "
     "--rdzv-endpoint=host:29400 train.py", "torchrun", 4, "train.py"),
    ("torchrun --nnodes=1:4 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=h:1 train.py", "torchrun", 2,
     "train.py"),
    ("torchrun --nproc-per-node 4 -m my.module --lr 1", "torchrun", 4, "my.module --lr 1"),
    ("torchrun --no-python --nproc-per-node=2 ./a.out -v", "torchrun", 2, "./a.out -v"),
    ("torchrun --standalone --nproc-per-node=auto train.py", "torchrun", 8, "train.py"),
    ("torchrun --nproc-per-node=cpu train.py", "torchrun", 8, "train.py"),
    ("torchrun --tee 3 --log-dir /tmp/logs --nproc-per-node 2 train.py", "torchrun", 2, "train.py"),
    ("torchrun -r 3 -t 3 --nproc_per_node 2 train.py", "torchrun", 2, "train.py"),
    ("torchrun --local-ranks-filter 0 --nproc-per-node 2 train.py --lr 0.1", "torchrun", 2, "train.py --lr 0.1"),
    ("torchrun --master-addr 127.0.0.1 --master-port 29501 --nproc-per-node 2 train.py", "torchrun", 2, "train.py"),
    ("torchrun --nproc-per 3 train.py", "torchrun", 3, "train.py"),  # argparse: a unique prefix
    ("torchrun train.py", "torchrun", 1, "train.py"),
    ("python -m torch.distributed.run --nproc-per-node=2 train.py", "torchrun", 2, "train.py"),
    ("python3 -X dev -m torch.distributed.run --nproc_per_node 2 train.py", "torchrun", 2, "train.py"),
    ("python -m torch.distributed.launch --nproc-per-node=2 --use-env train.py", "torchrun", 2, "train.py"),
    ("torchrun --nproc-per-node 2 -- train.py --nproc-per-node 9", "torchrun", 2, "train.py --nproc-per-node 9"),
    # accelerate launch (accelerate docs: "Launching your code", CLI reference)
    ("accelerate launch --multi_gpu --num_processes 2 train.py", "accelerate", 2, "train.py"),
    ("accelerate launch --cpu train.py", "accelerate", 1, "train.py"),
    ("accelerate launch --mixed_precision bf16 --num_processes 1 train.py", "accelerate", 1, "train.py"),
    ("accelerate launch --multi_gpu --mixed_precision=fp16 --num_processes=2 train.py --a 1", "accelerate", 2,
     "train.py --a 1"),
    ("accelerate launch -m my.module --arg", "accelerate", 1, "my.module --arg"),
    ("accelerate launch --multi-gpu --num-processes 4 --main_process_port 29501 train.py", "accelerate", 4,
     "train.py"),
    ("accelerate launch --num_processes 2 --num_machines 1 --multi_gpu --dynamo_backend no train.py", "accelerate",
     2, "train.py"),
    ("accelerate launch --no_python --multi_gpu --num_processes 2 ./prog a", "accelerate", 2, "./prog a"),
    ("accelerate launch --use_fsdp --fsdp_sharding_strategy FULL_SHARD --multi_gpu --num_processes 2 train.py",
     "accelerate", 2, "train.py"),
    # Open MPI mpirun(1) (4.1 and 5.0)
    ("mpirun -np 4 ./a.out", "mpirun", 4, "./a.out"),
    ("mpirun -n 4 --map-by ppr:2:package ./a.out", "mpirun", 4, "./a.out"),
    ("mpirun -N 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --oversubscribe -np 12 ./a.out", "mpirun", 12, "./a.out"),
    ("mpirun -x LD_LIBRARY_PATH -x FOO=bar -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --mca btl tcp,self -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --bind-to core --map-by core -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --report-bindings -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --tag-output --timestamp-output -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --merge-stderr-to-stdout --pernode ./a.out", "mpirun", 1, "./a.out"),
    ("mpirun --nolocal -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --use-hwthread-cpus -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("mpirun --allow-run-as-root -c 2 python t.py", "mpirun", 2, "python t.py"),
    ("mpirun -np 2 --display-map --noprefix python t.py", "mpirun", 2, "python t.py"),
    ("mpiexec -n 2 -s python t.py", "mpirun", 2, "python t.py"),
    ("mpirun --np=2 python -u t.py", "mpirun", 2, "python -u t.py"),
    ("mpirun -host a,b -np 4 ./a.out", "mpirun", 4, "./a.out"),
    ("mpirun ./a.out", "mpirun", 8, "./a.out"),  # one rank per core
    # MPICH hydra (Using_the_Hydra_Process_Manager), Intel MPI (Global Hydra Options)
    ("mpiexec -f hostfile -n 32 ./app", "mpirun", 32, "./app"),
    ("mpirun -genvall -np 4 python train.py", "mpirun", 4, "python train.py"),
    ("mpiexec.hydra -genv OMP_NUM_THREADS 4 -n 2 ./app", "mpirun", 2, "./app"),
    ("mpiexec.hydra -genv OMP_NUM_THREADS=4 -n 2 ./app", "mpirun", 2, "./app"),
    ("mpiexec -n 2 -ppn 1 ./app", "mpirun", 1, "./app"),
    ("mpiexec -bind-to core -n 2 ./app", "mpirun", 2, "./app"),
    ("mpiexec -l -n 2 ./app", "mpirun", 2, "./app"),
    ("mpiexec.hydra -print-rank-map -n 2 ./app", "mpirun", 2, "./app"),
    ("mpiexec -envall -n 2 -wdir /tmp ./app", "mpirun", 2, "./app"),
    ("mpiexec -prepend-rank -n 3 ./app arg", "mpirun", 3, "./app arg"),
    ("mpiexec.hydra -perhost 2 -n 4 ./app", "mpirun", 2, "./app"),
    ("mpiexec -n 2 -envlist PATH,HOME ./app", "mpirun", 2, "./app"),
    ("mpiexec.hydra -silent-abort -ordered-output -n 2 ./app", "mpirun", 2, "./app"),
    # srun(1)
    ("srun -n 2 ./app", "srun", 2, "./app"),
    ("srun -N1 -n4 -l ./app", "srun", 4, "./app"),
    ("srun --ntasks=2 --cpu-bind=cores python t.py", "srun", 2, "python t.py"),
    ("srun -lv -n2 ./app", "srun", 2, "./app"),
    ("srun --kill-on-bad-exit -n 2 ./app", "srun", 2, "./app"),
    ("srun --ntasks-per-node=2 --nodes=1 ./app", "srun", 2, "./app"),
    ("srun -K -n 2 ./app", "srun", 2, "./app"),
    ("srun --ntasks-per-n=2 ./app", "srun", 2, "./app"),  # getopt_long: a unique prefix
    # wrappers in front of the launcher
    ("env OMP_NUM_THREADS=2 torchrun --nproc-per-node 2 t.py", "torchrun", 2, "t.py"),
    ("nice -n 10 mpirun -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("nice -5 torchrun --nproc-per-node 2 t.py", "torchrun", 2, "t.py"),
    ("numactl --membind=0 torchrun --nproc-per-node 2 t.py", "torchrun", 2, "t.py"),
    ("chrt -f 10 mpirun -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("taskset 0x3 mpirun -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("taskset -c 1 torchrun --nproc-per-node=cpu t.py", "torchrun", 1, "t.py"),  # torch counts the CPUs it may use
    ("timeout 600 torchrun --nproc-per-node 2 t.py", "torchrun", 2, "t.py"),
    ("timeout -k 5 -s INT 1h mpirun -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("timeout --kill-after=5 --foreground 10m torchrun --nproc-per-node 3 t.py", "torchrun", 3, "t.py"),
    ("stdbuf -oL -eL mpirun -np 2 ./a.out", "mpirun", 2, "./a.out"),
    ("nohup setsid -w ionice -c 3 torchrun --nproc-per-node 2 t.py", "torchrun", 2, "t.py"),
    ("time -o t.txt torchrun --nproc-per-node 2 t.py", "torchrun", 2, "t.py"),
    ("bash -c 'torchrun --nproc-per-node 2 t.py --lr 1'", "torchrun", 2, "t.py --lr 1"),
    ("sh -c 'exec mpirun -np 2 python t.py'", "mpirun", 2, "python t.py"),
    ("bash -lc 'OMP_NUM_THREADS=1 exec torchrun --nproc-per-node 2 t.py' job", "torchrun", 2, "t.py"),
    ("timeout 600 nice -n 5 bash -c \"env A='x y' sh -c 'torchrun --nproc-per-node 2 t.py'\"", "torchrun", 2, "t.py"),
    ("dash -e -c 'python -m torch.distributed.run --nproc-per-node=2 t.py'", "torchrun", 2, "t.py"),
]


def _read(line: str, **kw):
    cmd = split_launcher(shlex.split(line))
    assert cmd is not None, line
    return cmd, launcher_ranks(cmd, logical_cpus=8, physical_cores=8, interpreter=PY, **kw)


def test_the_table_is_large_enough():
    assert len(LINES) >= 40


@pytest.mark.parametrize("line, launcher, count, target", LINES, ids=[row[0][:60] for row in LINES])
def test_cpuperf_reads_the_count_and_the_program_as_the_launcher_does(line, launcher, count, target):
    cmd, ranks = _read(line)
    assert (cmd.launcher, ranks.count, " ".join(cmd.target)) == (launcher, count, target)


@pytest.mark.parametrize("line, said", [
    ("torchrun --nproc-per-node=0 t.py", "torchrun --nproc-per-node=0: torchrun starts that many worker processes"),
    ("torchrun --nproc-per-node=-1 t.py", "-1 starts none"),
    ("torchrun --nproc-per-node abc t.py", "torchrun reads it with int() and refuses 'abc'"),
    ("torchrun --nproc-per-node \u00b2 t.py", "refuses '\u00b2'"),
    ("torchrun --nproc-per-node 99999 t.py", "99999 worker processes torchrun starts, and this host has 8"),
    ("torchrun --nproc-per-node gpu t.py", "this host has none"),
    ("mpirun -np 0 ./a.out", "mpirun -np 0: the number of processes to start; 0 starts none"),
    ("mpirun -np 4x ./a.out", "must be a whole number"),
    ("mpirun -np 9 ./a.out", "Open MPI gives each a slot"),
    ("mpiexec -n 2 -ppn 0 ./a.out", "processes per node; 0 starts none"),
    ("accelerate launch --multi_gpu --num_processes two t.py", "accelerate's parser refuses 'two'"),
    ("accelerate launch --multi_gpu --num_processes 0 t.py", "0 starts none"),
    ("srun -n 0 ./a.out", "srun -n 0"),
])
def test_a_count_the_launcher_would_refuse_or_that_starts_nothing_is_refused_in_its_own_words(line, said):
    with pytest.raises(UsageError) as err:
        _read(line)
    assert said in err.value.message, err.value.message


@pytest.mark.parametrize("line, said", [
    ("torchrun --nproc 2 t.py", "ambiguous"),  # --nproc-per-node and --nproc_per_node
    ("torchrun --bogus 1 t.py", "torchrun has no option --bogus"),
    ("accelerate launch --num_proc 2 t.py", "accelerate has no option --num_proc"),  # allow_abbrev=False
    ("torchrun --standalone=1 t.py", "takes no value"),
])
def test_an_option_the_launchers_parser_refuses_is_refused(line, said):
    with pytest.raises(UsageError) as err:
        split_launcher(line.split())
    assert said in err.value.message


def test_oversubscribe_and_host_lists_keep_the_launchers_count():
    _, ranks = _read("mpirun --oversubscribe -np 12 ./a.out")
    assert ranks.count == 12 and ranks.oversubscribed and not ranks.place and ranks.step
    _, ranks = _read("mpirun --map-by core:OVERSUBSCRIBE -np 12 ./a.out")
    assert ranks.count == 12 and ranks.oversubscribed
    _, ranks = _read("mpirun -host a,b -np 12 ./a.out")
    assert ranks.count == 12 and not ranks.place and "names hosts" in ranks.why
    _, ranks = _read("torchrun --nproc-per-node 12 t.py", oversubscribe=True)  # cpuperf --set oversubscribe=true
    assert ranks.count == 12 and not ranks.place


def test_an_mpmd_line_is_left_whole_to_the_launcher():
    cmd, ranks = _read("mpirun -np 2 ./a : -np 2 ./b")
    assert ranks.count is None and not ranks.place and not ranks.step and "several programs" in ranks.why
    assert cmd.target == ("./a", ":", "-np", "2", "./b")


def test_the_rank_step_goes_only_where_it_runs_the_rank_exactly():
    assert _read("accelerate launch --tpu --multi_gpu --num_processes 2 t.py")[1].step is False  # TPU: no --no_python
    assert _read("torchrun --run-path --nproc-per-node 2 t.py")[1].step is False
    assert _read("srun -n 2 ./app")[1].step is False
    cmd = split_launcher("torchrun --nproc-per-node 2 t.py".split())
    assert launcher_ranks(cmd, logical_cpus=8, physical_cores=8, interpreter=None).step is False  # which Python?
    assert _read("torchrun --no-python --nproc-per-node 2 ./a.out")[1].step is True


def test_wrappers_stay_in_front_of_the_launcher_with_the_rank_step_behind_it():
    cmd = split_launcher("env X=1 nice -n 5 torchrun --nproc-per-node 2 t.py --lr 1".split())
    assert cmd is not None and [w.name for w in cmd.wrappers] == ["env", "nice"] and cmd.wrapper_env == {"X": "1"}
    assert list(with_rank_step(cmd, "/cp/python", PY)) == [
        "env", "X=1", "nice", "-n", "5", "torchrun", "--nproc-per-node", "2", "--no-python",
        "/cp/python", "-m", "cpuperf.run.rankexec", "--", PY, "-u", "t.py", "--lr", "1"]
    cmd = split_launcher("mpirun -genvall -np 4 python train.py".split())
    assert list(with_rank_step(cmd, "/cp/python", PY))[:5] == ["mpirun", "-genvall", "-np", "4", "/cp/python"]


def test_a_thread_count_set_in_front_of_the_launcher_is_the_users():
    _, ranks = _read("env OMP_NUM_THREADS=7 torchrun --nproc-per-node 2 t.py")
    assert ranks.user_threads == "7" and any("OMP_NUM_THREADS=7" in n for n in ranks.notes)
    _, ranks = _read("torchrun --nproc-per-node 2 t.py")
    assert ranks.user_threads is None


def test_pet_nproc_per_node_is_torchruns_default_for_the_option():
    cmd = split_launcher("torchrun t.py".split())
    ranks = launcher_ranks(cmd, logical_cpus=8, physical_cores=8, interpreter=PY, environ={"PET_NPROC_PER_NODE": "3"})
    assert ranks.count == 3 and "PET_NPROC_PER_NODE=3" in ranks.source


# -- the data ------------------------------------------------------------------------------------------

def test_no_option_is_listed_that_no_launcher_has_and_reporting_is_not_binding():
    rules = load_builtin("launchers.toml")
    every = {n.lstrip("-") for table in ("torchrun", "accelerate", "mpirun", "srun")
             for key in ("flags", "valued", "optional", "two_values", "env_pair", "binding", "hosts")
             for n in rules[table].get(key, ())}
    assert not {"x-all", "map-by-node"} & every
    assert "report-bindings" not in rules["mpirun"]["binding"]
    for name in ("genvall", "envall", "print-rank-map", "pernode", "nolocal", "merge-stderr-to-stdout"):
        assert name in rules["mpirun"]["flags"], name


def test_each_option_has_one_arity_across_open_mpi_and_hydra():
    rule = load_builtin("launchers.toml")["mpirun"]
    groups = [set(rule[k]) for k in ("flags", "optional", "valued", "two_values", "env_pair")]
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not a & b, a & b
    for key in ("nproc", "per_node", "binding", "hosts"):
        listed = set(rule[key]) - set().union(*groups)
        assert not listed, (key, listed)


def _argparse_table(parser):
    flags, valued = set(), set()
    for action in parser._actions:
        (flags if action.nargs == 0 else valued).update(action.option_strings)
    return flags, valued


def test_torchruns_table_is_the_installed_torchs_own_parser():
    run = pytest.importorskip("torch.distributed.run")
    flags, valued = _argparse_table(run.get_args_parser())
    rule = load_builtin("launchers.toml")["torchrun"]
    assert flags <= set(rule["flags"]) and valued <= set(rule["valued"]), (flags - set(rule["flags"]),
                                                                            valued - set(rule["valued"]))


def test_accelerates_table_is_the_installed_accelerates_own_parser():
    launch = pytest.importorskip("accelerate.commands.launch")
    flags, valued = _argparse_table(launch.launch_command_parser())
    rule = load_builtin("launchers.toml")["accelerate"]
    assert flags <= set(rule["flags"])
    families = tuple(rule["valued_families"])
    assert {v for v in valued if not v.startswith(families)} <= set(rule["valued"])


# -- through the CLI: one line, exit 2 ---------------------------------------------------------------------

@pytest.mark.parametrize("tail, said", [
    (["torchrun", "--nproc-per-node=0", "t.py"], "torchrun --nproc-per-node=0: torchrun starts that many"),
    (["torchrun", "--nproc-per-node", "\u00b2", "t.py"], "Unsupported nproc_per_node value"),
    (["mpirun", "-np", "99999", "./a.out"], "mpirun -np 99999: 99999 processes"),
])
def test_refused_counts_exit_2_with_one_line(tail, said):
    proc = run_cli(["train", "--auto", "--dry-run", "--", *tail])
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert said in proc.stderr and "Traceback" not in proc.stderr


def test_every_table_names_its_source():
    rules = load_builtin("launchers.toml")
    tables = [rules[t] for t in ("torchrun", "accelerate", "mpirun", "srun")] + list(rules["wrappers"].values())
    assert all(str(t.get("source", "")).strip() for t in tables)


# -- wrappers that hide the launcher (issue 42) ------------------------------------------------------------

@pytest.mark.parametrize("line, shown", [
    ("sh -c 'cd /work && torchrun --nproc-per-node 2 t.py'", "sh -c"),
    ("bash -c 'torchrun --nproc-per-node $N t.py'", "bash -c"),
    ("bash -c 'mpirun -np 2 ./a.out | tee log'", "bash -c"),
    ("xargs -a args.txt torchrun", "xargs"),
    ("nice -n 5 ./my-wrapper.sh --x mpirun -np 4 ./a.out", "./my-wrapper.sh"),
    ("timeout 600 bash -c 'python -m torch.distributed.run --nproc-per-node 2 t.py; echo done'", "bash -c"),
])
def test_a_launcher_behind_a_command_cpuperf_cannot_read_is_left_to_place_its_own_ranks(line, shown):
    cmd, ranks = _read(line)
    assert cmd.hidden and shown in cmd.hidden
    assert ranks.count is None and not ranks.place and not ranks.step
    assert "placement is left to the launcher" in ranks.why and "cannot tell how many ranks" in ranks.why


@pytest.mark.parametrize("line", ["python t.py --launcher torchrun", "bash -c 'python t.py'", "bash run.sh",
                                  "sh -c 'cd /x && python t.py'", "timeout 10 python t.py --mpirun x"])
def test_a_single_program_is_no_launcher_whatever_its_arguments_name(line):
    assert split_launcher(shlex.split(line)) is None


def test_the_rank_step_goes_inside_the_shell_line_and_the_shells_own_arguments_stay():
    cmd = split_launcher(shlex.split("timeout 600 bash -lc 'exec torchrun --nproc-per-node 2 t.py --x \"a b\"' job 1"))
    step = with_rank_step(cmd, "/cp/python", PY)
    assert list(step[:3]) == ["timeout", "600", "bash"] and step[3] == "-lc" and list(step[5:]) == ["job", "1"]
    assert shlex.split(step[4]) == ["exec", "torchrun", "--nproc-per-node", "2", "--no-python", "/cp/python", "-m",
                                    "cpuperf.run.rankexec", "--", PY, "-u", "t.py", "--x", "a b"]


def test_short_options_of_wrappers_take_their_value_attached():
    cmd = split_launcher(shlex.split("stdbuf -oL timeout -k5 -sKILL 10 nice -n5 torchrun --nproc-per-node 2 t.py"))
    assert [w.name for w in cmd.wrappers] == ["stdbuf", "timeout", "nice"] and cmd.target == ("t.py",)


# -- the launcher line's own variables (issue 41 item 6) ---------------------------------------------------

@pytest.mark.parametrize("line, threads", [
    ("mpirun -np 2 -x OMP_NUM_THREADS=2 python t.py", "2"),
    ("mpiexec.hydra -genv OMP_NUM_THREADS 3 -n 2 ./app", "3"),
    ("mpiexec.hydra -genv OMP_NUM_THREADS=3 -n 2 ./app", "3"),
    ("mpiexec -env OMP_NUM_THREADS=4 -n 2 ./app", "4"),
    ("mpiexec --env OMP_NUM_THREADS 4 -n 2 ./app", "4"),
    ("mpirun -np 2 -x OMP_NUM_THREADS python t.py", "6"),  # forwarded: this environment's value
    ("mpiexec -genvlist PATH,OMP_NUM_THREADS -n 2 ./app", "6"),
    ("srun --export=ALL,OMP_NUM_THREADS=5 -n 2 ./app", "5"),
    ("bash -c 'OMP_NUM_THREADS=2 exec mpirun -np 2 ./app'", "2"),
    ("mpirun -np 2 python t.py", "6"),
])
def test_a_thread_count_set_on_the_launcher_line_is_the_users_and_every_rank_keeps_it(line, threads):
    cmd, ranks = _read(line, environ={"OMP_NUM_THREADS": "6"})
    assert ranks.user_threads == threads


@pytest.mark.parametrize("line, said", [
    ("mpirun -x KMP_AFFINITY=compact -np 2 ./a.out", "-x KMP_AFFINITY=compact"),
    ("mpirun -x OMP_PROC_BIND=close -x OMP_PLACES=cores -np 2 ./a.out", "-x OMP_PROC_BIND=close"),
    ("mpiexec -genv I_MPI_PIN_DOMAIN core -n 2 ./app", "-genv I_MPI_PIN_DOMAIN core"),
    ("mpirun -x GOMP_CPU_AFFINITY=0-3 -np 2 ./a.out", "GOMP_CPU_AFFINITY"),
])
def test_a_binding_variable_on_the_launcher_line_leaves_placement_to_the_user(line, said):
    _, ranks = _read(line)
    assert not ranks.place and "your launcher line binds the ranks itself" in ranks.why and said in ranks.why
    assert any("cpuperf keeps it" in n for n in ranks.notes)


def test_a_launcher_that_passes_no_environment_gets_no_placement():
    _, ranks = _read("mpiexec -genvnone -n 2 ./app")
    assert not ranks.place and "-genvnone" in ranks.why
    _, ranks = _read("srun --export=NONE -n 2 ./app")
    assert any("only the variables it names" in n for n in ranks.notes)


def test_a_thread_count_on_the_line_that_no_openmp_reads_is_refused():
    with pytest.raises(UsageError) as err:
        _read("mpirun -x OMP_NUM_THREADS=abc -np 2 ./a.out")
    assert "-x OMP_NUM_THREADS=abc" in err.value.message


def test_an_option_whose_arity_differs_between_releases_leaves_placement_to_the_launcher():
    _, ranks = _read("mpirun -dvm -np 2 ./a.out")
    assert not ranks.place


def test_open_mpis_table_is_the_installed_mpiruns_own_help():
    """Every option `mpirun --help all` of the installed Open MPI lists has its arity in the table."""
    import os
    import re
    import shutil
    import subprocess

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun (apt-get install openmpi-bin)")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    text = subprocess.run([mpirun, "--help", "all"], capture_output=True, text=True, env=env, timeout=60).stdout
    if "Open MPI" not in text and "mpirun" not in text:
        pytest.skip("not Open MPI's mpirun")
    rule = load_builtin("launchers.toml")["mpirun"]
    arity = {**{n: 0 for n in (*rule["flags"], *rule["optional"])}, **{n: 1 for n in rule["valued"]},
             **{n: 2 for n in rule["two_values"]}, **{n: None for n in rule["version_dependent"]}}
    seen = 0
    for line in text.splitlines():
        m = re.match(r"^ {0,3}(-[A-Za-z][-a-z0-9_]*(?:\|--?[A-Za-z][-a-z0-9_]*)*)((?: <arg\d>)*)(\s|$)", line)
        if not m:
            continue
        for name in (n.lstrip("-") for n in m.group(1).split("|")):
            seen += 1
            if name in ("h", "help") or arity.get(name, -1) is None:
                continue  # --help [topic] starts nothing; a version-dependent option is left to the launcher
            assert arity.get(name, -1) == m.group(2).count("<arg"), (name, line)
    assert seen > 100


# -- through the CLI: an empty command ---------------------------------------------------------------

def test_an_empty_command_after_the_separator_is_a_usage_error():
    proc = run_cli(["train", "--auto", "--"])
    assert proc.returncode == 2 and "no command after `--`" in proc.stderr, proc.stderr
    proc = run_cli(["train", "--json", "--"])
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == 2


# -- every MPI spelling in the table -------------------------------------------------------------------

# Real lines per MPI flavour (the count each starts on this node, the program): Open MPI mpirun(1) 4.1 / 5.0,
# MPICH hydra's `mpiexec -h` (options.c), Intel MPI's Global and Local Hydra Options (2021.x).
MPI_LINES = [
    ("mpirun -genvall -np 4 python x.py", 4, "python x.py"),
    ("mpiexec.hydra -genvall -n 4 python x.py", 4, "python x.py"),
    ("mpirun -genvnone -np 2 python x.py", 2, "python x.py"),
    ("mpiexec -genv I_MPI_DEBUG 5 -genv OMP_NUM_THREADS 2 -np 3 python x.py a", 3, "python x.py a"),
    ("mpiexec -genv I_MPI_DEBUG=5 -genvall -n 3 python x.py", 3, "python x.py"),
    ("mpiexec -n 2 -env FOO bar python x.py", 2, "python x.py"),
    ("mpiexec -n 2 -env FOO=bar -envall python x.py", 2, "python x.py"),
    ("mpiexec -genvlist PATH,LD_LIBRARY_PATH -genvexcl HOME -n 2 ./app", 2, "./app"),
    ("mpiexec.hydra -hosts localhost -ppn 2 -n 4 ./app", 2, "./app"),
    ("mpiexec.hydra -f hosts.txt -perhost 3 -n 6 ./app", 3, "./app"),
    ("mpiexec.hydra -machinefile m.txt -n 4 ./app", 4, "./app"),
    ("mpiexec.hydra -machine m.txt -grr 2 -n 4 ./app", 2, "./app"),
    ("mpiexec -launcher ssh -bootstrap ssh -iface eth0 -n 2 ./app", 2, "./app"),
    ("mpiexec -usize 8 -tune t.dat -wdir /tmp -n 2 ./app", 2, "./app"),
    ("mpiexec -outfile-pattern o.%r -errfile-pattern e.%r -prepend-rank -n 2 ./app", 2, "./app"),
    ("mpirun --np 2 -x NCCL_DEBUG -x OMP_NUM_THREADS=2 python x.py", 2, "python x.py"),
    ("mpirun --n 2 --map-by slot --rank-by core python x.py", 2, "python x.py"),
    ("mpirun -c 2 --hostfile h.txt python x.py", 2, "python x.py"),
    ("mpirun -np 2 --mca btl self,tcp --mca pml ob1 --oversubscribe python x.py", 2, "python x.py"),
    ("mpirun -np 2 --prtemca plm_rsh_agent ssh --display map python x.py", 2, "python x.py"),
    ("mpirun --npernode 2 -np 4 python x.py", 2, "python x.py"),
    ("mpirun -np 2 --output tag,timestamp --stdin none --wdir /tmp python x.py", 2, "python x.py"),
    ("mpirun -np 2 -q --tag-output python x.py", 2, "python x.py"),
    ("prterun -n 2 --personality ompi python x.py", 2, "python x.py"),
    ("orterun -np 2 -am a.conf python x.py", 2, "python x.py"),
]


@pytest.mark.parametrize("line, count, target", MPI_LINES, ids=[row[0][:60] for row in MPI_LINES])
def test_every_mpi_flavours_line_gives_its_rank_count_and_program(line, count, target):
    cmd, ranks = _read(line)
    assert (cmd.launcher, ranks.count, " ".join(cmd.target)) == ("mpirun", count, target)
    assert not cmd.unknown, cmd.unknown


def _mpi_spellings():
    rule = load_builtin("launchers.toml")["mpirun"]
    for key, words in (("flags", ()), ("optional", ()), ("valued", ("2",)), ("two_values", ("a", "2")),
                       ("env_pair", ("A", "2"))):
        for name in rule.get(key, ()):
            yield name, key, words


@pytest.mark.parametrize("dashes", ["-", "--"])
def test_each_mpi_option_in_the_table_takes_exactly_its_own_words(dashes):
    """Every spelling in compat/launchers.toml [mpirun], with one dash or two and the words it takes, leaves the
    rank count and the program where the launcher finds them: a flag eats no word, -genv NAME VALUE two."""
    rule = load_builtin("launchers.toml")["mpirun"]
    per_node = set(rule["per_node"])
    for name, key, words in _mpi_spellings():
        forms = [(f"{dashes}{name}", *words)]
        if key == "env_pair":
            forms.append((f"{dashes}{name}", "A=2"))
        if key == "optional":
            forms.append((f"{dashes}{name}=2",))
        for form in forms:
            line = ["mpirun", *form, "-np", "3", "python", "x.py", "-v"]
            cmd, ranks = _read(shlex.join(line))
            want = 2 if name in per_node else 3
            assert (ranks.count, cmd.target, cmd.unknown) == (want, ("python", "x.py", "-v"), ()), line
