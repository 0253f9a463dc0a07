"""What is being trained: the built-in presets, a Hugging Face config, or explicit numbers.

Shapes only (no torch): enough for the memory plan and FLOP counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Tuple

from cpuperf.errors import FieldError, verbatim
from cpuperf.jsonable import NOT_IN_JSON, JsonObject, as_json
from cpuperf.knowledge.knobs import bounded
from cpuperf.probe.model_files import local_config_path, read_model_config

if TYPE_CHECKING:
    from cpuperf.probe.facts import HostFacts
    from cpuperf.probe.hf import ScriptModel


# The block families the memory plan counts activations for (decide/memory.py, _layer_bytes_per_token).
BLOCKS = ("gpt2", "llama")


@dataclass(frozen=True)
class DataParallel:
    """What a command trained as one process lets cpuperf do with ranks without changing its math (issue 51): split
    it into N data-parallel ranks only where it runs data-parallel under a launcher's environment AND cpuperf can keep
    its global batch (per-device batch x accumulation x ranks), by the flags the launch passes."""

    kind: str  # builtin | trainer | accelerate | process-group | plain | unread
    signs: str  # what cpuperf read to say so (said in the plan)
    # the one process's per-device batch and accumulation, where cpuperf passes both on the command line (a
    # Trainer whose arguments come from it); None: the batch is the command's own code's, it cannot be kept
    per_device: Optional[int] = None
    grad_accum: int = 1
    where: str = ""  # where that batch comes from ("your --per_device_train_batch_size 8", "the Trainer's default 8")

    @property
    def global_batch(self) -> Optional[int]:
        return None if self.per_device is None else self.per_device * self.grad_accum

    def split(self, ranks: int) -> Optional[Tuple[int, int]]:
        """(per-device batch, accumulation) that keep the global batch over `ranks`, or None where none does."""
        if ranks <= 1:
            return (self.per_device, self.grad_accum) if self.per_device is not None else None
        if self.kind != "trainer" or self.per_device is None:
            return None
        return split_batch(self.per_device, self.grad_accum, ranks)

    def why_not_split(self, ranks: int) -> str:
        """Why `ranks` ranks would change the job (for the plan), given split(ranks) is None."""
        copies = f"each of {ranks} ranks would run the whole job: {ranks} identical copies writing the same outputs"
        if self.kind in ("plain", "unread"):
            return f"{self.signs}: {copies}"
        if self.kind in ("accelerate", "process-group"):
            return (f"{self.signs}, but its batch is its own code's, which cpuperf cannot pass: {ranks} ranks would "
                    f"train {ranks}x the global batch")
        if self.per_device is None:
            return f"{self.signs}, but cpuperf cannot pass its batch on the command line ({self.where})"
        return (f"its global batch {self.global_batch} ({self.per_device} per device x {self.grad_accum} accumulation) "
                f"does not split evenly into {ranks} ranks")


@dataclass(frozen=True)
class BatchSplit:
    """How the ranks cpuperf starts share what one process of a user's Trainer trained: the same global batch."""

    ranks: int
    per_device: int
    grad_accum: int
    was_per_device: int
    was_grad_accum: int
    where: str  # where the one process's batch came from

    @property
    def global_batch(self) -> int:
        return self.per_device * self.grad_accum * self.ranks

    def describe(self) -> str:
        return (f"global batch {self.global_batch} kept over {self.ranks} ranks: {self.was_per_device} per device x "
                f"{self.was_grad_accum} accumulation x 1 process ({self.where}) -> {self.per_device} x "
                f"{self.grad_accum} x {self.ranks} ranks")

    def to_json(self) -> JsonObject:
        return {"ranks": self.ranks, "global_batch": self.global_batch,
                "before": {"per_device": self.was_per_device, "grad_accum": self.was_grad_accum, "processes": 1,
                           "from": self.where},
                "after": {"per_device": self.per_device, "grad_accum": self.grad_accum, "processes": self.ranks}}


BUILTIN_LOOP = DataParallel("builtin", "cpuperf's own loop: it splits the global batch over its ranks")

# A user's script before cpuperf read its source (cpuperf.plan.user_script.data_parallel tells): never split.
NOT_READ = DataParallel("unread", "the script's source was not read")


