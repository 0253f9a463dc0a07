"""The one output sink: stdout carries the product, stderr carries messages.

Modes: human (rich tables when stdout is a terminal), json (one object, versioned schema),
quiet (product only, no messages). Rich is imported lazily to keep start-up fast.

A closed stream (`>&-`) or one whose reader left (`| head -c1`) is one outcome for every command
(docs/exit-codes.md): what cannot be shown is dropped (the stream is /dev/null from then on, for cpuperf and
the processes it starts), the command runs to its end and exits with its own code. Any other failure to write
(a full disk under `> FILE`) is StreamError, exit 10, the stream named: the product is not silently cut short.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Callable, Mapping, Optional

from cpuperf.errors import FilesystemError

if TYPE_CHECKING:  # rich is imported where it draws (fast start-up)
    from rich.console import Console, RenderableType

# Terminal control characters: C0 but tab and newline, DEL, C1 (ECMA-48 5.2/5.3: ESC and CSI start sequences
# that clear the screen or set the window title), and the Unicode line/paragraph separators. A string from a
# file, a node or a package is shown with these escaped, never sent raw to a terminal.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def inert(text: str) -> str:
    """`text` with every terminal control character written as an escape (\\x1b, \\u2028): safe on any terminal."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text)


# -- the standard streams ---------------------------------------------------------------------------

_STREAMS = {0: "stdin", 1: "stdout", 2: "stderr"}


class StreamError(FilesystemError):
    """stdout or stderr refused a write for another reason than a closed stream or a reader gone (a full disk, an
    I/O error): exit 10, the stream named."""


def _devnull_onto(fd: int) -> None:
    """/dev/null on descriptor `fd` (inheritable, as a standard stream is)."""
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
    else:
        os.set_inheritable(fd, True)


def guard_std_streams() -> None:
    """At start-up: a closed descriptor 0, 1 or 2 gets /dev/null, so no file cpuperf opens takes its number (a lock
    or a log on descriptor 1 would get the product, and every child would inherit it as its stdout); a stream Python
    left as None for want of its descriptor is made again on it. What a closed stream would have shown is dropped."""
    for fd in _STREAMS:
        try:
            os.fstat(fd)
        except OSError:
            try:
                _devnull_onto(fd)
            except OSError:  # no /dev/null (a bare chroot): the None streams below stay None, _write skips them
                return
    for fd, name in _STREAMS.items():
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False, encoding="utf-8",
                                    errors="backslashreplace"))


def _gone(exc: BaseException) -> bool:
    """A closed stream or a reader gone: EPIPE, EBADF, or a stream object already closed (ValueError)."""
    return isinstance(exc, ValueError) or getattr(exc, "errno", None) in (errno.EPIPE, errno.EBADF, errno.ECONNRESET)


def stream_failed(stream: Optional[IO[str]], exc: BaseException) -> None:
    """A write to `stream` raised `exc`: a stream gone is /dev/null from now on (this process and its children);
    any other failure is StreamError (exit 10) naming it."""
    fd = _fileno(stream)
    name = _STREAMS.get(fd if fd is not None else -1, "an output stream")
    if not _gone(exc):
        why = getattr(exc, "strerror", None) or str(exc)
        raise StreamError(f"cannot write {name}: {why}",
                          hint=f"free space where {name} goes, or send it elsewhere") from None
    if fd is not None:
        with contextlib.suppress(OSError):
            _devnull_onto(fd)  # the pipe's end dropped: a later write or a child's goes nowhere, quietly
    with contextlib.suppress(OSError, ValueError):
        if stream is not None:
            stream.flush()  # what was left in the buffer goes to /dev/null, not to an error at exit


def _fileno(stream: Optional[IO[str]]) -> Optional[int]:
    try:
        return stream.fileno() if stream is not None else None
    except (OSError, ValueError, AttributeError):
        return {id(sys.__stdout__): 1, id(sys.__stderr__): 2}.get(id(stream))


def write_stream(stream: Optional[IO[str]], text: str) -> None:
    """Write and flush `text` on `stream` (stdout or stderr) under the rule above; None (no stream at all): dropped."""
    if stream is None:
        return
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError) as exc:
        stream_failed(stream, exc)


def _rendered(stream: IO[str], renderable: RenderableType) -> str:
    """A rich renderable as the text `stream`'s console would print: rich draws, write_stream writes (rich's own
    writes end a broken pipe with a silent SystemExit(1))."""
    import io

    drawn = io.StringIO()
    _console(stream, into=drawn).print(renderable)
    return drawn.getvalue()


