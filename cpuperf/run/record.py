"""What every `cpuperf train` run leaves in its run directory besides its own files, for the built-in loop and a
user's command alike: plan.json (the plan as `cpuperf train --dry-run --json` prints it, the full lever report
included), status.json (start, end, wall seconds, exit code, the signal that stopped it, where its log and plan are,
and the throughput the framework reported), and for a user's script run directly, logs/output.log (its stdout and
stderr as they were shown: run/launcher.py tees them).

The metrics of a user's script are what its framework printed or wrote, read back, never guessed: the Hugging Face
Trainer's closing line ({'train_runtime': ..., 'train_samples_per_second': ...}) from the log, Lightning's CSV logger
file (lightning_logs/version_N/metrics.csv written during the run).
"""

from __future__ import annotations

import ast
import csv
import glob
import io
import json
import math
import os
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional

from cpuperf.fsutil import atomic_write_bytes

PLAN_NAME = "plan.json"
STATUS_NAME = "status.json"
OUTPUT_LOG = "output.log"  # under the run's logs/
STATUS_SCHEMA = "cpuperf.run-status/1"
_TAIL_BYTES = 4 * 1024 * 1024  # the Trainer's closing line is at the end: the last 4 MiB of a log is read
_HF_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "epoch")


def iso(t: float) -> str:
    """A wall-clock time as UTC ISO 8601, to the second."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


class NotOurs(OSError):
    """A file of that name in the run directory that cpuperf did not write (`--out .` in a project with its own
    plan.json): left as it is."""


def ours(path: str, marker: bytes) -> bool:
    """Whether `path` is absent, or a regular file cpuperf wrote (its first bytes hold `marker`: a schema, a record
    type, the plot's title). A link or another program's file is not replaced."""
    try:
        if os.path.islink(path):
            return False
        if not os.path.exists(path):
            return True
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as fh:
            return marker in fh.read(4096)
    except OSError:
        return False


def write_json(path: str, obj: Dict[str, Any]) -> None:
    """`obj` (with its "schema") as indented JSON, written whole (never half a file); NotOurs where a file of that
    name is not one cpuperf wrote; a failure is said by the caller."""
    if not ours(path, f'"schema": "{obj.get("schema")}"'.encode()):
        raise NotOurs(f"{path} is not cpuperf's: left as it is")
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=_default) + "\n").encode("utf-8"), make_parents=False)


def _default(obj: object) -> object:
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _TAIL_BYTES))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _number(value: object) -> Optional[float]:
    """A float the framework printed (the Trainer prints '13.37' as text since transformers 5), or None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def hf_metrics(text: str) -> Optional[Dict[str, float]]:
    """The Trainer's closing summary, the last line of `text` that holds one: {'train_runtime': '1.2',
    'train_samples_per_second': '13.3', ...} (PrinterCallback, or the progress bar's write). Pure."""
    for line in reversed(text.splitlines()):
        if "'train_samples_per_second'" not in line and '"train_samples_per_second"' not in line:
            continue
        start, end = line.find("{"), line.rfind("}")
        if start < 0 or end < start:
            continue
        try:
            found = ast.literal_eval(line[start:end + 1])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if not isinstance(found, dict):
            continue
        values = {k: _number(found.get(k)) for k in _HF_KEYS}
        return {k: v for k, v in values.items() if v is not None}
    return None


def lightning_metrics(cwd: str, since: float) -> Optional[Dict[str, Any]]:
    """The last value of each column of the newest Lightning CSV log (lightning_logs/version_N/metrics.csv under the
    directory the script ran in) written since `since`, with its path; None where the run wrote none."""
    found = []
    for path in glob.glob(os.path.join(cwd, "lightning_logs", "version_*", "metrics.csv")):
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if mtime >= since:
            found.append((mtime, path))
    if not found:
        return None
    path = max(found)[1]
    try:
        rows = list(csv.DictReader(io.StringIO(_tail_whole(path))))
    except (csv.Error, ValueError):
        return None
    last: Dict[str, Any] = {}
    for row in rows:
        for key, raw in row.items():
            value = _number(raw) if raw not in (None, "") else None
            if key and value is not None:
                last[key] = value
    return {"from": path, **last} if last else None


def _tail_whole(path: str) -> str:
    """A CSV read whole when small, else its header and last lines (a row cut at the start is dropped)."""
    text = _tail(path)
    try:
        size = os.path.getsize(path)
    except OSError:
        return text
    if size <= _TAIL_BYTES:
        return text
    with open(path, encoding="utf-8", errors="replace") as fh:
        header = fh.readline()
    return header + text.split("\n", 1)[-1]


def script_metrics(logs: List[str], cwd: str, since: float) -> Optional[Dict[str, Any]]:
    """What the user's framework reported: the Trainer's summary from the first of `logs` that holds one (the
    run's output.log, or under a launcher rank 0's log, then launcher.log), else Lightning's CSV log; with the
    throughput as samples/s where it is one of them."""
    for log in logs:
        hf = hf_metrics(_tail(log))
        if hf:
            return {"framework": "transformers", "from": log, **hf, "samples_per_s": hf.get("train_samples_per_second")}
    lit = lightning_metrics(cwd, since)
    if lit:
        return {"framework": "lightning", **lit}
    return None


def hf_steps(text: str, logging_steps: int) -> List[Dict[str, Any]]:
    """The Trainer's loss lines ({'loss': '4.02', 'grad_norm': ..., 'epoch': '0.125'}) as step records: the k-th
    line is step k x logging_steps (the Trainer logs every logging_steps steps; its lines carry no step). Pure."""
    records: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if "'loss'" not in line or "train_runtime" in line:
            continue
        start, end = line.find("{"), line.rfind("}")
        try:
            found = ast.literal_eval(line[start:end + 1]) if 0 <= start < end else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        loss = _number(found.get("loss")) if isinstance(found, dict) else None
        if loss is not None:
            records.append({"type": "step", "step": (len(records) + 1) * logging_steps, "loss": loss})
    return records


def lightning_steps(path: str) -> List[Dict[str, Any]]:
    """Lightning's CSV log (a `step` column, the loss logged as `loss`, `train_loss` or a name ending in `loss`) as
    step records; [] where it has no such column."""
    try:
        rows = list(csv.DictReader(io.StringIO(_tail_whole(path))))
    except (csv.Error, ValueError):
        return []
    records: List[Dict[str, Any]] = []
    for row in rows:
        step = _number(row.get("step"))
        names = [k for k in row if k and k.endswith("loss") and not k.startswith("val")]
        name = next((k for k in ("train_loss", "loss", "train_loss_step") if k in names), names[0] if names else None)
        loss = _number(row.get(name)) if name and row.get(name) not in (None, "") else None
        if step is not None and loss is not None:
            records.append({"type": "step", "step": int(step), "loss": loss})
    return records


def step_records(metrics: Optional[Dict[str, Any]], logging_steps: Optional[int]) -> List[Dict[str, Any]]:
    """The per-step loss the framework reported, as the built-in loop's metrics.jsonl records (cpuperf plot draws
    them): the Trainer's loss lines where its logging interval is known, Lightning's CSV log."""
    if not metrics:
        return []
    if metrics.get("framework") == "transformers" and logging_steps:
        return hf_steps(_tail(str(metrics["from"])), logging_steps)
    if metrics.get("framework") == "lightning":
        return lightning_steps(str(metrics["from"]))
    return []


def write_steps(path: str, records: List[Dict[str, Any]]) -> None:
    if not ours(path, b'{"type": "'):
        raise NotOurs(f"{path} is not cpuperf's: left as it is")
    atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in records).encode("utf-8"), make_parents=False)


