"""A child process that trains a reference workload for a while and reports its throughput.

`python -m cpuperf.train.bench '{"workload": "lm", "size": "small", "dtype": "fp32", ...}'` prints one
JSON object. Used by `cpuperf bench` (allocator and compile measurements) and by benchmarks/.
torch is imported inside functions: this module is also imported by the torch-free parent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from cpuperf.jsonable import JsonMapping, JsonValue
from cpuperf.train import observed
from cpuperf.worker_settings import COMPILE_MODES  # how torch.compile can be asked (benchmarks/compile_modes.py)

if TYPE_CHECKING:
    from torch import Tensor, nn
    from torch.optim import Optimizer

    LossFn = Callable[[nn.Module], Tensor]

# Reference workloads: (builder, batch size, FLOPs-per-sample function). Sizes 'small' and 'large'.
LM_SHAPES = {"small": {"n_layer": 4, "n_head": 4, "d_model": 256, "seq_len": 128},
             "large": {"n_layer": 6, "n_head": 6, "d_model": 384, "seq_len": 256},
             # GPT-2 small's width and depth (the gpt2-small preset) at a 128-token context: ~85M parameters,
             # weights, gradients and AdamW state ~1.4 GB: big enough for the allocator and memory levers;
             # a step ~2-3 s on 2 cores at batch 2, so a run is a few steps.
             "gpt2": {"n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 128}}
MLP_SHAPES = {"small": (1024, 1024, 4), "large": (2048, 4096, 4)}  # (input, hidden, layers)
CONV_SHAPES = {"small": (64, 32), "large": (128, 64)}  # (image side, base channels)
BATCH = {"lm": 16, "mlp": 256, "conv": 32}
SIZE_BATCH = {("lm", "gpt2"): 2}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The settings of one run or one served request, read once from their JSON (absent keys: the defaults)."""

    workload: str = "lm"
    size: str = "small"
    dtype: str = "fp32"
    batch: int = 0  # 0: the workload's reference batch
    shape: Optional[Dict[str, int]] = None  # an explicit LM shape (n_layer, n_head, d_model, seq_len)
    cpus_per_rank: Tuple[Tuple[int, ...], ...] = ()  # [[cpus of rank 0], [cpus of rank 1], ...]: pinned ranks
    threads_per_rank: int = 0
    optimizer: str = ""
    ipex: bool = False
    fp32_math_mode: str = ""
    compile: bool = False
    compile_mode: str = ""  # one of COMPILE_MODES: how torch.compile is asked (benchmarks/compile_modes.py)
    warmup: int = 2
    steps: int = 10
    seconds: Optional[float] = None  # a run's default is 5 s, a served request's 1 s
    windows: int = 1

    @classmethod
    def from_json(cls, data: JsonMapping) -> BenchConfig:
        """The config from its JSON object; ValueError/TypeError for a value of the wrong kind."""
        shape = data.get("shape")
        pin = data.get("cpus_per_rank")
        seconds = data.get("seconds")
        return cls(
            workload=str(data.get("workload", "lm")), size=str(data.get("size", "small")),
            dtype=str(data.get("dtype", "fp32")), batch=_whole(data.get("batch") or 0),
            shape={str(k): _whole(v) for k, v in shape.items()} if isinstance(shape, dict) and shape else None,
            cpus_per_rank=tuple(tuple(_whole(c) for c in cpus) for cpus in pin if isinstance(cpus, list))
            if isinstance(pin, list) else (),
            threads_per_rank=_whole(data.get("threads_per_rank") or 0),
            optimizer=str(data.get("optimizer") or ""), ipex=bool(data.get("ipex")),
            fp32_math_mode=str(data.get("fp32_math_mode") or ""), compile=bool(data.get("compile")),
            compile_mode=str(data.get("compile_mode") or ""),
            warmup=_whole(data.get("warmup", 2)), steps=_whole(data.get("steps", 10)),
            seconds=None if seconds is None else _figure(seconds), windows=_whole(data.get("windows") or 1))


def _whole(value: JsonValue) -> int:
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"not a whole number: {type(value).__name__}")


def _figure(value: JsonValue) -> float:
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"not a number: {type(value).__name__}")


def lm_shape(size: str, shape: Optional[Mapping[str, int]] = None) -> Dict[str, int]:
    """The LM's shape: an explicit one (a model cpuperf plans for: `cpuperf bench --compile --model`) or a size."""
    return dict(shape) if shape else LM_SHAPES[size]


