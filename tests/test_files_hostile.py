"""Plan and facts files from elsewhere are data, never code (issue 32): a property test over hand-edited files.

A saved plan (`recommend --save`) and a node's facts (`doctor --save-facts`) are edited as an attacker would:
hostile variable names and values, shell-owned variables, foreign preloads, emptied identities, booleans as
strings, control characters, impossible numbers. For every edit, through the real CLI and real shells: no
command runs (a canary file a hostile value would create stays absent), no library outside what the probe
found is preloaded, no raw control character reaches stdout or stderr, no traceback, and the exit code is the
documented one (2 for bad input; an edit that leaves the file valid runs).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from cli_util import run_cli
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cpuperf.errors import ExitCode

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
SHELL_OWNED = ["PROMPT_COMMAND", "PS0", "PS1", "PS2", "PATH", "PYTHONSTARTUP", "ZDOTDIR", "fish_function_path",
               "fish_user_paths", "BASH_ENV", "ENV", "IFS", "LD_LIBRARY_PATH", "OMP_TOOL_LIBRARIES", "FI_PROVIDER_PATH"]
CODE = ["$(touch {c}/d)", "`touch {c}/b`", "; touch {c}/s #", "'; touch {c}/q; '", "\ntouch {c}/n\n",
        "\\'\ntouch {c}/f\n"]
CONTROLS = ["\x1b[2J", "\x1b]0;pwned\x07", "\x9b31m", "\u2028", "\r", "\x00", "\x7f"]
EVIL_SO = "/tmp/cpuperf-evil/libevil.so"


def _fill(value: Any, canary: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{c}", str(canary))
    if isinstance(value, list):
        return [_fill(v, canary) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, canary) for k, v in value.items()}
    return value


HOSTILE_TEXT = st.lists(st.sampled_from(CODE + CONTROLS + ["x", "2", "0-3"]), min_size=1, max_size=3).map("".join)
PLAIN_NAME = st.sampled_from(["OMP_NUM_THREADS", "KMP_BLOCKTIME", "CCL_WORKER_COUNT", "I_MPI_PIN_DOMAIN", "MALLOC_CONF"])
ENV_NAME = st.one_of(st.sampled_from(SHELL_OWNED), PLAIN_NAME.map(lambda n: n + "\n"),
                     st.tuples(PLAIN_NAME, st.sampled_from(CONTROLS)).map("".join), PLAIN_NAME)

# (edit, must the file be refused?)
PLAN_EDITS = st.one_of(
    st.tuples(st.just("env"), ENV_NAME, st.one_of(HOSTILE_TEXT, st.just("1"))),
    st.tuples(st.just("preload"), st.sampled_from([EVIL_SO, "/tmp/x.so:" + EVIL_SO, "libevil.so", EVIL_SO + "\n"])),
    st.tuples(st.just("identity"), st.sampled_from(["host", "stack", "both", "drop-one"])),
    st.tuples(st.just("bool"), st.sampled_from(["false", "true", 0, 1, None, "yes"])),
    st.tuples(st.just("notes"), HOSTILE_TEXT),
    st.tuples(st.just("made_on"), HOSTILE_TEXT),
    st.tuples(st.just("cpus"), st.lists(st.one_of(st.integers(-5, 5000), st.just("0"), st.just(True)), max_size=3)),
    st.tuples(st.just("threads"), st.one_of(st.integers(-3, 10**6), st.just("2"), st.just(2.5))),
)


def _edit_plan(plan: Dict[str, Any], edit: Tuple[Any, ...]) -> Tuple[Dict[str, Any], bool]:
    """The edited plan and whether it must be refused (None: either way, as long as the output is inert)."""
    plan = copy.deepcopy(plan)
    kind = edit[0]
    if kind == "env":
        name, value = edit[1], edit[2]
        plan["env"] = [e for e in plan["env"] if e["name"] != name] + [
            {"name": name, "value": value, "reason": "", "kind": "set"}]
        plain = re.fullmatch(r"[A-Z_]+", name) is not None and name not in SHELL_OWNED
        return plan, not plain or CONTROL.search(value) is not None or "$" in value or "`" in value
    if kind == "preload":
        plan["env"] = [e for e in plan["env"] if e["name"] != "LD_PRELOAD"] + [
            {"name": "LD_PRELOAD", "value": edit[1], "reason": "", "kind": "prepend"}]
        return plan, True
    if kind == "identity":
        if edit[1] in ("host", "both"):
            plan["host"] = {}
        if edit[1] in ("stack", "both"):
            plan["stack"] = {}
        if edit[1] == "drop-one":
            plan["host"].pop("physical_cores")
        return plan, True
    if kind == "bool":
        plan["oversubscribe"] = edit[1]
        return plan, True
    if kind in ("notes", "made_on"):
        plan[kind] = [edit[1]] if kind == "notes" else edit[1]
        return plan, CONTROL.search(edit[1]) is not None
    slot = plan["placement"]["slots"][0]
    if kind == "cpus":
        slot["cpus"] = slot["compute_cpus"] = edit[1]
        return plan, not edit[1] or any(not isinstance(c, int) or isinstance(c, bool) or c not in _usable(plan)
                                        for c in edit[1])
    slot["threads"] = edit[1]
    return plan, not isinstance(edit[1], int) or not 1 <= edit[1] <= len(_usable(plan))


def _usable(plan: Dict[str, Any]) -> List[int]:
    from cpuperf.probe.parse import parse_cpulist

    return list(parse_cpulist(plan["host"]["usable_cpus"]) or ())


def _inert(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for stream in (proc.stdout, proc.stderr):
        assert CONTROL.search(stream) is None, repr(stream[-500:])


def _eval_everywhere(code: str, tmp: Path) -> None:
    """Evaluate ccl-env's output as users do, in every shell that is installed (interactive bash included)."""
    path = tmp / "env.sh"
    path.write_text(code)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": str(tmp)}
    runs = [["sh", "-c", f'eval "$(cat {path})"'], ["dash", "-c", f'eval "$(cat {path})"'],
            ["zsh", "-f", "-c", f'eval "$(cat {path})"'], ["fish", "--no-config", "-c", f"source {path}"]]
    for argv in runs:
        if shutil.which(argv[0]):
            subprocess.run(argv, env=env, cwd=tmp, capture_output=True, timeout=60)
    subprocess.run(["bash", "--norc", "--noprofile", "-i"], input=f". {path}\ntrue\nexit\n", env=env, cwd=tmp,
                   capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory) -> Dict[str, Any]:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    # planned from the rules alone (a cache of its own): an allocator another test measured into the suite's cache
    # would add LD_PRELOAD to the plan's env, and ISSUE_CASES name env entries by their index
    cache = tmp_path_factory.mktemp("plan-cache")
    proc = run_cli(["recommend", "--save", str(path), "--quiet"], {"CPUPERF_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(path.read_text())


def test_hand_edited_plans_run_nothing_and_get_their_exit_code(saved_plan, tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    evil = Path(EVIL_SO)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(PLAN_EDITS)
    def check(edit: Tuple[Any, ...]) -> None:
        plan, refuse = _edit_plan(saved_plan, _fill(edit, canary))
        path = tmp_path / "edited.json"
        path.write_text(json.dumps(plan))
        for argv in (["ccl-env", "--plan", str(path), "--preload"], ["train", "--plan", str(path), "--dry-run"]):
            proc = run_cli(argv)
            _inert(proc)
            assert proc.returncode in (ExitCode.OK, ExitCode.USAGE), (edit, proc.returncode, proc.stderr[-1000:])
            if refuse:
                assert proc.returncode == ExitCode.USAGE, (edit, argv[0], proc.stdout[-1000:])
            if proc.returncode == ExitCode.USAGE:
                assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")].__len__() == 1
                assert proc.stdout == ""
            else:
                assert EVIL_SO not in proc.stdout and "libevil" not in proc.stdout
                if argv[0] == "ccl-env":
                    _eval_everywhere(proc.stdout, tmp_path)
            assert list(canary.iterdir()) == [], (edit, argv[0])
        assert not evil.with_suffix(".ran").exists()

    check()


def _this_node_facts(tmp: Path) -> Dict[str, Any]:
    path = tmp / "facts.json"
    proc = run_cli(["doctor", "--save-facts", str(path), "--quiet"])
    assert path.exists(), proc.stderr
    return json.loads(path.read_text())


FACT_FIELDS = [("cpu", "model_name"), ("cpu", "microarchitecture"), ("cpu", "vendor"), ("cpu", "isa"),
               ("topology", "physical_cores"), ("topology", "sockets"), ("topology", "cpu_quota"),
               ("memory", "total_bytes"), ("software", "python")]
FACT_VALUES = st.one_of(HOSTILE_TEXT, st.sampled_from(["many", "not.a.version", "avx2", -4, 0, 10**12, 1e30, -1,
                                                       "NaN", ["avx2", 3], {"a": 1}, True, None]))


def test_hand_edited_facts_files_are_refused_in_one_line_or_shown_inert(tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    base = _this_node_facts(tmp_path)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(base["nodes"][0]["name"] + "\n")

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(st.sampled_from(FACT_FIELDS), FACT_VALUES, st.sampled_from(["value", "package", "name"]))
    def check(field: Tuple[str, str], value: Any, where: str) -> None:
        facts = copy.deepcopy(base)
        node = facts["nodes"][0]
        host = node["facts"]["host"]
        value = _fill(value, canary)
        if where == "package" and host.get("software"):
            host["software"]["packages"]["torch"] = {"version": value, "local": None, "build": None, "cuda": None,
                                                     "location": None}
        elif where == "name":
            node["name"] = value
        else:
            host[field[0]][field[1]] = value
        path = tmp_path / "edited.json"
        path.write_text(json.dumps(facts))
        for argv in (["doctor", "--facts", str(path)],
                     ["recommend", "--hostfile", str(hostfile), "--node-facts", str(path)]):
            proc = run_cli(argv)
            _inert(proc)
            assert proc.returncode in (0, ExitCode.USAGE, ExitCode.UNREACHABLE, ExitCode.NODES_DIFFER), \
                (field, value, where, proc.returncode, proc.stderr[-1000:])
            assert "HostFacts" not in proc.stderr and "__init__" not in proc.stderr
            if proc.returncode == ExitCode.USAGE:
                assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]) == 1
        assert list(canary.iterdir()) == []

    check()


@pytest.mark.parametrize("kind", ["fifo", "zero", "big"])
def test_facts_files_are_read_bounded_and_without_blocking(tmp_path, kind):
    import os

    path = str(tmp_path / "facts.json")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path = "/dev/zero"
    else:
        with open(path, "wb") as fh:
            fh.truncate(17 * 1024 * 1024)
    proc = run_cli(["doctor", "--facts", path], timeout=30)
    assert proc.returncode == ExitCode.USAGE and "Traceback" not in proc.stderr
    assert ("FIFO" in proc.stderr) if kind == "fifo" else ("device" in proc.stderr) if kind == "zero" \
        else ("larger than 16 MiB" in proc.stderr)


def test_save_facts_without_a_hostfile_saves_this_node(tmp_path):
    facts = _this_node_facts(tmp_path)
    assert facts["schema"] == "cpuperf.cluster-facts/1" and len(facts["nodes"]) == 1
    assert facts["nodes"][0]["name"] == socket.gethostname().split(".")[0]
    proc = run_cli(["doctor", "--facts", str(tmp_path / "facts.json"), "--json"])
    assert proc.returncode == 0, proc.stderr


ISSUE_CASES = [
    (("env", "CCL_X\n", "touch {c}/nl"), "env[1].name"),
    (("env", "PROMPT_COMMAND", "touch {c}/pc"), "PROMPT_COMMAND"),
    (("env", "fish_function_path", "{c}"), "fish_function_path"),
    (("env", "PATH", "{c}"), "'PATH'"),
    (("env", "MASTER_ADDR", "10.0.0.1"), "belongs to each launch"),
    (("preload", EVIL_SO), "LD_PRELOAD"),
    (("identity", "both"), "host.arch is missing"),
    (("bool", "false"), "oversubscribe must be true or false"),
    (("notes", "\x1b]0;pwned\x07\x1b[2Jhello"), "notes[0]"),
    (("cpus", [57, 1000]), "CPU 57 is not one of host.usable_cpus"),
]


@pytest.mark.parametrize("edit,named", ISSUE_CASES, ids=[c[0][0] + "-" + str(i) for i, c in enumerate(ISSUE_CASES)])
def test_the_issue_cases_are_refused_naming_the_field(saved_plan, tmp_path, edit, named):
    canary = tmp_path / "canary"
    canary.mkdir()
    plan, refuse = _edit_plan(saved_plan, _fill(edit, canary))
    assert refuse or edit[1] == "MASTER_ADDR"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    for argv in (["ccl-env", "--plan", str(path), "--preload"], ["train", "--plan", str(path), "--dry-run"]):
        proc = run_cli(argv)
        _inert(proc)
        assert proc.returncode == ExitCode.USAGE, (argv, proc.stdout[-500:])
        assert named in proc.stderr.splitlines()[0], proc.stderr
    assert list(canary.iterdir()) == []


def test_a_plan_that_differs_from_a_fresh_one_says_so_and_runs_as_saved(saved_plan, tmp_path):
    plan = copy.deepcopy(saved_plan)
    threads = plan["placement"]["slots"][0]["threads"]
    if threads < 2:
        pytest.skip("needs a host with 2 usable CPUs or more")
    for d in plan["decisions"]:
        if d["id"] == "threads_per_rank":
            d["value"] = 1
    plan["placement"]["slots"][0]["threads"] = 1
    plan["env"] = [{**e, "value": "1"} if e["name"] == "OMP_NUM_THREADS" else e for e in plan["env"]]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    cache = {"CPUPERF_CACHE_DIR": str(tmp_path / "cache")}
    said = "the plan differs from what cpuperf decides here: threads_per_rank"
    stderrs = []
    for _ in range(2):  # the second time from the remembered comparison (ccl-env runs in every new shell)
        proc = run_cli(["ccl-env", "--plan", str(path), "--json"], cache)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["env"]["OMP_NUM_THREADS"] == "1"  # what the plan says, never more
        assert any(d.startswith("threads_per_rank: the plan says 1") for d in out["plan_differences"])
        assert any(d.startswith("env OMP_NUM_THREADS: the plan sets 1") for d in out["plan_differences"])
        stderrs.append(proc.stderr)
    assert len(list((tmp_path / "cache" / "plan-checks").iterdir())) == 1
    # ccl-env's notes are said the first time they hold, not in every new shell (run/said.py); the JSON carries
    # the differences every time, and --explain says them again
    assert said in stderrs[0]
    assert said not in stderrs[1]
    proc = run_cli(["ccl-env", "--plan", str(path), "--json", "--explain"], cache)
    assert proc.returncode == 0, proc.stderr
    assert said in proc.stderr
    proc = run_cli(["train", "--plan", str(path), "--dry-run", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert any("threads_per_rank: the plan says 1" in n for n in out["notes"])
    assert out["launch"]["env"]["OMP_NUM_THREADS"] == "1"
    unchanged = tmp_path / "same.json"
    unchanged.write_text(json.dumps(saved_plan))
    proc = run_cli(["ccl-env", "--plan", str(unchanged), "--json"])
    assert json.loads(proc.stdout)["plan_differences"] == []


def test_the_plan_schema_knows_every_identity_field_the_plan_writes():
    from cpuperf.plan import saved
    from cpuperf.probe import probe_host

    facts = probe_host()
    assert tuple(saved.host_identity(facts)) == saved._HOST_FIELDS
    assert set(saved.stack_identity(facts)) <= {"python", *saved.STACK_PACKAGES}


@pytest.mark.parametrize("path,value,named", [
    (("topology", "physical_cores"), "many", "physical_cores must be a whole number"),
    (("topology", "physical_cores"), -4, "physical_cores must be in 1.."),
    (("topology", "physical_cores"), 10**12, "physical_cores must be in 1.."),
    (("memory", "total_bytes"), -1, "total_bytes must be in 1.."),
    (("memory", "total_bytes"), 1e30, "total_bytes must be a whole number"),
    (("cpu", "isa"), "avx2", "isa must be a list"),
    (("software", "python"), "not.a.version", "python is not a Python version"),
    (("topology", "cpu_quota"), float("nan"), "cpu_quota must be a finite number"),
])
def test_facts_fields_are_typed_and_ranged(path, value, named):
    from cpuperf.probe import probe_host
    from cpuperf.probe.facts_schema import FactsError, check_host

    data = json.loads(json.dumps(probe_host().to_json()))
    check_host(data)
    data[path[0]][path[1]] = value
    with pytest.raises(FactsError, match=re.escape(named)):
        check_host(data)
