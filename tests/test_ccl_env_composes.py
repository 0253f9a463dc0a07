"""The first hour's commands compose: `eval "$(cpuperf ccl-env)"`, then `cpuperf train --auto`.

ccl-env marks what it exports as cpuperf's own (CPUPERF_CCL_ENV: each variable it set, with a digest of its value),
so a later cpuperf plans those variables again instead of keeping them as the user's: the plan after the eval is
the plan without it, in every shell ccl-env writes for (real shells evaluate its output, then run `train --dry-run
--json`). A variable the user changes after the eval is the user's again. Every "kept" or "applied" thread line of
a real 2-rank run is what the ranks ran, read back from them. And a layout of the user's own that `train --tune`
measured slower than cpuperf's plan for the same script is said, with both figures; nothing is said without them.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from cli_util import cli_env, run_cli
from levers_util import levers

from cpuperf.boundary import CCL_ENV_MARKER
from cpuperf.decide.runtime_env import ours_in, ours_marker, users_own
from cpuperf.plan.applied import RankView, RenderedJob, lever_report
from cpuperf.plan.layout_note import slower_layout
from cpuperf.plan.request import PlanRequest, with_command

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
# How each shell reads ccl-env's output, as docs/commands.md says.
SHELLS = {"sh": ("dash", "-c", 'eval "$({ccl} --shell sh)"; {then}'),
          "bash": ("bash", "--norc", "--noprofile", "-c", 'eval "$({ccl} --shell bash)"; {then}'),
          "zsh": ("zsh", "-f", "-c", 'eval "$({ccl} --shell zsh)"; {then}'),
          "fish": ("fish", "--no-config", "-c", "{ccl} --shell fish | source; {then}")}
COMPARED = ("launch", "levers", "decisions", "notes", "applied", "settings")


def _env(tmp: Path, **extra: str) -> Dict[str, str]:
    env = cli_env({"CPUPERF_CACHE_DIR": str(tmp / "cache"), "HOME": str(tmp), **extra})
    env["PYTHONPATH"] = str(ROOT) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", CCL_ENV_MARKER):
        env.pop(name, None)
    return env


def _cpuperf() -> str:
    return f"{shlex.quote(sys.executable)} -m cpuperf"


def _in_shell(shell: str, then: str, env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    *argv, body = SHELLS[shell]
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    line = body.format(ccl=f"{_cpuperf()} ccl-env", then=then)
    return subprocess.run([*argv, line], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _plan(out: str) -> Dict[str, Any]:
    plan = json.loads(out)
    return {k: plan.get(k) for k in COMPARED}


TRAIN = {"torchrun": ["--", "torchrun", "--nproc-per-node", "2", "plain_loop.py", "--steps", "2"],
         "builtin": ["--nproc-per-node", "2"]}


@pytest.mark.parametrize("shell", SHELLS)
def test_after_the_eval_train_plans_as_without_it_in_every_shell(shell, tmp_path):
    env = _env(tmp_path)
    for kind, args in TRAIN.items():
        train = ["train", "--auto", "--dry-run", "--json", "--out", str(tmp_path / "run"), *args]
        alone = subprocess.run([sys.executable, "-m", "cpuperf", *train], env=env, cwd=SCRIPTS, capture_output=True,
                               text=True, timeout=300)
        assert alone.returncode == 0, alone.stderr
        probe = f"env > {shlex.quote(str(tmp_path / 'env.txt'))}; {_cpuperf()} {shlex.join(train)}"
        after = _in_shell(shell, probe, env, SCRIPTS)
        assert after.returncode == 0, after.stderr
        seen = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines() if "=" in line)
        # the shell has what ccl-env exported, marker included, and train plans as if it had none of it
        assert seen.get("OMP_NUM_THREADS") and seen.get(CCL_ENV_MARKER), (shell, seen.get(CCL_ENV_MARKER))
        assert set(ours_in(seen)) >= {"OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT"}
        assert _plan(after.stdout) == _plan(alone.stdout), (shell, kind)
        assert "kept your OMP_NUM_THREADS" not in after.stdout + after.stderr


def test_a_variable_changed_after_the_eval_is_yours_again(tmp_path):
    env = _env(tmp_path)
    train = ["train", "--auto", "--dry-run", "--json", "--out", str(tmp_path / "run"), *TRAIN["torchrun"]]
    out = _in_shell("bash", f"export OMP_NUM_THREADS=3; {_cpuperf()} {shlex.join(train)}", env, SCRIPTS)
    assert out.returncode == 0, out.stderr
    notes = " ".join(json.loads(out.stdout)["notes"] + json.loads(out.stdout)["launch"]["notes"])
    assert "your OMP_NUM_THREADS=3" in notes, notes
    # the others ccl-env set still hold its values: still cpuperf's
    again = _in_shell("bash", f"export OMP_NUM_THREADS=3; {_cpuperf()} ccl-env --json", env, SCRIPTS)
    report = json.loads(again.stdout)
    assert [k["name"] for k in report["kept"]] == ["OMP_NUM_THREADS"]
    assert "OMP_NUM_THREADS" not in report["cpuperf_set"]["names"]
    assert {"MASTER_ADDR", "MASTER_PORT"} <= set(report["cpuperf_set"]["names"])


def test_ccl_env_after_itself_replaces_its_own_values_and_json_names_them(tmp_path):
    env = _env(tmp_path)
    out = _in_shell("bash", f"{_cpuperf()} ccl-env --nproc-per-node 2 --json", env, SCRIPTS)
    report = json.loads(out.stdout)
    assert report["kept"] == [], report["kept"]  # its own earlier exports are not kept as yours
    marker = report["env"][CCL_ENV_MARKER]
    assert report["cpuperf_set"] == {"variable": CCL_ENV_MARKER, "names": list(ours_in(report["env"]))}
    assert marker == ours_marker({n: report["env"][n] for n in report["cpuperf_set"]["names"]})
    dotenv = run_cli(["ccl-env", "--shell", "dotenv"], {"CPUPERF_CACHE_DIR": str(tmp_path / "cache")})
    assert re.search(rf"^{CCL_ENV_MARKER}=[A-Za-z0-9_:,]+$", dotenv.stdout, re.M), dotenv.stdout


def test_the_marker_names_only_values_that_still_hold():
    env = {"OMP_NUM_THREADS": "2", "MASTER_PORT": "29500", "CCL_X": "a,b:c"}
    env[CCL_ENV_MARKER] = ours_marker(env)
    assert ours_in(env) == {"OMP_NUM_THREADS": "2", "MASTER_PORT": "29500", "CCL_X": "a,b:c"}
    assert users_own(env) == {}
    changed = {**env, "OMP_NUM_THREADS": "4"}
    assert users_own(changed) == {"OMP_NUM_THREADS": "4"}
    unset = {k: v for k, v in env.items() if k != "MASTER_PORT"}
    assert "MASTER_PORT" not in ours_in(unset)
    for bad in ("", "junk", "OMP_NUM_THREADS", "OMP_NUM_THREADS:", f"{CCL_ENV_MARKER}:x", "1X:abc,,:"):
        assert ours_in({"OMP_NUM_THREADS": "2", CCL_ENV_MARKER: bad}) == {}


# -- kept and applied lines are what the ranks ran ----------------------------------------------------------------

def test_the_thread_lever_is_held_to_the_read_back():
    decided = levers({"threads_per_rank": 1, "nproc_per_node": 2})
    job = RenderedJob(auto=True, nproc_per_node=2, nnodes=1, env={"OMP_NUM_THREADS": "2"},
                      ranks=(RankView((), 1), RankView((), 1)))
    state = {s.id: s for s in lever_report(decided, job)}["threads_per_rank"]
    assert state.applied and "OMP_NUM_THREADS=1" in state.how  # each rank's own count, not the environment's 2
    ran = RenderedJob(**{**job.__dict__, "ran_threads": ("2", "2")})
    state = {s.id: s for s in lever_report(decided, ran)}["threads_per_rank"]
    assert not state.applied and "ran OMP_NUM_THREADS=2 (read back)" in state.how
    kept = RenderedJob(auto=True, nproc_per_node=2, nnodes=1, env={"OMP_NUM_THREADS": "2"},
                       ranks=(RankView((), None), RankView((), None)), ran_threads=("1", "1"))
    state = {s.id: s for s in lever_report(decided, kept)}["threads_per_rank"]
    assert "your OMP_NUM_THREADS=2" not in state.how and "OMP_NUM_THREADS=1 (read back)" in state.how


def _said_counts(text: str) -> List[str]:
    """Every thread count a kept/applied line claims for the ranks."""
    claims = []
    for line in text.splitlines():
        if line.startswith("applied: rank ") or line.startswith("applied: env OMP_NUM_THREADS="):
            claims += re.findall(r"OMP_NUM_THREADS=(\d+)", line)
        if line.startswith("lever applied: threads_per_rank="):
            claims.append(line.split("=", 1)[1].split(" ", 1)[0])
        if line.startswith("note: kept your OMP_NUM_THREADS="):
            claims += re.findall(r"OMP_NUM_THREADS='?(\d+)", line)
    return claims


def _ran(out_dir: Path) -> List[Optional[str]]:
    return [json.loads(p.read_text())["omp_num_threads"] for p in sorted(out_dir.glob("rank*.json"))]


@pytest.mark.parametrize("how", ["yours", "ccl-env"])
def test_a_real_two_rank_run_says_only_what_the_ranks_ran(how, tmp_path):
    """`OMP_NUM_THREADS=N train --auto --nproc-per-node 2 -- python plain_loop.py`: the per-rank step starts each rank
    with the plan's count, so the user's N, kept in the environment, is said not to be what runs; after
    `eval "$(cpuperf ccl-env)"` the run is the run without it. Each rank writes what it ran (FIXTURE_OUT_DIR)."""
    env = _env(tmp_path)
    args = ["train", "--auto", "--nproc-per-node", "2", "--", sys.executable, "plain_loop.py", "--steps", "2"]
    dry = subprocess.run([sys.executable, "-m", "cpuperf", *args[:2], "--dry-run", "--json", *args[2:]], env=env,
                         cwd=SCRIPTS, capture_output=True, text=True, timeout=300)
    planned = {r["threads"] for r in json.loads(dry.stdout)["launch"]["per_rank"]}
    assert len(planned) == 1 and None not in planned, planned
    count = planned.pop()
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    # -v: the full report before the job (the kept and applied lines); --json: the levers after it, read back
    run = [*args[:2], "-v", "--json", "--out", str(tmp_path / "run"), *args[2:]]
    line = f"{_cpuperf()} {shlex.join(run)}"
    if how == "yours":
        line = f"export OMP_NUM_THREADS={count + 1}; {line}"
    else:
        line = f'eval "$({_cpuperf()} ccl-env)"; {line}'
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", line], env={**env, "FIXTURE_OUT_DIR": str(ranks)},
                          cwd=SCRIPTS, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = _ran(ranks)
    assert ran == [str(count), str(count)], ran
    claims = _said_counts(done.stderr)
    assert claims and set(claims) == {str(count)}, (claims, done.stderr[-3000:])
    levers = json.loads(done.stdout)["levers"]
    threads = [lv for lv in levers["applied"] if lv["id"] == "threads_per_rank"]
    assert threads and threads[0]["value"] == count and "read back: every rank ran it" in threads[0]["how"], levers
    if how == "yours":
        assert f"your OMP_NUM_THREADS='{count + 1}' is not what the ranks run" in done.stderr, done.stderr[-3000:]
        assert f"not applied: env OMP_NUM_THREADS={count + 1} (each rank is started with" in done.stderr


# -- a slower layout of your own, said with the figures ---------------------------------------------------------

def _entry(rate: float, ranks: int, threads: int, noise: float = 0.02) -> Dict[str, Any]:
    point = {"dtype": "fp32", "allocator": None, "optimizer": None, "ranks": ranks, "threads": threads,
             "pinned": False, "compile": False}
    return {"best": point, "start": point, "best_samples_per_s": rate, "start_samples_per_s": rate, "noise": noise,
            "levers": {}, "stopped": "converged", "elapsed_s": 60.0, "rounds": 1, "runs": 5,
            "measured_at": int(time.time()), "budget_s": 300.0, "skipped": {}, "steps": 20}


def _keys(argv: List[str]) -> str:
    from cpuperf.plan.script_read import read_user_script
    from cpuperf.plan.user_script import key_of_command
    from cpuperf.probe.launchers import read_script

    cmd = with_command(PlanRequest(auto=True, user_argv=tuple(argv))).command
    assert cmd is not None
    text = read_script(cmd.script.script)
    return key_of_command(cmd.script, read_user_script(cmd.script, text), text)


YOURS = ["torchrun", "--nproc-per-node", "2", str(SCRIPTS / "hf_parser.py"), "--output_dir", "o"]
PLAN = ["python", str(SCRIPTS / "hf_parser.py"), "--output_dir", "o"]


def _note(tuned: Dict[str, Dict[str, Any]]) -> Optional[str]:
    from cpuperf.plan.script_read import read_user_script
    from cpuperf.probe.launchers import read_script

    cmd = with_command(PlanRequest(auto=True, user_argv=tuple(YOURS))).command
    assert cmd is not None
    text = read_script(cmd.script.script)
    return slower_layout(cmd, read_user_script(cmd.script, text), text, tuned, (sys.executable, "python"))


def test_a_slower_layout_of_yours_is_said_only_from_two_measurements():
    yours, plan = _keys(YOURS), _keys(PLAN)
    note = _note({yours: _entry(106.0, 2, 1), plan: _entry(285.0, 1, 2)})
    assert note is not None and "106.0 samples/s" in note and "285.0 samples/s" in note and "2.7x" in note, note
    assert f"`cpuperf train --auto -- python {SCRIPTS / 'hf_parser.py'} --output_dir o` runs the plan" in note
    assert _note({yours: _entry(106.0, 2, 1)}) is None  # the plan not measured: no figure invented
    assert _note({plan: _entry(285.0, 1, 2)}) is None  # yours not measured
    assert _note({yours: _entry(106.0, 2, 1), plan: _entry(110.0, 1, 2)}) is None  # within the margin
    assert _note({yours: _entry(100.0, 2, 1, 0.2), plan: _entry(130.0, 1, 2, 0.2)}) is None  # within the noise
    assert _note({yours: _entry(106.0, 2, 1), plan: _entry(285.0, 2, 1)}) is None  # the same layout


def test_train_says_the_slower_layout_from_the_cache(tmp_path):
    """The figures come from the measurement cache `train --tune` writes (run.measure.save_tuned)."""
    cache = tmp_path / "cache"
    env = _env(tmp_path)
    script = (
        "import sys, json\nfrom cpuperf.probe import probe_host\nfrom cpuperf.run import measure\n"
        "facts = probe_host()\nfor key, entry in json.loads(sys.argv[1]).items():\n"
        "    measure.save_tuned(facts, 'tuned_by_command', key, entry)\n")
    seeds = {_keys(YOURS): _entry(106.0, 2, 1), _keys(PLAN): _entry(285.0, 1, 2)}
    subprocess.run([sys.executable, "-c", script, json.dumps(seeds)], env=env, check=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "cpuperf", "train", "--auto", "--dry-run", "--json", "--out",
                          str(tmp_path / "run"), "--", *YOURS], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    notes = [n for n in json.loads(out.stdout)["notes"] if "trained" in n and "samples/s" in n]
    assert len(notes) == 1 and "2.7x as fast" in notes[0], notes
    assert cache.exists()