def split_batch(per_device: int, grad_accum: int, ranks: int) -> Optional[Tuple[int, int]]:
    """(b, a) with b x a x ranks == per_device x grad_accum, b <= per_device: the per-device batch divided where it
    divides, else the accumulation, else the largest micro-batch that does; None where the global batch cannot be
    shared equally by `ranks` ranks."""
    if ranks <= 1:
        return per_device, grad_accum
    if per_device % ranks == 0:
        return per_device // ranks, grad_accum
    if grad_accum % ranks == 0:
        return per_device, grad_accum // ranks
    total = per_device * grad_accum
    if total % ranks:
        return None
    share = total // ranks
    micro = max(d for d in range(1, min(per_device, share) + 1) if share % d == 0)
    return micro, share // micro


@dataclass(frozen=True)
class Workload:
    name: str
    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    vocab: int
    batch_size: int  # global batch the user asked for (samples per optimizer step)
    steps: Optional[int]
    params: int  # parameter count
    source: str  # 'preset' | 'hf-config' | 'explicit' | 'script' (read from a user script's arguments) | 'unknown'
    # A user script's own batch and optimizer (its Trainer arguments): the plan keeps them unless you --set them.
    per_device_batch: Optional[int] = field(default=None, metadata=NOT_IN_JSON)
    grad_accum: Optional[int] = field(default=None, metadata=NOT_IN_JSON)
    optimizer: Optional[str] = field(default=None, metadata=NOT_IN_JSON)  # a cpuperf optimizer id
    found: str = field(default="", metadata=NOT_IN_JSON)  # where a script's model was found, or why it was not
    of_script: bool = field(default=False, metadata=NOT_IN_JSON)  # trained by a user's script (its batch is its own)
    # The block's shape beyond width and depth, for the activations it keeps (decide/memory.py): the MLP's width
    # (0: 4 x d_model), the key/value heads (0: n_head; fewer with grouped-query attention), and the block family:
    # 'gpt2' (LayerNorm, one fused q/k/v projection, GELU MLP: the built-in model) or 'llama' (RMSNorm computed in
    # fp32 ops, q, k, v, gate and up projections apart, SwiGLU MLP). A saved plan keeps them (one written before they
    # were has none: the defaults).
    d_ff: int = 0
    kv_heads: int = 0
    block: str = "gpt2"
    # True where the sequence length is not the script's own (it names none cpuperf reads): the plan says so.
    seq_assumed: bool = field(default=False, metadata=NOT_IN_JSON)
    parallel: DataParallel = field(default=BUILTIN_LOOP, metadata=NOT_IN_JSON)  # may cpuperf split it into ranks
    # Why this built-in model: set where the host chose it (no --model). In JSON as "why" where the host chose another
    # than the built-in default (DEFAULT_PRESET), so the plans of hosts that train it read as they always have.
    why: str = field(default="", metadata=NOT_IN_JSON)

    def splits_into(self, ranks: int, batch_yours: bool = False, gpus: bool = False) -> bool:
        """Whether `ranks` ranks started by cpuperf run the same job as one process (the same global batch, one
        copy): cpuperf's own loop where its global batch splits evenly; a user's Trainer whose batch cpuperf passes
        (not where you set the per-device batch or accumulation: those are per rank, yours to multiply). On GPUs
        (one rank per visible GPU) a Trainer run as one process already trains its per-device batch on every
        visible GPU (torch.nn.DataParallel: TrainingArguments' n_gpu and train_batch_size), so DDP ranks keep it."""
        if ranks <= 1:
            return True
        if self.parallel.kind == "builtin":
            return not batch_yours and self.batch_size % ranks == 0
        if gpus and self.parallel.kind == "trainer":
            return True
        return not batch_yours and self.parallel.split(ranks) is not None

    @property
    def head_dim(self) -> int:
        return self.d_model // max(1, self.n_head)

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N plus attention 12*L*d*T (Kaplan et al. 2020, table 1; PaLM app. B)."""
        return 6.0 * self.params + 12.0 * self.n_layer * self.d_model * self.seq_len

    @property
    def known(self) -> bool:
        """False when a user script's model could not be told: no memory plan is made for a guess."""
        return self.source != "unknown"

    def to_json(self) -> JsonObject:
        return as_json(self)

    def json_computed(self) -> JsonObject:
        if not self.of_script:
            return {"why": self.why} if self.why and self.name != DEFAULT_PRESET else {}
        return {"found": self.found, "per_device_batch": self.per_device_batch, "grad_accum": self.grad_accum,
                "optimizer": self.optimizer}


