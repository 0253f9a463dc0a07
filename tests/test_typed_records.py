"""A plan record holds typed values: no dataclass field of plan/ or decide/ is `Any` or a mapping of `Any`.

A value of no fixed shape is JSON (cpuperf/jsonable.py: JsonObject, JsonMapping) or a vocabulary's type
(knowledge/knobs.py: SetValue), so mypy asks which kind it is where it is read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "cpuperf"


def _dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")) == "dataclass":
            return True
    return False


def _any_fields(text: str, rel: str):
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and _dataclass(node):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    if re.search(r"\bAny\b", ast.unparse(stmt.annotation)):  # typing.Any, or "Any" quoted
                        yield f"{rel}:{stmt.lineno}: {node.name}.{stmt.target.id}: {ast.unparse(stmt.annotation)}"


def test_no_plan_record_field_is_any():
    found = [hit for layer in ("plan", "decide") for path in sorted((PKG / layer).rglob("*.py"))
             for hit in _any_fields(path.read_text(), str(path.relative_to(PKG)))]
    assert found == []


def test_the_scan_sees_an_any_field_in_a_string_annotation_too():
    text = '''
@dataclass(frozen=True)
class A:
    fine: Dict[str, JsonValue]
    loose: Mapping[str, Any]
    quoted: "Optional[Tuple[Dict[str, Any], str]]"

class NotARecord:
    x: Any
'''
    assert [h.split(": ")[1] for h in _any_fields(text, "x.py")] == ["A.loose", "A.quoted"]
