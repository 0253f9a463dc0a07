"""Where Hugging Face tools keep their files on this host: the one reading of HF_HOME and friends.

The rules are huggingface_hub's (src/huggingface_hub/constants.py, 2.4.0: HF_HOME, HUGGINGFACE_HUB_CACHE,
HF_HUB_CACHE) and accelerate's (src/accelerate/commands/config/config_args.py: the same HF_HOME default, then
accelerate/default_config.yaml). An unset XDG_CACHE_HOME means ~/.cache, as both have it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from cpuperf.jsonable import JsonObject, JsonValue


def _expanded(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def hf_home(environ: Optional[Mapping[str, str]] = None) -> str:
    """$HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface."""
    env = os.environ if environ is None else environ
    default = os.path.join(env.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "huggingface")
    return _expanded(env.get("HF_HOME", default))


def hub_cache(environ: Optional[Mapping[str, str]] = None) -> str:
    """$HF_HUB_CACHE, else the legacy $HUGGINGFACE_HUB_CACHE, else HF_HOME/hub."""
    env = os.environ if environ is None else environ
    return _expanded(env.get("HF_HUB_CACHE", env.get("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home(env), "hub"))))


def cached_model_config(model_id: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """config.json of a model already in the local hub cache, newest snapshot first (never downloads)."""
    snapshots = Path(hub_cache(environ)) / ("models--" + model_id.replace("/", "--")) / "snapshots"
    try:
        found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for snap in found:
        if (snap / "config.json").is_file():
            return str(snap / "config.json")
    return None


def accelerate_default_config(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether `accelerate launch` will read a default config file (it does when one exists)."""
    return os.path.isfile(os.path.join(hf_home(environ), "accelerate", "default_config.yaml"))


# -- the model a user's script trains, from its own arguments ------------------------------------------------

# The arguments Hugging Face's example scripts (run_clm.py and kin) and most Trainer scripts use for the model,
# and the TrainingArguments that size a rank's memory. Both spellings argparse accepts (HfArgumentParser takes
# --per-device-train-batch-size too).
_MODEL_ARGS = ("model_name_or_path", "config_name", "model_type", "config_overrides")
# A script of one's own often names its length --seq_len (the recorded H100 check's Trainer script did:
# tests/fixtures/hosts/h100-emeraldrapids-16c/trainer/trainer_script.py) or --max_seq_len.
SEQ_ARGS = ("block_size", "max_seq_length", "max_length", "seq_length", "seq_len", "max_seq_len")
_TRAINER_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "optim", "max_steps")
# TrainingArguments' --optim names -> cpuperf's optimizer ids (the families the memory plan knows).
_OPTIM_IDS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw_fused", "adamw_hf": "adamw", "adamw": "adamw",
              "adafactor": "adafactor", "adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit",
              "paged_adamw_8bit": "adamw_8bit"}
_TYPE_DEFAULTS = ("import json, sys\nimport transformers\nfrom transformers import AutoConfig\n"
                  "config = json.loads(AutoConfig.for_model(sys.argv[1]).to_json_string())\n"
                  "print(json.dumps({'config': config, 'from': transformers.__file__}))\n")


@dataclass(frozen=True)
class ScriptModel:
    """The model and batch a user's script names in its own arguments, as found on this host (never the network)."""

    config: Optional[JsonObject]  # the model's config.json (or its type's defaults with your overrides)
    where: str  # where it was found, in words
    why_not: str = ""  # when config is None: why the model could not be told
    per_device_batch: Optional[int] = None
    grad_accum: Optional[int] = None
    optimizer: Optional[str] = None  # a cpuperf optimizer id (--optim mapped), None when not given
    seq_len: Optional[int] = None  # --block_size / --max_seq_length where given
    max_steps: Optional[int] = None  # the run length (--max_steps) where given: what torch.compile must pay back in


def _args_file(named: Mapping[str, str], cwd: str) -> Dict[str, str]:
    """`script.py args.json`: HfArgumentParser reads every argument from that one file (`named` holds its path under
    the key ARGS_FILE where the command's only argument is such a file)."""
    path = named.get(ARGS_FILE, "")
    if not path.endswith(".json"):
        return {}
    args = [path]
    from cpuperf.fsutil import InputRefused, read_capped

    try:
        data = json.loads(read_capped(os.path.join(cwd, args[0]), 1024 * 1024).decode("utf-8"))
    except (OSError, InputRefused, ValueError):
        return {}
    keys = set(_MODEL_ARGS + SEQ_ARGS + _TRAINER_ARGS)
    return {k: str(v) for k, v in data.items() if k in keys and v is not None} if isinstance(data, dict) else {}


