"""Which TrainingArguments flags an installed transformers version accepts (data: compat/trainer_flags.toml)."""

from __future__ import annotations

from typing import FrozenSet, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from cpuperf.data import load_builtin


def supported_flags(transformers_version: Optional[str]) -> FrozenSet[str]:
    """Flag ids valid for that version; for no transformers, those of the newest known release."""
    table = load_builtin("trainer_flags.toml")
    rows = table.get("transformers_flag", [])
    if transformers_version is None:
        version = Version(table.get("newest_known", "5.0.0"))
    else:
        try:
            version = Version(transformers_version)
        except InvalidVersion:
            version = Version(table.get("newest_known", "5.0.0"))
    ok = set()
    for row in rows:
        if version in SpecifierSet(row["versions"]):
            ok.add(row["id"])
    return frozenset(ok)
