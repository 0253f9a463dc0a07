"""The one table of process-environment variables (compat/variables.toml, issue 41 item 1).

Each row says which runtime reads the variable, the lever it carries, its type and range, whether a plan may set
it, whether it makes a runtime write files or load code, and its source. The code reads the table; the scan below
fails on any other list of these names (a tuple, list, set or dict of them, a prefix test) in cpuperf/ or in
another compat/ file, so a variable added to one list and not the others cannot happen again.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from cpuperf.data import load_builtin
from cpuperf.decide.records import Levers
from cpuperf.errors import BadDataError
from cpuperf.knowledge.knobs import RULED_IDS
from cpuperf.knowledge.variables import TYPES, parse, value_problem, variables
from cpuperf.plan.saved import env_name_problem, env_value_problem

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "cpuperf"
TABLE = variables()


def test_every_row_has_a_lever_of_the_record_a_known_type_and_a_source():
    levers = {f.name for f in dataclasses.fields(Levers) if f.name != "ruled"} | set(RULED_IDS)
    assert len(TABLE.rows) >= 40 and len(TABLE.families) >= 8
    for row in (*TABLE.rows.values(), *TABLE.families):
        assert row.lever is None or row.lever in levers, row
        assert row.source.count("http") >= 1, row
    for row in TABLE.rows.values():
        assert row.type in TYPES and row.reason, row
        assert not (row.plan and row.writes_files and not row.file_options), row  # the loader refuses it too


def _raw() -> dict:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in load_builtin("variables.toml").items()}


@pytest.mark.parametrize("change, message", [
    (lambda r: r["variable"][0].update(type="integer"), "is not one of threads"),
    (lambda r: r["variable"][0].update(lever="speed"), "is not a lever"),
    (lambda r: r["variable"][0].update(source="the docs"), "cite the documentation by its address"),
    (lambda r: (r["variable"][0].pop("min"), r["variable"][0].pop("max")), "needs its range"),
    (lambda r: r["variable"][0].pop("min"), "both or neither"),
    (lambda r: r["variable"][0].update(plan="yes"), "must be true or false"),
    (lambda r: r["variable"].append(dict(r["variable"][0])), "has a row already"),
    (lambda r: r["variable"].append({**r["variable"][0], "name": "X_DUMP", "writes_files": True}),
     "never a plan's"),
    (lambda r: r["variable"][0].update(colour="red"), "unknown key 'colour'"),
    (lambda r: r["family"][0].update(prefix="omp"), "a name like"),
    (lambda r: r.update(schema="cpuperf.variables/0"), "schema"),
])
def test_a_bad_row_is_refused_at_load_naming_it(change, message):
    raw = _raw()
    raw["variable"] = [dict(v) for v in raw["variable"]]
    raw["family"] = [dict(f) for f in raw["family"]]
    change(raw)
    with pytest.raises(BadDataError, match=message):
        parse(raw)


# -- a plan carries what the table says, typed as it says ---------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TABLE.rows))
def test_each_row_decides_whether_a_plan_may_carry_it(name):
    row = TABLE.rows[name]
    problem = env_name_problem(name)
    if row.plan and not row.launch:
        assert problem is None
    else:
        assert problem is not None
        if row.launch:
            assert "each launch" in problem
        elif row.writes_files:
            assert "file" in problem and row.reason in problem
        elif row.loads_code:
            assert "loads code" in problem


@pytest.mark.parametrize("family", [f.prefix for f in TABLE.families])
def test_a_family_takes_tuning_names_and_refuses_names_of_files(family):
    assert env_name_problem(family + "SOME_KNOB") is None
    assert env_value_problem(family + "SOME_KNOB", "ofi,2") is None
    assert env_value_problem(family + "SOME_KNOB", "/tmp/x") is not None  # a value naming a file
    for part in TABLE.refused_parts:
        assert env_name_problem(f"{family}X_{part}") is not None


@pytest.mark.parametrize("name, good, bad", [
    ("OMP_NUM_THREADS", "4,2", "0"), ("OMP_NUM_THREADS", "56", "100000"), ("CCL_WORKER_COUNT", "2", "two"),
    ("CCL_WORKER_AFFINITY", "0,1,4-7", "0-"), ("KMP_BLOCKTIME", "200ms", "soon"), ("MASTER_PORT", "29500", "70000"),
    ("MASTER_ADDR", "node-1", "no host!"), ("GLOO_SOCKET_IFNAME", "eth0", "an-interface-name-too-long"),
    ("MALLOC_CONF", "oversize_threshold:1,background_thread:true", "dirty decay"),
])
def test_values_are_checked_by_the_rows_type_and_range(name, good, bad):
    assert value_problem(name, good) is None
    assert value_problem(name, bad) is not None


def test_options_that_write_files_are_refused_in_a_plan():
    assert env_value_problem("MALLOC_CONF", "background_thread:true") is None
    problem = env_value_problem("MALLOC_CONF", "background_thread:true,prof:true")
    assert problem is not None and "prof" in problem and "write files" in problem
    assert env_value_problem("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2") is None
    assert env_value_problem("LD_PRELOAD", "libjemalloc.so") is not None


# -- no other list of these names --------------------------------------------------------------------------------

NAMES = set(TABLE.rows)
PREFIXES = {f.prefix for f in TABLE.families}


# Lists that hold a name of the table for another reason, each with why.
ELSEWHERE = {
    # what would redirect pip in its child (pipx drops the same): pip's and Python's, not a job's runtime
    ("plan/install.py", "PYTHONPATH"),
    # the worker's own env:// rendezvous, built with its values from the rank's record (RANK .. MASTER_PORT)
    ("train/dist_env.py", "MASTER_PORT"),
    # an argv (-genv NAME VALUE) that sets one variable, not a list of them
    ("plan/launch.py", "I_MPI_PIN"),
    # the metavars of the options that name a path (--python PATH), not variables (cli.PATH_METAVARS)
    ("cli.py", "PATH"),
}


def _is_ours(text: str) -> bool:
    return text in NAMES or text in PREFIXES


def _strings(node: ast.AST) -> List[str]:
    elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _lists_of_names(tree: ast.AST) -> Iterator[Tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            found = [s for s in _strings(node) if _is_ours(s)]
            if len(found) >= 2 or found and len(_strings(node)) >= 2:
                yield node.lineno, ", ".join(found)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "startswith" and node.args:
            arg = node.args[0]
            texts = _strings(arg) if isinstance(arg, ast.Tuple) else (
                [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else [])
            found = [t for t in texts if t in PREFIXES or t in NAMES]
            if found:
                yield node.lineno, "prefix test " + ", ".join(found)


def test_no_other_list_of_variable_names_in_the_code():
    """A tuple/list/set/dict holding a name or family of the table beside other strings, or a prefix test on a
    family, is a second list of variables: read the table (cpuperf.knowledge.variables) instead."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = str(path.relative_to(PKG))
        found += [f"{module}:{line}: {what}" for line, what in _lists_of_names(tree) if (module, what) not in ELSEWHERE]
    assert found == []