# The built-in LM's presets come from cpuperf/train/model.py (torch-free), so the engine plans for
# exactly the model `cpuperf train` builds. Global batch defaults per preset: CPU default 16;
# GPT-2-small shape (GPU workload) 32.
_DEFAULT_BATCH = {"tiny": 16, "small": 16, "gpt2-small": 32, "micro": 16}
DEFAULT_PRESET = "tiny"  # the built-in model where no host is given, and the smallest a host chooses


def _builtin_presets() -> Dict[str, Workload]:
    from cpuperf.knowledge.models import PRESETS as MODEL_PRESETS
    from cpuperf.knowledge.models import non_embedding_params

    out: Dict[str, Workload] = {}
    for name, cfg in MODEL_PRESETS.items():
        params = non_embedding_params(cfg) + cfg.vocab_size * cfg.d_model + cfg.seq_len * cfg.d_model
        out[name] = Workload(name, cfg.n_layer, cfg.d_model, cfg.n_head, cfg.seq_len, cfg.vocab_size,
                             _DEFAULT_BATCH.get(name, 16), None, params, "preset")
    return out


PRESETS: Dict[str, Workload] = _builtin_presets()


def reference_run_s(workload: Workload, cores: int, steps: int, gflops_per_core: float) -> float:
    """Seconds the plain fp32 run of `steps` optimizer steps takes at `gflops_per_core` on `cores` (an estimate)."""
    flops = workload.flops_per_token() * workload.seq_len * workload.batch_size * steps
    return flops / (max(1, cores) * gflops_per_core * 1e9)


def builtin_default(facts: HostFacts) -> Tuple[str, str]:
    """(preset, why): the built-in model a host trains when none is named, by compat/tuning.toml [builtin_model]."""
    from cpuperf.decide.placement import cpu_budget, usable_cores
    from cpuperf.knowledge.tuning import tuning

    rule, rate = tuning().builtin_model, float(tuning().compile.assumed_gflops_per_thread)
    cores, _ = cpu_budget(facts, usable_cores(facts))  # after affinity, cpuset, quota and Slurm: what the run gets
    steps, budget = rule.reference_steps, float(rule.run_budget_s)
    est = {name: reference_run_s(PRESETS[name], cores, steps, rate) for name in rule.presets}
    fits = [name for name in rule.presets if est[name] <= budget] or [rule.presets[0]]
    chosen = fits[-1]
    w = PRESETS[chosen]
    said = (f"{w.n_layer} layers x {w.d_model}, {w.seq_len} tokens, {w.params / 1e6:.1f}M parameters: {cores} "
            f"physical core(s) to keep busy run its {steps} reference steps in ~{est[chosen] / 60:.0f} min (fp32, "
            f"{rate:.0f} GFLOP/s per core assumed)")
    larger = [name for name in rule.presets if est[name] > est[chosen]]
    limit = f"{budget / 60:.0f} min"
    said += (f"; {larger[0]} would take ~{est[larger[0]] / 60:.0f} min, over the {limit} budget" if larger else
             f", the largest of {', '.join(rule.presets)} within the {limit} budget")
    return chosen, said + " (compat/tuning.toml [builtin_model])"


def from_hf_config(path: str, batch_size: int = 8) -> Workload:
    """A Hugging Face config.json (GPT-2, Llama, BERT... key names differ by family)."""
    read = read_model_config(path)
    if read.config is None:  # a usage error (exit 2) says what is wrong with it
        raise FieldError("params", None, verbatim(read.problem), "pass a Hugging Face config.json, or {flag}/{opt.seq_len}")
    return from_config_dict(read.config, path, batch_size)


