"""The one output sink: stdout carries the product, stderr carries messages.

Modes: human (rich tables when stdout is a terminal), json (one object, versioned schema),
quiet (product only, no messages). Rich is imported lazily to keep start-up fast.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Output:
    json_mode: bool = False
    quiet: bool = False

    # -- stdout: the product -------------------------------------------------------------
    def product(self, text: str) -> None:
        """Write product text to stdout verbatim (adds a newline when missing)."""
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        sys.stdout.flush()

    def json(self, obj: Any) -> None:
        """Write one JSON object to stdout."""
        try:  # NaN and Infinity are not JSON: a script's parser would reject the whole object
            text = json.dumps(obj, indent=2, sort_keys=False, default=_json_default, allow_nan=False)
        except ValueError:
            text = json.dumps(_finite(json.loads(json.dumps(obj, default=_json_default))), indent=2,
                              sort_keys=False, allow_nan=False)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def table(self, renderable: Any) -> None:
        """Print a rich renderable (table) to stdout as the product."""
        stdout_console().print(renderable)

    # -- stderr: commentary -------------------------------------------------------------
    def info(self, text: str) -> None:
        if not self.quiet:
            _err_write(text)

    def warn(self, text: str) -> None:
        if not self.quiet:
            _err_write(f"warning: {text}")

    def error(self, text: str, hint: Optional[str] = None) -> None:
        _err_write(f"error: {text}" + (f"\n  hint: {hint}" if hint else ""))

    def err_renderable(self, renderable: Any) -> None:
        if not self.quiet:
            stderr_console().print(renderable)


def _finite(obj: Any) -> Any:
    """Non-finite floats (which inputs should have refused already) as null."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _err_write(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def colour_allowed(stream: Any) -> bool:
    """Colour and spinners only on a terminal, and never when NO_COLOR is set."""
    if os.environ.get("NO_COLOR") is not None:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _console(stream: Any):  # rich.console.Console
    from rich.console import Console

    colour = colour_allowed(stream)
    width = None
    if not colour:
        # A fixed width off a terminal keeps piped output and golden files stable.
        width = int(os.environ.get("COLUMNS", "100") or 100)
    return Console(file=stream, no_color=not colour, color_system="auto" if colour else None,
                   highlight=False, width=width, force_terminal=False if not colour else None,
                   emoji=False)


def stdout_console():
    return _console(sys.stdout)


def stderr_console():
    return _console(sys.stderr)