def remove_empty_lightning_dirs(cwd: str, since: float, base_was_there: bool) -> List[str]:
    """The empty lightning_logs/version_N directories Lightning's default logger made in `cwd` during this run (a
    script that logs nothing and keeps no checkpoint leaves one per run), and lightning_logs itself where this run
    made it and it is left empty: removed, their paths returned. Nothing with a file in it, nothing older."""
    base = os.path.join(cwd, "lightning_logs")
    removed = []
    for path in sorted(glob.glob(os.path.join(base, "version_*"))):
        try:
            st = os.lstat(path)
            if not os.path.isdir(path) or os.path.islink(path) or st.st_mtime < since or os.listdir(path):
                continue
            os.rmdir(path)
        except OSError:
            continue
        removed.append(path)
    try:
        if removed and not base_was_there and not os.listdir(base):
            os.rmdir(base)
            removed.append(base)
    except OSError:
        pass
    return removed


def status(*, kind: str, command: List[str], run_dir: str, started: float, wall_s: float, code: int,
           signal_name: Optional[str], log: Optional[str], metrics: Optional[Dict[str, Any]],
           plan: Optional[str]) -> Dict[str, Any]:
    """status.json's object: how the run ended and where its files are."""
    ended = started + wall_s
    state = "interrupted" if signal_name else "completed" if code == 0 else "failed"
    return {"schema": STATUS_SCHEMA, "kind": kind, "status": state, "command": command,
            "started": iso(started), "ended": iso(ended), "wall_s": round(wall_s, 3), "exit_code": code,
            "signal": signal_name, "run_dir": run_dir, "plan": plan,
            "log": log if log and os.path.isfile(log) else None, "metrics": metrics}


def now() -> float:
    return time.time()
