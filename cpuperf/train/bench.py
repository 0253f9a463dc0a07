"""A child process that trains a reference workload for a while and reports its throughput.

`python -m cpuperf.train.bench '{"workload": "lm", "size": "small", "dtype": "fp32", ...}'` prints one
JSON object. Used by `cpuperf bench` (allocator and compile measurements) and by benchmarks/.
torch is imported inside functions: this module is also imported by the torch-free parent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

from cpuperf.train import observed

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


def lm_shape(size: str, shape: Any = None) -> Dict[str, int]:
    """The LM's shape: an explicit one (a model cpuperf plans for: `cpuperf bench --compile --model`) or a size."""
    return dict(shape) if shape else LM_SHAPES[size]


def flops_per_sample(workload: str, size: str, shape: Any = None) -> float:
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


def _build(workload: str, size: str, batch: int, shape: Any = None) -> Tuple[Any, Any]:
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

        def loss_fn(m: Any) -> Any:
            return m(x, y)[1]
    elif workload == "mlp":
        d_in, hidden, layers = MLP_SHAPES[size]
        mods = [nn.Linear(d_in, hidden), nn.GELU()]
        for _ in range(layers - 1):
            mods += [nn.Linear(hidden, hidden), nn.GELU()]
        model = nn.Sequential(*mods, nn.Linear(hidden, 10))
        x = torch.randn(batch, d_in, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)

        def loss_fn(m: Any) -> Any:
            return nn.functional.cross_entropy(m(x), y)
    elif workload == "conv":
        side, ch = CONV_SHAPES[size]
        convs: list[Any] = []
        c_in = 3
        for c_out in (ch, ch * 2, ch * 4, ch * 8):
            convs += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
                       nn.Conv2d(c_out, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c_out
        model = nn.Sequential(*convs, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, 10))
        x = torch.randn(batch, 3, side, side, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)

        def loss_fn(m: Any) -> Any:
            return nn.functional.cross_entropy(m(x), y)
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    return model, loss_fn


