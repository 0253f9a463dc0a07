"""Where one built-in training step spends its time: forward, backward and optimizer apart, GEMM against the rest.

`python -m benchmarks.profile_step [--only lm-small,mlp-small,lm-gpt2] [--dtype bf16] [--steps 5] [--out DIR]`
builds each reference workload exactly as the throughput suite does (cpuperf.train.bench: the same model, batch,
AdamW and bf16 autocast), runs its warm-up, then records `--steps` steps under torch's profiler. Each step's phases
are marked (record_function); each operator's own time (self CPU time, so nothing is counted twice) is put in one
class: GEMM (the matrix products oneDNN or the BLAS runs), attention, the optimizer's update (whatever runs inside
its step), the other element-wise work, reductions and normalisation, copies and casts, and the rest. Prints a table and writes
profile.json and profile.md under --out: the answer to "what bounds this workload, if not the GEMMs".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
from pathlib import Path
from typing import Dict, List, Tuple

RESULTS = Path(__file__).resolve().parent / "results"

# An operator's class by its name: the first pattern found in the name wins (order matters: `addmm` before `add`).
CLASSES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("gemm", ("::mm", "::addmm", "::bmm", "::baddbmm", "mkldnn_linear", "mkldnn_matmul", "::_mkl_linear",
              "onednn", "::linear_backward")),
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("norm/reduce", ("layer_norm", "native_layer_norm", "softmax", "log_softmax", "::sum", "::mean", "nll_loss",
                     "cross_entropy", "::max", "::norm")),
    ("copy/cast", ("::copy_", "::to", "_to_copy", "::clone", "::contiguous", "::cat", "::fill_", "::zero_",
                   "::zeros", "::empty", "::resize_", "::transpose", "::t", "::view", "::reshape", "::expand",
                   "::permute", "::slice", "::select", "::index", "embedding", "::as_strided")),
    ("elementwise", ("::add", "::mul", "::div", "::sub", "gelu", "::relu", "::silu", "::tanh", "::exp", "::pow",
                     "::sqrt", "::rsqrt", "dropout", "::where", "::neg", "threshold", "::sigmoid", "::lerp")),
)
PHASES = ("forward", "backward", "optimizer")


def op_class(name: str) -> str:
    low = name.lower()
    for cls, patterns in CLASSES:
        if any(p in low for p in patterns):
            return cls
    return "other"


def profile_workload(workload: str, size: str, dtype: str, steps: int, warmup: int,
                     optimizer: str = "") -> Dict[str, object]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from cpuperf.train.bench import BATCH, SIZE_BATCH, BenchConfig, _build, _optimised

    batch = SIZE_BATCH.get((workload, size), BATCH[workload])
    torch.manual_seed(0)
    model, loss_fn = _build(workload, size, batch)
    model.train()
    model, opt = _optimised(model, BenchConfig(workload=workload, size=size, dtype=dtype, optimizer=optimizer), dtype)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with record_function("forward"), autocast:
            loss = loss_fn(model)
        with record_function("backward"):
            torch.autograd.backward(loss)
        with record_function("optimizer"):
            opt.step()

    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    phase_us = {p: 0.0 for p in PHASES}
    class_us: Dict[str, float] = {}
    by_op: Dict[str, float] = {}
    for ev in prof.events():
        if ev.name in PHASES:
            phase_us[ev.name] += ev.cpu_time_total
            continue
        own = float(ev.self_cpu_time_total)
        if own <= 0:
            continue
        parent, phase = ev.cpu_parent, ""
        while parent is not None and not phase:
            phase = parent.name if parent.name in PHASES else ""
            parent = parent.cpu_parent
        # the optimizer's update is element-wise work of its own kind: counted by where it runs, not by its name
        cls = "optimizer" if phase == "optimizer" else op_class(ev.name)
        class_us[cls] = class_us.get(cls, 0.0) + own
        if cls != "gemm":
            by_op[ev.name] = by_op.get(ev.name, 0.0) + own
    top = sorted(((us, name) for name, us in by_op.items()), reverse=True)
    total = sum(class_us.values()) or 1.0
    step_ms = sum(phase_us.values()) / steps / 1000.0
    return {
        "workload": f"{workload}-{size}", "dtype": dtype, "optimizer": optimizer or "adamw (foreach)", "batch": batch, "steps": steps,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "step_ms_profiled": round(step_ms, 2),  # under the profiler: its own cost included
        "phase_share": {p: round(phase_us[p] / (sum(phase_us.values()) or 1.0), 3) for p in PHASES},
        "class_share": {c: round(v / total, 3) for c, v in sorted(class_us.items(), key=lambda kv: -kv[1])},
        "top_not_gemm": [{"op": name, "share": round(us / total, 3)} for us, name in sorted(top, reverse=True)[:8]],
    }


def render(rows: List[Dict[str, object]]) -> str:
    lines = ["| workload | dtype | step ms (profiled) | forward / backward / optimizer | GEMM share | largest other classes |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        phases, classes = r["phase_share"], r["class_share"]
        assert isinstance(phases, dict) and isinstance(classes, dict)
        others = ", ".join(f"{c} {v:.0%}" for c, v in classes.items() if c != "gemm")
        split = " / ".join(f"{phases[p]:.0%}" for p in PHASES)
        lines.append(f"| {r['workload']} | {r['dtype']} | {r['step_ms_profiled']} | {split} | {classes.get('gemm', 0):.0%} "
                     f"| {others} |")
    for r in rows:
        top = r["top_not_gemm"]
        assert isinstance(top, list)
        lines.append(f"\n{r['workload']}: largest operators that are not GEMM: "
                     + ", ".join(f"{t['op']} {t['share']:.0%}" for t in top[:6]))
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_step", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="lm-small,mlp-small,lm-gpt2", help="workload-size list")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--optimizer", default="", choices=("", "adamw_fused"), help="AdamW as the plan runs it")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=None, help="directory for profile.json and profile.md (default: print only)")
    args = ap.parse_args(argv)
    rows = []
    for item in args.only.split(","):
        workload, size = item.split("-", 1)
        steps = 2 if size == "gpt2" else args.steps  # a gpt2 step takes seconds on 2 cores
        rows.append(profile_workload(workload, size, args.dtype, steps, 1 if size == "gpt2" else args.warmup,
                                    args.optimizer))
        print(f"profiled {item}", file=sys.stderr)
    table = render(rows)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        host = {"machine": platform.machine(), "processor": platform.processor()}
        (out / "profile.json").write_text(json.dumps({"host": host, "rows": rows}, indent=1) + "\n")
        (out / "profile.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