def from_config_dict(cfg: Mapping[str, object], where: str, batch_size: int = 8) -> Workload:
    """The shape and parameter count of a Hugging Face model config (GPT-2, Llama, BERT... key names differ)."""
    def pick(*keys: str, default: Optional[int] = None) -> Optional[int]:
        for key in keys:
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return int(value)
        return default

    n_layer = pick("num_hidden_layers", "n_layer", "num_layers")
    d_model = pick("hidden_size", "n_embd", "d_model")
    if not n_layer or not d_model:
        raise FieldError("params", None, f"{verbatim(where)} has no layer count or hidden size",
                         "pass {flag} and {opt.seq_len} instead")
    n_head = pick("num_attention_heads", "n_head", default=max(1, d_model // 64)) or 1
    seq = pick("max_position_embeddings", "n_positions", "n_ctx", "seq_length", default=1024) or 1024
    vocab = pick("vocab_size", default=32000) or 32000
    inter = pick("intermediate_size", "n_inner", default=4 * d_model) or 4 * d_model
    kv_heads = pick("num_key_value_heads", default=n_head) or n_head
    tied = bool(cfg.get("tie_word_embeddings", True))
    gated = str(cfg.get("hidden_act", "")).lower() in ("silu", "swiglu") or "llama" in str(cfg.get("model_type", ""))
    mlp = (3 if gated else 2) * d_model * inter
    # q and o projections d x d; k and v d x (kv heads x head size): grouped-query attention shares them.
    attention = 2 * d_model * d_model + 2 * d_model * (kv_heads * (d_model // n_head))
    params = n_layer * (attention + mlp) + vocab * d_model * (1 if tied else 2)
    name = cfg.get("_name_or_path") or cfg.get("model_type") or Path(where).parent.name
    return Workload(str(name), n_layer, d_model, n_head, min(seq, 4096), vocab, batch_size, None, params, "hf-config",
                    d_ff=inter, kv_heads=kv_heads, block="llama" if gated else "gpt2")


def from_script(found: ScriptModel) -> Workload:
    """What a user's script trains, from its own arguments (cpuperf.probe.hf.script_model): its model's shape, its
    sequence length where it names one, its per-device batch and accumulation, its run length (--max_steps; else
    unknown); 'unknown' where it cannot be told."""
    steps = found.max_steps
    if found.config is None:
        return Workload("unknown", 1, 1, 1, 1, 1, 1, steps, 0, "unknown", found.per_device_batch, found.grad_accum,
                        found.optimizer, found.why_not, True, parallel=NOT_READ)
    base = from_config_dict(found.config, found.where)
    seq = found.seq_len or base.seq_len
    per_device = found.per_device_batch
    return replace(base, seq_len=seq, batch_size=(per_device or 8) * (found.grad_accum or 1), steps=steps,
                   source="script", per_device_batch=per_device, grad_accum=found.grad_accum,
                   optimizer=found.optimizer, found=found.where, of_script=True, seq_assumed=not found.seq_len,
                   parallel=NOT_READ)


def for_script(base: Workload, found: ScriptModel) -> Workload:
    """A model given with --model, trained by a user's script: its shape, with the script's own batch and optimizer."""
    per_device = found.per_device_batch
    return replace(base, batch_size=(per_device or 8) * (found.grad_accum or 1), per_device_batch=per_device,
                   grad_accum=found.grad_accum, optimizer=found.optimizer, found=f"--model {base.name}", of_script=True,
                   steps=found.max_steps, parallel=NOT_READ)


def resolve_workload(model: Optional[str] = None, params: Optional[str] = None, seq_len: Optional[int] = None,
                     batch_size: Optional[int] = None, steps: Optional[int] = None,
                     host: Optional[HostFacts] = None) -> Workload:
    """The workload from CLI inputs: a preset name, a config path, a model id in the HF cache, or numbers. With no
    model and no size, the host's built-in default (builtin_default) where its facts are given, else tiny."""
    if model is None and params is None and host is not None:
        chosen, why = builtin_default(host)
        base = replace(PRESETS[chosen], why=why)
    elif model is None or model in PRESETS:
        base = PRESETS[model or DEFAULT_PRESET]
    elif (path := local_config_path(model)) is not None:
        base = from_hf_config(path)
    else:
        from cpuperf.probe.hf import cached_model_config

        cached = cached_model_config(model)
        if cached is None:
            raise FieldError("params", None, f"model {verbatim(repr(model))} is neither a preset ({', '.join(PRESETS)}), a config file, "
                             "nor in the local Hugging Face cache",
                             "pass the path of its config.json, or {flag} N {opt.seq_len} T")
        base = from_hf_config(cached)
    if params is not None:
        count = parse_count(params)
        # Explicit size: keep the preset's aspect, scale layers/width to match roughly.
        base = replace(_scaled(base, count), params=count, source="explicit", name=f"{base.name}@{params}")
    # Each size held to the one table of bounds (worker_settings.BOUNDS), whichever command gave it: recommend planned
    # --batch-size 2**62 for ever on a 4-socket host where train refused it.
    if seq_len is not None:
        base = replace(base, seq_len=bounded("seq_len", seq_len))
    if batch_size is not None:
        base = replace(base, batch_size=bounded("batch_size", batch_size))
    if steps is not None:
        base = replace(base, steps=bounded("max_steps", steps, field="steps"))
    return base


def with_model_shape(base: Workload, shape: Mapping[str, int]) -> Workload:
    """The built-in model as the worker builds it with `--set model.*` applied (cpuperf.knowledge.models, the shapes
    and parameter count cpuperf.train.model uses), so the memory plan sizes what the worker will allocate: a
    `model.d_model` of 262144 planned as the preset's 3M parameters, then the worker died allocating terabytes."""
    if not shape:
        return base
    from cpuperf.knowledge.models import ModelConfig, non_embedding_params

    ratio = base.d_ff // base.d_model if base.d_ff and base.d_model and base.d_ff % base.d_model == 0 else 4
    cfg = ModelConfig(base.n_layer, base.n_head, base.d_model, base.seq_len, base.vocab, ratio)
    cfg = replace(cfg, **{k: int(v) for k, v in shape.items() if k in _MODEL_FIELDS})
    if cfg.d_model % cfg.n_head:
        field_name = "model.d_model" if "d_model" in shape else "model.n_head"
        raise FieldError(field_name, shape.get(field_name[6:]),
                         f"{{typed}}: the model's width {cfg.d_model} is not divisible by its {cfg.n_head} heads",
                         "choose model.d_model a multiple of model.n_head", setting=True)
    params = non_embedding_params(cfg) + cfg.vocab_size * cfg.d_model + cfg.seq_len * cfg.d_model
    return replace(base, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model, seq_len=cfg.seq_len,
                   vocab=cfg.vocab_size, d_ff=0 if cfg.mlp_ratio == 4 else cfg.mlp_ratio * cfg.d_model,
                   kv_heads=0, block="gpt2", params=params)


_MODEL_FIELDS = ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "mlp_ratio")


def _scaled(base: Workload, count: int) -> Workload:
    """Depth and width for `count` parameters at the base's width/depth ratio (12*L*d^2 ~ count).

    The memory plan's activations follow the shapes: a 7B model with the tiny preset's 4 x 256
    layers would claim its activations are a few MiB.
    """
    aspect = base.d_model / max(1, base.n_layer)
    layers = max(1, round((count / (12.0 * aspect * aspect)) ** (1.0 / 3.0)))
    head_dim = max(1, base.head_dim)
    d_model = max(head_dim, int(round(aspect * layers / head_dim)) * head_dim)
    n_head = max(1, d_model // head_dim)
    # The MLP's width and the key/value heads keep their proportions to the width and the heads.
    return replace(base, n_layer=layers, d_model=d_model, n_head=n_head,
                   d_ff=round(base.d_ff * d_model / base.d_model) if base.d_ff else 0,
                   kv_heads=max(1, base.kv_heads * n_head // max(1, base.n_head)) if base.kv_heads else 0)


def parse_count(text: str) -> int:
    """'124M' -> 124_000_000; '7B' -> 7e9; '350000' -> 350000."""
    t = text.strip().upper().replace("_", "")
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(t[-1:] or "", 1)
    number = t[:-1] if t[-1:] in "KMBGT" else t
    try:
        value = float(number) * mult
    except ValueError:
        raise FieldError("params", text, "{flag} {value!r} is not a count", "e.g. {flag} 124M or {flag} 7B") from None
    if not value >= 1:  # also NaN
        raise FieldError("params", text, "{flag} {value!r} must be a positive count", "e.g. {flag} 124M or {flag} 7B")
    if value > 1e15:  # also inf: 1e999 parses as infinity
        raise FieldError("params", text, "{flag} {value!r} is beyond any model (over 10^15)", "e.g. {flag} 7B")
    return int(value)