def _positive(text: Optional[str]) -> Optional[int]:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _read_json(path: str) -> Tuple[Optional[JsonObject], str]:
    from cpuperf.fsutil import InputRefused, read_capped

    try:
        data: JsonValue = json.loads(read_capped(path, 4 * 1024 * 1024).decode("utf-8"))
    except (OSError, InputRefused, ValueError) as exc:
        return None, f"{path} could not be read as JSON ({str(exc).splitlines()[0][:100] if str(exc) else 'unreadable'})"
    if not isinstance(data, dict):
        return None, f"{path} is not a JSON object"
    return data, ""


def _named_config(name: str, cwd: str, environ: Optional[Mapping[str, str]]) -> Tuple[Optional[JsonObject], str, str]:
    """(config, where, why not) for a model named by path or hub id: a local directory or file, else the local
    Hugging Face cache. Nothing is downloaded: a model only on the hub cannot be told here."""
    path = name if os.path.isabs(name) else os.path.join(cwd, name)
    if os.path.isdir(path):
        cfg = os.path.join(path, "config.json")
        if not os.path.isfile(cfg):
            return None, "", f"{name} is a directory without config.json"
        data, why = _read_json(cfg)
        return data, os.path.join(name, "config.json"), why
    if os.path.isfile(path):
        data, why = _read_json(path)
        return data, name, why
    cached = cached_model_config(name, environ)
    if cached is None:
        return None, "", (f"{name!r} is neither a local directory nor in the local Hugging Face cache "
                          f"({hub_cache(environ)}): cpuperf never downloads it")
    data, why = _read_json(cached)
    return data, f"the local Hugging Face cache ({name})", why


def _overrides(text: str) -> Tuple[JsonObject, str]:
    """--config_overrides 'n_embd=10,n_layer=2' as PretrainedConfig.update_from_string reads it."""
    out: JsonObject = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            return {}, f"--config_overrides {text!r}: expected key=value pairs separated by commas"
        value: JsonValue = raw.strip()
        try:
            value = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                pass
        if raw.strip().lower() in ("true", "false"):
            value = raw.strip().lower() == "true"
        out[key.strip()] = value
    return out, ""


class Ran(Protocol):
    """What a finished child leaves that is read here (subprocess.CompletedProcess, text mode)."""

    @property
    def returncode(self) -> int: ...

    @property
    def stdout(self) -> str: ...


# run(argv, timeout): the child's result, None where it could not start or ran past the timeout.
Runner = Callable[[Sequence[str], float], Optional[Ran]]


def _run(argv: Sequence[str], timeout: float) -> Optional[Ran]:
    import subprocess

    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def _type_defaults(model_type: str, python: Optional[str], run: Optional[Runner]) -> Tuple[Optional[JsonObject], str]:
    """The installed transformers' defaults for a model type (AutoConfig.for_model), in a child with a timeout
    and the hub switched off; remembered (_remembered_type) so that only the first run of a command pays the
    child's seconds (importing transformers imports torch)."""
    if python is None:
        return None, f"--model_type {model_type}: your script's Python was not found to read transformers' defaults"
    known = _remembered_type(python, model_type)
    if known is not None:
        return known, ""
    result = (run or _run)([python, "-I", "-c", _TYPE_DEFAULTS, model_type], 60.0)
    if result is None or result.returncode != 0:
        return None, (f"--model_type {model_type}: the installed transformers does not know it "
                      "(or transformers is not installed for your script's Python)")
    try:
        data: JsonValue = json.loads(result.stdout)
    except ValueError:
        return None, f"--model_type {model_type}: transformers printed no config"
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return None, f"--model_type {model_type}: no config"
    where = data.get("from") if isinstance(data, dict) else None
    if isinstance(where, str):
        _remember_type(python, model_type, where, config)
    return config, ""


def _type_key(python: str, model_type: str) -> Tuple[List[object], Path]:
    """The cache entry of a model type's defaults as `python`'s transformers gives them: the interpreter's own path
    (a venv's python is a link to the base one: not resolved) and its file's identity are the key."""
    import zlib

    from cpuperf import __version__
    from cpuperf.fsutil import cache_root

    path = os.path.abspath(python)
    st = os.stat(path)
    key: List[object] = [__version__, path, st.st_mtime_ns, st.st_size, model_type]
    text = json.dumps(key)
    return key, cache_root() / "model-types" / f"{zlib.crc32(text.encode()):08x}{zlib.adler32(text.encode()):08x}.json"


