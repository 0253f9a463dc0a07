"""Decided means applied (issue 41): every lever of a plan is in the job or listed as not applied, with why.

A property over host classes (test_host_classes' recorded trees, the GPU class through its recorded NVML answer
and CUDA torch) x paths (the built-in loop, a Trainer script, the script behind torchrun, mpirun and accelerate
launch, a plain run): the real CLI plans each (`train --dry-run --json`, called in-process with the environment
test_plan_golden gives its children), and its `levers` report names every decided lever exactly once, each not-applied one with a reason, and each
applied one is really in the job the same JSON describes (worker settings, per-rank threads and CPUs, the flags on
the command, the preload). Then the pure function itself over a table of decisions and jobs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from cli_util import run_in_process
from host_classes import CLASSES, TRAINER_SCRIPT, HostClass, planning_env
from levers_util import levers

from cpuperf.knowledge.knobs import DECISION_IDS
from cpuperf.plan.applied import PLAIN, RankView, RenderedJob, lever_report, split
from cpuperf.worker_settings import TrainSettings

PATHS: Dict[str, List[str]] = {
    "builtin": ["--auto"],
    "builtin-plain": [],
    "trainer": ["--auto", "--", "python", "train.py", "--output_dir", "o"],
    "torchrun": ["--auto", "--", "torchrun", "--nproc-per-node", "2", "train.py", "--output_dir", "o"],
    "accelerate": ["--auto", "--", "accelerate", "launch", "--num_processes", "2", "train.py", "--output_dir", "o"],
    "mpirun": ["--auto", "--", "mpirun", "-np", "2", "python", "train.py", "--output_dir", "o"],
    "trainer-plain": ["--", "python", "train.py", "--output_dir", "o"],
    # a plain run with pinning set: the ranks are pinned, their threads stay torch's own (no second count)
    "builtin-pinned-plain": ["--set", "affinity=auto"],
    # Slurm: the user's srun line, and cpuperf's own srun inside an allocation (PATH_ENV): dry runs, no Slurm here
    "srun": ["--auto", "--", "srun", "-n", "2", "python", "train.py", "--output_dir", "o"],
    "own-srun": ["--auto", "--nproc-per-node", "2"],
    # MPICH / Intel MPI: the user's hydra line (-ppn, -genv). cpuperf's own mpirun is test_launch_plan's: under
    # --sysroot the probe finds no launcher on the recorded tree
    # the Trainer script inside a shell line: read through, its flags inside the line; a chained line gets none
    "shell-line": ["--auto", "--", "bash", "-c", "python train.py --output_dir o"],
    "shell-chained": ["--auto", "--hf-flags", "always", "--", "bash", "-c", "cd . && python train.py --output_dir o"],
    "hydra": ["--auto", "--", "mpiexec.hydra", "-n", "2", "-ppn", "2", "-genv", "I_MPI_DEBUG", "0", "python", "train.py",
              "--output_dir", "o"],
    # every framework adapter (cpuperf/plan/frameworks) and DeepSpeed's runner, on every class (issue 61)
    "lightning": ["--auto", "--", "python", "lit.py"],
    "lightning-cli": ["--auto", "--", "python", "lit_cli.py", "fit"],
    "plain-loop": ["--auto", "--", "python", "loop.py"],
    "deepspeed": ["--auto", "--", "deepspeed", "--num_gpus", "2", "train.py", "--output_dir", "o"],
}
LIGHTNING = "import lightning as L\n\ntrainer = L.Trainer(max_epochs=1)\n"
LIGHTNING_CLI = "from lightning.pytorch.cli import LightningCLI\n\nLightningCLI()\n"
PLAIN_LOOP = "import torch\n\nmodel = torch.nn.Linear(4, 4)\nmodel(torch.zeros(1, 4)).sum().backward()\n"
# What a path adds to the child's environment: the Slurm allocation srun runs in (slurm_facts reads these).
PATH_ENV: Dict[str, Dict[str, str]] = {
    "own-srun": {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "cn01"},
}


def _dry_run(cls: HostClass, path: str, root: Path) -> Tuple[int, Dict[str, Any], str]:
    tree = cls.tree(root / f"tree-{cls.name}")
    options = PATHS[path]
    script = options[options.index("--"):] if "--" in options else []
    args = ["train", "--dry-run", "--json", *options[:len(options) - len(script)], "--sysroot", str(tree), *script]
    # in-process (tests/cli_util.py): the same entry point, environment and directory as test_plan_golden's children
    proc = run_in_process(args, {**planning_env(cls, root), **PATH_ENV.get(path, {})}, cwd=str(root / "run"))
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else {}), proc.stderr


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> Dict[Tuple[str, str], Tuple[int, Dict[str, Any], str]]:
    root = tmp_path_factory.mktemp("levers")
    for sub in ("run", "home"):
        (root / sub).mkdir()
    (root / "run" / "train.py").write_text(TRAINER_SCRIPT)
    for name, text in (("lit.py", LIGHTNING), ("lit_cli.py", LIGHTNING_CLI), ("loop.py", PLAIN_LOOP)):
        (root / "run" / name).write_text(text)
    for cls in CLASSES:
        cls.tree(root / f"tree-{cls.name}")
    keys = [(cls, path) for cls in CLASSES for path in PATHS]
    got = [_dry_run(cls, path, root) for cls, path in keys]
    return {(cls.name, path): result for (cls, path), result in zip(keys, got)}


def _words(plan: Dict[str, Any]) -> List[str]:
    launch = plan["launch"]
    return [*launch["argv"], *launch["rank_command"]]


def _check_claim(item: Dict[str, Any], plan: Dict[str, Any]) -> None:
    """An applied lever is where the report says: in the settings, the ranks, the command or the environment."""
    how, value, launch = item["how"], item["value"], plan["launch"]
    if how.startswith("worker setting "):
        assert plan["settings"][item["id"]] == value, item
    elif how.startswith("flag "):
        flags = how[len("flag "):].split(", ")
        words = " ".join(_words(plan))
        assert all(f in words for f in flags), (item, words)
    elif how.startswith("each rank starts with OMP_NUM_THREADS="):
        assert [r["threads"] for r in launch["per_rank"]] == [value] * len(launch["per_rank"]), item
    elif how == "each rank pinned to its CPUs":
        assert launch["affinity"] or all(r["cpus"] for r in launch["per_rank"]), item
    elif how.startswith("variable "):  # a variable the script's framework reads (PL_TRAINER_PRECISION=bf16-mixed)
        name, _, val = how[len("variable "):].partition("=")
        assert launch["env"].get(name) == val, (item, launch["env"])
    elif how.startswith("env LD_PRELOAD"):
        assert value in launch["env"]["LD_PRELOAD"], item
    elif "rank(s) per node" in how:
        assert launch["nproc_per_node"] == value, item
    elif "node(s)" in how:
        assert launch["nnodes"] == value, item


@pytest.mark.parametrize("cls", CLASSES, ids=[c.name for c in CLASSES])
def test_every_decided_lever_is_applied_or_listed_with_a_reason(dry_runs, cls: HostClass):
    for path in PATHS:
        if (cls.name, path) not in dry_runs:
            continue
        code, plan, err = dry_runs[(cls.name, path)]
        assert code == 0, f"{cls.name} {path}: exit {code}: {err[-1500:]}"
        report = plan["levers"]
        named = [i["id"] for i in report["applied"]] + [i["id"] for i in report["not_applied"]]
        assert sorted(named) == sorted(DECISION_IDS), (cls.name, path, named)
        values = {d["id"]: d["value"] for d in plan["decisions"] if d["id"] != "plain"}
        for item in report["not_applied"]:
            assert item["why"].strip(), (cls.name, path, item)
        for item in report["applied"]:
            assert item["how"].strip(), (cls.name, path, item)
            if item["id"] in values:
                assert item["value"] == values[item["id"]], (cls.name, path, item)
            _check_claim(item, plan)


def test_a_plain_run_says_which_levers_auto_would_change(dry_runs):
    _, plan, _ = dry_runs[("avx512-bf16", "builtin-plain")]
    reasons = {i["id"]: i["why"] for i in plan["levers"]["not_applied"]}
    assert reasons.get("dtype") == PLAIN  # bf16 decided, fp32 run: said, not silent


def test_the_gpu_host_lists_what_its_launch_leaves_to_torch(dry_runs):
    gpu = next(c for c in CLASSES if c.gpus)
    _, plan, _ = dry_runs[(gpu.name, "trainer")]
    states = {i["id"]: i for i in plan["levers"]["applied"] + plan["levers"]["not_applied"]}
    assert states["device"]["value"] == "cuda"
    assert "attention" in {i["id"] for i in plan["levers"]["not_applied"]}
    # cpuperf pins no cores there, but torchrun binds each rank to its GPU's NUMA node: the report says which
    if "--numa-binding=node" in plan["launch"]["argv"]:
        assert "--numa-binding=node" in states["affinity"]["how"], states["affinity"]


# -- the pure function ---------------------------------------------------------------------------------

JOBS = {
    "builtin": RenderedJob(auto=True, nproc_per_node=1, nnodes=1, env={"OMP_NUM_THREADS": "4"},
                           ranks=(RankView((0, 1, 2, 3), 4),), settings=TrainSettings(dtype="bf16", device="cpu")),
    "script": RenderedJob(auto=True, nproc_per_node=2, nnodes=1, env={}, ranks=(RankView((), 2), RankView((), 2)),
                          flags=(("--use_cpu",), ("--bf16",)), flags_left=(("--optim", "the Trainer's default"),)),
    "plain": RenderedJob(auto=False, nproc_per_node=1, nnodes=1, env={}, ranks=(RankView((), None),),
                         settings=TrainSettings(dtype="fp32")),
}
LEVERS = {
    "cpu-bf16": levers({"dtype": "bf16", "threads_per_rank": 4, "affinity": "auto", "allocator": "jemalloc"}),
    "gpu": levers({"device": "cuda", "dtype": "bf16", "tf32": True, "pin_memory": True, "nproc_per_node": 2,
                   "ddp_backend": "nccl", "attention": "flash", "zero": {"zero_optimization": {"stage": 2}}}),
    "set-by-you": levers({"batch_size": 4, "optimizer": "adafactor"}, overridden={"batch_size", "optimizer"}),
}


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("decided", LEVERS)
def test_the_report_names_each_lever_once(job, decided):
    report = lever_report(LEVERS[decided], JOBS[job])
    assert [s.id for s in report] == list(DECISION_IDS)
    assert all(s.how for s in report)
    out = split(report)
    assert len(out["applied"]) + len(out["not_applied"]) == len(DECISION_IDS)


def test_a_claim_follows_the_job_not_the_plan():
    decided = LEVERS["cpu-bf16"]
    by_id = {s.id: s for s in lever_report(decided, JOBS["builtin"])}
    assert by_id["dtype"].applied and by_id["threads_per_rank"].applied and by_id["affinity"].applied
    assert not by_id["allocator"].applied  # jemalloc decided, nothing preloaded: said
    preloaded = RenderedJob(**{**JOBS["builtin"].__dict__, "env": {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}})
    assert {s.id: s for s in lever_report(decided, preloaded)}["allocator"].applied
    script = {s.id: s for s in lever_report(decided, JOBS["script"])}
    assert script["dtype"].how == "flag --bf16" and not script["threads_per_rank"].applied


def test_the_trainers_defaults_are_claimed_only_for_a_script_that_builds_trainingarguments():
    """A plain torch script's batch is its own code's: the report said 'default: the Trainer's
    per_device_train_batch_size 8' for a script with no Trainer in it."""
    decided = levers({"batch_size": 8, "grad_accum_steps": 1, "dataloader_workers": 0})
    plain = RenderedJob(auto=True, nproc_per_node=1, nnodes=1, env={}, ranks=(RankView((), 2),),
                        flags_why="not a Hugging Face Trainer script", trainer=False)
    trainer = RenderedJob(**{**plain.__dict__, "trainer": True})
    for lever in ("batch_size", "grad_accum_steps", "dataloader_workers"):
        theirs = {s.id: s for s in lever_report(decided, plain)}[lever]
        assert not theirs.applied and "its own code's" in theirs.how, theirs
        assert {s.id: s for s in lever_report(decided, trainer)}[lever].applied
    assert "the Trainer's per_device_train_batch_size 8" in {s.id: s for s in lever_report(decided, trainer)}[
        "batch_size"].how
    # A script not read (`python -m pkg.train`): no default is claimed, and none is denied either.
    unread = RenderedJob(**{**plain.__dict__, "trainer": None})
    assert "the script was not read" in {s.id: s for s in lever_report(decided, unread)}["batch_size"].how
    # A value on the command line is the command's own, whatever parses it.
    given = RenderedJob(**{**plain.__dict__, "own_values": {"per_device_train_batch_size": "8"}})
    assert {s.id: s for s in lever_report(decided, given)}["batch_size"].how == (
        "your command's own --per_device_train_batch_size 8")