def flops_per_sample(workload: str, size: str, shape: Optional[Mapping[str, int]] = None) -> float:
    """Training FLOPs per sample (forward + backward = 3x forward matmul FLOPs)."""
    if workload == "lm":
        from cpuperf.knowledge.models import flops_per_token, make_config

        cfg = make_config("tiny", lm_shape(size, shape))
        return flops_per_token(cfg) * cfg.seq_len
    if workload == "mlp":
        d_in, hidden, layers = MLP_SHAPES[size]
        macs = d_in * hidden + (layers - 1) * hidden * hidden + hidden * 10
        return 6.0 * macs
    side, ch = CONV_SHAPES[size]
    macs = 0
    c_in, s = 3, side
    for c_out in (ch, ch * 2, ch * 4, ch * 8):
        macs += s * s * 9 * (c_in * c_out + c_out * c_out)  # two 3x3 convs per stage
        c_in, s = c_out, s // 2
    return 6.0 * (macs + c_in * 10)


def _build(workload: str, size: str, batch: int,
           shape: Optional[Mapping[str, int]] = None) -> Tuple[nn.Module, LossFn]:
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(0)
    if workload == "lm":
        from cpuperf.knowledge.models import make_config
        from cpuperf.train.model import build_model

        cfg = make_config("tiny", lm_shape(size, shape))
        model = build_model(cfg)
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
        y = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)

        def loss_fn(m: nn.Module) -> Tensor:
            loss: Tensor = m(x, y)[1]
            return loss
    elif workload == "mlp":
        d_in, hidden, layers = MLP_SHAPES[size]
        mods = [nn.Linear(d_in, hidden), nn.GELU()]
        for _ in range(layers - 1):
            mods += [nn.Linear(hidden, hidden), nn.GELU()]
        model = nn.Sequential(*mods, nn.Linear(hidden, 10))
        x = torch.randn(batch, d_in, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)

        def loss_fn(m: nn.Module) -> Tensor:
            return nn.functional.cross_entropy(m(x), y)
    elif workload == "conv":
        side, ch = CONV_SHAPES[size]
        convs: List[nn.Module] = []
        c_in = 3
        for c_out in (ch, ch * 2, ch * 4, ch * 8):
            convs += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
                       nn.Conv2d(c_out, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c_out
        model = nn.Sequential(*convs, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, 10))
        x = torch.randn(batch, 3, side, side, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)

        def loss_fn(m: nn.Module) -> Tensor:
            return nn.functional.cross_entropy(m(x), y)
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    return model, loss_fn


def _place_rank(cfg: BenchConfig) -> Tuple[int, int]:
    """(world size, rank) from torchrun's variables: this rank pinned, its threads set, its group joined."""
    import torch

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    pin = cfg.cpus_per_rank
    if pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, pin[int(os.environ.get("LOCAL_RANK", "0")) % len(pin)])
    if cfg.threads_per_rank:
        torch.set_num_threads(cfg.threads_per_rank)
    if world > 1:  # data parallel over ranks started by torchrun: the global batch split between them
        import torch.distributed as dist

        dist.init_process_group("gloo")
    return world, rank


def _optimised(model: nn.Module, cfg: BenchConfig, dtype: str) -> Tuple[nn.Module, Optimizer]:
    """(model, AdamW optimizer) with the settings under test: fused AdamW, IPEX, oneDNN bf16 math, compile."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if cfg.optimizer == "adamw_fused" else None)
    if cfg.ipex:
        import intel_extension_for_pytorch as ipex  # noqa: F401  (legacy stacks only)

        model, opt = ipex.optimize(model, optimizer=opt, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    if cfg.fp32_math_mode == "bf16":
        try:
            mkldnn: ModuleType = torch.backends.mkldnn  # its `matmul` is torch >= 2.9's
            mkldnn.matmul.fp32_precision = "bf16"
        except AttributeError:
            pass
    if cfg.compile:
        model = compiled_model(torch, model, cfg.compile_mode or "default")
    return model, opt


def available_compile_modes(torch: ModuleType) -> List[str]:
    """The COMPILE_MODES the installed torch has: torch.compile (2.0), a module's own compile (regional: 2.2)."""
    if not hasattr(torch, "compile"):
        return []
    return [m for m in COMPILE_MODES if not m.startswith("regional") or hasattr(torch.nn.Module, "compile")]


def compiled_model(torch: ModuleType, model: nn.Module, how: str) -> nn.Module:
    """`model` under torch.compile as `how` (COMPILE_MODES) asks; regional without repeated blocks: the whole.
    The built-in worker (cpuperf.train.loop) compiles its model here too, so a mode measured is the mode run."""
    if how not in COMPILE_MODES:
        raise SystemExit(f"unknown compile_mode {how!r}: one of {', '.join(COMPILE_MODES)}")
    mode = "max-autotune" if how.endswith("max-autotune") else None
    blocks = getattr(getattr(model, "module", model), "blocks", None)
    if how.startswith("regional") and blocks is not None:
        for block in blocks:
            block.compile(mode=mode)  # in place: the module's forward compiled, shared code for equal blocks
        return model
    compiled: nn.Module = torch.compile(model, mode=mode)  # a module compiled is one (OptimizedModule)
    return compiled


