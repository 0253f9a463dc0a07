"""The training loop of one rank: setup (devices, process group, data, model, checkpoint), steps, summary.

Run.run() is the whole run; cpuperf.train.worker is its entry and error boundary. torch is imported
inside functions only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import math
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Mapping, Optional, TextIO, Tuple

from cpuperf.boundary import RDZV_TIMEOUT
from cpuperf.errors import FilesystemError, exit_code_for_signal
from cpuperf.fsutil import append_nofollow
from cpuperf.train import SCHEMA
from cpuperf.train.errors import DiskFullError, DistInitError, MissingFeatureError, TrainError
from cpuperf.train.rundir import METRICS_NAME
from cpuperf.worker_settings import ConfigError, TrainSettings

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim import Optimizer

    from cpuperf.knowledge.gpu import Peak
    from cpuperf.knowledge.models import ModelConfig
    from cpuperf.output import Progress
    from cpuperf.train.gpu import MemoryProbe

RDZV_TIMEOUT_VAR = RDZV_TIMEOUT  # seconds; set by cpuperf train's launch plan
# The process group's timeout also bounds every gloo collective (rank 0 writing a big checkpoint
# while the others wait), so it never goes below torch's own 10-minute default.
MIN_PG_TIMEOUT_S = 600


class Terminated(BaseException):
    """SIGTERM/SIGHUP before the loop started: nothing to checkpoint, so stop at once."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Stop:
    """Signal flag set by the handler and read at step boundaries (armed once the loop runs)."""

    signum: Optional[int] = None
    armed: bool = False


def install_signal_handlers(stop: Stop) -> None:
    """SIGINT/SIGTERM/SIGHUP: a clean stop with a checkpoint in the loop, an immediate one before it."""
    def handler(signum: int, _frame: Optional[FrameType]) -> None:
        if stop.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: give up on the clean stop
        if not stop.armed:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated(signum)
        stop.signum = signum

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def import_torch() -> ModuleType:
    with warnings.catch_warnings():
        # The CPU wheel warns at import when numpy is absent; the worker does not use numpy.
        warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
        try:
            import torch
        except ImportError as exc:
            raise MissingFeatureError(f"torch does not import ({exc})",
                                      hint="install PyTorch first (cpuperf install)")
    module: ModuleType = torch  # (Any to mypy where torch is not installed)
    return module


def peak_tflops(s: TrainSettings, device_name: str, dtype: Optional[str] = None,
                cfg: Optional[ModelConfig] = None) -> Optional[Peak]:
    """The MFU denominator (gpu.Peak) from settings.peak_tflops, compat/gpu_peaks.toml, or on CPU the
    sustained GEMM rate at the model's own shapes (cfg) in its dtype (cpuperf.train.peak); None if unknown.

    `dtype` is the precision the run really uses (the AMP plan's), default settings.dtype. A card not
    in the table gets a measured GEMM peak in Run.prepare.
    """
    from cpuperf.knowledge.gpu import Peak, math_dtype, table_peak

    dt = dtype or s.dtype
    if s.peak_tflops is not None:
        return Peak(s.peak_tflops, math_dtype(dt, s.tf32 and s.device == "cuda"), "settings.peak_tflops")
    if s.device != "cuda":
        import torch

        from cpuperf.train.peak import this_hardware_peak

        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return this_hardware_peak(dt, torch.get_num_threads(), cpus)[0]
    return table_peak(device_name, dt, s.tf32)


def cpu_peak_parts(s: TrainSettings, dtype: str,
                   cfg: ModelConfig) -> Tuple[Optional[Peak], Dict[str, object], Optional[Peak]]:
    """(hardware peak, its info, the measured GEMM ceiling at the model's shapes) for a CPU run.

    The ceiling is measured first: a hardware peak it beats was taken at a clock the cores do not run at.
    """
    import torch

    from cpuperf.train.peak import cpu_peak, this_hardware_peak

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    note = {}
    try:
        achievable = cpu_peak(cfg.d_model, cfg.vocab_size, s.batch_size * cfg.seq_len, dtype, torch.get_num_threads())
    except Exception as exc:  # the report must never stop training
        achievable, note = None, {"achievable_note": f"measuring the GEMM ceiling failed: {type(exc).__name__}"}
    hardware, info = this_hardware_peak(dtype, torch.get_num_threads(), cpus,
                                        achievable.tflops if achievable is not None else None)
    return hardware, {**info, **note}, achievable


