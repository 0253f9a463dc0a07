"""compat/tuning.toml, typed: THE one reader of the tuning rules. Every section becomes a frozen record whose field
types and ranges are checked once, here, with an error that names the file and the row (`tuning.toml [judge]
confidence: ...`); every other module asks `tuning()` for the record and reads attributes, never the raw table.
Pure and light (no engine): the worker and ccl-env's preload read it too."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Type, TypeVar

from cpuperf.data import load_builtin, load_toml, overlays
from cpuperf.errors import BadDataError

FILE = "compat/tuning.toml"
R = TypeVar("R")


def _range(low: Optional[float] = None, high: Optional[float] = None) -> Dict[str, Any]:
    return {"low": low, "high": high}


@dataclass(frozen=True)
class CclWorkers:
    """[ccl_workers]: oneCCL progress threads per rank, by the rank's cores."""

    default: int = field(metadata=_range(1))
    min_cores_for_default: int = field(metadata=_range(1))
    small: int = field(metadata=_range(1))
    medium: int = field(metadata=_range(1))
    min_cores_for_medium: int = field(metadata=_range(1))
    reason: str
    source: str


@dataclass(frozen=True)
class Kmp:
    """[kmp]: what libiomp5 gets where it is preloaded."""

    affinity: str
    blocktime: str
    reason: str
    source: str


@dataclass(frozen=True)
class OpenmpWait:
    """[openmp_wait]: how OpenMP threads wait between parallel regions where other work shares the host's CPUs."""

    policy: str  # OMP_WAIT_POLICY's value
    min_threads: int = field(metadata=_range(2))  # a rank of fewer threads has no team to wait for
    kmp_blocktime: str  # KMP_BLOCKTIME instead of [kmp]'s where libiomp5 is preloaded and the same conditions hold
    kmp_source: str  # the measurement kmp_blocktime rests on
    reason: str
    source: str


@dataclass(frozen=True)
class AllocatorRule:
    """[allocator]: the threshold, the refusals and the wheel (decide/allocator.py owns the rule it makes)."""

    min_speedup: float = field(metadata=_range(1.0))  # preload only where the measured ratio reaches this
    not_with_ranks: Tuple[str, ...]  # never preloaded into a job of several ranks
    not_with_ranks_source: str
    jemalloc_malloc_conf: str  # the MALLOC_CONF the launchers export with jemalloc
    source: str
    wheel: str  # the wheel that ships a preloadable allocator without root
    wheel_allocator: str  # the allocator that wheel ships (the others come from the system's packages)
    wheel_version: str  # the version tested (cpuperf install prefers it)
    wheel_platforms: Tuple[str, ...]  # the CPU architectures it is built for
    system_install: str
    reason: str = ""


@dataclass(frozen=True)
class Compile:
    """[compile]: the compile crossover's assumptions where nothing was measured."""

    measure_when_run_exceeds_s: float = field(metadata=_range(0))
    measure_rounds: int = field(metadata=_range(1, 100))
    assumed_compile_seconds_per_layer: float = field(metadata=_range(0))
    assumed_speedup_cpu: float = field(metadata=_range(0))
    assumed_speedup_gpu: float = field(metadata=_range(0))
    assumed_gflops_per_thread: float = field(metadata=_range(1e-9))
    reason: str
    source: str


@dataclass(frozen=True)
class BuiltinModel:
    """[builtin_model]: the built-in model a host trains when none is named."""

    presets: Tuple[str, ...]
    reference_steps: int = field(metadata=_range(1))
    run_budget_s: float = field(metadata=_range(1e-9))
    reason: str
    source: str


@dataclass(frozen=True)
class Dtype:
    """[dtype]: the measured bf16 veto and the GPU capability bars."""

    min_bf16_over_fp32_gemm: float = field(metadata=_range(0))
    fp16_gpu_below_cc: str
    fp32_gpu_below_cc: str
    source: str


@dataclass(frozen=True)
class Fp32MathMode:
    """[fp32_math_mode]: oneDNN's bf16 math for fp32 matmuls."""

    min_torch: str
    value: str
    source: str


@dataclass(frozen=True)
class Optimizer:
    """[optimizer]: the torch releases with a fused AdamW."""

    fused_cuda_min_torch: str
    fused_cpu_min_torch: str
    source: str


@dataclass(frozen=True)
class Memory:
    """[memory]: bytes per parameter of each optimizer's state (the bytes_per_param_X keys), the attention
    coefficient and the headrooms."""

    bytes_per_param: Tuple[Tuple[str, float], ...]  # (adamw, 16.0), ...: the keys' X and their values
    activation_attn_coeff: float = field(metadata=_range(0))
    headroom: float = field(metadata=_range(1e-9, 1.0))
    gpu_headroom: float = field(metadata=_range(1e-9, 1.0))
    source: str


@dataclass(frozen=True)
class GpuBatch:
    """[gpu_batch]: the batch multiples on a GPU."""

    multiple: int = field(metadata=_range(1))
    fp16_tensor_core_multiple: int = field(metadata=_range(1))
    source: str


