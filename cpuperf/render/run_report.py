"""What `cpuperf train` says around a run, short enough for one screen: the lever report once, before the job
starts (a few lines; the full report is plan.json in the run directory, --json, or -v), and a summary at the end
(how it ended, wall time, throughput where known, where the run directory, log, plan and status are). Pure."""

from __future__ import annotations

import os
import shlex
from typing import Any, Dict, List, Mapping, Optional, Sequence

from cpuperf.plan.applied import LeverState, show_value

_MOST = 8  # ids named on one line before "and N more"


def _named(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_MOST])
    return shown + (f" and {len(items) - _MOST} more" if len(items) > _MOST else "")


def _plain(s: LeverState) -> bool:
    """A lever the job leaves off or at the framework's default: counted, not named, in the short report."""
    return (s.how.startswith("default") or s.value is None or s.value is False or s.value == "none"
            or (isinstance(s.value, int) and not isinstance(s.value, bool) and s.value == 0)
            or (s.id in _COUNTS_OR_SWITCHES and s.value == 1))


_COUNTS_OR_SWITCHES = ("nnodes", "nproc_per_node", "grad_accum_steps")


def short_levers(states: Sequence[LeverState], flags: Sequence[str], full_report: str) -> List[str]:
    """The lever report in three lines at most: the levers the job carries (those left at their default counted),
    the ones it does not (the script's own code's apart), the flags added to the command; then where the full
    report is."""
    chosen = [f"{s.id}={show_value(s.value)}" for s in states if s.applied and not _plain(s)]
    defaults = sum(1 for s in states if s.applied and _plain(s))
    own = [s.id for s in states if not s.applied and "own code" in s.how]
    missed = [f"{s.id}={show_value(s.value)}" for s in states if not s.applied and "own code" not in s.how]
    lines = [f"levers applied: {_named(chosen) or 'none'}" + (f" (+{defaults} off or at their default)" if defaults else "")]
    if missed or own:
        lines.append("levers not applied: " + _named(missed)
                     + (("; " if missed else "") + f"left to your code: {_named(own)}" if own else ""))
    if flags:
        lines.append("flags added: " + " ".join(flags))
    lines.append(f"the full lever report: {full_report} (or -v)")
    return lines


def where(path: Optional[str], cwd: str) -> str:
    """`path` relative to `cwd` where that is shorter (runs/train/version_0/plan.json), else as it is."""
    if not path:
        return "-"
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return rel if len(rel) < len(path) else path


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec} s" if m < 60 else f"{m // 60} h {m % 60} min"


def throughput(metrics: Optional[Mapping[str, Any]]) -> Optional[str]:
    """'45.2 samples/s (transformers)' from status.json's metrics, where the run reported one."""
    if not metrics:
        return None
    value = metrics.get("samples_per_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        source = metrics.get("framework")
        return f"{value:.1f} samples/s" + (f" ({source})" if source else "")
    return None


def summary_lines(status: Dict[str, Any], cwd: str, extra: Sequence[tuple[str, Optional[str]]] = ()) -> List[str]:
    """The closing summary: one line for how the run ended, then one per place (run dir, log, plan, status, ...)."""
    how = {"completed": "completed", "failed": "failed", "interrupted": "interrupted"}.get(status["status"], "ended")
    head = f"cpuperf train: {how} in {_duration(float(status['wall_s']))}, exit {status['exit_code']}"
    if status.get("signal"):
        head += f" ({status['signal']})"
    speed = throughput(status.get("metrics"))
    if speed:
        head += f", {speed}"
    run_dir = status["run_dir"]
    places = [("run dir", run_dir), ("log", status.get("log")), ("plan", status.get("plan")),
              ("status", os.path.join(run_dir, "status.json")), *extra]
    return [head] + [f"  {name}: {where(path, cwd)}" for name, path in places if path]


def shell_wrapped(argv: Sequence[str], env: Mapping[str, str], width: Optional[int]) -> str:
    """`VAR=value ... argv` as one copy-pasteable command, its lines at most `width` wide where it is given: words
    joined by ` \\` line continuations, a word longer than a line cut into quoted pieces that the shell joins
    again (`'{"a": 1, '\\` then `'"b": 2}'` at the start of the next line). None: one line, as plan.launch's."""
    words = [(f"{k}=", str(v)) for k, v in env.items()] + [("", a) for a in argv]
    if width is None:
        return " ".join(prefix + shlex.quote(raw) for prefix, raw in words)
    room = max(20, width - 2)  # a line's end holds " \\"
    lines: List[str] = []  # each ends where the next starts: " \\" between words, "\\" inside a cut word
    line = ""
    for prefix, raw in words:
        word = prefix + shlex.quote(raw)
        if len(word) <= room - 2:
            if line and len(line) + 1 + len(word) > room:
                lines.append(line + " \\")
                line = "  " + word
            else:
                line = f"{line} {word}" if line else word
            continue
        if line:
            lines.append(line + " \\")
        pieces = [shlex.quote(cut) for cut in _cuts(raw, room - len(prefix) - 3)]
        # the shell joins adjacent quoted strings into one word: each piece but the last ends its line with "\\"
        lines.extend((prefix if n == 0 else "") + piece + "\\" for n, piece in enumerate(pieces[:-1]))
        line = pieces[-1] if len(pieces) > 1 else prefix + pieces[-1]
    if line:
        lines.append(line)
    return "\n".join(lines)


def _cuts(raw: str, most: int) -> List[str]:
    """`raw` in pieces each at most `most` wide once quoted (a quote in it takes five: '"'"')."""
    cuts, piece, size = [], "", 2
    for ch in raw:
        cost = 5 if ch == "'" else 1
        if piece and size + cost > most:
            cuts.append(piece)
            piece, size = "", 2
        piece, size = piece + ch, size + cost
    return cuts + [piece] if piece else cuts


def wrap_comments(text: str, width: Optional[int]) -> str:
    """Each `# ...` line of `text` longer than `width` broken at spaces, continued as `#   ...`; other lines as they
    are. None: as is."""
    if width is None:
        return text
    import textwrap

    out: List[str] = []
    for line in text.split("\n"):
        if not line.startswith("#") or len(line) <= width:
            out.append(line)
            continue
        out.extend(textwrap.wrap(line, width, subsequent_indent="#   ", break_on_hyphens=False) or [line])
    return "\n".join(out)