def bounded_mfu(s: TrainSettings, achieved: Optional[float], peak: Optional[Peak], world: int,
                cfg: ModelConfig) -> Tuple[Optional[float], Optional[Peak], Dict[str, object]]:
    """(MFU, the peak used, notes): never above 100% (cpuperf.train.peak.bounded_mfu); GPUs and a set peak."""
    import torch

    from cpuperf.train.peak import bounded_mfu as bound

    return bound(achieved, peak, world, None, torch.get_num_threads(), data_fallback=False)


def cpu_mfu_report(s: TrainSettings, achieved: Optional[float], hardware: Optional[Peak], achievable: Optional[Peak],
                   world: int, cfg: ModelConfig, info: Dict[str, object]) -> Dict[str, object]:
    """The summary's MFU fields on CPU: MFU against the hardware peak, the measured ceiling beside it."""
    from cpuperf.train.peak import cpu_mfu, measure_cpu_peak, workload_shapes

    remeasure = None
    if achievable is not None:
        shapes = workload_shapes(cfg.d_model, cfg.vocab_size, s.batch_size * cfg.seq_len)
        remeasure = lambda: measure_cpu_peak(shapes, achievable.dtype, repeats=7, seconds=0.5)  # noqa: E731
    mfu, frac, ceiling, notes = cpu_mfu(achieved, hardware, achievable, world, remeasure)
    if hardware is None and info.get("why_none"):
        notes["mfu_note"] = f"MFU not reported: {info['why_none']}"
    return {"mfu": _round(mfu, 5), "peak": hardware.to_json() if hardware is not None else None,
            "hardware_peak": info, "achievable": ceiling.to_json() if ceiling is not None else None,
            "pct_of_achievable": _round(frac * 100 if frac is not None else None, 2), **notes}


def worker_backend(torch: ModuleType, s: TrainSettings) -> str:
    """The backend the plan decided (cpuperf.decide.backend); torch's own default for the device where the
    worker runs without a plan (settings written by hand), never a rule of the worker's own."""
    if s.ddp_backend:
        return s.ddp_backend
    defaults = getattr(torch.distributed.Backend, "default_device_backend_map", None) or {}
    backend: str = defaults.get(s.device, "gloo")  # torch before 2.1 had no table: gloo, its CPU default
    return backend


def checksum(model: nn.Module) -> int:
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


