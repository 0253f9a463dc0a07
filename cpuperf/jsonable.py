"""Dataclasses to JSON-ready data by one walk: `as_json(record)`.

The walk follows `dataclasses.asdict`, so a record's JSON is what asdict + json.dumps wrote before: fields in
declaration order, nested dataclasses as objects, tuples and lists (a NamedTuple included) as lists, mappings as
objects. It also takes what asdict leaves for json.dumps to refuse: an enum is its value, a path its text, a set
a sorted list. What a record shows differently says so where it is declared:
- a field's metadata `json_key("name")` writes it under another key, `NOT_IN_JSON` leaves it out;
- a method `json_computed(self)` gives values computed for JSON: a key that is a field's replaces its value in
  place, any other comes after the fields.
Standard library only: the node probe bundle (run/probe_bundle.py) carries this module with probe/.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

# Free-form JSON, for data that has no fixed shape (a record's own JSON, what json.loads gave before it is checked).
# Reading a value out of one makes mypy ask which kind it is: parse it into a typed record at the edge instead.
JsonValue = Union[None, bool, int, float, str, List["JsonValue"], Dict[str, "JsonValue"]]
JsonObject = Dict[str, JsonValue]
JsonMapping = Mapping[str, JsonValue]  # read-only: a Dict[str, str] is one, where it is not a JsonObject

_KEY = "json"  # field metadata: the field's key in JSON; None leaves the field out

NOT_IN_JSON: Mapping[str, Optional[str]] = MappingProxyType({_KEY: None})


def json_key(name: str) -> Mapping[str, Optional[str]]:
    """Field metadata: write the field under `name`."""
    return MappingProxyType({_KEY: name})


def as_json(record: object) -> Dict[str, Any]:
    """A dataclass instance as JSON-ready data (dicts, lists, str, int, float, bool, None), recursively."""
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"as_json takes a dataclass instance, not {type(record).__name__}")
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(record):
        key = f.metadata.get(_KEY, f.name)
        if key is not None:
            out[key] = _value(getattr(record, f.name))
    computed: Optional[Callable[[], Mapping[str, object]]] = getattr(record, "json_computed", None)
    if computed is not None:
        out.update((k, _value(v)) for k, v in computed().items())
    return out


def _value(value: object) -> Any:
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, enum.Enum):
        return _value(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_json(value)
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _value(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_value(v) for v in value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value
