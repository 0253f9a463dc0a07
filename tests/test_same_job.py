"""The same job, only faster (issue 51): on a multi-socket host `train --auto` splits a one-process command into ranks
only where the command runs data-parallel under a launcher and cpuperf keeps its global batch; a plain script stays
one process with every core, a Trainer's batch is shared by the ranks, a user's own launcher is theirs.

Planned on recorded multi-socket trees (--sysroot: 2 sockets with SMT and two NUMA nodes each, like an EPYC 7451;
4 sockets of 16 cores, 64 CPUs), for every command form; the property checked is the launch's own argv:
world size x per-device batch x accumulation equals what the user's one process trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
from cli_util import run_cli
from hosts import make_host

from cpuperf.decide.workload import DataParallel, split_batch

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
NO_GPU = {"CPUPERF_OVERRIDE_GPUS": "[]"}
HOSTS = {2: dict(sockets=2, cores_per_socket=6, threads_per_core=2, nodes_per_socket=2),
         4: dict(sockets=4, cores_per_socket=16)}


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> Dict[int, Path]:
    root = tmp_path_factory.mktemp("sockets")
    return {n: make_host(root / f"s{n}", flags=("avx2", "fma", "avx512f"), **spec) for n, spec in HOSTS.items()}


def _plan(tree: Path, cmd: Sequence[str], *extra: str, cwd: Optional[Path] = None) -> dict:
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree), *extra, "--", *cmd],
                   extra_env=NO_GPU, cwd=str(cwd or SCRIPTS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _last(argv: Sequence[str], name: str, default: int) -> int:
    """What argparse keeps for `name`: its last value (either spelling, `--k v` or `--k=v`)."""
    value = default
    for i, item in enumerate(argv):
        key, eq, rest = item.partition("=")
        if key.replace("-", "_") == "__" + name:
            value = int(rest if eq else argv[i + 1])
    return value


def _trainer_global_batch(plan: dict) -> int:
    argv = plan["launch"]["argv"]
    return plan["launch"]["world_size"] * _last(argv, "per_device_train_batch_size", 8) * \
        _last(argv, "gradient_accumulation_steps", 1)


def _trainer(batch: Optional[int] = None, accum: Optional[int] = None) -> List[str]:
    cmd = ["python", "hf_parser.py", "--output_dir", "o", "--max_steps", "3"]
    cmd += ["--per_device_train_batch_size", str(batch)] if batch is not None else []
    return cmd + (["--gradient_accumulation_steps", str(accum)] if accum is not None else [])


# -- the split itself: pure ----------------------------------------------------------------------------------------

def test_split_batch_keeps_the_global_batch_or_refuses():
    for per_device in range(1, 13):
        for accum in range(1, 5):
            for ranks in range(1, 9):
                got = split_batch(per_device, accum, ranks)
                if got is None:
                    assert (per_device * accum) % ranks, (per_device, accum, ranks)
                    continue
                b, a = got
                assert b * a * ranks == per_device * accum and 1 <= b <= per_device, (per_device, accum, ranks, got)
    assert split_batch(8, 1, 2) == (4, 1)  # the per-device batch first: the same number of optimizer steps
    assert split_batch(1, 4, 2) == (1, 2)  # else the accumulation
    assert split_batch(6, 2, 4) == (3, 1)  # else the largest micro-batch that shares it exactly


def test_only_a_trainer_whose_batch_cpuperf_passes_is_split():
    trainer = DataParallel("trainer", "hf", 8, 1, "yours")
    assert trainer.split(2) == (4, 1) and trainer.split(3) is None
    assert DataParallel("trainer", "in code", None).split(2) is None  # its batch is in its code
    for kind in ("plain", "accelerate", "process-group", "unread"):
        assert DataParallel(kind, "signs").split(2) is None, kind
        assert "2" in DataParallel(kind, "signs").why_not_split(2)


# -- every command form on every multi-socket class ---------------------------------------------------------------

@pytest.mark.parametrize("sockets", sorted(HOSTS))
def test_a_plain_script_stays_one_process_with_every_core(trees, sockets):
    for cmd in (["python", "plain_loop.py", "--steps", "2"],  # no process group
                ["python", "accelerate_loop.py"],  # data-parallel, but its batch is its own code's
                ["python", "ddp_loop.py"],  # forms its own process group: the same
                ["python", "-m", "some_package.train"],  # source not read
                ["env", "FOO=1", "python", "plain_loop.py"],  # behind a wrapper
                ["bash", "-c", "python plain_loop.py --steps 2"]):  # inside a shell line
        plan = _plan(trees[sockets], cmd)
        assert plan["launch"]["world_size"] == 1 and plan["launch"]["launcher"] == "direct", cmd
        cores = HOSTS[sockets]["sockets"] * HOSTS[sockets]["cores_per_socket"]
        assert plan["launch"]["per_rank"][0]["threads"] == cores, cmd  # the whole host's physical cores
        not_applied = {d["id"]: d for d in plan["levers"]["not_applied"]}
        ranks = not_applied["nproc_per_node"]
        assert ranks["value"] == sockets and f"--set nproc_per_node={sockets}" in ranks["why"], (cmd, ranks)
        assert any("the same job as yours" in n for n in plan["notes"]), cmd


@pytest.mark.parametrize("sockets", sorted(HOSTS))
@pytest.mark.parametrize("batch,accum", [(8, None), (None, None), (1, None), (2, 3), (3, None)])
def test_a_trainer_keeps_its_global_batch_split_or_not(trees, sockets, batch, accum):
    plan = _plan(trees[sockets], _trainer(batch, accum))
    user_global = (batch or 8) * (accum or 1)
    assert _trainer_global_batch(plan) == user_global, plan["launch"]["argv"]
    world = plan["launch"]["world_size"]
    assert world > 1 or user_global % 2, "a batch that splits evenly over the sockets is split"
    if world > 1:
        assert plan["global_batch"]["global_batch"] == user_global
        assert plan["global_batch"]["before"]["per_device"] == (batch or 8)
        assert any(f"global batch {user_global} kept over {world} ranks" in n for n in plan["notes"]), plan["notes"]
    if batch == 1:
        assert world == 1  # nothing to share


@pytest.mark.parametrize("sockets", sorted(HOSTS))
def test_wrapped_trainer_lines_keep_the_batch_too(trees, sockets):
    for cmd in (["env", "FOO=1", *_trainer(8)], ["nice", "-n", "5", *_trainer(8)],
                ["bash", "-c", " ".join(_trainer(8))]):
        plan = _plan(trees[sockets], cmd)
        launched = plan["launch"]["argv"]
        if cmd[0] == "bash":  # the line is rewritten inside its quotes
            launched = [w for part in launched for w in part.split()]
            plan["launch"]["argv"] = launched
        assert plan["launch"]["world_size"] == sockets, cmd
        assert _trainer_global_batch(plan) == 8, (cmd, launched)


def test_your_launcher_is_yours_and_the_plan_says_its_global_batch(trees):
    plan = _plan(trees[2], ["torchrun", "--nproc-per-node", "2", *_trainer(8)[1:]])
    assert plan["launch"]["world_size"] == 2
    assert _last(plan["launch"]["argv"], "per_device_train_batch_size", 8) == 8  # unchanged
    assert any("global batch 2 x 8 per device x 1 accumulation = 16" in n for n in plan["notes"]), plan["notes"]


def test_a_rank_count_you_set_stands_with_its_consequence_said(trees):
    plan = _plan(trees[2], ["python", "plain_loop.py"], "--set", "nproc_per_node=2")
    assert plan["launch"]["world_size"] == 2
    assert any(n.startswith("warning: nproc_per_node=2 is yours") and "identical copies" in n for n in plan["notes"])
    # a Trainer's batch is still kept where it can be
    plan = _plan(trees[2], _trainer(8), "--set", "nproc_per_node=2")
    assert plan["launch"]["world_size"] == 2 and _trainer_global_batch(plan) == 8
    # a per-device batch you set is per rank: not split by cpuperf's own count
    plan = _plan(trees[2], _trainer(8), "--set", "batch_size=8")
    assert plan["launch"]["world_size"] == 1


@pytest.mark.parametrize("sockets", sorted(HOSTS))
def test_the_builtin_loop_splits_its_global_batch_exactly(trees, sockets, tmp_path):
    for batch in (None, 6, 5):
        args = ["train", "--auto", "--dry-run", "--json", "--sysroot", str(trees[sockets]), "--out", str(tmp_path)]
        proc = run_cli(args + (["--batch-size", str(batch)] if batch else []), extra_env=NO_GPU)
        assert proc.returncode == 0, proc.stderr[-2000:]
        plan = json.loads(proc.stdout)
        s, world = plan["settings"], plan["launch"]["world_size"]
        assert s["batch_size"] * s["grad_accum_steps"] * world == plan["workload"]["batch_size"], (batch, s, world)
        assert plan["global_batch"]["global_batch"] == plan["workload"]["batch_size"]


# -- the tuner: a layout that cannot keep the batch is no candidate -------------------------------------------------

def test_the_tuner_offers_only_layouts_that_keep_the_job(tmp_path):
    from dataclasses import replace

    from cpuperf.decide.recommend import RecommendRequest, recommend
    from cpuperf.decide.records import Measurements
    from cpuperf.decide.tune import candidates, keeps_the_job
    from cpuperf.decide.workload import PRESETS
    from cpuperf.probe import probe_host

    facts = probe_host(sysroot=str(make_host(tmp_path / "h", sockets=1, cores_per_socket=4, flags=("avx2", "fma"))))
    from cpuperf.knowledge.tuning import tuning as typed

    tuning = typed()
    base = replace(PRESETS["micro"], of_script=True)
    for dp, want in ((DataParallel("plain", "no process group"), [(1, 4)]),
                     (DataParallel("trainer", "hf", 8, 1, "yours"), [(1, 4), (2, 2), (4, 1)]),
                     (DataParallel("trainer", "hf", 3, 1, "yours"), [(1, 4)]),
                     (DataParallel("trainer", "hf", 1, 2, "yours"), [(1, 4), (2, 2)])):
        rec = recommend(facts, replace(base, parallel=dp), RecommendRequest(measurements=Measurements(source="test"), overrides={"nproc_per_node": 1, "threads_per_rank": 4}, environ={}))
        rec = replace(rec, levers=replace(rec.levers, nproc_per_node=replace(rec.levers.nproc_per_node, overridden=False),
                                          threads_per_rank=replace(rec.levers.threads_per_rank, overridden=False)))
        cand = candidates(facts, rec, tuning)
        layouts = list(cand.values.get("layout", [(1, 4)]))
        assert sorted(layouts) == want, (dp, layouts, cand.skipped)
        assert all(keeps_the_job(rec, r) for r, _ in layouts)
        if want == [(1, 4)]:
            assert "would change the job" in cand.skipped["layout"]


# -- checked from inside the job ---------------------------------------------------------------------------------

def test_a_mismatch_read_back_from_the_ranks_is_an_error():
    from types import SimpleNamespace

    from cpuperf.decide.workload import BatchSplit
    from cpuperf.plan.launch import RankObservation
    from cpuperf.plan.user_script import batch_ran

    dp = DataParallel("trainer", "hf", 8, 1, "yours")
    split = BatchSplit(2, 4, 1, 8, 1, "yours")
    rec = SimpleNamespace(workload=SimpleNamespace(parallel=dp), split=split, levers=SimpleNamespace(world=2))
    argv = ("python", "s.py", "--per_device_train_batch_size", "8", "--per_device_train_batch_size", "4")
    good = [RankObservation(r, 100 + r, world_size=2, argv=argv) for r in (0, 1)]
    ran, mismatch = batch_ran(rec, good)  # type: ignore[arg-type]
    assert mismatch is None and ran is not None and ran.global_batch == 8 and ran.ranks_read == 2
    doubled = [RankObservation(r, 100 + r, world_size=2, argv=argv[:4]) for r in (0, 1)]
    ran, mismatch = batch_ran(rec, doubled)  # type: ignore[arg-type]
    assert ran is not None and ran.global_batch == 16 and mismatch is not None and "the plan 8" in mismatch
    split_world = [RankObservation(0, 1, world_size=2, argv=argv), RankObservation(1, 2, world_size=1, argv=argv)]
    assert batch_ran(rec, split_world)[1] is not None  # type: ignore[arg-type]
    assert batch_ran(rec, [RankObservation(0, 1)]) == (None, None)  # type: ignore[arg-type]  # nothing read back


@pytest.mark.full  # a real two-rank Trainer run on this host
def test_a_real_trainer_run_split_in_two_trains_the_batch_it_had_as_one_process(tmp_path):
    pytest.importorskip("transformers")
    cmd = [sys.executable, str(SCRIPTS / "hf_parser.py"), "--output_dir", str(tmp_path / "o"), "--max_steps", "2",
           "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no"]
    # 2 ranks x 1 thread: the layout `train --tune` chose for this script on a 2-core guest
    proc = run_cli(["train", "--auto", "--json", "--set", "nproc_per_node=2", "--set", "threads_per_rank=1",
                    "--out", str(tmp_path / "run"), "--", *cmd],
                   extra_env={"FIXTURE_OUT_DIR": str(tmp_path)}, timeout=600, process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for seen in ranks:  # each rank's own TrainingArguments and launch environment
        assert seen["hyper"]["per_device_train_batch_size"] == 2 and seen["hyper"]["gradient_accumulation_steps"] == 1
        assert seen["world_size"] == 2
    got = json.loads(proc.stdout)["verification"]["global_batch"]
    assert got == {"world_size": 2, "per_device": 2, "grad_accum": 1, "global_batch": 4, "planned": 4,
                   "ranks_read": 2}, got
    assert "global batch 4 (planned 4" in proc.stderr


# -- the host-class matrix: the property on every class, as a two-socket host -------------------------------------

def _class_tree(root: Path, cls) -> Path:
    from hosts import write

    tree = root / cls.name
    if not tree.exists():
        make_host(tree, sockets=2, cores_per_socket=4, flags=cls.isa or ("avx2", "fma"), vendor=cls.vendor,
                  family=cls.family, model=cls.model, name=f"{cls.what} (recorded, two sockets)")
        if cls.cpuinfo is not None:
            write(tree, "/proc/cpuinfo", cls.cpuinfo(8))
    return tree


@pytest.mark.parametrize("cls", [c for c in __import__("host_classes").CLASSES if c.device == "cpu"],
                         ids=lambda c: c.name)
def test_every_cpu_class_keeps_the_users_global_batch_on_two_sockets(tmp_path_factory, cls):
    tree = _class_tree(tmp_path_factory.getbasetemp() / "classes", cls)
    env = {**NO_GPU, **cls.extra}
    for batch, accum in ((8, None), (1, None), (2, 2)):
        proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree), "--", *_trainer(batch, accum)],
                       extra_env=env, cwd=str(SCRIPTS))
        assert proc.returncode == 0, proc.stderr[-2000:]
        plan = json.loads(proc.stdout)
        assert _trainer_global_batch(plan) == batch * (accum or 1), (cls.name, batch, plan["launch"]["argv"])
        assert plan["launch"]["world_size"] == (1 if batch == 1 else 2), (cls.name, batch)  # split where it keeps
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree), "--", "python", "plain_loop.py"],
                   extra_env=env, cwd=str(SCRIPTS))
    assert proc.returncode == 0 and json.loads(proc.stdout)["launch"]["world_size"] == 1, cls.name
    proc = run_cli(["train", "--auto", "--dry-run", "--json", "--sysroot", str(tree)], extra_env=env)
    plan = json.loads(proc.stdout)
    s = plan["settings"]
    assert s["batch_size"] * s["grad_accum_steps"] * plan["launch"]["world_size"] == plan["workload"]["batch_size"]
