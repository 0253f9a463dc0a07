"""cpuperf.jsonable: one walk turns a dataclass into JSON-ready data, as asdict + json.dumps wrote it, with a
field's other key, its absence and computed values declared on the class."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Any, Dict, NamedTuple, Optional, Tuple

import pytest

from cpuperf.jsonable import NOT_IN_JSON, as_json, json_key


class Colour(enum.Enum):
    RED = "red"


class Pair(NamedTuple):
    left: int
    right: int


@dataclasses.dataclass(frozen=True)
class Inner:
    cpus: Tuple[int, ...]
    colour: Colour = Colour.RED


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    inners: Tuple[Inner, ...]
    by_name: Dict[str, Tuple[str, ...]]
    pair: Pair
    path: Path
    tags: frozenset = frozenset({"b", "a"})
    count: Optional[int] = dataclasses.field(default=None, metadata=json_key("ranks"))
    secret: str = dataclasses.field(default="", metadata=NOT_IN_JSON)
    error: str = ""

    def json_computed(self) -> Dict[str, Any]:
        return {"error": self.error or None, "width": len(self.inners), "first": self.inners[0]}


def _outer() -> Outer:
    return Outer("n", Inner((0, 1)), (Inner((2,)), Inner(())), {"eth0": ("10.0.0.1",)}, Pair(1, 2),
                 Path("/tmp/x"), count=4, secret="s")


def test_nested_records_tuples_and_declared_keys():
    data = as_json(_outer())
    assert data == {"name": "n", "inner": {"cpus": [0, 1], "colour": "red"},
                    "inners": [{"cpus": [2], "colour": "red"}, {"cpus": [], "colour": "red"}],
                    "by_name": {"eth0": ["10.0.0.1"]}, "pair": [1, 2], "path": "/tmp/x", "tags": ["a", "b"],
                    "ranks": 4, "error": None, "width": 2, "first": {"cpus": [2], "colour": "red"}}
    # a computed value for a field takes the field's place; new ones come after every field
    assert list(data) == ["name", "inner", "inners", "by_name", "pair", "path", "tags", "ranks", "error", "width",
                          "first"]
    assert "secret" not in data and "count" not in data


def test_the_walk_writes_what_asdict_and_json_dumps_wrote():
    @dataclasses.dataclass
    class Plain:
        a: Tuple[Inner, ...]
        b: Dict[str, Any]
        c: Optional[float] = None
        d: bool = False

    rec = Plain((Inner((3, 4)),), {"x": [1, (2, 3)], "y": {"z": Pair(5, 6)}}, 1.5, True)
    plain = dataclasses.asdict(rec)
    plain["a"][0]["colour"] = "red"  # asdict leaves the enum to json.dumps, which refuses it
    assert json.dumps(as_json(rec)) == json.dumps(plain)


def test_a_record_is_not_changed_and_the_data_is_its_own():
    rec = _outer()
    data = as_json(rec)
    data["by_name"]["eth0"].append("x")
    assert rec.by_name == {"eth0": ("10.0.0.1",)} and rec.secret == "s"


def test_only_a_dataclass_instance_is_taken():
    with pytest.raises(TypeError, match="dataclass instance"):
        as_json(Inner)
    with pytest.raises(TypeError, match="dataclass instance"):
        as_json({"a": 1})
