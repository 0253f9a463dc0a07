"""TrainSettings: everything one run of the built-in worker needs, as a dataclass with a JSON form (torch-free).

Below plan/ and train/, so the plan carries the worker's settings as this typed record (JobPlan.settings) and the
worker reads the same record from its --config. Its only imports: the standard library, jsonable and errors.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from cpuperf.errors import CpuperfError, ExitCode
from cpuperf.jsonable import JsonObject, as_json

PRESETS = ("tiny", "small", "gpt2-small", "micro")
DTYPES = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "adamw_fused")
DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "ccl", "mpi", "nccl")
PROGRESS = ("auto", "rich", "plain", "off")
# How torch.compile is asked for CPU training: the whole model (inductor's default), the whole model with max-autotune
# (on CPU it adds inductor's C++ GEMM templates to the choices it times), and regional compile: each repeated block
# compiled alone (the LM's transformer blocks; one compile serves all of them), with either mode. `cpuperf bench
# --compile` measures each; the compile decision names the one that pays back (cpuperf.decide.recommend).
COMPILE_MODES = ("default", "max-autotune", "regional", "regional-max-autotune")
MODEL_KEYS = ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "mlp_ratio")
# Measured on a 2-core EPYC Zen 3 (fp32, tiny preset, batch 16): ~2.7 steps/s in the training
# loop, so 400 steps + 4 evals take ~2.3 minutes; the loss falls 6.7 -> ~1.5 in the first minute.
DEFAULT_MAX_STEPS = 400

# The one table of bounds on a run's sizes, (least, most) by setting id (model.X: the model's shape), read by every
# door a size enters by: the worker's schema (TrainSettings.validate), the knob vocabulary that types --set, --config
# and a saved plan (cpuperf.knowledge.knobs), train's options (--batch-size, --max-steps, --seed: cpuperf.plan.request)
# and the workload recommend and train plan (--batch-size, --seq-len, --steps: cpuperf.decide.workload). Each bound is
# far above any real job and far below one that never ends a step, overflows or takes minutes to plan
# (recommend --batch-size 2**62 never returned).
MAX_BATCH, MAX_ACCUMULATION, MAX_WORKERS = 1 << 20, 1 << 16, 4096  # a global batch of a million samples
MAX_STEPS = 1 << 30  # a billion optimizer steps: a thousand times a long pre-training
MAX_SEQ_LEN = 1 << 24  # 16M tokens: past the longest context windows models ship
# bpe_merges: ids 256 + merge index are cached as 16-bit values (cpuperf/train/tokenizer.py, the ids file).
# torch.manual_seed takes 0..2**64-1, and the worker seeds its batch order with seed * 1_000_003 + epoch
# (cpuperf/train/batches.py); 2**32-1 is the range numpy and most tools take, far inside both.
MAX_SEED = (1 << 32) - 1
BOUNDS: Dict[str, Tuple[int, int]] = {
    "batch_size": (1, MAX_BATCH), "grad_accum_steps": (1, MAX_ACCUMULATION), "dataloader_workers": (0, MAX_WORKERS),
    "max_steps": (1, MAX_STEPS), "warmup": (0, MAX_STEPS), "eval_every": (0, MAX_STEPS), "ckpt_every": (0, MAX_STEPS),
    "log_every": (1, MAX_STEPS), "eval_batches": (1, 1 << 20), "bpe_merges": (1, (1 << 16) - 256), "seed": (0, MAX_SEED),
    "seq_len": (1, MAX_SEQ_LEN),
    "model.n_layer": (1, 1 << 12), "model.n_head": (1, 1 << 12), "model.d_model": (1, 1 << 18),
    "model.seq_len": (1, MAX_SEQ_LEN), "model.vocab_size": (1, 1 << 24), "model.mlp_ratio": (1, 1 << 8),
}


def out_of_bounds(key: str, value: int) -> Optional[str]:
    """Why an integer `value` of setting `key` is outside BOUNDS (`must be at least 1`, `at most 1048576`), or None."""
    low, high = BOUNDS[key]
    if value < low:
        return f"must be at least {low}"
    if value > high:
        return f"at most {high} (cpuperf's bound, far above any real run)"
    return None


class ConfigExit(enum.IntEnum):
    """The exit code of malformed settings: 2 (usage), named `bad_config` in the worker's error records, as the
    worker's own codes name it (cpuperf.train.errors.TrainExit.BAD_CONFIG)."""

    BAD_CONFIG = int(ExitCode.USAGE)


class ConfigError(CpuperfError, ValueError):
    """Malformed or contradictory settings (exit 2). Not a TrainError (cpuperf.train.errors, a layer above): the
    worker reports both as one line with its code."""

    code = ConfigExit.BAD_CONFIG  # type: ignore[assignment]  # the worker's code, named as its records name it