# -- the paths the first property left out, and what they must show ---------------------------------------------

def test_the_launch_lines_of_srun_and_mpirun_are_the_ones_reported(dry_runs):
    """cpuperf's own srun (inside an allocation) and mpirun start the decided ranks, each pinned with the decided
    threads; the user's srun and hydra lines keep their rank counts and the report names each lever."""
    _, own_srun, _ = dry_runs[("avx512-bf16", "own-srun")]
    launch = own_srun["launch"]
    assert launch["launcher"] == "srun" and launch["argv"][0] == "srun" and "--ntasks-per-node=2" in launch["argv"]
    applied = {i["id"]: i["how"] for i in own_srun["levers"]["applied"]}
    assert applied["nproc_per_node"] == "the launch starts 2 rank(s) per node"
    assert applied["affinity"] == "each rank pinned to its CPUs"
    for path in ("srun", "hydra"):
        _, plan, _ = dry_runs[("avx512-bf16", path)]
        assert plan["launch"]["yours"]["launcher"] == {"srun": "srun", "hydra": "mpirun"}[path]
        assert plan["launch"]["yours"]["ranks"] == 2
        states = {i["id"] for i in plan["levers"]["applied"] + plan["levers"]["not_applied"]}
        assert states == set(DECISION_IDS)


