"""Progress on stderr: a rich bar on a TTY, plain log lines otherwise, or nothing."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

EVERY_S = 6.0  # the longest a plain log stays silent between step lines (but for a step longer than that)


def _fmt_eta(seconds: Optional[float]) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(seconds + 0.5)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """Rank 0's view of the run: update() every step, log() at log steps, note() for events."""

    def __init__(self, mode: str, total: Optional[int], start: int = 0,
                 stream: Optional[TextIO] = None) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "rich" if getattr(self.stream, "isatty", lambda: False)() else "plain"
        self.mode = mode
        self.total = total
        self._t0 = self._last = time.monotonic()
        self._first = self._step = start
        self._bar: Optional[RichProgress] = None
        self._task: Optional[TaskID] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if mode == "plain":  # a step longer than EVERY_S (a busy host) must not leave the log silent either
            threading.Thread(target=self._tick, name="cpuperf-train-progress", daemon=True).start()
        if mode == "rich":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[sps]} samples/s"),
                TextColumn("{task.fields[tps]} tok/s"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("train", total=total, completed=start,
                                            loss="-", sps="-", tps="-")

    def update(self, step: int) -> None:
        """Move the bar to `step`; in plain mode, a short line where `EVERY_S` passed since the last one (ten
        steps between log lines took a minute on a busy host)."""
        self._step = step
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=step)
        elif self.mode == "plain" and time.monotonic() - self._last >= EVERY_S:
            self._write(self._where())

    def _where(self) -> str:
        """'step 37/400 eta 4m10s': the last step done, and the time left at the rate so far."""
        step = self._step
        rate = (step - self._first) / (time.monotonic() - self._t0) if step > self._first else 0.0
        eta = (self.total - step) / rate if self.total and rate > 0 else None
        return f"step {step}{f'/{self.total}' if self.total else ''} eta {_fmt_eta(eta)}\n"

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            if time.monotonic() - self._last >= EVERY_S:
                self._write(self._where())

    def _write(self, text: str) -> None:
        with self._lock:
            self._last = time.monotonic()
            self.stream.write(text)
            self.stream.flush()

    def log(self, rec: Dict[str, Any], eta_s: Optional[float]) -> None:
        """Show one metrics record (step, loss, lr, samples_per_s, tokens_per_s)."""
        if self.mode == "rich" and self._bar is not None and self._task is not None:  # (both set in rich mode)
            self._bar.update(self._task, completed=rec["step"], loss=f"{rec['loss']:.4f}",
                             sps=f"{rec['samples_per_s']:.1f}", tps=f"{rec['tokens_per_s']:.0f}")
        elif self.mode == "plain":
            total = f"/{self.total}" if self.total else ""
            self._write(
                f"step {rec['step']}{total} loss {rec['loss']:.4f} lr {rec['lr']:.2e} "
                f"samples/s {rec['samples_per_s']:.1f} tokens/s {rec['tokens_per_s']:.0f} "
                f"eta {_fmt_eta(eta_s)}\n")

    def note(self, text: str) -> None:
        """A one-line event (eval result, checkpoint written)."""
        if self.mode == "rich" and self._bar is not None:
            self._bar.console.print(text)
        elif self.mode == "plain":
            self._write(text + "\n")

    def close(self) -> None:
        """Stop the live bar (leaves the last frame on screen) or the plain log's timer."""
        self._stop.set()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
