"""compat/frameworks.toml read once into typed rules: how a training framework reads cpuperf's levers itself
(Lightning's PL_TRAINER_<ARG> defaults, LightningCLI's --trainer.precision). A row that is not what the file's header
says is a BadDataError naming it. Pure."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Mapping, Tuple

from cpuperf.data import load_builtin
from cpuperf.errors import BadDataError

SCHEMA = "cpuperf.frameworks/1"
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_OPTION = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9_.-]*$")
_VALUE = re.compile(r"[A-Za-z0-9_-]+$")  # Lightning's precision names: bf16-mixed, 16-mixed


@dataclass(frozen=True)
class LightningRule:
    trainer_paths: Tuple[str, ...]  # the modules Lightning's Trainer is imported from
    cli_paths: Tuple[str, ...]  # and LightningCLI
    precision_env: str  # PL_TRAINER_PRECISION
    precision: Mapping[str, str]  # the plan's dtype -> Lightning's precision ('bf16' -> 'bf16-mixed')
    cli_precision_option: str  # --trainer.precision
    cli_config_options: Tuple[str, ...]  # LightningCLI options that may decide the precision themselves
    source: str


def _bad(what: str) -> BadDataError:
    return BadDataError(f"malformed data file compat/frameworks.toml: {what}", hint="fix the row, or reinstall cpuperf")


def _strings(row: Mapping[str, Any], key: str, pattern: re.Pattern[str]) -> Tuple[str, ...]:
    value = row.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and pattern.match(v) for v in value):
        raise _bad(f"[lightning].{key} must be a list of names")
    return tuple(value)


def _string(row: Mapping[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not pattern.match(value):
        raise _bad(f"[lightning].{key} {str(value)[:40]!r} is not a name")
    return value


@functools.lru_cache(maxsize=1)
def lightning_rule() -> LightningRule:
    """The [lightning] rule of the shipped compat/frameworks.toml."""
    return parse_lightning(load_builtin("frameworks.toml"))


def parse_lightning(raw: Mapping[str, Any]) -> LightningRule:
    """The [lightning] rule of a parsed frameworks.toml; BadDataError naming what is not as the header says."""
    if raw.get("schema") != SCHEMA:
        raise _bad(f"schema {str(raw.get('schema'))[:40]!r}, expected {SCHEMA!r}")
    row = raw.get("lightning")
    if not isinstance(row, dict):
        raise _bad("no [lightning] table")
    precision = row.get("precision")
    if not isinstance(precision, dict) or not precision or not all(
            k in ("bf16", "fp16") and isinstance(v, str) and _VALUE.match(v) for k, v in precision.items()):
        raise _bad("[lightning].precision must map bf16/fp16 to Lightning's precision names")
    source = row.get("source")
    if not isinstance(source, str) or not source.strip():
        raise _bad("[lightning].source is missing")
    return LightningRule(_strings(row, "trainer_paths", _DOTTED), _strings(row, "cli_paths", _DOTTED),
                         _string(row, "precision_env", re.compile(r"PL_[A-Z_]+$")), dict(precision),
                         _string(row, "cli_precision_option", _OPTION),
                         _strings(row, "cli_config_options", _OPTION), source)