def test_the_trainers_default_fused_adamw_is_applied_by_that_default(dry_runs):
    """The installed (recorded) transformers and torch make fused AdamW the Trainer's default: no --optim is added,
    and the optimizer the plan decided is said to be applied by that default, not 'not applied'."""
    for path in ("trainer", "torchrun", "mpirun"):
        _, plan, _ = dry_runs[("avx512-bf16", path)]
        assert not any(w.startswith("--optim") for w in _words(plan))
        applied = {i["id"]: i for i in plan["levers"]["applied"]}
        assert applied["optimizer"]["value"] == "adamw_fused", (path, plan["levers"])
        assert applied["optimizer"]["how"] == "default: the Trainer's default is fused AdamW"


def test_a_shell_lines_flags_are_inside_it_or_listed_as_not_applied(dry_runs):
    carried = set()
    for cls in CLASSES:
        line = dry_runs[(cls.name, "shell-line")][1]
        argv, flags = line["launch"]["argv"], line["applied"]["flags"]
        carried.update(flags)
        assert argv[-3:-1] == ["bash", "-c"] and argv[-1] == " ".join(["python", "train.py", "--output_dir", "o", *flags])
        chained = dry_runs[(cls.name, "shell-chained")][1]
        assert chained["launch"]["argv"][-1] == "cd . && python train.py --output_dir o" and not chained["applied"]["flags"]
        flagless = [i for i in chained["levers"]["not_applied"] if "no Trainer flags" in i["why"]]
        assert all("would reach the shell, not your script" in i["why"] for i in flagless), (cls.name, flagless)
        if "--bf16" in flags:  # what the line carried is, behind a chained line, listed with that reason
            assert "dtype" in {i["id"] for i in flagless}, cls.name
    assert {"--bf16", "--use_cpu"} <= carried  # the bf16 classes' lines carry their flags


