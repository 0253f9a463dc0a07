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
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from cli_util import run_in_process
from host_classes import CLASSES, TRAINER_SCRIPT, HostClass, planning_env
from levers_util import levers

from cpuperf.knowledge.knobs import DECISION_IDS
from cpuperf.plan.applied import PLAIN, RankView, RenderedJob, lever_report, split

PATHS: Dict[str, List[str]] = {
    "builtin": ["--auto"],
    "builtin-plain": [],
    "trainer": ["--auto", "--", "python", "train.py", "--output_dir", "o"],
    "torchrun": ["--auto", "--", "torchrun", "--nproc-per-node", "2", "train.py", "--output_dir", "o"],
    "accelerate": ["--auto", "--", "accelerate", "launch", "--num_processes", "2", "train.py", "--output_dir", "o"],
    "mpirun": ["--auto", "--", "mpirun", "-np", "2", "python", "train.py", "--output_dir", "o"],
    "trainer-plain": ["--", "python", "train.py", "--output_dir", "o"],
}


def _dry_run(cls: HostClass, path: str, root: Path) -> Tuple[int, Dict[str, Any], str]:
    tree = cls.tree(root / f"tree-{cls.name}")
    options = PATHS[path]
    script = options[options.index("--"):] if "--" in options else []
    args = ["train", "--dry-run", "--json", *options[:len(options) - len(script)], "--sysroot", str(tree), *script]
    # in-process (tests/cli_util.py): the same entry point, environment and directory as test_plan_golden's children
    proc = run_in_process(args, planning_env(cls, root), cwd=str(root / "run"))
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else {}), proc.stderr


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> Dict[Tuple[str, str], Tuple[int, Dict[str, Any], str]]:
    root = tmp_path_factory.mktemp("levers")
    for sub in ("run", "home"):
        (root / sub).mkdir()
    (root / "run" / "train.py").write_text(TRAINER_SCRIPT)
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
    elif how.startswith("env LD_PRELOAD"):
        assert value in launch["env"]["LD_PRELOAD"], item
    elif "rank(s) per node" in how:
        assert launch["nproc_per_node"] == value, item
    elif "node(s)" in how:
        assert launch["nnodes"] == value, item


@pytest.mark.parametrize("cls", CLASSES, ids=[c.name for c in CLASSES])
def test_every_decided_lever_is_applied_or_listed_with_a_reason(dry_runs, cls: HostClass):
    for path in PATHS:
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


# -- the pure function ---------------------------------------------------------------------------------

JOBS = {
    "builtin": RenderedJob(auto=True, nproc_per_node=1, nnodes=1, env={"OMP_NUM_THREADS": "4"},
                           ranks=(RankView((0, 1, 2, 3), 4),), settings={"dtype": "bf16", "device": "cpu"}),
    "script": RenderedJob(auto=True, nproc_per_node=2, nnodes=1, env={}, ranks=(RankView((), 2), RankView((), 2)),
                          flags=(("--use_cpu",), ("--bf16",)), flags_left=(("--optim", "the Trainer's default"),)),
    "plain": RenderedJob(auto=False, nproc_per_node=1, nnodes=1, env={}, ranks=(RankView((), None),),
                         settings={"dtype": "fp32"}),
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