def _install_stamp(init_file: str) -> List[int]:
    """What changes when transformers or anything else is installed into that environment: its package's
    __init__.py and the folder it is installed in (site-packages gets a new dist-info on every install)."""
    a, b = os.stat(init_file), os.stat(os.path.dirname(os.path.dirname(init_file)))
    return [a.st_mtime_ns, a.st_size, b.st_mtime_ns]


def _remembered_type(python: str, model_type: str) -> Optional[JsonObject]:
    """A model type's defaults read before by the same interpreter from the same, unchanged install; else None."""
    from cpuperf.readback import read_json

    try:
        key, path = _type_key(python, model_type)
        known = read_json(path, 4 << 20)
        if known["key"] == key and known["stamp"] == _install_stamp(known["from"]) and isinstance(known["config"], dict):
            return dict(known["config"])
    except (OSError, ValueError, TypeError, KeyError):  # absent, unreadable, another install: read again
        pass
    return None


def _remember_type(python: str, model_type: str, init_file: str, config: JsonObject) -> None:
    from cpuperf.fsutil import atomic_write_bytes

    try:
        key, path = _type_key(python, model_type)
        entry = {"key": key, "from": init_file, "stamp": _install_stamp(init_file), "config": config}
        atomic_write_bytes(path, json.dumps(entry).encode("utf-8"))
    except OSError:
        pass  # a read-only cache: the next run reads the defaults again


# What a dry run says where it did not start a program of the user's to learn something (train --dry-run shows it).
NOT_RUN_IN_A_DRY_RUN = "a dry run starts no program of yours"


ARGS_FILE = "<args file>"  # the key of `script_model`'s values that names an arguments file


def script_model(given: Mapping[str, str], cwd: str, environ: Optional[Mapping[str, str]] = None,
                 python: Optional[str] = None, run: Optional[Runner] = None, may_run: bool = True) -> ScriptModel:
    """The model a script trains, from the values its own parser reads from its arguments (`given`: option -> value,
    cpuperf.plan.script_args), as Hugging Face's example scripts read them: --config_name,
    else --model_name_or_path (a local directory or the local HF cache), else --model_type with --config_overrides
    (that type's defaults in the installed transformers, read by `run(argv, timeout)`). Never the network.
    `may_run` False (a dry run): no program is started, the script's Python included (it is the user's: a wrapper
    named python3-wrapper, or the interpreter on a launcher's `#!` line, ran under --dry-run); the type's defaults
    are then not read, and the reason says so."""
    wanted = set(_MODEL_ARGS + SEQ_ARGS + _TRAINER_ARGS)
    named = {k: v for k, v in given.items() if k in wanted and v} or _args_file(given, cwd)
    batch = _positive(named.get("per_device_train_batch_size"))
    accum = _positive(named.get("gradient_accumulation_steps"))
    optim = named.get("optim")
    optimizer = _OPTIM_IDS.get(optim) if optim else None
    seq = next((_positive(named.get(k)) for k in SEQ_ARGS if _positive(named.get(k))), None)

    steps = _positive(named.get("max_steps"))

    def made(config: Optional[JsonObject], where: str, why: str) -> ScriptModel:
        return ScriptModel(config, where, why, batch, accum, optimizer, seq, steps)

    if optim and optimizer is None:
        return made(None, "", f"--optim {optim}: an optimizer whose memory cpuperf does not know")
    for key in ("config_name", "model_name_or_path"):
        if named.get(key):
            config, where, why = _named_config(named[key], cwd, environ)
            return made(config, f"--{key} {where}" if config is not None else "", why)
    if named.get("model_type") and not may_run:
        return made(None, "", f"--model_type {named['model_type']}: {NOT_RUN_IN_A_DRY_RUN}, so the installed "
                              "transformers' defaults for this type (read through your script's Python) are not read "
                              "here: the plan assumes an unknown model size; a real run reads them")
    if named.get("model_type"):
        config, why = _type_defaults(named["model_type"], python, run)
        if config is not None and named.get("config_overrides"):
            extra, why = _overrides(named["config_overrides"])
            config = {**config, **extra} if not why else None
        where = f"--model_type {named['model_type']} (the installed transformers' defaults" + (
            f", with --config_overrides {named['config_overrides']})" if named.get("config_overrides") else ")")
        return made(config, where if config is not None else "", why)
    return made(None, "", "the script names no model in its arguments (--model_name_or_path, --config_name, "
                          "--model_type)")