@pytest.mark.parametrize("cls", [c for c in CLASSES if not c.gpus], ids=[c.name for c in CLASSES if not c.gpus])
def test_threads_per_rank_is_one_value_on_every_path(dry_runs, cls: HostClass):
    """The env's OMP_NUM_THREADS, each rank's thread count and the worker's setting are the one decided value where
    cpuperf sets threads (--auto), and nothing at all where it does not (a plain run, pinned or not)."""
    for path, options in PATHS.items():
        if (cls.name, path) not in dry_runs:
            continue
        _, plan, _ = dry_runs[(cls.name, path)]
        launch = plan["launch"]
        decided = next(d["value"] for d in plan["decisions"] if d["id"] == "threads_per_rank") \
            if "--auto" in options else None
        seen = {r["threads"] for r in launch["per_rank"]}
        if "OMP_NUM_THREADS" in launch["env"]:
            seen.add(int(launch["env"]["OMP_NUM_THREADS"]))
        if plan.get("settings") is not None:
            seen.add(plan["settings"].get("threads_per_rank"))
        mine = {t for t in seen if t is not None}
        if decided is None:
            assert mine == set(), (cls.name, path, seen)
        else:  # a user's launcher cpuperf does not place gets none; every other path the one value
            assert mine <= {decided}, (cls.name, path, seen, decided)


# -- recommend and ccl-env report the levers of what they render --------------------------------------------------