@dataclass(frozen=True)
class TensorCore:
    """A [[tensor_core]] row: the GEMM multiple for a math dtype from a compute capability (and card)."""

    math: str
    min_cc: str
    card: str
    multiple: int = field(metadata=_range(1))
    source: str


@dataclass(frozen=True)
class Dataloader:
    gpu_workers_per_gpu: int = field(metadata=_range(0))
    source: str


@dataclass(frozen=True)
class GpuMemory:
    min_free_fraction: float = field(metadata=_range(0, 1))
    source: str


@dataclass(frozen=True)
class Load:
    """[load]: when a CPU counts as taken, and the sampling window."""

    busy_cpu_fraction: float = field(metadata=_range(0, 1))
    window_s: float = field(metadata=_range(0, 60))
    reason: str
    source: str


@dataclass(frozen=True)
class Placement:
    pin_ranks_sharing_a_vm_numa_node: bool
    reason: str
    source: str


@dataclass(frozen=True)
class NumaMemory:
    """[numa_memory]: the memory policy of one process whose CPUs span several NUMA nodes."""

    policy: str
    reason: str
    source: str


@dataclass(frozen=True)
class Measure:
    """[measure]: a cached measurement's age, its repeats and the sequential rounds."""

    max_age_days: float = field(metadata=_range(0))
    single_figure_max_spread: float = field(metadata=_range(0))
    repeats: int = field(metadata=_range(1))
    min_rounds: int = field(metadata=_range(1))
    budget_s: float = field(metadata=_range(0))
    disturbed_tries: int = field(metadata=_range(1))
    windows: int = field(metadata=_range(1))
    workload_window_s: float = field(metadata=_range(1e-9))
    reason: str
    source: str


@dataclass(frozen=True)
class Judge:
    """[judge]: the one judgement of a measured comparison."""

    confidence: float = field(metadata=_range(1e-9, 0.999999))
    resolution: float = field(metadata=_range(0, 1))
    reason: str
    source: str


@dataclass(frozen=True)
class HfTrainer:
    default_fused_min_transformers: str
    default_fused_min_torch: str
    cpu_bf16_min_gemm_ratio: float = field(metadata=_range(0))
    reason: str
    source: str


@dataclass(frozen=True)
class Tune:
    """[tune]: the joint tuner's budget, rounds and bar."""

    budget_s: float = field(metadata=_range(0))
    passes: int = field(metadata=_range(1))
    windows: int = field(metadata=_range(1))
    min_gain: float = field(metadata=_range(0, 1))
    seconds: float = field(metadata=_range(1e-9))
    steps: int = field(metadata=_range(1))
    warmup: int = field(metadata=_range(0))
    script_steps: int = field(metadata=_range(1))
    script_passes: int = field(metadata=_range(1))
    script_budget_s: float = field(metadata=_range(0))
    tune_when_run_exceeds_steps: int = field(metadata=_range(0))
    reason: str
    source: str


@dataclass(frozen=True)
class ArmLever:
    """An [[arm_lever]] row: the variable, its value, and when it applies."""

    env: str
    value: str
    changes_math: bool
    training: bool
    what: str
    source: str
    knob: Optional[str] = None
    when: Optional[str] = None
    needs_isa: Optional[str] = None
    min_torch: Optional[str] = None
    why_not_training: Optional[str] = None


@dataclass(frozen=True)
class Tuning:
    """Every section of compat/tuning.toml, typed."""

    ccl_workers: CclWorkers
    kmp: Kmp
    openmp_wait: OpenmpWait
    allocator: AllocatorRule
    compile: Compile
    builtin_model: BuiltinModel
    dtype: Dtype
    fp32_math_mode: Fp32MathMode
    optimizer: Optimizer
    memory: Memory
    gpu_batch: GpuBatch
    tensor_core: Tuple[TensorCore, ...]
    dataloader: Dataloader
    gpu_memory: GpuMemory
    load: Load
    placement: Placement
    numa_memory: NumaMemory
    measure: Measure
    judge: Judge
    hf_trainer: HfTrainer
    tune: Tune
    arm_lever: Tuple[ArmLever, ...]


def _bad(where: str, message: str) -> BadDataError:
    return BadDataError(f"{FILE} {where}: {message}", hint="fix the row (every value has the type and range its "
                        "record in cpuperf/knowledge/tuning.py gives)")


def _value(where: str, kind: str, raw: object, meta: Mapping[str, Any]) -> object:
    """One field's value as its annotated type, checked against its range."""
    if kind.startswith("Optional["):
        return None if raw is None else _value(where, kind[len("Optional["):-1], raw, meta)
    if kind == "Tuple[str, ...]":
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise _bad(where, f"{raw!r} is not a list of strings")
        return tuple(raw)
    if kind == "bool":
        if not isinstance(raw, bool):
            raise _bad(where, f"{raw!r} is not true or false")
        return raw
    if kind == "str":
        if not isinstance(raw, str):
            raise _bad(where, f"{raw!r} is not a string")
        return raw
    if kind in ("int", "float"):
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or (kind == "int" and not isinstance(raw, int)):
            raise _bad(where, f"{raw!r} is not {'a whole number' if kind == 'int' else 'a number'}")
        low, high = meta.get("low"), meta.get("high")
        if (low is not None and raw < low) or (high is not None and raw > high):
            raise _bad(where, f"{raw!r} is outside {low if low is not None else '-inf'}..{high if high is not None else 'inf'}")
        return raw  # an int where the file has one: read as the raw table was (90, not 90.0, in a message)
    raise AssertionError(f"no reader for {kind}")  # pragma: no cover - a field type this module lacks