@dataclass(frozen=True)
class TrainSettings:
    """One worker run. None means "decide for me" (threads: torch's default; backend: by device)."""

    preset: str = "tiny"
    model: Dict[str, int] = field(default_factory=dict)  # overrides of the preset: n_layer, d_model, ...
    dtype: str = "fp32"
    compile: bool = False
    compile_mode: str = "default"  # one of COMPILE_MODES: how torch.compile is asked when compile is on
    ipex: bool = False
    threads_per_rank: Optional[int] = None  # None: torch's default
    batch_size: int = 16  # per rank, per micro-step
    grad_accum_steps: int = 1
    grad_checkpointing: bool = False
    optimizer: str = "adamw"
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    warmup: int = 20  # steps of linear warm-up
    max_steps: Optional[int] = DEFAULT_MAX_STEPS
    time_budget_s: Optional[float] = None
    eval_every: int = 100  # steps; 0 = only at the end
    eval_batches: int = 4
    ckpt_every: int = 100  # steps; 0 = only on exit / interrupt
    log_every: int = 10
    out_dir: str = "runs/train"
    resume: bool = False
    seed: int = 1234
    device: str = "cpu"
    ddp_backend: Optional[str] = None
    dataloader_workers: int = 0
    progress: str = "auto"
    tf32: bool = True
    fp32_math_mode: Optional[str] = None  # 'bf16': oneDNN runs fp32 matmuls in bf16 (AMX hosts)
    bpe_merges: int = 512
    tokenizer_cache: Optional[str] = None  # default: <out_dir>
    peak_tflops: Optional[float] = None  # MFU denominator; default: compat/gpu_peaks.toml or measured
    confirm_batch: bool = True  # CUDA: one trial step at the planned batch; shrink it if it won't fit

    # ---- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> JsonObject:
        """Plain-JSON dict of every field."""
        return as_json(self)

    def to_json(self) -> str:
        """JSON text of to_dict()."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, obj: object) -> TrainSettings:
        """Build and validate from a dict; unknown keys and wrong types raise ConfigError."""
        if not isinstance(obj, dict):
            raise ConfigError("settings must be a JSON object")
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - set(names))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}",
                              hint=f"known settings: {', '.join(names)}")
        defaults = cls()
        kwargs: dict[str, Any] = {}
        for key, value in obj.items():
            kwargs[key] = _coerce(key, value, getattr(defaults, key))
        s = cls(**kwargs)
        s.validate()
        return s

    @classmethod
    def from_json(cls, text_or_path: str) -> TrainSettings:
        """Parse a JSON object given inline (starts with '{') or as a path to a file."""
        text = text_or_path.strip()
        if not text.startswith("{"):
            try:
                text = Path(text_or_path).read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read settings file {text_or_path}: {exc.strerror}")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"settings are not valid JSON: {exc.msg} at line {exc.lineno} "
                              f"column {exc.colno}")
        return cls.from_dict(obj)

    def replace(self, **changes: object) -> TrainSettings:
        """A validated copy with `changes` applied."""
        return TrainSettings.from_dict({**self.to_dict(), **changes})

    # ---- checks ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError for values out of range or contradicting each other."""
        self._check_choices()
        self._check_ranges()
        self._check_pairs()
        self._check_model_overrides()

    def _check_choices(self) -> None:
        def one_of(name: str, allowed: Tuple[str, ...], allow_none: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if v not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)} (got {v!r})")

        one_of("preset", PRESETS)
        one_of("dtype", DTYPES)
        one_of("optimizer", OPTIMIZERS)
        one_of("device", DEVICES)
        one_of("ddp_backend", BACKENDS, allow_none=True)
        one_of("progress", PROGRESS)
        one_of("compile_mode", COMPILE_MODES)
        one_of("fp32_math_mode", ("bf16",), allow_none=True)

    def _check_ranges(self) -> None:
        for name in ("batch_size", "grad_accum_steps", "log_every", "eval_batches", "bpe_merges", "warmup",
                     "eval_every", "ckpt_every", "dataloader_workers", "seed", "max_steps"):
            value = getattr(self, name)
            why = None if value is None else out_of_bounds(name, value)  # max_steps None: the time budget ends it
            if why is not None:
                raise ConfigError(f"{name} {why} (got {value})")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise ConfigError(f"threads_per_rank must be >= 1 or null (got {self.threads_per_rank})")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ConfigError(f"time_budget_s must be > 0 or null (got {self.time_budget_s})")
        if self.max_steps is None and self.time_budget_s is None:
            raise ConfigError("give max_steps or time_budget_s (or both); the run needs an end")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0 (got {self.lr})")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio})")

    def _check_pairs(self) -> None:
        """Settings that only work with a given device."""
        if self.dtype == "fp16" and self.device != "cuda":
            raise ConfigError("dtype fp16 needs device cuda (fp16 autocast + GradScaler)",
                              hint="use dtype bf16 or fp32 on CPU")
        if self.ddp_backend == "nccl" and self.device != "cuda":
            raise ConfigError("ddp_backend nccl needs device cuda", hint="use gloo (or ccl) on CPU")
        if self.ipex and self.device != "cpu":
            raise ConfigError("ipex is for device cpu in this worker")

    def _check_model_overrides(self) -> None:
        bad = sorted(set(self.model) - set(MODEL_KEYS))
        if bad:
            raise ConfigError(f"unknown model override(s): {', '.join(bad)}",
                              hint=f"known: {', '.join(MODEL_KEYS)}")
        for k, v in self.model.items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"model.{k} must be a positive integer (got {v!r})")
            why = out_of_bounds(f"model.{k}", v)
            if why is not None:
                raise ConfigError(f"model.{k} {why} (got {v})")


SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(TrainSettings))  # the worker's settings, by id


def _coerce(key: str, value: object, default: object) -> object:
    """Check `value` against the type of the field's default; ints are accepted for floats."""
    optional_int = {"threads_per_rank", "max_steps"}
    optional_float = {"time_budget_s", "peak_tflops"}
    optional_str = {"ddp_backend", "tokenizer_cache", "fp32_math_mode"}
    if value is None:
        if key in optional_int | optional_float | optional_str:
            return None
        raise ConfigError(f"{key} must not be null")
    if key in optional_int or isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer (got {value!r})")
        return value
    if key in optional_float or isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number (got {value!r})")
        return float(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false (got {value!r})")
        return value
    if key in optional_str or isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string (got {value!r})")
        return value
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a JSON object (got {value!r})")
        return dict(value)
    return value