def _toml_lists(obj: object, where: str) -> Iterator[Tuple[str, List[str]]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _toml_lists(value, f"{where}.{key}")
    elif isinstance(obj, list):
        texts = [v for v in obj if isinstance(v, str)]
        if texts:
            yield where, texts
        for i, value in enumerate(obj):
            if isinstance(value, (dict, list)):
                yield from _toml_lists(value, f"{where}[{i}]")


def test_no_other_compat_file_lists_these_variables():
    found = []
    for path in sorted((ROOT / "compat").glob("*.toml")):
        if path.name == "variables.toml":
            continue
        for where, texts in _toml_lists(load_builtin(path.name), path.name):
            ours = [t for t in texts if _is_ours(t)]
            if ours:
                found.append(f"{where}: {', '.join(ours)}")
    assert found == []


def test_the_scan_sees_a_list_of_variables():
    """The scan above can fail: the lists this table replaced, written the old way, are each found."""
    old = ('PLACEMENT_VARS = ("OMP_NUM_THREADS", "KMP_AFFINITY")\n'
           'keep = {"LD_PRELOAD", "MALLOC_CONF"}\n'
           'x = [n for n in names if n.startswith(("MASTER_", "GLOO_"))]\n'
           'y = {k: v for k, v in env.items() if not k.startswith("MASTER_")}\n'
           'z = ("OMP_NUM_THREADS", "a reason")\n')
    lines = {line for line, _ in _lists_of_names(ast.parse(old))}
    assert lines == {1, 2, 3, 4, 5}


def test_each_arm_lever_names_a_row_of_the_table():
    """compat/tuning.toml's [[arm_lever]] rows carry their lever's variable: each one is a row here, a plan may set
    those cpuperf applies, and the inference-only one it never sets is refused in a plan."""
    for lever in load_builtin("tuning.toml")["arm_lever"]:
        row = TABLE.row(lever["env"])
        assert row is not None, lever["env"]
        assert row.plan == lever.get("training", True), row
        assert value_problem(row.name, str(lever["value"])) is None