@dataclass
class Output:
    json_mode: bool = False
    quiet: bool = False
    verbose: bool = False  # -v: the full reports (train's lever report, each lever and why) where a command has them

    # -- stdout: the product -------------------------------------------------------------
    def product(self, text: str) -> None:
        """Write product text to stdout (adds a newline when missing); control characters escaped."""
        text = inert(text)
        write_stream(sys.stdout, text if text.endswith("\n") or not text else text + "\n")

    def json(self, obj: object) -> None:
        """Write one JSON object to stdout."""
        try:  # NaN and Infinity are not JSON: a script's parser would reject the whole object
            text = json.dumps(obj, indent=2, sort_keys=False, default=_json_default, allow_nan=False)
        except ValueError:
            text = json.dumps(_finite(json.loads(json.dumps(obj, default=_json_default))), indent=2,
                              sort_keys=False, allow_nan=False)
        write_stream(sys.stdout, text + "\n")

    def table(self, renderable: RenderableType) -> None:
        """Print a rich renderable (table) to stdout as the product: cells as plain text, control characters escaped."""
        write_stream(sys.stdout, _rendered(sys.stdout, _inert_renderable(renderable)))

    # -- stderr: commentary -------------------------------------------------------------
    def info(self, text: str) -> None:
        if not self.quiet:
            _err_write(text)

    def warn(self, text: str) -> None:
        if not self.quiet:
            _err_write(f"warning: {text}")

    def error(self, text: str, hint: Optional[str] = None) -> None:
        # An error stays one line (and its hint one more), whatever the width: a script greps for it, a log holds it
        _err_write(f"error: {text}" + (f"\n  hint: {hint}" if hint else ""), wrap=False)

    def err_renderable(self, renderable: RenderableType) -> None:
        if not self.quiet:
            write_stream(sys.stderr, _rendered(sys.stderr, _inert_renderable(renderable)))

    def teller(self, prefix: str = "") -> Teller:
        """A `log` for the engine's long steps: its lines on stderr after `prefix`; progress lines (ProgressLine)
        not under --json (a script reads the product), nothing at all under --quiet."""
        return Teller(prefix, self.quiet, self.json_mode)


@dataclass(frozen=True)
class Teller:
    """Output.teller's callable; `silent` tells a caller that says something only once not to count it as said."""

    prefix: str
    silent: bool
    json_mode: bool

    def __call__(self, text: str) -> None:
        if self.silent or (self.json_mode and isinstance(text, ProgressLine)):
            return
        _err_write(self.prefix + text)


class ProgressLine(str):
    """A message that says how a long step is going: shown on a terminal or a log, never under --json or --quiet."""