def lr_lambda(s: TrainSettings, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if s.warmup and step < s.warmup:
            return (step + 1) / s.warmup
        span = max(1, total - s.warmup)
        progress = min(1.0, (step - s.warmup) / span)
        return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def schedule_length(s: TrainSettings) -> int:
    # With only a time budget the length is unknown; cosine over a nominal horizon (documented).
    return s.max_steps if s.max_steps is not None else 10_000


def disk_full(exc: BaseException, path: Path) -> Optional[DiskFullError]:
    """A DiskFullError for a write to `path` that failed because its filesystem is full, else None.

    torch.save reports a short write as `RuntimeError: [enforce fail at inline_container.cc:...]`,
    so besides ENOSPC the free space of the filesystem itself decides.
    """
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not full and not isinstance(exc, OSError):
        try:
            st = os.statvfs(path.parent)
            full = st.f_bavail * st.f_frsize < 1 << 20
        except OSError:
            full = False
    if not full:
        return None
    return DiskFullError(f"no space left on device ({path})", hint="free some space, or pass another --out")


def pg_timeout_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """init_process_group's timeout: the launch's rendezvous bound, never under MIN_PG_TIMEOUT_S."""
    raw = (os.environ if environ is None else environ).get(RDZV_TIMEOUT_VAR, "")
    try:
        asked = float(raw)
    except ValueError:
        asked = 0.0
    return max(asked if math.isfinite(asked) else 0.0, MIN_PG_TIMEOUT_S)


@dataclasses.dataclass
class LoopState:
    """What the loop tracks between steps (rates, losses, windows, the stop reason)."""

    start_step: int
    window_loss: Tensor
    exclude: int = 1
    loss_first: Optional[float] = None
    loss_last: Optional[float] = None
    eval_loss: Optional[float] = None
    eval_step: Optional[int] = None
    warmup_s: Optional[float] = None
    t_measure: Optional[float] = None
    step_measure: int = 0
    excluded_s: float = 0.0
    window_steps: int = 0
    t_window: float = 0.0
    step_window: int = 0
    status: str = "completed"
    t_end: float = 0.0


class Run:
    """One training run; run() returns (summary or None on ranks > 0, exit code)."""

    def __init__(self, s: TrainSettings, stop: Stop) -> None:
        self.s = s
        self.stop = stop
        self.torch = import_torch()
        self.t_start = time.perf_counter()
        self.memory_probe: Optional[MemoryProbe] = None  # gpu.MemoryProbe for the batch trial; None = torch.cuda's
        self.metrics: Optional[TextIO] = None
        self.start_progress: Optional[Progress] = None  # cpuperf.output.Progress until the first step (set by the worker)

    # ---------------------------------------------------------------------------------- setup
    def setup_dist(self) -> None:
        from cpuperf.train.dist_env import LaunchEnvError, rank_info

        try:
            info = rank_info(os.environ)
        except LaunchEnvError as exc:
            raise ConfigError(f"launcher environment: {exc}")
        self.info = info
        self.world = info.world_size if info else 1
        self.rank = info.rank if info else 0
        self.local_rank = info.local_rank if info else 0
        self.setup_device()
        self.ipex = None
        if self.s.ipex:
            try:
                import intel_extension_for_pytorch as ipex
            except ImportError as exc:
                raise MissingFeatureError(
                    f"ipex asked for, but intel_extension_for_pytorch does not import ({exc})",
                    hint="install the IPEX wheel matching this torch, or set ipex false")
            self.ipex = ipex
        self.backend: Optional[str] = None
        if self.world > 1:
            self.init_process_group()

    def setup_device(self) -> None:
        torch, s = self.torch, self.s
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
        if s.threads_per_rank is not None:
            torch.set_num_threads(s.threads_per_rank)
        if s.fp32_math_mode == "bf16":
            try:  # torch >= 2.9 (compat/tuning.toml [fp32_math_mode]): oneDNN runs the remaining fp32 matmuls in bf16
                torch.backends.mkldnn.matmul.fp32_precision = "bf16"
            except AttributeError as exc:
                raise MissingFeatureError(f"fp32_math_mode bf16 needs a newer torch ({exc})",
                                          hint="set fp32_math_mode none") from exc
        if s.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = s.tf32
            torch.backends.cudnn.allow_tf32 = s.tf32

    def check_backend(self, backend: str) -> None:
        torch = self.torch
        if backend == "ccl":
            try:
                import oneccl_bindings_for_pytorch  # noqa
            except ImportError as exc:
                raise MissingFeatureError(
                    f"ddp_backend ccl asked for, but oneccl_bindings_for_pytorch does not "
                    f"import ({exc})", hint="install oneccl_bind_pt, or use ddp_backend gloo")
        elif backend == "mpi" and not torch.distributed.is_mpi_available():
            raise MissingFeatureError("ddp_backend mpi asked for, but this torch has no MPI",
                                      hint="use ddp_backend gloo (or ccl)")
        elif backend == "nccl" and not torch.distributed.is_nccl_available():
            raise MissingFeatureError("ddp_backend nccl is not available in this torch")

    def init_process_group(self) -> None:
        info = self.info
        assert info is not None  # world > 1 comes from a launcher's variables
        backend = worker_backend(self.torch, self.s)
        self.check_backend(backend)
        if info.master_addr is None:
            raise ConfigError(f"{info.launcher} started ranks on several nodes but "
                              "MASTER_ADDR is not set", hint="export MASTER_ADDR=<rank 0 host>")
        os.environ.update(info.torch_env())
        try:
            self.torch.distributed.init_process_group(
                backend=backend, rank=info.rank, world_size=info.world_size,
                timeout=datetime.timedelta(seconds=pg_timeout_s()))
        except Exception as exc:  # gloo/nccl raise assorted types
            raise DistInitError(f"init_process_group({backend}) failed: {exc}".splitlines()[0],
                                hint=f"check MASTER_ADDR={info.master_addr} "
                                     f"MASTER_PORT={info.master_port} are reachable")
        self.backend = backend

    def setup_data(self) -> None:
        from cpuperf.knowledge.models import make_config
        from cpuperf.train.corpus import corpus_sha256, load_corpus, split_tokens
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
        from cpuperf.train.checkpoint import CKPT_NAME
        from cpuperf.train.gpu import amp_plan
        from cpuperf.train.model import build_model

        torch, s = self.torch, self.s
        torch.manual_seed(s.seed)
        random.seed(s.seed)
        model = build_model(self.cfg, grad_checkpointing=s.grad_checkpointing).to(self.device)
        opt = self.make_optimizer(model)
        if self.ipex is not None:
            dt = torch.bfloat16 if s.dtype == "bf16" else torch.float32
            model.train()
            model, opt = self.ipex.optimize(model, optimizer=opt, dtype=dt)
        self.raw_model = model
        self.opt = opt
        self.sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(s, schedule_length(s)))
        self.amp = amp_plan(s.dtype, self.device)
        if self.rank == 0 and s.dtype != "fp32" and self.amp.name != s.dtype:
            why = {"bf16": "bf16 autocast: native here, no loss scaling needed",
                   "fp16": "fp16 autocast + GradScaler: no native bf16 before compute capability 8.0",
                   "fp32": "fp32: no Tensor Cores before compute capability 7.0"}[self.amp.name]
            sys.stderr.write(f"cpuperf train: note: dtype {s.dtype} asked for; this device runs {why}\n")
        self.scaler = torch.amp.GradScaler("cuda") if self.amp.grad_scaler else None
        self.step = 0
        self.ckpt_path = self.out_dir / CKPT_NAME
        self.resumed_from: Optional[int] = None
        self.ckpt_elapsed = 0.0
        ck = self.restore(model) if s.resume and os.path.lexists(self.ckpt_path) else {}  # a link: refused by load
        self.setup_batch_trial(model, ck)
        self.wrap_model(model)

    def make_optimizer(self, model: nn.Module) -> Optimizer:
        s = self.s
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": s.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        kw: dict[str, object] = {"lr": s.lr, "betas": (0.9, 0.95), "eps": 1e-8}
        # The implementation recommend chose (fused where the installed torch has it, else foreach);
        # IPEX swaps in its own fused step, so it gets the plain optimizer.
        if getattr(self, "ipex", None) is None:
            kw["fused" if s.optimizer == "adamw_fused" else "foreach"] = True
        try:
            opt: Optimizer = self.torch.optim.AdamW(groups, **kw)
            return opt
        except (RuntimeError, ValueError, TypeError) as exc:
            raise MissingFeatureError(f"optimizer {s.optimizer}: {exc}".splitlines()[0],
                                      hint="use optimizer adamw")

    def restore(self, model: nn.Module) -> Dict[str, Any]:
        """Load the checkpoint into model, optimizer, scheduler, scaler and the RNGs; return it."""
        from cpuperf.train.checkpoint import load

        torch = self.torch
        try:
            ck = load(self.ckpt_path, map_location=self.device)
        except FilesystemError:  # a link where the checkpoint is (fsutil.LinkRefused): exit 10, the link named
            raise
        except Exception as exc:
            raise TrainError(f"cannot load checkpoint {self.ckpt_path}: {exc}".splitlines()[0],
                             hint="delete it or set resume false to start over")
        if ck.get("model_config") != dataclasses.asdict(self.cfg):
            raise ConfigError(f"checkpoint {self.ckpt_path} is for another model shape "
                              f"{ck.get('model_config')}",
                              hint="resume with the options the run was started with (its --model, --set model.*), "
                                   "or give another --out")
        model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
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
        if "cuda" in rng and self.s.device == "cuda":
            torch.cuda.set_rng_state(rng["cuda"].cpu())
        return ck

    def setup_batch_trial(self, model: nn.Module, ck: Dict[str, Any]) -> None:
        s = self.s
        self.batch_trial: Optional[Dict[str, Any]] = None
        if s.device == "cuda" and self.resumed_from is not None and ck.get("batch_trial"):
            # The batch the trial fitted when the run started; the data order depends on it.
            self.batch_trial = {**ck["batch_trial"], "from_checkpoint": True}
        elif s.device == "cuda" and s.confirm_batch:
            self.batch_trial = self.trial_batch(model)
        if self.batch_trial is not None and self.batch_trial.get("adjusted"):
            self.s = s.replace(batch_size=self.batch_trial["batch"],
                               grad_accum_steps=self.batch_trial["grad_accum_steps"])
        if s.device == "cuda":  # the run's peak is its training's, not the trial's (which may try a larger batch)
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def wrap_model(self, model: nn.Module) -> None:
        """DDP over several ranks, then torch.compile when asked, as its compile_mode asks."""
        self.model = model
        self.ddp_model: Optional[DistributedDataParallel] = None
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.s.device == "cuda" else None
            self.model = self.ddp_model = DDP(model, device_ids=ids)
        if self.s.compile:
            try:
                from cpuperf.train.bench import compiled_model

                self.model = compiled_model(self.torch, self.model, self.s.compile_mode)
            except Exception as exc:
                raise MissingFeatureError(f"torch.compile failed: {exc}".splitlines()[0],
                                          hint="set compile false")

    def trial_batch(self, model: nn.Module) -> Dict[str, Any]:
        """CUDA only: one forward+backward at the planned batch; shrink it if it would not fit."""
        from cpuperf.knowledge.tuning import tuning
        from cpuperf.train.gpu import BatchFitError, confirm_batch, cuda_memory

        torch, s = self.torch, self.s
        rules = tuning()
        multiple = rules.gpu_batch.fp16_tensor_core_multiple if self.amp.name == "fp16" \
            else rules.gpu_batch.multiple
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

        report: Optional[Dict[str, Any]] = None
        failure = "no rank measured a batch"
        try:
            report = confirm_batch(step, s.batch_size, s.batch_size * s.grad_accum_steps * self.world,
                                   self.world, multiple, self.memory_probe or cuda_memory(self.device),
                                   fixed_bytes=moments + buckets, grad_bytes=grad_bytes,
                                   headroom=rules.memory.gpu_headroom)
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
    def autocast(self) -> contextlib.AbstractContextManager[object]:
        torch = self.torch
        if not self.amp.autocast:
            return contextlib.nullcontext()
        on: contextlib.AbstractContextManager[object] = torch.autocast(device_type=self.device.type, dtype=self.amp.dtype)
        return on

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
    def comm_device(self) -> torch.device:
        device: torch.device = self.device if self.backend == "nccl" else self.torch.device("cpu")
        return device

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
        try:
            save_atomic(obj, self.ckpt_path)
        except Exception as exc:
            full = disk_full(exc, self.ckpt_path)
            if full is not None:
                raise full from None
            raise

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
    def starting(self, phase: str) -> None:
        """Say what the run is doing before its first step (the worker's start-up progress, rank 0)."""
        if self.start_progress is not None:
            self.start_progress.update(phase, now=True)

    def started(self) -> None:
        """The first step is done (its own line follows): the start-up progress ends."""
        if self.start_progress is not None:
            self.start_progress.__exit__(None, None, None)
            self.start_progress = None

    def run(self) -> tuple[Optional[Dict[str, Any]], int]:
        self.setup_dist()
        self.starting("building the tokenizer and the corpus")
        self.setup_data()
        self.starting("building the model")
        self.setup_model()
        self.prepare()
        self.starting("the first step (oneDNN and allocator warm-up; later steps are faster)")
        st = self.train_loop()
        self.finish(st)
        summary = self.summarise(st)
        if self.world > 1:
            self.torch.distributed.barrier()
            # DDP (its reducer and gloo work) goes before its process group: the other order aborted at exit
            # ("terminate called without an active exception") in 3 of 10 2-rank gloo jobs with mimalloc.
            del self.model, self.ddp_model, self.opt
            import gc

            gc.collect()
            self.torch.distributed.destroy_process_group()
        code = 0
        if st.status == "interrupted":
            code = exit_code_for_signal(signal.Signals(self.stop.signum).name if self.stop.signum else None)
        return summary, int(code)

    def emit(self, rec: Dict[str, Any]) -> None:
        """One JSON line in metrics.jsonl (rank 0 only)."""
        if self.metrics is None:
            return
        try:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()
        except OSError as exc:
            full = disk_full(exc, self.metrics_path)
            raise (full or exc) from None

    def prepare(self) -> None:
        """Metrics file, runtime and attention reports, the MFU peak, the settings record."""
        from cpuperf.knowledge.models import flops_per_token, non_embedding_params
        from cpuperf.train.runtime_check import runtime_report

        s = self.s  # the batch trial may have changed batch_size and grad_accum_steps
        self.global_batch = s.batch_size * s.grad_accum_steps * self.world
        self.fpt = flops_per_token(self.cfg)
        self.n_params = sum(p.numel() for p in self.raw_model.parameters())
        self.is0 = self.rank == 0
        self.metrics_path = self.out_dir / METRICS_NAME
        if self.is0:
            # Append, never truncate: a resumed run adds its records after the earlier ones (a
            # fresh run into a directory that holds metrics was refused by rundir.claim).
            self.metrics = os.fdopen(append_nofollow(self.metrics_path), "a", encoding="utf-8")  # never through a link
        runtime = runtime_report()
        if self.is0 and s.dtype == "bf16" and s.device == "cpu" and runtime["native_bf16"] is False:
            sys.stderr.write("cpuperf train: note: this CPU has no AVX512-BF16/AMX, so bf16 is "
                             "emulated and much slower than fp32\n")
        if self.is0 and s.resume and self.resumed_from is None:
            sys.stderr.write(f"cpuperf train: note: no checkpoint at {self.ckpt_path}; "
                             "starting from step 0\n")
        self.attention = self.attention_report()
        self.peak = peak_tflops(s, self.device_name, self.amp.name, self.cfg)
        self.peak_info: Dict[str, Any] = {}
        self.achievable: Optional[Peak] = None
        if s.device != "cuda" and s.peak_tflops is None:
            self.peak, self.peak_info, self.achievable = cpu_peak_parts(s, self.amp.name, self.cfg)
        elif self.peak is None and self.is0:
            from cpuperf.train.gpu import measure_peak

            # A card compat/gpu_peaks.toml does not know, or a CPU: measure its GEMM peak once.
            self.peak = measure_peak(self.device, self.amp.name, s.tf32 and s.device == "cuda")
        self.emit({"type": "settings", "schema": SCHEMA, "settings": s.to_dict(),
                   "model": {**dataclasses.asdict(self.cfg), "params": self.n_params,
                             "non_embedding_params": non_embedding_params(self.cfg),
                             "flops_per_token": self.fpt},
                   "world_size": self.world,
                   "rank_launcher": self.info.launcher if self.info else None,
                   "backend": self.backend, "device": self.device_name,
                   "master": ({"addr": self.info.master_addr, "port": self.info.master_port}
                              if self.info and self.world > 1 else None),
                   "resumed_from": self.resumed_from,
                   "tokenizer": {"vocab_size": self.tok.vocab_size, "cached": self.tokenizer_cached,
                                 "seconds": round(self.tokenizer_s, 3)},
                   "data": {"train_tokens": len(self.split.train), "eval_tokens": len(self.split.eval)},
                   "runtime": runtime})

    def attention_report(self) -> Dict[str, Any]:
        from cpuperf.train.gpu import sdpa_report

        s, cfg = self.s, self.cfg
        try:
            attention = sdpa_report(s.batch_size, cfg.n_head, cfg.seq_len, cfg.d_model // cfg.n_head,
                                    self.amp.name, self.device)
        except Exception as exc:  # the report must never stop training
            attention = {"kernel": None, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        if self.is0:
            why = "; ".join(f"not {k}: {v}" for k, v in attention.get("why_not", {}).items())
            sys.stderr.write(f"cpuperf train: attention kernel {attention['kernel']}"
                             + (f" ({why})" if why else "") + "\n")
        return attention

    def batches(self) -> Iterator[Tuple[Tensor, Tensor]]:
        """The iterator of (x, y) micro-batches from this run's step on."""
        from cpuperf.train.batches import TokenBatches

        torch, s = self.torch, self.s
        try:
            ds = TokenBatches(self.split.train, self.cfg.seq_len, s.batch_size, s.seed,
                              rank=self.rank, world_size=self.world, grad_accum_steps=s.grad_accum_steps,
                              start_micro=self.step * s.grad_accum_steps)
        except ValueError as exc:
            raise ConfigError(str(exc), hint="use a shorter model.seq_len")
        if s.dataloader_workers > 0:
            return iter(torch.utils.data.DataLoader(
                ds, batch_size=None, shuffle=False, num_workers=s.dataloader_workers,
                worker_init_fn=lambda _: torch.set_num_threads(1),
                pin_memory=self.device.type == "cuda", persistent_workers=True))
        return (ds[k] for k in range(len(ds)))

    def train_loop(self) -> LoopState:
        from cpuperf.train.progress import Progress

        s = self.s
        loader = self.batches()
        self.progress = Progress(s.progress if self.is0 else "off", s.max_steps, start=self.step)
        if self.progress.mode == "rich":
            self.started()  # the live bar says it from here (elapsed time; lines from a thread would tear it)
        if self.is0 and self.resumed_from is not None:
            self.progress.note(f"resumed from {self.ckpt_path} at step {self.resumed_from}")
        # Steps left out of the rates: the first (allocator and oneDNN warm-up); with compile
        # the first few, since inductor compiles forward and backward and may recompile once.
        st = LoopState(start_step=self.step, step_measure=self.step, step_window=self.step,
                       exclude=5 if s.compile else 1,
                       window_loss=self.torch.zeros((), dtype=self.torch.float64, device=self.device))
        st.t_window = self.t_loop = time.perf_counter()
        self.stop.armed = True  # from here a signal stops at a step boundary, with a checkpoint
        while True:
            if s.max_steps is not None and self.step >= s.max_steps:
                break
            reason = self.should_stop()
            if reason is not None:
                st.status = "interrupted" if reason == "signal" else "time_budget"
                break
            t_step = time.perf_counter()
            lr = self.train_step(loader, st)
            self.after_step(st, t_step, lr)
        self.sync()
        st.t_end = time.perf_counter()
        self.progress.close()
        return st

    def train_step(self, loader: Iterator[Tuple[Tensor, Tensor]], st: LoopState) -> float:
        """One optimizer step over grad_accum_steps micro-batches; returns the lr it used."""
        torch, s = self.torch, self.s
        accum, ddp = s.grad_accum_steps, self.world > 1
        for micro in range(accum):
            x, y = next(loader)
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            # Skip the gradient all-reduce on all but the last micro-step (on the DDP module
            # itself, which torch.compile wraps).
            no_sync = self.ddp_model.no_sync() if ddp and micro < accum - 1 and self.ddp_model is not None \
                else contextlib.nullcontext()
            with no_sync, self.autocast():
                _, loss = self.model(x, y)
                loss = loss / accum
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            st.window_loss += loss.detach().to(torch.float64)
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
        st.window_steps += 1
        return float(lr)

    def after_step(self, st: LoopState, t_step: float, lr: float) -> None:
        """Warm-up bookkeeping, the step record every log_every steps, evals and checkpoints."""
        s = self.s
        done = self.step - st.start_step
        if done == 1:
            self.sync()
            st.warmup_s = time.perf_counter() - t_step
            self.started()
        if done == st.exclude:
            self.sync()
            st.t_measure, st.step_measure = time.perf_counter(), self.step
        last = s.max_steps is not None and self.step >= s.max_steps
        if done == 1 or self.step % s.log_every == 0 or last:
            self.log_step(st, lr)
        else:
            self.progress.update(self.step)
        t_pause = time.perf_counter()
        paused = False
        if s.eval_every and self.step % s.eval_every == 0 and not last:
            st.eval_loss, st.eval_step = self.evaluate(), self.step
            self.emit({"type": "eval", "step": self.step, "eval_loss": st.eval_loss})
            if self.is0 and st.eval_loss is not None:
                self.progress.note(f"step {self.step}: eval loss {st.eval_loss:.4f}")
            paused = True
        if s.ckpt_every and self.step % s.ckpt_every == 0 and not last:
            self.save_checkpoint()
            paused = True
        if paused:  # keep evals and checkpoints out of the throughput figures
            self.sync()
            st.t_window, st.step_window = time.perf_counter(), self.step
            if st.t_measure is not None:
                st.excluded_s += st.t_window - t_pause

    def log_step(self, st: LoopState, lr: float) -> None:
        """The mean loss over the window (all ranks), rates and ETA: a step record."""
        s = self.s
        self.sync()
        now = time.perf_counter()
        lv = self.all_mean(float(st.window_loss) / st.window_steps)
        if not math.isfinite(lv):
            raise TrainError(f"loss became {lv} at step {self.step}", hint="lower lr, or use dtype fp32")
        dt = max(now - st.t_window, 1e-9)
        sps = (self.step - st.step_window) * self.global_batch / dt
        step_time = dt / max(1, self.step - st.step_window)
        eta = None
        if s.max_steps is not None:
            eta = (s.max_steps - self.step) * step_time
        if s.time_budget_s is not None:
            left = s.time_budget_s - (now - self.t_loop)
            eta = left if eta is None else min(eta, left)
        rec = {"type": "step", "step": self.step, "loss": round(lv, 5), "lr": lr,
               "samples_per_s": round(sps, 3), "tokens_per_s": round(sps * self.cfg.seq_len, 1),
               "elapsed_s": round(now - self.t_loop, 3)}
        self.emit(rec)
        if self.is0:
            self.progress.log(rec, eta)
        if st.loss_first is None:
            st.loss_first = lv
        st.loss_last = lv
        st.window_loss.zero_()
        st.window_steps = 0
        st.t_window, st.step_window = time.perf_counter(), self.step

    def finish(self, st: LoopState) -> None:
        """The final eval (unless interrupted) and checkpoint."""
        if st.status == "interrupted":
            self.save_checkpoint()
            if self.is0:
                name = signal.Signals(self.stop.signum or signal.SIGTERM).name
                sys.stderr.write(f"cpuperf train: {name} at step {self.step}; checkpoint "
                                 f"written to {self.ckpt_path}\n")
            return
        if st.eval_step != self.step:
            st.eval_loss = self.evaluate()
            self.emit({"type": "eval", "step": self.step, "eval_loss": st.eval_loss})
        self.save_checkpoint()

    def rank_checksums(self) -> list[str]:
        """Every rank's parameter checksum (hex), gathered from all ranks."""
        torch = self.torch
        mine = checksum(self.raw_model)
        values = [mine]
        if self.world > 1:
            # all_gather of int64 tensors (all_gather_object would need numpy).
            t = torch.tensor([mine], dtype=torch.int64, device=self.comm_device)
            parts = [torch.zeros_like(t) for _ in range(self.world)]
            torch.distributed.all_gather(parts, t)
            values = [int(p.item()) for p in parts]
        return [f"{v & (2**64 - 1):016x}" for v in values]

    def gpu_memory(self) -> Optional[Dict[str, int]]:
        """Rank 0's real peak on its card since the batch trial: what torch allocated and what its caching allocator
        reserved (torch.cuda.max_memory_allocated / max_memory_reserved); None off a GPU."""
        if self.s.device != "cuda":
            return None
        torch = self.torch
        return {"max_allocated_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                "max_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
                "batch_size": self.s.batch_size}

    def summarise(self, st: LoopState) -> Optional[Dict[str, Any]]:
        """Rank 0's summary record (also the last line of metrics.jsonl); None on other ranks."""
        checksums = self.rank_checksums()
        if not self.is0:
            return None
        # Rates over the steps after the warm-up ones (all steps if the run was shorter), minus
        # the time spent in evals and checkpoints.
        if st.t_measure is None:
            st.t_measure, st.step_measure, st.excluded_s = self.t_loop, st.start_step, 0.0
        measured_steps = self.step - st.step_measure
        span = st.t_end - st.t_measure - st.excluded_s
        sps = measured_steps * self.global_batch / span if measured_steps and span > 0 else None
        tps = sps * self.cfg.seq_len if sps is not None else None
        achieved = tps * self.fpt / 1e12 if tps is not None else None
        peak = self.peak
        if self.s.device != "cuda" and self.s.peak_tflops is None:
            mfu_fields = cpu_mfu_report(self.s, achieved, peak, self.achievable, self.world, self.cfg, self.peak_info)
        else:
            mfu, peak, peak_notes = bounded_mfu(self.s, achieved, peak, self.world, self.cfg)
            mfu_fields = {"mfu": _round(mfu, 5), "peak": peak.to_json() if peak is not None else None, **peak_notes}
        summary = {
            "schema": SCHEMA, "status": st.status, "steps": self.step,
            "steps_this_run": self.step - st.start_step, "resumed_from": self.resumed_from,
            "loss_first": st.loss_first, "loss_last": st.loss_last, "eval_loss": st.eval_loss,
            "samples_per_s": _round(sps, 3), "tokens_per_s": _round(tps, 1),
            "warmup_s": _round(st.warmup_s, 4), "elapsed_s": round(st.t_end - self.t_start, 3),
            "train_s": round(st.t_end - self.t_loop, 3),
            "world_size": self.world, "device": self.device_name, "backend": self.backend,
            "threads": self.torch.get_num_threads(),
            "model": {"params": self.n_params, "flops_per_token": self.fpt,
                      **dataclasses.asdict(self.cfg)},
            "achieved_tflops": _round(achieved, 4), **mfu_fields,
            "amp": {"dtype": self.amp.name, "autocast": self.amp.autocast,
                    "grad_scaler": self.amp.grad_scaler},
            "attention_kernel": self.attention, "batch_trial": self.batch_trial, "gpu_memory": self.gpu_memory(),
            "settings": self.s.to_dict(),
            "metrics_file": str(self.metrics_path), "checkpoint": str(self.ckpt_path),
            "param_checksums": checksums,
        }
        self.emit({"type": "summary", **summary})
        if self.metrics is not None:
            self.metrics.close()
        return summary


def _round(v: Optional[float], digits: int) -> Optional[float]:
    return round(v, digits) if v is not None else None
