"""The training worker: `python -m cpuperf.train.worker --config PATH_OR_JSON [--json]`.

Runs alone, or as one rank under torchrun / mpirun / srun (see dist_env.py). Rank 0 claims the run
directory (rundir.py), writes the checkpoint, the metrics file (JSON lines) and the summary; every
rank trains (loop.py). This module is the entry and the one error boundary.

Exit codes (errors.TrainExit): 0 done, 1 failed, 2 bad config (or an existing run without --resume),
3 missing IPEX/oneCCL/CUDA/MPI, 8 torch.distributed failed to start, 10 another run holds the run
directory, 130 SIGINT, 143 SIGTERM and 129 SIGHUP (each after a checkpoint once training has started).
No traceback unless CPUPERF_DEBUG=1. Under cpuperf train (CPUPERF_RANK_ERRORS set) an error goes to
that directory as JSON instead of stderr, so the user reads it once, from cpuperf.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any, Dict, Mapping, Optional

from cpuperf.boundary import RANK_ERRORS
from cpuperf.errors import exit_code_for_signal
from cpuperf.train.errors import TrainError, TrainExit
from cpuperf.train.loop import Run, Stop, Terminated, install_signal_handlers
from cpuperf.train.loop import lr_lambda as _lr_lambda  # noqa: F401  (tests, older imports)
from cpuperf.train.loop import peak_tflops as _peak_tflops  # noqa: F401
from cpuperf.train.rundir import METRICS_NAME  # noqa: F401
from cpuperf.worker_settings import ConfigError, TrainSettings

_Stop = Stop  # the name older callers use
ERRORS_VAR = RANK_ERRORS  # a directory where a rank leaves rank<R>.json on error


def _peak_clock(summary: Dict[str, Any]) -> str:
    """' (262 GFLOP/s at 4.10 GHz, boost clock)': the CPU peak MFU divides by, with the clock it assumes."""
    hw, peak = summary.get("hardware_peak") or {}, summary.get("peak") or {}
    if not hw.get("clock_used_ghz") or not peak.get("tflops"):
        return ""
    return f" ({peak['tflops'] * 1e3:.0f} GFLOP/s at {hw['clock_used_ghz']:.2f} GHz, {hw['clock_used']} clock)"


def _human(summary: Dict[str, Any]) -> str:
    def f(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"cpuperf train: {summary['status']} at step {summary['steps']} "
        f"({summary['train_s']:.1f}s training, {summary['world_size']} rank(s) on "
        f"{summary['device']})",
        f"  loss {f(summary['loss_first'], '.4f')} -> {f(summary['loss_last'], '.4f')}, "
        f"eval loss {f(summary['eval_loss'], '.4f')}",
        f"  {f(summary['samples_per_s'], '.1f')} samples/s, {f(summary['tokens_per_s'], '.0f')} "
        f"tokens/s, first step {f(summary['warmup_s'], '.2f')}s"
        + (f", MFU {summary['mfu'] * 100:.1f}% of the hardware peak{_peak_clock(summary)}"
           if summary.get("mfu") is not None else "")
        + (f", {summary['pct_of_achievable']:.0f}% of achievable (measured GEMM)"
           if summary.get("pct_of_achievable") is not None else ""),
        f"  metrics {summary['metrics_file']}, checkpoint {summary['checkpoint']}",
    ]
    extra = []
    if (summary.get("attention_kernel") or {}).get("kernel"):
        extra.append(f"attention {summary['attention_kernel']['kernel']}")
    if (summary.get("amp") or {}).get("autocast"):
        amp = summary["amp"]
        extra.append(f"{amp['dtype']} autocast" + (" + GradScaler" if amp["grad_scaler"] else ""))
    mem = summary.get("gpu_memory") or {}
    if mem:
        extra.append(f"GPU memory peak {mem['max_allocated_bytes'] / 2**30:.1f} GiB allocated, "
                     f"{mem['max_reserved_bytes'] / 2**30:.1f} GiB reserved")
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


def _rank(environ: Mapping[str, str]) -> int:
    """This process's global rank from the launcher's variables (0 when malformed: setup says why)."""
    from cpuperf.train.dist_env import LaunchEnvError, rank_info

    try:
        info = rank_info(environ)
    except LaunchEnvError:
        return 0
    return info.rank if info else 0


def _report(err: TrainError | ConfigError, as_json: bool, debug_hint: bool = False) -> int:
    """The one error line (or a record for cpuperf train), and the JSON object with --json."""
    errors_dir = os.environ.get(ERRORS_VAR)
    rank = _rank(os.environ)
    written = False
    if errors_dir:
        record = {**err.to_json()["error"], "rank": rank}
        try:
            with open(os.path.join(errors_dir, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
                json.dump(record, fh)
            written = True
        except OSError:
            written = False
    if not written:
        hint = f" (hint: {err.hint})" if err.hint else ""
        extra = " (set CPUPERF_DEBUG=1 for a traceback)" if debug_hint else ""
        sys.stderr.write(f"cpuperf train: error: {err.message}{hint}{extra}\n")
    if as_json:
        sys.stdout.write(json.dumps(err.to_json()) + "\n")
    return int(err.code)


def _train(args: argparse.Namespace, stop: Stop) -> tuple[Optional[Dict[str, Any]], int]:
    """Settings, the run directory (rank 0), the run."""
    from cpuperf.output import Progress
    from cpuperf.train.rundir import claim

    settings = load_settings(args)
    lock = claim(settings.out_dir, settings.resume) if _rank(os.environ) == 0 else None
    say = _say if _rank(os.environ) == 0 and settings.progress != "off" else None
    # Until its first step a run prints nothing of its own (torch's import, the tokenizer, the model, oneDNN's
    # warm-up: a minute or more on a busy host): said at least every 6 s, and what it is doing.
    with Progress(say, "cpuperf train: starting") as start:
        start.update("importing torch", now=True)
        try:
            run = Run(settings, stop)
            run.start_progress = start
            return run.run()
        finally:
            if lock is not None:
                lock.release()


def _say(text: str) -> None:
    from cpuperf.output import message_width, wrap_lines

    sys.stderr.write(wrap_lines(text, message_width()) + "\n")  # the terminal's width, as cpuperf's own messages
    sys.stderr.flush()


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point; returns the exit code (the one error boundary of the worker)."""
    from cpuperf.output import guard_std_streams

    guard_std_streams()  # a closed stdout or stderr is /dev/null: no file of the run takes its number
    args = build_parser().parse_args(argv)
    debug = os.environ.get("CPUPERF_DEBUG") == "1"
    stop = Stop()
    install_signal_handlers(stop)
    try:
        summary, code = _train(args, stop)
    except (TrainError, ConfigError) as exc:  # ConfigError: the settings' schema (cpuperf.worker_settings)
        if debug:
            raise
        return _report(exc, args.json)
    except KeyboardInterrupt:
        sys.stderr.write("cpuperf train: interrupted\n")
        return int(TrainExit.INTERRUPTED)
    except Terminated as exc:
        sys.stderr.write(f"cpuperf train: {signal.Signals(exc.signum).name} before training started\n")
        return int(exit_code_for_signal(signal.Signals(exc.signum).name))
    except OSError as exc:  # a file the run writes (metrics, logs, the run directory): exit 10, the path named
        if debug:
            raise
        from cpuperf.errors import FilesystemError, from_os_error

        fs = exc if isinstance(exc, FilesystemError) else from_os_error(exc)  # a link refused (fsutil): its own line
        return _report(TrainError(fs.message, hint=fs.hint, code=TrainExit.FILESYSTEM), args.json)  # type: ignore[arg-type]  # TrainExit, the worker's codes
    except Exception as exc:
        if debug:
            raise
        return _report(TrainError(f"{type(exc).__name__}: {exc}".splitlines()[0]), args.json, True)
    if summary is not None:
        if args.json:
            sys.stdout.write(json.dumps(summary) + "\n")
        else:
            from cpuperf.output import message_width, wrap_lines

            sys.stderr.write(wrap_lines(_human(summary), message_width()))  # the terminal's width, as cpuperf's
    return code


if __name__ == "__main__":
    _code = main()
    # Skip interpreter teardown: after a distributed run, gloo's static destructors can race a peer
    # closing its sockets and abort ("terminate called without an active exception", exit 134) once
    # the run has already succeeded; seen in ~1 of 15 two-rank runs under cpuperf train.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