class Progress:
    """What a long step is doing, how far along it is and about how long is left, said through `say` (stderr)
    when the step moves on, and repeated by a timer thread whenever `every` seconds pass without a line, so a
    user never waits more than that in silence (a torch import or one round on a loaded host can take longer).
    `say` None: nothing is said."""

    def __init__(self, say: Optional[Callable[[str], object]], what: str, every: float = 6.0, gap: float = 3.0,
                 clock: Callable[[], float] = time.monotonic):
        self.say, self.what, self.every, self.gap, self.clock = say, what, every, gap, clock
        self.started = self.last = clock()
        self.detail, self.left_s = "", None  # type: str, Optional[float]
        self._said: Optional[str] = None  # the detail of the last line said
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def line(self, again: bool = False) -> str:
        """The line; `again`: its detail was said already (the timer's repeat), so it reads as work going on after
        it, never as the same step a second time (`GEMM round 3` twice read as a round measured twice)."""
        elapsed = self.clock() - self.started
        left = "" if self.left_s is None else f", about {_seconds(self.left_s)} left"
        detail = f"still working; last: {self.detail}" if again and self.detail else self.detail
        return f"{self.what}{': ' + detail if detail else ''} ({_seconds(elapsed)} so far{left})"

    def update(self, detail: str, left_s: Optional[float] = None, now: bool = False) -> None:
        """The step moved on: said at once when `now` or `gap` seconds passed since the last line."""
        with self._lock:
            self.detail, self.left_s = detail, left_s
            if now or self.clock() - self.last >= self.gap:
                self._tell()

    def _tell(self) -> None:
        self.last = self.clock()
        again, self._said = self.detail == self._said, self.detail
        if self.say is not None:
            self.say(ProgressLine(self.line(again)))

    def _tick(self) -> None:
        while not self._stop.wait(min(0.5, self.every / 4)):  # a loaded host delays a wake-up: margin under 10 s
            with self._lock:
                if self.clock() - self.last >= self.every:
                    if self.left_s is not None:  # the estimate counts down between the step's own updates
                        self.left_s = max(0.0, self.left_s - (self.clock() - self.last))
                    self._tell()

    def __enter__(self) -> Progress:
        if self.say is not None:
            self._thread = threading.Thread(target=self._tick, name="cpuperf-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)


def _seconds(s: float) -> str:
    """12 s, 3 min 5 s."""
    s = max(0, int(round(s)))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"


def _finite(obj: object) -> object:
    """Non-finite floats (which inputs should have refused already) as null."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _json_default(obj: object) -> object:
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _inert_renderable(renderable: RenderableType) -> RenderableType:
    """A rich Table with every cell and title as Text (never markup) with control characters escaped; other
    renderables (str, Text) likewise. Tables are what doctor fills with names from nodes and facts files."""
    from rich.table import Table
    from rich.text import Text

    def cell(value: RenderableType) -> RenderableType:
        if isinstance(value, str):
            return Text(inert(value))
        if isinstance(value, Text):
            clean = inert(value.plain)
            return value if clean == value.plain else Text(clean, style=value.style)
        return value

    if isinstance(renderable, Table):
        for column in renderable.columns:
            column._cells[:] = [cell(c) for c in column._cells]
            column.header = cell(column.header)
        if renderable.title is not None:
            title = cell(renderable.title)  # a str or Text: a Text
            renderable.title = title if isinstance(title, Text) else renderable.title
        return renderable
    return cell(renderable)


def message_width(environ: Optional[Mapping[str, str]] = None, stream: object = None) -> Optional[int]:
    """The width message lines are wrapped to: COLUMNS where it is a width (as piped_width holds it), else the
    terminal's where stderr is one (shutil.get_terminal_size), else None: a log file gets each message whole."""
    environ = os.environ if environ is None else environ
    if (environ.get("COLUMNS") or "").strip():
        return piped_width(environ.get("COLUMNS"))
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return None
    import shutil

    return max(PIPED_WIDTH_MIN, shutil.get_terminal_size().columns)


def wrap_lines(text: str, width: Optional[int], indent: str = "  ") -> str:
    """Each line of `text` longer than `width` broken at spaces, its continuation indented by `indent` past the line's
    own indent; a word longer than a line is cut (a path wider than the terminal wraps there anyway). None: as is."""
    if width is None:
        return text
    import textwrap

    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip(" "))]
        out.extend(textwrap.wrap(line, width, initial_indent="", subsequent_indent=lead + indent,
                                 break_on_hyphens=False, drop_whitespace=True) or [line])
    return "\n".join(out)


def _err_write(text: str, wrap: bool = True) -> None:
    text = wrap_lines(inert(text), message_width()) if wrap else inert(text)
    write_stream(sys.stderr, text + "\n")


def message(text: str) -> None:
    """One message line on stderr, terminal-safe (inert): for code that has no Output at hand. Every message that
    carries a value from a file, the environment or another process goes through here or through Output."""
    _err_write(text)


def colour_allowed(stream: object) -> bool:
    """Colour and spinners only on a terminal, and never when NO_COLOR is set."""
    if os.environ.get("NO_COLOR") is not None:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


# Off a terminal: COLUMNS when it is a width a table can be drawn in, else 100. Below 20 columns rich draws
# nothing at all (COLUMNS=0 printed an empty doctor with exit 0); past 1000 a line is padded to no one's benefit.
PIPED_WIDTH, PIPED_WIDTH_MIN, PIPED_WIDTH_MAX = 100, 20, 1000


def piped_width(columns: Optional[str]) -> int:
    """The width for output off a terminal: COLUMNS when it is a whole number, held to 20..1000; else 100.
    rich itself ignores a COLUMNS that is not digits; so does this (COLUMNS=abc was an internal error)."""
    text = (columns or "").strip()
    if not text.isascii() or not text.isdigit():
        return PIPED_WIDTH
    if len(text) > 6:  # int() refuses past 4300 digits; any such number is past the cap
        return PIPED_WIDTH_MAX
    return min(max(int(text), PIPED_WIDTH_MIN), PIPED_WIDTH_MAX)


def _console(stream: IO[str], into: Optional[IO[str]] = None) -> Console:
    """A console drawing for `stream` (its colours and width); `into`: the file it writes to, when not the stream."""
    from rich.console import Console

    colour = colour_allowed(stream)
    width = None
    if not colour:
        # A fixed width off a terminal keeps piped output and golden files stable.
        width = piped_width(os.environ.get("COLUMNS"))
    elif into is not None:  # drawn into a buffer for a terminal: the width rich gives the terminal, not the buffer
        width = Console(file=stream, highlight=False, emoji=False).width
    return Console(file=into or stream, no_color=not colour, color_system="auto" if colour else None,
                   highlight=False, width=width, force_terminal=(into is not None) if colour else False,
                   emoji=False)


def stdout_console() -> Console:
    return _console(sys.stdout)

