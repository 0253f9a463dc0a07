"""The typed decision record (issue 41): every lever one typed attribute, one owner, never read by string key.

`Levers` (cpuperf/decide/records.py) is the vocabulary's decided knobs as fields, in the vocabulary's order, each
value typed by the same closed set the knob declares; the planner, the renderers and the edges read a lever as an
attribute. A lever read by its id as a string (`rec.chosen["dtype"]`, `rec.get("dtype")`, `"dtype" in ...`) is a
second vocabulary that nothing checks: the source scan below fails on one.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import List, Optional, Tuple, Union, get_args, get_origin, get_type_hints

import pytest

from cpuperf.decide import records
from cpuperf.decide.records import Constraints, Decision, Levers, levers_of
from cpuperf.knowledge.knobs import BY_ID, DECISION_IDS

PKG = Path(__file__).resolve().parent.parent / "cpuperf"
LAYERS = ("decide", "plan", "render", "run")

# Mappings whose keys happen to spell a lever's id but are not the plan's levers (compat/tuning.toml's sections are
# typed records now: cpuperf.knowledge.tuning): a saved plan's inputs and placement JSON, a tuned
# point's schema (the knob table's choices), the add-on package names, the worker's settings
# being written, the install resolution's IPEX wheel, a cached torch.compile measurement (its dtype), the knob
# table's dtype choices. (module, the receiver's source text).
NOT_LEVERS = {
    ("decide/tune.py", "data"), ("plan/install.py", "data"),
    ("plan/environment.py", "p"), ("plan/environment.py", "raw"), ("plan/saved.py", "data"), ("plan/saved.py", "i"),
    ("decide/measurement_schema.py", "BY_ID"), ("render/compat.py", "PIP_NAME"),
    ("plan/request.py", "decided"), ("plan/install.py", "resolution"), ("decide/recommend.py", "entry"),
    ("decide/recommend.py", "BY_ID"),
}


def _value_type(field_type: object) -> object:
    """Decision[X] -> X."""
    (inner,) = get_args(field_type)
    return inner


def _literals(kind: object) -> Tuple[object, ...]:
    """The values a lever's type allows, None included where it is Optional; () for bool, int and dict."""
    if get_origin(kind) is Union:
        return tuple(v for arg in get_args(kind) for v in (_literals(arg) if arg is not type(None) else (None,)))
    return get_args(kind) if get_origin(kind) is not None and get_origin(kind).__name__ == "Literal" else ()


# The levers with a field of their own; a knob row that names its `rule` is a lever of the generic path (Levers.ruled).
TYPED = tuple(i for i in DECISION_IDS if not BY_ID[i].rule)


def test_levers_are_the_decided_knobs_in_the_vocabulary_order():
    assert tuple(f.name for f in dataclasses.fields(Levers) if f.name != "ruled") == TYPED
    assert tuple(f.name for f in dataclasses.fields(Constraints) if f.name not in ("ruled", "options")) == TYPED


def test_the_generic_levers_keep_the_vocabulary_order_and_their_own_ids():
    base = {n: Decision(n, None, "r") for n in TYPED}
    levers = Levers(**base)
    assert tuple(d.id for d in levers.all()) == TYPED
    with pytest.raises(ValueError, match="not the ruled knobs"):
        Levers(**base, ruled=(Decision("dtype", "fp32", "r"),))


def test_launch_options_are_pins_by_their_knob_row_never_decisions():
    from cpuperf.decide.recommend import user_constraints
    from cpuperf.knowledge.knobs import OPTION_IDS

    assert OPTION_IDS == ("oversubscribe", "numa_memory")
    fixed = records.constraints_of(user_constraints({"numa_memory": "none", "oversubscribe": "true", "dtype": "bf16"}))
    assert fixed.oversubscribe and fixed.options["numa_memory"].value is None and fixed.pinned() == ("dtype",)
    assert records.Constraints().under(fixed).options == fixed.options


@pytest.mark.parametrize("lever", TYPED)
def test_each_lever_type_is_its_knobs_closed_set(lever):
    hints = get_type_hints(Levers, vars(records))
    kind = _value_type(hints[lever])
    knob = BY_ID[lever]
    if knob.kind == "choice":
        allowed = set(_literals(kind))
        if knob.id == "zero":  # a DeepSpeed config or none: only none can be set
            assert type(None) in get_args(kind)
        else:
            assert allowed == set(knob.choices), (lever, allowed, knob.choices)
    else:
        base = {"bool": bool, "int": int}[knob.kind]
        assert kind is base, (lever, kind)


def test_a_record_holds_each_lever_under_its_own_name():
    base = {n: Decision(n, None, "r") for n in TYPED}
    with pytest.raises(ValueError, match="the dtype lever holds the decision 'device'"):
        Levers(**{**base, "dtype": Decision("device", "cpu", "r")})
    with pytest.raises(ValueError, match="decisions lack zero"):
        levers_of([d for n, d in base.items() if n != "zero"])


def _receiver(node: ast.AST) -> Optional[Tuple[ast.AST, str]]:
    """(the mapping read, the lever id) when `node` reads a lever's id as a string key; None otherwise."""
    ids = set(DECISION_IDS)
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant) \
            and node.slice.value in ids:
        return node.value, node.slice.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
            and node.func.attr in ("get", "value", "decision", "pop", "setdefault") \
            and isinstance(node.args[0], ast.Constant) and node.args[0].value in ids:
        return node.func.value, node.args[0].value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in ids:
        return node.args[0], node.args[1].value
    if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and node.left.value in ids \
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        return node.comparators[0], node.left.value
    return None


def _string_key_reads() -> List[str]:
    found = []
    for layer in LAYERS:
        for path in sorted((PKG / layer).glob("*.py")):
            module = path.relative_to(PKG).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                hit = _receiver(node)
                if hit is not None and (module, ast.unparse(hit[0])) not in NOT_LEVERS:
                    found.append(f"{module}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_no_lever_is_read_by_string_key_in_the_planner_renderers_or_edges():
    assert _string_key_reads() == []


def test_the_scan_finds_a_string_key_read():
    tree = ast.parse('rec.chosen["dtype"]; rec.get("compile"); "threads_per_rank" in fixed; getattr(lv, "zero")')
    assert [_receiver(n)[1] for n in ast.walk(tree) if _receiver(n)] == ["dtype", "compile", "threads_per_rank", "zero"]


def test_the_known_non_lever_mappings_are_still_there():
    """Each exemption names a mapping the code still reads: a stale one would hide a new lever read."""
    seen = set()
    for layer in LAYERS:
        for path in sorted((PKG / layer).glob("*.py")):
            module = path.relative_to(PKG).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                hit = _receiver(node)
                if hit is not None:
                    seen.add((module, ast.unparse(hit[0])))
    assert NOT_LEVERS - seen == set()


def test_a_launch_option_reports_itself_after_the_levers():
    """The lever report lists each launch option as its application reported it (JobPlan.launch_options), after the
    levers; a job without one has no row for it."""
    from levers_util import levers

    from cpuperf.plan.applied import LeverState, RenderedJob, lever_report

    job = RenderedJob(auto=True, nproc_per_node=1, nnodes=1, env={}, ranks=())
    mine = LeverState("numa_memory", "interleave", False, "interleave over NUMA nodes 0,1: numactl is not installed")
    report = lever_report(levers({}), job)
    assert [s.id for s in report] == list(DECISION_IDS)
    with_option = lever_report(levers({}), dataclasses.replace(job, options=(mine,)))
    assert with_option == report + (mine,)