def _record(cls: Type[R], table: object, where: str, extra: Optional[Dict[str, object]] = None) -> R:
    """The table as the record `cls`: each field present (or defaulted), of its type and in its range."""
    if not isinstance(table, dict):
        raise _bad(where, "is not a table")
    values: Dict[str, object] = dict(extra or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(k for k in table if k not in names and not k.startswith("bytes_per_param_"))
    if unknown:
        raise _bad(f"{where} {unknown[0]}", "not a key this table has (a typo?)")
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in values:
            continue
        if f.name not in table:
            if f.default is dataclasses.MISSING:
                raise _bad(f"{where} {f.name}", "missing")
            continue
        values[f.name] = _value(f"{where} {f.name}", str(f.type), table[f.name], f.metadata)
    return cls(**values)


def _rows(cls: Type[R], raw: object, name: str) -> Tuple[R, ...]:
    if not isinstance(raw, list):
        raise _bad(f"[[{name}]]", "is not a list of tables")
    return tuple(_record(cls, row, f"[[{name}]] row {i + 1}") for i, row in enumerate(raw))


def _memory(table: object) -> Memory:
    if not isinstance(table, dict):
        raise _bad("[memory]", "is not a table")
    prefix = "bytes_per_param_"
    per = tuple((k[len(prefix):], float(_value(f"[memory] {k}", "float", v, _range(1))))  # type: ignore[arg-type]
                for k, v in table.items() if k.startswith(prefix))
    if "adamw" not in dict(per):
        raise _bad("[memory] bytes_per_param_adamw", "missing")
    return _record(Memory, table, "[memory]", {"bytes_per_param": per})


def parse(data: Mapping[str, Any]) -> Tuning:
    """A tuning.toml's tables as the typed record (BadDataError naming the file and row where one is wrong)."""
    sections: Dict[str, object] = {}
    for f in dataclasses.fields(Tuning):
        raw = data.get(f.name)
        if raw is None:
            raise _bad(f"[{f.name}]", "missing")
        if f.name == "memory":
            sections[f.name] = _memory(raw)
        elif f.name == "tensor_core":
            sections[f.name] = _rows(TensorCore, raw, f.name)
        elif f.name == "arm_lever":
            sections[f.name] = _rows(ArmLever, raw, f.name)
        else:
            cls = {"ccl_workers": CclWorkers, "kmp": Kmp, "openmp_wait": OpenmpWait, "allocator": AllocatorRule, "compile": Compile,
                   "builtin_model": BuiltinModel, "dtype": Dtype, "fp32_math_mode": Fp32MathMode,
                   "optimizer": Optimizer, "gpu_batch": GpuBatch, "dataloader": Dataloader, "gpu_memory": GpuMemory,
                   "load": Load, "placement": Placement, "numa_memory": NumaMemory, "measure": Measure, "judge": Judge,
                   "hf_trainer": HfTrainer, "tune": Tune}[f.name]
            sections[f.name] = _record(cls, raw, f"[{f.name}]")
    return Tuning(**sections)  # type: ignore[arg-type]


def overlay(shipped: Mapping[str, Any], extra: Mapping[str, Any]) -> Dict[str, Any]:
    """`extra`'s sections over `shipped`'s: a table's keys replace the shipped ones (the others kept); an array of
    tables ([[tensor_core]], [[arm_lever]]) or a value replaces the shipped one whole."""
    out = dict(shipped)
    for name, section in extra.items():
        base = out.get(name)
        out[name] = {**base, **section} if isinstance(base, dict) and isinstance(section, dict) else section
    return out


@functools.lru_cache(maxsize=8)
def _tuning(over: Tuple[str, ...]) -> Tuning:
    data = load_builtin("tuning.toml")
    for path in over:
        data = overlay(data, load_toml(path))
    try:
        return parse(data)
    except BadDataError as exc:
        if not over:
            raise
        raise BadDataError(f"{exc.message} (with {', '.join(over)} over it)",
                           hint="fix the row in that file, or unset CPUPERF_COMPAT_DIR") from None


def tuning() -> Tuning:
    """compat/tuning.toml, read and checked once; a tuning.toml in a $CPUPERF_COMPAT_DIR directory overlays it
    (`overlay`: section by section, key by key), so a rule is changed in data without a release."""
    return _tuning(overlays("tuning.toml"))


tuning.cache_clear = _tuning.cache_clear  # type: ignore[attr-defined]  # what this process read: read again