def _timed_steps(step: Callable[[], None], cfg: BenchConfig, world: int,
                 window: Optional[observed.CpuWindow] = None) -> Tuple[float, int, float, List[float]]:
    """(first step's seconds, steps timed, their seconds, the time at each step's end) after the warm-up; every
    rank stops at the same step. `window` (observed.CpuWindow) brackets the timed steps."""
    t0 = time.perf_counter()
    step()  # the first step carries compile / oneDNN primitive creation
    first = time.perf_counter() - t0
    for _ in range(cfg.warmup):
        step()
    min_steps, seconds = cfg.steps, 5.0 if cfg.seconds is None else cfg.seconds
    if window is not None:
        window.begin()
    count, start = 0, time.perf_counter()
    marks: List[float] = []  # the time at the end of each step: the windows' rates (tuning's short repeats in one process)
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - start
        marks.append(elapsed)
        done = (count >= min_steps and elapsed >= seconds) or elapsed >= seconds * 2  # emulated bf16: never minutes
        if world > 1:  # every rank stops at the same step (DDP's all-reduces must pair up)
            import torch
            import torch.distributed as dist

            flag = torch.tensor([1.0 if done else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            done = bool(flag.item())
        if done:
            break
    if window is not None:
        window.end()
    return first, count, elapsed, marks


def run(cfg: BenchConfig) -> Dict[str, object]:
    import contextlib

    import torch

    workload, size = cfg.workload, cfg.size
    batch = cfg.batch or SIZE_BATCH.get((workload, size), BATCH[workload])
    world, rank = _place_rank(cfg)
    torch.manual_seed(0)
    model, loss_fn = _build(workload, size, max(1, batch // world), cfg.shape)
    model.train()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    dtype = cfg.dtype
    model, opt = _optimised(model, cfg, dtype)
    autocast: contextlib.AbstractContextManager[object] = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext())
    seen: Dict[str, Optional[str]] = {}  # read inside the step: what the timed code ran under

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            if not seen:
                seen["autocast"] = observed.autocast_dtype(torch)
            loss = loss_fn(model)
        torch.autograd.backward(loss)
        opt.step()

    window = observed.CpuWindow()
    first, count, elapsed, marks = _timed_steps(step, cfg, world, window)
    ran = observed.what_ran(model, opt, torch.get_num_threads(), seen.get("autocast"))
    ranks_ran: List[object] = [ran]
    windows: List[observed.WindowFigures] = [window.figures()]
    if world > 1:
        import torch.distributed as dist

        ranks_ran, windows, elapsed = _gathered(ran, window.figures(), elapsed, world)
        # DDP (its reducer) goes before its process group: destroyed after it, the gloo teardown aborted
        # at exit ("terminate called without an active exception") in 3 of 10 2-rank jobs with mimalloc.
        del model, opt, step
        import gc

        gc.collect()
        dist.destroy_process_group()
    return {
        "samples_per_s": count * max(1, batch // world) * world / elapsed,
        "window_rates": window_rates(marks, cfg.windows, max(1, batch // world) * world),
        "ranks": world, "rank": rank,
        "steps": count,
        "first_step_s": first,
        "threads": torch.get_num_threads(),
        "allowed_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "allocator": ran["allocator"],
        "batch": batch,
        "openmp": ran["openmp"],
        "ran": ranks_ran,  # one record per rank, read back inside it
        "window": observed.combine_windows(windows),  # the timed steps: who else used their CPUs
        "flops_per_sample": flops_per_sample(workload, size, cfg.shape),
        "compile_modes": available_compile_modes(torch),
        "torch": torch.__version__,
    }


def _gathered(ran: object, window: observed.WindowFigures, elapsed: float,
              world: int) -> Tuple[List[object], List[observed.WindowFigures], float]:
    """Every rank's record of what it ran and of its timed window, and the slowest rank's time: the job is as fast
    as its slowest rank."""
    import torch
    import torch.distributed as dist

    ranks_ran: List[object] = [None] * world
    windows: List[observed.WindowFigures] = [{} for _ in range(world)]
    dist.all_gather_object(ranks_ran, ran)
    dist.all_gather_object(windows, window)
    slowest = torch.tensor([elapsed])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return ranks_ran, windows, float(slowest.item())


def window_rates(marks: List[float], windows: int, batch: int) -> List[float]:
    """samples/s over `windows` consecutive runs of steps (as equal in steps as the count allows)."""
    windows = max(1, min(windows, len(marks)))
    out, prev_t, prev_i = [], 0.0, 0
    for w in range(1, windows + 1):
        i = round(w * len(marks) / windows)
        span = marks[i - 1] - prev_t
        if span > 0:
            out.append((i - prev_i) * batch / span)
        prev_t, prev_i = marks[i - 1], i
    return out


def best_window(run: Callable[[], object], work: float, seconds: float, windows: int) -> float:
    """The highest rate (work per second) of `windows` timed windows of `seconds` each, each at least one run: on a
    shared host other work steals some windows and not others, and the least disturbed is the closest to the
    host's own figure."""
    best = 0.0
    for _ in range(max(1, windows)):
        count, start = 0, time.perf_counter()
        while True:
            run()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, work * count / elapsed)
    return best


def gemm_rate(dtype: str, size: int, seconds: float, cache: ServeCache, windows: int = 1) -> float:
    """GFLOP/s of size x size matrix products in `dtype` (best of `windows`; operands made, and warmed, once)."""
    import torch

    key = (dtype, size)
    if key not in cache.operands:
        kind = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        a, b = torch.randn(size, size, dtype=kind), torch.randn(size, size, dtype=kind)
        torch.mm(a, b)  # warm-up: oneDNN primitive creation
        cache.operands[key] = (a, b)
    a, b = cache.operands[key]
    return best_window(lambda: torch.mm(a, b), 2.0 * size ** 3 / 1e9, seconds, windows)


@dataclasses.dataclass
class ServeCache:
    """What a server keeps between requests: the operands of each (dtype, size) product, the warmed step of each
    (workload, size, batch, optimizer, dtype)."""

    operands: Dict[Tuple[str, int], Tuple[Tensor, Tensor]] = dataclasses.field(default_factory=dict)
    steps: Dict[Tuple[str, str, int, str, str], Callable[[], None]] = dataclasses.field(default_factory=dict)


def _workload_rate(cfg: BenchConfig, cache: ServeCache) -> float:
    """samples/s of the reference workload `cfg` names (best of cfg['windows'] of cfg['seconds']; built, and
    warmed, once)."""
    import torch

    workload, size = cfg.workload, cfg.size
    batch = cfg.batch or SIZE_BATCH.get((workload, size), BATCH[workload])
    dtype = "bf16" if cfg.dtype == "bf16" else "fp32"  # bf16: the forward under CPU autocast, as a plan runs it
    key = (workload, size, batch, cfg.optimizer, dtype)
    if key not in cache.steps:
        torch.manual_seed(0)
        model, loss_fn = _build(workload, size, batch)
        model.train()
        # The optimizer a plan runs (cpuperf.train.loop: adamw_fused fused, adamw foreach); none named: torch's own
        # default (on CPU the per-parameter loop). Its allocations are part of what an allocator is measured on.
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if cfg.optimizer == "adamw_fused" else None,
                                foreach=True if cfg.optimizer == "adamw" else None)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            if dtype == "bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = loss_fn(model)
            else:
                loss = loss_fn(model)
            torch.autograd.backward(loss)
            opt.step()

        step()  # the first step carries oneDNN primitive creation and the optimizer's state
        cache.steps[key] = step
    return best_window(cache.steps[key], float(batch), 1.0 if cfg.seconds is None else cfg.seconds, cfg.windows)


def serve(lines: Iterable[str], write: Callable[[str], None]) -> int:
    """`--serve`: one timed run per request line, one JSON answer line each, the models and operands kept between
    requests. The parent alternates requests between servers (one per allocator preloaded) so that load from other
    work falls on both sides of a ratio alike, and pays each process's start (torch's import) once."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    cache = ServeCache()
    write(json.dumps({"ready": True, "threads": torch.get_num_threads(), "torch": torch.__version__}))
    for line in lines:
        try:
            cfg = json.loads(line)
        except ValueError:
            write(json.dumps({"error": "bad request"}))
            continue
        if not isinstance(cfg, dict) or cfg.get("quit"):
            break
        if "gemm" in cfg:
            rate = gemm_rate(str(cfg["gemm"]), _whole(cfg.get("size", 512)), _figure(cfg.get("seconds", 0.25)), cache,
                             _whole(cfg.get("windows", 1)))
        else:
            rate = _workload_rate(BenchConfig.from_json(cfg), cache)
        write(json.dumps({"rate": rate}))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--serve":
        def write(text: str) -> None:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

        return serve(sys.stdin, write)
    try:
        data: Union[JsonValue, Dict[str, JsonValue]] = json.loads(args[0]) if args else {}
    except ValueError as exc:
        print(json.dumps({"error": f"bad settings JSON: {exc}"}))
        return 2
    if not isinstance(data, dict):
        print(json.dumps({"error": "bad settings JSON: not an object"}))
        return 2
    result = run(BenchConfig.from_json(data))
    if result.get("rank", 0) == 0:  # one line per job, from rank 0
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