def _cli(cls: HostClass, root: Path, *args: str) -> Tuple[int, str, str]:
    tree = cls.tree(root / f"tree-{cls.name}")
    proc = run_in_process([*args, "--sysroot", str(tree)], planning_env(cls, root), cwd=str(root / "run"))
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("name", ["avx512-bf16", "avx2", "gpu"])
def test_recommend_and_ccl_env_carry_the_lever_report(tmp_path, name):
    cls = next(c for c in CLASSES if c.name == name)
    for sub in ("run", "home"):
        (tmp_path / sub).mkdir()
    code, out, err = _cli(cls, tmp_path, "recommend", "--json")
    assert code == 0, err[-1500:]
    rec = json.loads(out)
    report = rec["levers"]
    assert sorted(i["id"] for i in report["applied"] + report["not_applied"]) == sorted(DECISION_IDS)
    applied = {i["id"]: i["how"] for i in report["applied"]}
    decided = {d["id"]: d["value"] for d in rec["decisions"]}
    if decided["device"] == "cpu":  # the launch recommend prints carries the one thread count
        assert applied["threads_per_rank"] == f"each rank starts with OMP_NUM_THREADS={decided['threads_per_rank']}"
        assert rec["env"]["OMP_NUM_THREADS"] == str(decided["threads_per_rank"])
    if "--bf16" in rec["hf_args"]:
        assert applied["dtype"] == "flag --bf16"  # the Trainer flags recommend renders carry it
    code, text, err = _cli(cls, tmp_path, "recommend")
    assert code == 0 and f"# levers: {len(report['applied'])} of {len(DECISION_IDS)} applied" in text, err[-1500:]
    # each lever once: every decision in the table, and below it only the levers the lines do not carry, with why
    assert all(re.search(rf"^. {lever} ", text, re.M) for lever in DECISION_IDS), text
    assert all(re.search(rf"^# not applied: {i['id']}=", text, re.M) for i in report["not_applied"]), text
    assert not re.search(r"^# applied: ", text, re.M), text
    if decided["device"] != "cpu":
        return  # ccl-env decides for the CPU
    code, out, err = _cli(cls, tmp_path, "ccl-env", "--json")
    assert code == 0, err[-1500:]
    env = json.loads(out)
    report = env["levers"]
    assert sorted(i["id"] for i in report["applied"] + report["not_applied"]) == sorted(DECISION_IDS)
    applied = {i["id"]: i["how"] for i in report["applied"]}
    why = {i["id"]: i["why"] for i in report["not_applied"]}
    assert applied["threads_per_rank"] == f"env OMP_NUM_THREADS={env['env']['OMP_NUM_THREADS']}"
    assert why["nproc_per_node"].startswith("ccl-env renders the environment only")
    assert "batch_size" in why


@pytest.mark.parametrize("cls", CLASSES, ids=[c.name for c in CLASSES])
def test_every_framework_gets_the_dtype_by_its_own_mechanism_on_every_class(dry_runs, cls: HostClass):
    """The plan's dtype lever reaches Lightning as the precision its Trainer reads (LightningCLI: its option) on every
    class, a plain loop is told the autocast line, and DeepSpeed's runner is never wrapped."""
    lit, cli, loop, ds = (dry_runs[(cls.name, p)][1] for p in ("lightning", "lightning-cli", "plain-loop", "deepspeed"))
    dtype = next(d["value"] for d in lit["decisions"] if d["id"] == "dtype")
    assert dtype == cls.dtype, (cls.name, dtype)
    precision = {"bf16": "bf16-mixed", "fp16": "16-mixed"}.get(dtype)
    bf16 = precision is not None
    assert lit["launch"]["env"].get("PL_TRAINER_PRECISION") == precision, cls.name
    argv = cli["launch"]["argv"]
    assert (argv[-2:] == ["--trainer.precision", precision]) if bf16 else "--trainer.precision" not in argv, cls.name
    assert lit["launch"]["nproc_per_node"] == 1 and loop["launch"]["nproc_per_node"] == 1, cls.name
    assert any(i["flag"].startswith("dtype") and "torch.autocast" in i["why"]
               for i in loop["hf_flags"]["not_added"]) is bf16, cls.name
    assert "PL_TRAINER_PRECISION" not in loop["launch"]["env"], cls.name
    argv = ds["launch"]["argv"]
    assert argv[argv.index("deepspeed"):][:3] == ["deepspeed", "--num_gpus", "2"] and "torchrun" not in argv, cls.name
