"""What a user's own command is read for: its launcher's interpreter and its script's text (accelerate's config
file: probe/hf.py)."""

from __future__ import annotations

import os
import shutil
from typing import Optional, Sequence


def launcher_python(prefix: Sequence[str]) -> Optional[str]:
    """The Python a launcher runs scripts with: the one named (`python -m torch.distributed.run`), else the
    interpreter on the `#!` line of the launcher's script (a console script of that environment)."""
    if not prefix:  # a launcher behind a command cpuperf does not read: its Python is unknown
        return None
    first = prefix[0]
    path = shutil.which(first)
    if path is None:
        return None
    if tuple(prefix[1:2]) == ("-m",) or os.path.basename(first).startswith("python"):
        return path
    try:
        with open(path, "rb") as fh:
            head = fh.read(512).split(b"\n", 1)[0]
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
        return shutil.which(words[0]) if words else None
    return words[0] if words and os.path.isfile(words[0]) else None


def read_script(path: Optional[str]) -> Optional[str]:
    """The user's script text, to see how it parses its arguments (None: unreadable)."""
    if not path:
        return None
    from cpuperf.fsutil import InputRefused, read_text_capped

    try:
        return read_text_capped(path, errors="replace")
    except (OSError, InputRefused):
        return None


def program_missing(word: str, path: Optional[str]) -> bool:
    """Whether `word` names no program that can start: a path that is no executable file, or a name on no directory
    of `path` (the PATH the command runs with). exec(2) would fail with ENOENT or EACCES."""
    if "/" in word:
        return not (os.path.isfile(word) and os.access(word, os.X_OK))
    return shutil.which(word, path=path if path is not None else os.defpath) is None


def script_missing(script: str) -> bool:
    """Whether the script a command starts is not there (relative to the current directory, as the command runs)."""
    return not os.path.exists(script)