def _place_rank(cfg: Dict[str, Any], torch: Any) -> Tuple[int, int]:
    """(world size, rank) from torchrun's variables: this rank pinned, its threads set, its group joined."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    pin = cfg.get("cpus_per_rank")  # [[cpus of rank 0], [cpus of rank 1], ...]: pinned ranks
    if pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, pin[int(os.environ.get("LOCAL_RANK", "0")) % len(pin)])
    if cfg.get("threads_per_rank"):
        torch.set_num_threads(int(cfg["threads_per_rank"]))
    if world > 1:  # data parallel over ranks started by torchrun: the global batch split between them
        import torch.distributed as dist

        dist.init_process_group("gloo")
    return world, rank


def _optimised(model: Any, cfg: Dict[str, Any], torch: Any, dtype: str) -> Tuple[Any, Any]:
    """(model, AdamW optimizer) with the settings under test: fused AdamW, IPEX, oneDNN bf16 math, compile."""
    fused: Dict[str, Any] = {"fused": True} if cfg.get("optimizer") == "adamw_fused" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    if cfg.get("ipex"):
        import intel_extension_for_pytorch as ipex  # noqa: F401  (legacy stacks only)

        model, opt = ipex.optimize(model, optimizer=opt, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    if cfg.get("fp32_math_mode") == "bf16":
        try:
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        except AttributeError:
            pass
    if cfg.get("compile"):
        model = torch.compile(model)
    return model, opt


def _timed_steps(step: Callable[[], None], cfg: Dict[str, Any], world: int,
                 torch: Any, window: Any = None) -> Tuple[float, int, float, List[float]]:
    """(first step's seconds, steps timed, their seconds, the time at each step's end) after the warm-up; every
    rank stops at the same step. `window` (observed.CpuWindow) brackets the timed steps."""
    t0 = time.perf_counter()
    step()  # the first step carries compile / oneDNN primitive creation
    first = time.perf_counter() - t0
    for _ in range(int(cfg.get("warmup", 2))):
        step()
    min_steps, seconds = int(cfg.get("steps", 10)), float(cfg.get("seconds", 5.0))
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
            import torch.distributed as dist

            flag = torch.tensor([1.0 if done else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            done = bool(flag.item())
        if done:
            break
    if window is not None:
        window.end()
    return first, count, elapsed, marks


def run(cfg: Dict[str, Any]) -> Dict[str, Any]:
    import contextlib

    import torch

    workload, size = cfg.get("workload", "lm"), cfg.get("size", "small")
    batch = int(cfg.get("batch") or SIZE_BATCH.get((workload, size), BATCH[workload]))
    world, rank = _place_rank(cfg, torch)
    torch.manual_seed(0)
    model, loss_fn = _build(workload, size, max(1, batch // world), cfg.get("shape"))
    model.train()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    dtype = cfg.get("dtype", "fp32")
    model, opt = _optimised(model, cfg, torch, dtype)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext())
    seen: Dict[str, Any] = {}  # read inside the step: what the timed code ran under

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            if not seen:
                seen["autocast"] = observed.autocast_dtype(torch)
            loss = loss_fn(model)
        loss.backward()
        opt.step()

    window = observed.CpuWindow()
    first, count, elapsed, marks = _timed_steps(step, cfg, world, torch, window)
    ran = observed.what_ran(model, opt, torch, seen.get("autocast"))
    ranks_ran: List[Any] = [ran]
    windows: List[Any] = [window.figures()]
    if world > 1:
        import torch.distributed as dist

        ranks_ran, windows = [None] * world, [None] * world
        dist.all_gather_object(ranks_ran, ran)
        dist.all_gather_object(windows, window.figures())
        slowest = torch.tensor([elapsed])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the job is as fast as its slowest rank
        elapsed = float(slowest.item())
        # DDP (its reducer) goes before its process group: destroyed after it, the gloo teardown aborted
        # at exit ("terminate called without an active exception") in 3 of 10 2-rank jobs with mimalloc.
        del model, opt, step
        import gc

        gc.collect()
        dist.destroy_process_group()
    return {
        "samples_per_s": count * max(1, batch // world) * world / elapsed,
        "window_rates": window_rates(marks, int(cfg.get("windows") or 1), max(1, batch // world) * world),
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
        "flops_per_sample": flops_per_sample(workload, size, cfg.get("shape")),
        "torch": torch.__version__,
    }


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


def best_window(run: Callable[[], Any], work: float, seconds: float, windows: int) -> float:
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


def gemm_rate(dtype: str, size: int, seconds: float, cache: Dict[Any, Any], windows: int = 1) -> float:
    """GFLOP/s of size x size matrix products in `dtype` (best of `windows`; operands made, and warmed, once)."""
    import torch

    key = ("gemm", dtype, size)
    if key not in cache:
        kind = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        a, b = torch.randn(size, size, dtype=kind), torch.randn(size, size, dtype=kind)
        torch.mm(a, b)  # warm-up: oneDNN primitive creation
        cache[key] = (a, b)
    a, b = cache[key]
    return best_window(lambda: torch.mm(a, b), 2.0 * size ** 3 / 1e9, seconds, windows)


def _workload_rate(cfg: Dict[str, Any], cache: Dict[Any, Any]) -> float:
    """samples/s of the reference workload `cfg` names (best of cfg['windows'] of cfg['seconds']; built, and
    warmed, once)."""
    import torch

    workload, size = cfg.get("workload", "lm"), cfg.get("size", "small")
    batch = int(cfg.get("batch") or SIZE_BATCH.get((workload, size), BATCH[workload]))
    dtype = "bf16" if cfg.get("dtype") == "bf16" else "fp32"  # bf16: the forward under CPU autocast, as a plan runs it
    key = ("workload", workload, size, batch, dtype)
    if key not in cache:
        torch.manual_seed(0)
        model, loss_fn = _build(workload, size, batch)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            if dtype == "bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = loss_fn(model)
            else:
                loss = loss_fn(model)
            loss.backward()
            opt.step()

        step()  # the first step carries oneDNN primitive creation and the optimizer's state
        cache[key] = step
    return best_window(cache[key], float(batch), float(cfg.get("seconds", 1.0)), int(cfg.get("windows", 1)))


def serve(lines: Any, write: Callable[[str], None]) -> int:
    """`--serve`: one timed run per request line, one JSON answer line each, the models and operands kept between
    requests. The parent alternates requests between servers (one per allocator preloaded) so that load from other
    work falls on both sides of a ratio alike, and pays each process's start (torch's import) once."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    cache: Dict[Any, Any] = {}
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
            rate = gemm_rate(str(cfg["gemm"]), int(cfg.get("size", 512)), float(cfg.get("seconds", 0.25)), cache,
                             int(cfg.get("windows", 1)))
        else:
            rate = _workload_rate(cfg, cache)
        write(json.dumps({"rate": rate}))
    return 0


def main(argv: Any = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--serve":
        def write(text: str) -> None:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

        return serve(sys.stdin, write)
    try:
        cfg = json.loads(args[0]) if args else {}
    except ValueError as exc:
        print(json.dumps({"error": f"bad settings JSON: {exc}"}))
        return 2
    result = run(cfg)
    if result.get("rank", 0) == 0:  # one line per job, from rank 0
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
