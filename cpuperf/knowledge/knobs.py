"""The one vocabulary of settings: every knob's id, type, allowed values and who honours it.

`recommend` decides the knobs marked `decided`, `--set`/`--config` constrain any knob by the same id, the
launch plan carries the `launch` ones (ranks, threads, pinning, preload) and the built-in worker reads the
`worker` ones under the same names (cpuperf.worker_settings.TrainSettings), so a value means one thing
from the command line to the rank that runs it. Pure.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

from cpuperf.errors import FieldError, UsageError, verbatim
from cpuperf.worker_settings import BOUNDS, COMPILE_MODES, out_of_bounds

# A node count past this is a typo, not a plan (ranks and threads are bounded by the host, in placement).
MAX_COUNT = 4096
# Sizes are bounded by the one table (cpuperf.worker_settings.BOUNDS: batch, accumulation, steps, seed, the model's
# shape), read here for --set, --config and a saved plan as the worker's schema reads it. Dataloader workers are
# processes: the host bounds them further (its usable CPUs, where the plan is run).




# What a knob holds once its text is coerced (coerce): true/false, a count, a number, a choice or a path; None where
# the knob takes none. The built-in loop's model shape (`--set model.d_model=256`) gathers under the key 'model'.
KnobValue = Union[None, bool, int, float, str]
ModelShape = Dict[str, int]
SetValue = Union[KnobValue, ModelShape]
# --set / --config values by knob id, each typed by its knob (model.* under 'model'): the user's constraints.
Overrides = Dict[str, SetValue]


@dataclass(frozen=True)
class Knob:
    id: str
    kind: str  # bool | int | float | choice | str | dict
    choices: Tuple[KnobValue, ...] = ()
    minimum: Optional[float] = None
    maximum: Optional[float] = None  # past it no job finishes a step (a saved plan's batch of 10**15 never did)
    decided: bool = False  # recommend decides it (a Decision with this id)
    worker: bool = False  # the built-in loop's setting of the same name
    launch: bool = False  # carried by the launch plan (ranks, threads, CPUs, env)
    # a launch option: never decided; fixed by you (--set) or a cached tuning's verdict, and applied by its owner in
    # the launch, which reports whether the job carries it (cpuperf.plan.applied LeverState)
    option: bool = False
    # carried by its variable: the variables table's rows whose `lever` is this id (compat/variables.toml), set to its
    # value as env_text writes it, where the job's path sets the plan's variables; the report reads it back there
    env: bool = False
    # a lever of the generic path: the function that decides it ('module:function' under cpuperf.decide, called with
    # the host, the workload and the typed levers), held in Levers.ruled rather than a field of its own
    rule: str = ""
    nullable: bool = False  # 'none' means "decide for me" / "no limit"
    doc: str = ""


def _sized(key: str, *, decided: bool = False, worker: bool = False, nullable: bool = False) -> Knob:
    """An integer knob whose minimum and maximum are the one table's (worker_settings.BOUNDS)."""
    low, high = BOUNDS[key]
    return Knob(key, "int", minimum=low, maximum=high, decided=decided, worker=worker, nullable=nullable)


