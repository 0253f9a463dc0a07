"""A model's config.json on this machine (issue 54: the OS is read in probe/ only): where a `--model` path points,
and the file read bounded and parsed. Each answer is data or a one-line problem; deciding what the model is stays
in cpuperf.decide.workload."""

from __future__ import annotations

import json
import os
from typing import NamedTuple, Optional

from cpuperf.jsonable import JsonObject

MAX_CONFIG_BYTES = 4 * 1024 * 1024


def local_config_path(model: str) -> Optional[str]:
    """The config file a model given as a path names (a directory's config.json); None where no such path exists."""
    if not os.path.exists(model):
        return None
    return os.path.join(model, "config.json") if os.path.isdir(model) else model


class ConfigRead(NamedTuple):
    """A config file read: its JSON object, or the problem in one line (the config None)."""

    config: Optional[JsonObject]
    problem: Optional[str] = None


def _no_constant(name: str) -> object:
    """json's NaN / Infinity / -Infinity: not a number any config field may hold."""
    raise ValueError(f"{name} is not a finite number")


def read_model_config(path: str) -> ConfigRead:
    """A Hugging Face config.json, read bounded: the object, or why it cannot be used."""
    from cpuperf.fsutil import InputRefused, read_capped

    try:
        cfg = json.loads(read_capped(path, MAX_CONFIG_BYTES).decode("utf-8"), parse_constant=_no_constant)
    except InputRefused as exc:
        return ConfigRead(None, f"model config {exc}")
    except OSError as exc:
        return ConfigRead(None, f"cannot read model config {path}: {exc.strerror or exc}")
    except ValueError as exc:  # not UTF-8, not JSON, NaN/Infinity
        return ConfigRead(None, f"model config {path} is malformed: {str(exc).splitlines()[0][:120]}")
    if not isinstance(cfg, dict):
        return ConfigRead(None, f"model config {path} is not a JSON object")
    return ConfigRead(cfg)
