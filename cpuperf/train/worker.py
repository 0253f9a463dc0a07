"""The training worker: `python -m cpuperf.train.worker --config PATH_OR_JSON [--json]`.

Runs alone, or as one rank under torchrun / mpirun / srun (see dist_env.py). Rank 0 writes the
checkpoint, the metrics file (JSON lines) and the summary; every rank trains.

Exit codes (errors.TrainExit): 0 done, 1 failed, 2 bad config, 3 missing IPEX/oneCCL/CUDA/MPI,
8 torch.distributed failed to start, 130 SIGINT and 143 SIGTERM (both after a checkpoint).
No traceback unless CPUPERF_DEBUG=1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional

from cpuperf.train import SCHEMA
from cpuperf.train.errors import ConfigError, DistInitError, MissingFeatureError, TrainError, TrainExit
from cpuperf.train.settings import TrainSettings

METRICS_NAME = "metrics.jsonl"

class _Stop:
    """Signal flag set by the handler and read at step boundaries."""

    signum: Optional[int] = None


def _install_signal_handlers(stop: _Stop) -> None:
    def handler(signum: int, frame: Any) -> None:
        if stop.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: give up on the clean stop
        stop.signum = signum

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _import_torch() -> Any:
    with warnings.catch_warnings():
        # The CPU wheel warns at import when numpy is absent; the worker does not use numpy.
        warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
        try:
            import torch
        except ImportError as exc:
            raise MissingFeatureError(f"torch does not import ({exc})",
                                      hint="install PyTorch first (cpuperf install)")
    return torch


def _peak_tflops(s: TrainSettings, device_name: str, dtype: Optional[str] = None) -> Any:
    """The MFU denominator (gpu.Peak) from settings.peak_tflops or compat/gpu_peaks.toml; None if unknown.

    `dtype` is the precision the run really uses (the AMP plan's), default settings.dtype. Unknown
    (a card not in the table; every CPU: peaks depend on SKU, clocks and ISA) gets a measured GEMM
    peak in Run.run.
    """
    from cpuperf.train.gpu import Peak, math_dtype, table_peak

    dt = dtype or s.dtype
    if s.peak_tflops is not None:
        return Peak(s.peak_tflops, math_dtype(dt, s.tf32 and s.device == "cuda"), "settings.peak_tflops")
    if s.device != "cuda":
        return None
    return table_peak(device_name, dt, s.tf32)


def _checksum(model: Any) -> int:
    """Exact, order-independent hash of all parameters and buffers (bit patterns, wrapping int64).

    Integer addition wraps and is associative, so the value is bit-exact whatever the thread count;
    two ranks agree iff their weights are bitwise identical (up to a 2^-64 collision).
    """
    torch = sys.modules["torch"]
    total = torch.zeros((), dtype=torch.int64)
    int_of = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for i, (name, t) in enumerate(sorted(model.state_dict().items())):
        t = t.detach().contiguous().flatten()
        if t.dtype == torch.bool:
            t = t.to(torch.int8)
        bits = t.view(int_of[t.element_size()]).to(torch.int64).cpu()
        w = torch.arange(1, bits.numel() + 1, dtype=torch.int64) * (2 * i + 1)
        total += (bits * w).sum()
    return int(total)


def _lr_lambda(s: TrainSettings, total: int) -> Any:
    def f(step: int) -> float:
        if s.warmup and step < s.warmup:
            return (step + 1) / s.warmup
        span = max(1, total - s.warmup)
        progress = min(1.0, (step - s.warmup) / span)
        return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def _schedule_length(s: TrainSettings) -> int:
    # With only a time budget the length is unknown; cosine over a nominal horizon (documented).
    return s.max_steps if s.max_steps is not None else 10_000


class Run:
    """One training run; run() returns (summary or None on ranks > 0, exit code)."""

    def __init__(self, s: TrainSettings, stop: _Stop) -> None:
        self.s = s
        self.stop = stop
        self.torch = _import_torch()
        self.t_start = time.perf_counter()
        self.memory_probe: Any = None  # gpu.MemoryProbe for the batch trial; None = torch.cuda's

    # ---------------------------------------------------------------------------------- setup
    def setup_dist(self) -> None:
        from cpuperf.train.dist_env import LaunchEnvError, rank_info

        torch, s = self.torch, self.s
        try:
            info = rank_info(os.environ)
        except LaunchEnvError as exc:
            raise ConfigError(f"launcher environment: {exc}")
        self.info = info
        self.world = info.world_size if info else 1
        self.rank = info.rank if info else 0
        self.local_rank = info.local_rank if info else 0
        if s.device == "cuda":
            if not torch.cuda.is_available():
                raise MissingFeatureError("device cuda asked for, but torch sees no CUDA GPU",
                                          hint="use device cpu, or install a CUDA build of torch")
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.device_name = f"{self.device} ({torch.cuda.get_device_name(self.device)})"
        else:
            self.device = torch.device("cpu")
            self.device_name = "cpu"
        if s.threads is not None:
            torch.set_num_threads(s.threads)
        if s.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = s.tf32
            torch.backends.cudnn.allow_tf32 = s.tf32
        self.ipex = None
        if s.ipex:
            try:
                import intel_extension_for_pytorch as ipex  # type: ignore[import-not-found]
            except ImportError as exc:
                raise MissingFeatureError(
                    f"ipex asked for, but intel_extension_for_pytorch does not import ({exc})",
                    hint="install the IPEX wheel matching this torch, or set ipex false")
            self.ipex = ipex
        self.backend = None
        if self.world > 1:
            assert info is not None
            backend = s.resolved_backend()
            if backend == "ccl":
                try:
                    import oneccl_bindings_for_pytorch  # type: ignore[import-not-found]  # noqa
                except ImportError as exc:
                    raise MissingFeatureError(
                        f"ddp_backend ccl asked for, but oneccl_bindings_for_pytorch does not "
                        f"import ({exc})", hint="install oneccl_bind_pt, or use ddp_backend gloo")
            elif backend == "mpi" and not torch.distributed.is_mpi_available():
                raise MissingFeatureError("ddp_backend mpi asked for, but this torch has no MPI",
                                          hint="use ddp_backend gloo (or ccl)")
            elif backend == "nccl" and not torch.distributed.is_nccl_available():
                raise MissingFeatureError("ddp_backend nccl is not available in this torch")
            if info.master_addr is None:
                raise ConfigError(f"{info.launcher} started ranks on several nodes but "
                                  "MASTER_ADDR is not set", hint="export MASTER_ADDR=<rank 0 host>")
            os.environ.update(info.torch_env())
            import datetime

            try:
                torch.distributed.init_process_group(
                    backend=backend, rank=info.rank, world_size=info.world_size,
                    timeout=datetime.timedelta(minutes=10))
            except Exception as exc:  # gloo/nccl raise assorted types
                raise DistInitError(f"init_process_group({backend}) failed: {exc}".splitlines()[0],
                                    hint=f"check MASTER_ADDR={info.master_addr} "
                                         f"MASTER_PORT={info.master_port} are reachable")
            self.backend = backend

    def setup_data(self) -> None:
        from cpuperf.train.corpus import corpus_sha256, load_corpus, split_tokens
        from cpuperf.train.model import make_config
        from cpuperf.train.tokenizer import load_or_train

        s = self.s
        self.out_dir = Path(s.out_dir)
        if self.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        text = load_corpus()
        sha = corpus_sha256(text)
        cache = Path(s.tokenizer_cache) if s.tokenizer_cache else self.out_dir
        t0 = time.perf_counter()
        self.tok, ids, cached = load_or_train(cache, text, sha, s.bpe_merges)
        self.tokenizer_s = time.perf_counter() - t0
        self.tokenizer_cached = cached
        self.split = split_tokens(ids)
        try:
            self.cfg = make_config(s.preset, s.model, vocab_size=self.tok.vocab_size)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model: {exc}")
        if self.cfg.vocab_size < self.tok.vocab_size:
            raise ConfigError(f"model.vocab_size {self.cfg.vocab_size} is smaller than the "
                              f"tokenizer's {self.tok.vocab_size}")

    def setup_model(self) -> None:
        from cpuperf.train.checkpoint import CKPT_NAME, load
        from cpuperf.train.model import build_model

        torch, s = self.torch, self.s
        torch.manual_seed(s.seed)
        random.seed(s.seed)
        model = build_model(self.cfg, grad_checkpointing=s.grad_checkpointing).to(self.device)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": s.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        kw: dict[str, Any] = {"lr": s.lr, "betas": (0.9, 0.95), "eps": 1e-8}
        # The implementation recommend chose (fused where the installed torch has it, else foreach);
        # IPEX swaps in its own fused step, so it gets the plain optimizer.
        if self.ipex is None:
            kw["fused" if s.optimizer == "adamw_fused" else "foreach"] = True
        try:
            opt = torch.optim.AdamW(groups, **kw)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise MissingFeatureError(f"optimizer {s.optimizer}: {exc}".splitlines()[0],
                                      hint="use optimizer adamw")
        if self.ipex is not None:
            dt = torch.bfloat16 if s.dtype == "bf16" else torch.float32
            model.train()
            model, opt = self.ipex.optimize(model, optimizer=opt, dtype=dt)
        self.raw_model = model
        self.opt = opt
        self.sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(s, _schedule_length(s)))
        from cpuperf.train.gpu import amp_plan

        self.amp = amp_plan(s.dtype, self.device)
        if self.rank == 0 and s.dtype != "fp32" and self.amp.name != s.dtype:
            why = {"bf16": "bf16 autocast: native here, no loss scaling needed",
                   "fp16": "fp16 autocast + GradScaler: no native bf16 before compute capability 8.0",
                   "fp32": "fp32: no Tensor Cores before compute capability 7.0"}[self.amp.name]
            sys.stderr.write(f"cpuperf train: note: dtype {s.dtype} asked for; this device runs {why}\n")
        self.scaler = None
        if self.amp.grad_scaler:
            self.scaler = torch.amp.GradScaler("cuda")
        self.step = 0
        self.ckpt_path = self.out_dir / CKPT_NAME
        self.resumed_from: Optional[int] = None
        self.ckpt_elapsed = 0.0
        ck: dict = {}
        if s.resume and self.ckpt_path.exists():
            try:
                ck = load(self.ckpt_path, map_location=self.device)
            except Exception as exc:
                raise TrainError(f"cannot load checkpoint {self.ckpt_path}: {exc}".splitlines()[0],
                                 hint="delete it or set resume false to start over")
            if ck.get("model_config") != dataclasses.asdict(self.cfg):
                raise ConfigError(f"checkpoint {self.ckpt_path} is for another model shape "
                                  f"{ck.get('model_config')}", hint="use another out_dir")
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            self.sched.load_state_dict(ck["scheduler"])
            if self.scaler is not None and ck.get("scaler"):
                self.scaler.load_state_dict(ck["scaler"])
            self.step = int(ck["step"])
            self.resumed_from = self.step
            self.ckpt_elapsed = float(ck.get("elapsed_s", 0.0))
            rng = ck.get("rng", {})
            if "torch" in rng:
                torch.set_rng_state(rng["torch"].cpu())
            if "python" in rng:
                st = rng["python"]
                random.setstate((st[0], tuple(st[1]), st[2]))
            if "cuda" in rng and s.device == "cuda":
                torch.cuda.set_rng_state(rng["cuda"].cpu())
        self.batch_trial: Optional[dict] = None
        if s.device == "cuda" and self.resumed_from is not None and ck.get("batch_trial"):
            # The batch the trial fitted when the run started; the data order depends on it.
            self.batch_trial = {**ck["batch_trial"], "from_checkpoint": True}
        elif s.device == "cuda" and s.confirm_batch:
            self.batch_trial = self.trial_batch(model)
        if self.batch_trial is not None and self.batch_trial.get("adjusted"):
            self.s = s = s.replace(batch_size=self.batch_trial["batch"],
                                   grad_accum_steps=self.batch_trial["grad_accum_steps"])
        self.model = model
        self.ddp_model: Any = None
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if s.device == "cuda" else None
            self.model = self.ddp_model = DDP(model, device_ids=ids)
        if s.compile:
            try:
                self.model = torch.compile(self.model)
            except Exception as exc:
                raise MissingFeatureError(f"torch.compile failed: {exc}".splitlines()[0],
                                          hint="set compile false")

    def trial_batch(self, model: Any) -> dict:
        """CUDA only: one forward+backward at the planned batch; shrink it if it would not fit."""
        from cpuperf.data import load_builtin
        from cpuperf.train.gpu import BatchFitError, confirm_batch, cuda_memory

        torch, s = self.torch, self.s
        tuning = load_builtin("tuning.toml")
        multiple = tuning["gpu_batch"]["fp16_tensor_core_multiple"] if self.amp.name == "fp16" \
            else tuning["gpu_batch"]["multiple"]
        params = [p for p in model.parameters() if p.requires_grad]
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        moments = 0 if self.opt.state else 2 * grad_bytes  # AdamW's exp_avg and exp_avg_sq
        # DDP keeps its own gradient buckets (a second copy of the gradients unless
        # gradient_as_bucket_view): torch/nn/parallel/distributed.py, Reducer.
        buckets = grad_bytes if self.world > 1 else 0

        def step(n: int) -> None:
            x = torch.zeros((n, self.cfg.seq_len), dtype=torch.long, device=self.device)
            try:
                with self.autocast():
                    _, loss = model(x, x)
                loss.backward()
            finally:
                model.zero_grad(set_to_none=True)

        report: Optional[dict] = None
        failure = "no rank measured a batch"
        try:
            report = confirm_batch(step, s.batch_size, s.batch_size * s.grad_accum_steps * self.world,
                                   self.world, multiple, self.memory_probe or cuda_memory(self.device),
                                   fixed_bytes=moments + buckets, grad_bytes=grad_bytes,
                                   headroom=tuning["memory"]["gpu_headroom"])
        except BatchFitError as exc:
            failure = str(exc)
        batch = report["batch"] if report else 0
        if self.world > 1:  # every rank must step with the same batch (0: a rank found none fits)
            t = torch.tensor([batch], dtype=torch.int64, device=self.comm_device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
            batch = int(t.item())
        if report is None or batch < 1:
            raise TrainError(f"batch trial: {failure}",
                             hint="set grad_checkpointing true, or use a smaller model")
        if batch != report["batch"]:
            report["batch"] = batch
            report["grad_accum_steps"] = max(1, math.ceil(s.batch_size * s.grad_accum_steps / batch))
            report["adjusted"] = batch != s.batch_size
        report["planned_grad_accum_steps"] = s.grad_accum_steps
        report["global_batch"] = report["batch"] * report["grad_accum_steps"] * self.world
        if self.rank == 0 and report["adjusted"]:
            what = "out of memory" if report["oom"] else \
                f"peak {report['peak_bytes'] / 2**30:.1f} GiB"
            sys.stderr.write(
                f"cpuperf train: batch {s.batch_size} x {s.grad_accum_steps} does not fit ({what}); "
                f"using {report['batch']} x {report['grad_accum_steps']} "
                f"({report['bytes_per_sample'] / 2**20:.0f} MiB per sample)\n")
        return report

    # ------------------------------------------------------------------------------ pieces
    def autocast(self) -> Any:
        torch = self.torch
        if not self.amp.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp.dtype)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def all_mean(self, value: float) -> float:
        if self.world == 1:
            return value
        t = self.torch.tensor([value], dtype=self.torch.float64, device=self.comm_device)
        self.torch.distributed.all_reduce(t)
        return float(t.item()) / self.world

    @property
    def comm_device(self) -> Any:
        return self.device if self.backend == "nccl" else self.torch.device("cpu")

    def evaluate(self) -> Optional[float]:
        from cpuperf.train.batches import eval_batches

        torch = self.torch
        batches = eval_batches(self.split.eval, self.cfg.seq_len, self.s.batch_size,
                               self.s.eval_batches, self.rank, self.world)
        self.raw_model.eval()
        total, count = 0.0, 0
        with torch.no_grad(), self.autocast():
            for x, y in batches:
                _, loss = self.raw_model(x.to(self.device), y.to(self.device))
                total += float(loss) * x.shape[0]
                count += x.shape[0]
        self.raw_model.train()
        if self.world > 1:
            t = torch.tensor([total, float(count)], dtype=torch.float64, device=self.comm_device)
            torch.distributed.all_reduce(t)
            total, count = float(t[0]), int(t[1])
        return total / count if count else None

    def save_checkpoint(self) -> None:
        from cpuperf.train.checkpoint import CKPT_SCHEMA, save_atomic

        if self.rank != 0:
            return
        torch = self.torch
        st = random.getstate()
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": [st[0], list(st[1]), st[2]]}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        obj = {
            "schema": CKPT_SCHEMA, "step": self.step,
            "samples_seen": self.step * self.global_batch,
            "model": self.raw_model.state_dict(), "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng, "model_config": dataclasses.asdict(self.cfg),
            "settings": self.s.to_dict(), "world_size": self.world,
            "tokenizer_corpus_sha256": self.tok.corpus_sha256,
            "elapsed_s": self.ckpt_elapsed + (time.perf_counter() - self.t_loop),
            "batch_trial": self.batch_trial,
        }
        save_atomic(obj, self.ckpt_path)

    def should_stop(self) -> Optional[str]:
        """'signal' / 'time_budget' / None, agreed by all ranks (any rank's reason stops all)."""
        s = self.s
        sig = self.stop.signum or 0
        over = int(s.time_budget_s is not None
                   and time.perf_counter() - self.t_loop >= s.time_budget_s)
        if self.world > 1:
            t = self.torch.tensor([sig, over], dtype=self.torch.int64, device=self.comm_device)
            self.torch.distributed.all_reduce(t, op=self.torch.distributed.ReduceOp.MAX)
            sig, over = int(t[0]), int(t[1])
            if sig and self.stop.signum is None:
                self.stop.signum = sig
        if sig:
            return "signal"
        if over:
            return "time_budget"
        return None

    # --------------------------------------------------------------------------------- loop
    def run(self) -> tuple[Optional[dict], int]:
        from cpuperf.train.batches import TokenBatches
        from cpuperf.train.model import flops_per_token, non_embedding_params
        from cpuperf.train.progress import Progress
        from cpuperf.train.runtime_check import runtime_report

        torch, s = self.torch, self.s
        self.setup_dist()
        self.setup_data()
        self.setup_model()
        s = self.s  # the batch trial may have changed batch_size and grad_accum_steps
        self.global_batch = s.batch_size * s.grad_accum_steps * self.world
        tokens_per_sample = self.cfg.seq_len
        fpt = flops_per_token(self.cfg)
        n_params = sum(p.numel() for p in self.raw_model.parameters())
        is0 = self.rank == 0

        metrics = None
        self.metrics_path = self.out_dir / METRICS_NAME
        if is0:
            metrics = open(self.metrics_path, "a" if self.resumed_from is not None else "w",
                           encoding="utf-8")
        runtime = runtime_report()
        if is0 and s.dtype == "bf16" and s.device == "cpu" and runtime["native_bf16"] is False:
            sys.stderr.write("cpuperf train: note: this CPU has no AVX512-BF16/AMX, so bf16 is "
                             "emulated and much slower than fp32\n")
        if is0 and s.resume and self.resumed_from is None:
            sys.stderr.write(f"cpuperf train: note: no checkpoint at {self.ckpt_path}; "
                             "starting from step 0\n")

        from cpuperf.train.gpu import measure_peak, sdpa_report

        try:
            attention = sdpa_report(s.batch_size, self.cfg.n_head, self.cfg.seq_len,
                                    self.cfg.d_model // self.cfg.n_head, self.amp.name, self.device)
        except Exception as exc:  # the report must never stop training
            attention = {"kernel": None, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        if is0:
            why = "; ".join(f"not {k}: {v}" for k, v in attention.get("why_not", {}).items())
            sys.stderr.write(f"cpuperf train: attention kernel {attention['kernel']}"
                             + (f" ({why})" if why else "") + "\n")
        peak = _peak_tflops(s, self.device_name, self.amp.name)
        if peak is None and is0:
            # A card compat/gpu_peaks.toml does not know, or a CPU: measure its GEMM peak once.
            peak = measure_peak(self.device, self.amp.name, s.tf32 and s.device == "cuda")

        def emit(rec: dict) -> None:
            if metrics is not None:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()

        emit({"type": "settings", "schema": SCHEMA, "settings": s.to_dict(),
              "model": {**dataclasses.asdict(self.cfg), "params": n_params,
                        "non_embedding_params": non_embedding_params(self.cfg),
                        "flops_per_token": fpt},
              "world_size": self.world, "rank_launcher": self.info.launcher if self.info else None,
              "backend": self.backend, "device": self.device_name,
              "resumed_from": self.resumed_from,
              "tokenizer": {"vocab_size": self.tok.vocab_size, "cached": self.tokenizer_cached,
                            "seconds": round(self.tokenizer_s, 3)},
              "data": {"train_tokens": len(self.split.train), "eval_tokens": len(self.split.eval)},
              "runtime": runtime})

        start_step = self.step
        accum = s.grad_accum_steps
        try:
            ds = TokenBatches(self.split.train, self.cfg.seq_len, s.batch_size, s.seed,
                              rank=self.rank, world_size=self.world, grad_accum_steps=accum,
                              start_micro=start_step * accum)
        except ValueError as exc:
            raise ConfigError(str(exc), hint="use a shorter model.seq_len")
        if s.dataloader_workers > 0:
            loader: Any = iter(torch.utils.data.DataLoader(
                ds, batch_size=None, shuffle=False, num_workers=s.dataloader_workers,
                worker_init_fn=lambda _: torch.set_num_threads(1),
                pin_memory=self.device.type == "cuda", persistent_workers=True))
        else:
            loader = (ds[k] for k in range(len(ds)))

        progress = Progress(s.progress if is0 else "off", s.max_steps, start=start_step)
        if is0 and self.resumed_from is not None:
            progress.note(f"resumed from {self.ckpt_path} at step {self.resumed_from}")

        # Steps left out of the rates: the first (allocator and oneDNN warm-up); with compile
        # the first few, since inductor compiles forward and backward and may recompile once.
        exclude = 5 if s.compile else 1
        loss_first: Optional[float] = None
        loss_last: Optional[float] = None
        eval_loss: Optional[float] = None
        eval_step: Optional[int] = None
        warmup_s: Optional[float] = None
        t_measure: Optional[float] = None
        step_measure = start_step
        excluded_s = 0.0
        window_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        window_steps = 0
        t_window = time.perf_counter()
        step_window = start_step
        status = "completed"
        self.t_loop = time.perf_counter()
        model = self.model
        ddp = self.world > 1

        while True:
            if s.max_steps is not None and self.step >= s.max_steps:
                break
            reason = self.should_stop()
            if reason is not None:
                status = "interrupted" if reason == "signal" else "time_budget"
                break
            t_step = time.perf_counter()
            for micro in range(accum):
                x, y = next(loader)
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
                # Skip the gradient all-reduce on all but the last micro-step (on the DDP module
                # itself, which torch.compile wraps).
                no_sync = self.ddp_model.no_sync() if ddp and micro < accum - 1 \
                    else contextlib.nullcontext()
                with no_sync, self.autocast():
                    _, loss = model(x, y)
                    loss = loss / accum
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
                window_loss += loss.detach().to(torch.float64)
            if s.grad_clip > 0:
                if self.scaler is not None:
                    self.scaler.unscale_(self.opt)
                torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), s.grad_clip)
            if self.scaler is not None:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
            lr = self.sched.get_last_lr()[0]
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            window_steps += 1
            done = self.step - start_step
            if done == 1:
                self.sync()
                warmup_s = time.perf_counter() - t_step
            if done == exclude:
                self.sync()
                t_measure, step_measure = time.perf_counter(), self.step
            last = s.max_steps is not None and self.step >= s.max_steps
            if done == 1 or self.step % s.log_every == 0 or last:
                self.sync()
                now = time.perf_counter()
                lv = self.all_mean(float(window_loss) / window_steps)
                if not math.isfinite(lv):
                    raise TrainError(f"loss became {lv} at step {self.step}",
                                     hint="lower lr, or use dtype fp32")
                dt = max(now - t_window, 1e-9)
                sps = (self.step - step_window) * self.global_batch / dt
                step_time = dt / max(1, self.step - step_window)
                eta = None
                if s.max_steps is not None:
                    eta = (s.max_steps - self.step) * step_time
                if s.time_budget_s is not None:
                    left = s.time_budget_s - (now - self.t_loop)
                    eta = left if eta is None else min(eta, left)
                rec = {"type": "step", "step": self.step, "loss": round(lv, 5), "lr": lr,
                       "samples_per_s": round(sps, 3),
                       "tokens_per_s": round(sps * tokens_per_sample, 1),
                       "elapsed_s": round(now - self.t_loop, 3)}
                emit(rec)
                if is0:
                    progress.log(rec, eta)
                if loss_first is None:
                    loss_first = lv
                loss_last = lv
                window_loss.zero_()
                window_steps = 0
                t_window, step_window = time.perf_counter(), self.step
            else:
                progress.update(self.step)
            t_pause = time.perf_counter()
            paused = False
            if s.eval_every and self.step % s.eval_every == 0 and not last:
                eval_loss, eval_step = self.evaluate(), self.step
                emit({"type": "eval", "step": self.step, "eval_loss": eval_loss})
                if is0 and eval_loss is not None:
                    progress.note(f"step {self.step}: eval loss {eval_loss:.4f}")
                paused = True
            if s.ckpt_every and self.step % s.ckpt_every == 0 and not last:
                self.save_checkpoint()
                paused = True
            if paused:  # keep evals and checkpoints out of the throughput figures
                self.sync()
                t_window, step_window = time.perf_counter(), self.step
                if t_measure is not None:
                    excluded_s += t_window - t_pause
        self.sync()
        t_end = time.perf_counter()
        progress.close()

        if status == "interrupted":
            self.save_checkpoint()
            if is0:
                name = signal.Signals(self.stop.signum or signal.SIGTERM).name
                sys.stderr.write(f"cpuperf train: {name} at step {self.step}; checkpoint "
                                 f"written to {self.ckpt_path}\n")
        else:
            if eval_step != self.step:
                eval_loss = self.evaluate()
                emit({"type": "eval", "step": self.step, "eval_loss": eval_loss})
            self.save_checkpoint()

        # Rates over the steps after the warm-up ones (all steps if the run was shorter), minus
        # the time spent in evals and checkpoints.
        if t_measure is None:
            t_measure, step_measure, excluded_s = self.t_loop, start_step, 0.0
        measured_steps = self.step - step_measure
        span = t_end - t_measure - excluded_s
        sps_total = measured_steps * self.global_batch / span if measured_steps and span > 0 \
            else None

        mine = _checksum(self.raw_model)
        values = [mine]
        if self.world > 1:
            # all_gather of int64 tensors (all_gather_object would need numpy).
            t = torch.tensor([mine], dtype=torch.int64, device=self.comm_device)
            parts = [torch.zeros_like(t) for _ in range(self.world)]
            torch.distributed.all_gather(parts, t)
            values = [int(p.item()) for p in parts]
        checksums = [f"{v & (2**64 - 1):016x}" for v in values]

        summary = None
        if is0:
            tps = sps_total * tokens_per_sample if sps_total is not None else None
            achieved = tps * fpt / 1e12 if tps is not None else None
            mfu = (achieved / (peak.tflops * self.world)) if achieved is not None and peak else None
            summary = {
                "schema": SCHEMA, "status": status, "steps": self.step,
                "steps_this_run": self.step - start_step, "resumed_from": self.resumed_from,
                "loss_first": loss_first, "loss_last": loss_last, "eval_loss": eval_loss,
                "samples_per_s": round(sps_total, 3) if sps_total is not None else None,
                "tokens_per_s": round(tps, 1) if tps is not None else None,
                "warmup_s": round(warmup_s, 4) if warmup_s is not None else None,
                "elapsed_s": round(t_end - self.t_start, 3),
                "train_s": round(t_end - self.t_loop, 3),
                "world_size": self.world, "device": self.device_name, "backend": self.backend,
                "threads": torch.get_num_threads(),
                "model": {"params": n_params, "flops_per_token": fpt,
                          **dataclasses.asdict(self.cfg)},
                "achieved_tflops": round(achieved, 4) if achieved is not None else None,
                "mfu": round(mfu, 5) if mfu is not None else None,
                "peak": peak.to_json() if peak is not None else None,
                "amp": {"dtype": self.amp.name, "autocast": self.amp.autocast,
                        "grad_scaler": self.amp.grad_scaler},
                "attention_kernel": attention,
                "batch_trial": self.batch_trial,
                "settings": s.to_dict(),
                "metrics_file": str(self.metrics_path), "checkpoint": str(self.ckpt_path),
                "param_checksums": checksums,
            }
            emit({"type": "summary", **summary})
            if metrics is not None:
                metrics.close()
        if self.world > 1:
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        code = 0
        if status == "interrupted":
            code = TrainExit.TERMINATED if self.stop.signum == signal.SIGTERM else \
                TrainExit.INTERRUPTED
        return summary, int(code)


def _human(summary: dict) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"cpuperf train: {summary['status']} at step {summary['steps']} "
        f"({summary['train_s']:.1f}s training, {summary['world_size']} rank(s) on "
        f"{summary['device']})",
        f"  loss {f(summary['loss_first'], '.4f')} -> {f(summary['loss_last'], '.4f')}, "
        f"eval loss {f(summary['eval_loss'], '.4f')}",
        f"  {f(summary['samples_per_s'], '.1f')} samples/s, {f(summary['tokens_per_s'], '.0f')} "
        f"tokens/s, first step {f(summary['warmup_s'], '.2f')}s"
        + (f", MFU {summary['mfu'] * 100:.1f}%" if summary.get("mfu") is not None else ""),
        f"  metrics {summary['metrics_file']}, checkpoint {summary['checkpoint']}",
    ]
    extra = []
    if (summary.get("attention_kernel") or {}).get("kernel"):
        extra.append(f"attention {summary['attention_kernel']['kernel']}")
    if (summary.get("amp") or {}).get("autocast"):
        amp = summary["amp"]
        extra.append(f"{amp['dtype']} autocast" + (" + GradScaler" if amp["grad_scaler"] else ""))
    trial = summary.get("batch_trial") or {}
    if trial.get("adjusted"):
        extra.append(f"batch {trial['planned_batch']} -> {trial['batch']} x {trial['grad_accum_steps']} "
                     "(trial step)")
    if extra:
        lines.insert(3, "  " + ", ".join(extra))
    return "\n".join(lines) + "\n"


def _parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE (got {item!r})")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key.startswith("model."):
            out.setdefault("model", {})[key[6:]] = value
        else:
            out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    """The worker's command line."""
    p = argparse.ArgumentParser(prog="python -m cpuperf.train.worker",
                                description="cpuperf's built-in training loop (one rank).")
    p.add_argument("--config", help="settings: a JSON object, or a path to a JSON file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting (VALUE is JSON, else a string; model.X for shape)")
    p.add_argument("--out-dir", help="run directory (checkpoint, metrics, tokenizer cache)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    return p


def load_settings(args: argparse.Namespace) -> TrainSettings:
    """Settings from --config, then --set, --out-dir and --resume on top."""
    base: dict[str, Any] = {}
    if args.config:
        base = TrainSettings.from_json(args.config).to_dict()
    over = _parse_set(args.set)
    if "model" in over:
        over["model"] = {**base.get("model", {}), **over["model"]}
    base.update(over)
    if args.out_dir:
        base["out_dir"] = args.out_dir
    if args.resume:
        base["resume"] = True
    return TrainSettings.from_dict(base)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point; returns the exit code (the one error boundary of the worker)."""
    args = build_parser().parse_args(argv)
    debug = os.environ.get("CPUPERF_DEBUG") == "1"
    stop = _Stop()
    _install_signal_handlers(stop)
    try:
        settings = load_settings(args)
        summary, code = Run(settings, stop).run()
    except TrainError as exc:
        if debug:
            raise
        hint = f" (hint: {exc.hint})" if exc.hint else ""
        sys.stderr.write(f"cpuperf train: error: {exc.message}{hint}\n")
        if args.json:
            sys.stdout.write(json.dumps(exc.to_json()) + "\n")
        return int(exc.code)
    except KeyboardInterrupt:
        sys.stderr.write("cpuperf train: interrupted\n")
        return int(TrainExit.INTERRUPTED)
    except Exception as exc:
        if debug:
            raise
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0]
        sys.stderr.write(f"cpuperf train: error: {msg} (set CPUPERF_DEBUG=1 for a traceback)\n")
        if args.json:
            sys.stdout.write(json.dumps(TrainError(msg).to_json()) + "\n")
        return int(TrainExit.FAILED)
    if summary is not None:
        if args.json:
            sys.stdout.write(json.dumps(summary) + "\n")
        else:
            sys.stderr.write(_human(summary))
    return code


if __name__ == "__main__":
    _code = main()
    # Skip interpreter teardown: after a distributed run, gloo's static destructors can race a peer
    # closing its sockets and abort ("terminate called without an active exception", exit 134) once
    # the run has already succeeded; seen in ~1 of 15 two-rank runs under cpuperf train.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