KNOBS: Tuple[Knob, ...] = (
    # decided by recommend --------------------------------------------------------------------------
    Knob("device", "choice", choices=("cpu", "cuda"), decided=True, worker=True),
    Knob("dtype", "choice", choices=("fp32", "bf16", "fp16"), decided=True, worker=True),
    Knob("tf32", "bool", decided=True, worker=True),
    Knob("fp32_math_mode", "choice", choices=("bf16", None), decided=True, worker=True),
    Knob("nproc_per_node", "int", minimum=1, decided=True, launch=True),
    Knob("nnodes", "int", minimum=1, decided=True, launch=True),
    Knob("threads_per_rank", "int", minimum=1, decided=True, worker=True, launch=True),
    Knob("affinity", "choice", choices=("auto", None), decided=True, launch=True,
       doc="auto: each rank pinned to its own cores; none: unpinned"),
    Knob("ddp_backend", "choice", choices=("gloo", "ccl", "mpi", "nccl", None), decided=True, worker=True),
    Knob("ipex", "bool", decided=True, worker=True),
    Knob("compile", "bool", decided=True, worker=True),
    Knob("allocator", "choice", choices=("tcmalloc", "jemalloc", "mimalloc", None), decided=True, launch=True),
    Knob("attention", "choice", choices=("sdpa", "flash", "mem_efficient", "math"), decided=True),
    _sized("batch_size", decided=True, worker=True),
    _sized("grad_accum_steps", decided=True, worker=True),
    Knob("grad_checkpointing", "bool", decided=True, worker=True),
    Knob("optimizer", "choice", choices=("adamw", "adamw_fused", "adafactor", "adamw_8bit"), decided=True, worker=True),
    Knob("sharding", "choice", choices=("fsdp", "zero3", None), decided=True,
       doc="fsdp: torch FSDP full shard; zero3: DeepSpeed ZeRO-3 (installed); none: every rank holds the whole state"),
    Knob("offload", "bool", decided=True, doc="GPU ranks park the sharded state in host RAM"),
    _sized("dataloader_workers", decided=True, worker=True),
    Knob("pin_memory", "bool", decided=True),
    Knob("zero", "choice", choices=(None,), decided=True, doc="DeepSpeed ZeRO config; only none can be set"),
    # placement options ---------------------------------------------------------------------------------
    Knob("oversubscribe", "bool", launch=True, option=True, doc="allow more ranks x threads than usable cores"),
    Knob("numa_memory", "choice", choices=("interleave", None), launch=True, option=True,
         doc="one process over several NUMA nodes: interleave its memory over them (numactl); none: first touch"),
    # the built-in loop only -------------------------------------------------------------------------
    Knob("preset", "choice", choices=("tiny", "small", "gpt2-small", "micro"), worker=True),
    Knob("model", "dict", worker=True, doc="model.n_layer, model.n_head, model.d_model, model.seq_len, ..."),
    Knob("lr", "float", minimum=0.0, worker=True),
    Knob("min_lr_ratio", "float", minimum=0.0, worker=True),
    Knob("weight_decay", "float", minimum=0.0, worker=True),
    Knob("grad_clip", "float", minimum=0.0, worker=True),
    _sized("warmup", worker=True),
    _sized("max_steps", worker=True, nullable=True),
    Knob("time_budget_s", "float", minimum=0.0, worker=True, nullable=True),
    _sized("eval_every", worker=True),
    _sized("eval_batches", worker=True),
    _sized("ckpt_every", worker=True),
    _sized("log_every", worker=True),
    _sized("seed", worker=True),
    Knob("progress", "choice", choices=("auto", "rich", "plain", "off"), worker=True),
    Knob("compile_mode", "choice", choices=COMPILE_MODES,
         worker=True, doc="how torch.compile is asked when compile is on (default: the mode the plan measured best)"),
    _sized("bpe_merges", worker=True),
    Knob("peak_tflops", "float", minimum=0.0, worker=True, nullable=True),
    Knob("confirm_batch", "bool", worker=True),
    Knob("tokenizer_cache", "str", worker=True, doc="where the BPE tokenizer is cached (default: the run directory)"),
)

BY_ID: Dict[str, Knob] = {k.id: k for k in KNOBS}
DECISION_IDS: Tuple[str, ...] = tuple(k.id for k in KNOBS if k.decided)
RULED_IDS: Tuple[str, ...] = tuple(k.id for k in KNOBS if k.decided and k.rule)  # Levers.ruled, in this order
OPTION_IDS: Tuple[str, ...] = tuple(k.id for k in KNOBS if k.option)  # the launch options, in the vocabulary's order
# The model's shape keys the built-in loop takes under model.*
MODEL_KEYS = ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "mlp_ratio")
# Settings of a run that the command line owns (--out, --resume, --max-steps): not --set keys.
_NOT_SETTABLE = ("out_dir", "resume")  # settings of the worker that a command's own option sets


def env_text(value: object) -> str:
    """A lever's value as the variable that carries it holds it (a knob row marked `env`): true/false as 1/0."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return "" if value is None else str(value)


def known_ids() -> str:
    """Every id --set takes, for error hints."""
    return ", ".join(k.id for k in KNOBS if k.kind != "dict") + ", model.<" + "|".join(MODEL_KEYS) + ">"


def split_assignment(item: str) -> Tuple[str, str]:
    """'KEY=VALUE' -> (KEY, VALUE); anything else is a usage error."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise FieldError("set", item, "{opt.set} {value!r}: expected KEY=VALUE", "e.g. {set.dtype}=bf16")
    return key, value


