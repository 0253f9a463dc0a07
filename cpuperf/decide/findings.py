"""A doctor finding: what is wrong, how bad, and the exact fix. Shared by every check module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cpuperf.jsonable import JsonObject, as_json

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # error | warning | info
    message: str
    fix: Optional[str]

    def to_json(self) -> JsonObject:
        return as_json(self)