def _bool(key: str, text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise FieldError(key, text, "{typed}: expected true or false", setting=True)


def _number(key: str, text: str, kind: str, minimum: Optional[float], maximum: Optional[float] = None) -> Union[int, float]:
    try:
        value: Union[int, float] = int(text) if kind == "int" else float(text)
    except ValueError:
        raise FieldError(key, text, f"{{typed}}: expected {'an integer' if kind == 'int' else 'a number'}", setting=True) from None
    if kind == "float" and not math.isfinite(value):
        raise FieldError(key, text, "{typed}: expected a finite number", setting=True)
    why = out_of_bounds(key, int(value)) if key in BOUNDS else None  # the one table's words, as --batch-size says them
    if why is not None:
        raise FieldError(key, text[:40], "{typed}: " + why, setting=True)
    if minimum is not None and value < minimum:
        raise FieldError(key, text, f"{{typed}}: must be at least {minimum:g}", setting=True)
    if maximum is not None and value > maximum:
        raise FieldError(key, text[:40], f"{{typed}}: at most {maximum:.0f} (past it no step of a job finishes)", setting=True)
    if kind == "int" and key == "nnodes" and value > MAX_COUNT:
        raise FieldError(key, text, f"{{typed}}: more than {MAX_COUNT} nodes is not a plan cpuperf makes", setting=True)
    return value


def bounded(key: str, value: int, field: Optional[str] = None) -> int:
    """An integer a command's option gives (--batch-size, --seq-len, --steps, --max-steps, --seed) held to the one
    table's bounds for setting `key` (worker_settings.BOUNDS), as --set holds it: a FieldError about the option
    `field` (default: the key), the value named."""
    why = out_of_bounds(key, value)
    if why is not None:
        raise FieldError(field or key, value, "{typed}: " + why)
    return value


def coerce(key: str, raw: object) -> KnobValue:
    """One --set / --config value as its knob's plain type; a bad key or value is a usage error."""
    knob = BY_ID.get(key)
    if knob is None:
        if key in _NOT_SETTABLE:
            raise FieldError(key, raw, "{flag}: set it with {opt.%s}" % key, setting=True)
        raise FieldError("set", key, "unknown setting {value!r} in {flag}", "settings: " + known_ids())
    if not isinstance(raw, str):
        text = json.dumps(raw) if isinstance(raw, bool) or raw is None else str(raw)
    else:
        text = raw.strip()
    if text.lower() in ("none", "null", "") and (knob.nullable or None in knob.choices):
        return None
    if knob.kind == "bool":
        return _bool(key, text)
    if knob.kind in ("int", "float"):
        return _number(key, text, knob.kind, knob.minimum, knob.maximum)
    if knob.kind == "choice":
        value = None if text.lower() in ("none", "null") else text
        if value not in knob.choices:
            allowed = ", ".join("none" if c is None else str(c) for c in knob.choices)
            raise FieldError(key, text, f"{{typed}}: expected one of {verbatim(allowed)}", setting=True)
        return value
    return text


def parse_assignments(items: Sequence[str]) -> Overrides:
    """--set KEY=VALUE items -> {id: typed value}; model.X keys gather under 'model'."""
    out: Overrides = {}
    for item in items:
        key, raw = split_assignment(item)
        out = merge(out, coerce_entry(key, raw))  # model.n_layer then model.d_model: both (update kept the last)
    return out


def coerce_entry(key: str, raw: object) -> Overrides:
    """One key/value (from --set or a --config file) -> {id: typed value}."""
    if key.startswith("model."):
        sub = key[len("model."):]
        if sub not in MODEL_KEYS:
            raise UsageError(f"unknown model setting {key!r}", hint="model." + ", model.".join(MODEL_KEYS))
        low, high = BOUNDS[key]
        return {"model": {sub: int(_number(key, str(raw).strip(), "int", low, high))}}
    return {key: coerce(key, raw)}


def merge(base: Mapping[str, SetValue], extra: Mapping[str, SetValue]) -> Overrides:
    """Constraints from a config file, then --set on top (model.* merged key by key)."""
    out = dict(base)
    for key, value in extra.items():
        had = out.get(key)
        out[key] = {**had, **value} if isinstance(had, dict) and isinstance(value, dict) else value
    return out
