"""Render a merged runtime environment as code for POSIX sh (bash, zsh, dash), fish, a dotenv file, or JSON. Pure.

The default is POSIX sh, never a guess from $SHELL: the login shell is not the shell that evaluates the
output (a bash job script run by a fish user), and `export NAME='value'` means the same in sh, bash,
zsh and dash. fish syntax only when asked for (--shell fish).

Safety: any output may be evaluated by any shell (a fish user sources the default; a bash job script
reads a dotenv file), so every format must be inert in sh, bash, zsh, dash and fish alike. A value is
written only when single quotes mean the same to all of them: no quote, no backslash (fish escapes
\\ and \' inside '...', POSIX shells do not) and no control character; any other value is refused with a
note (runtime_env.shell_safe). Names are checked against ^[A-Za-z_][A-Za-z0-9_]*$ and a reserved list;
comments are one line with no quote, backslash, $ or backquote. Output is a plain assignment of each
final value, so evaluating it twice changes nothing.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from cpuperf.decide.runtime_env import EnvVar, Invalid, Kept, shell_safe, valid_name
from cpuperf.errors import UsageError

SCHEMA = "cpuperf.ccl-env/1"
SHELLS = ("sh", "bash", "zsh", "fish", "dotenv")
DEFAULT_SHELL = "sh"
# Written bare in a dotenv file (docker's --env-file takes values literally): nothing any shell expands,
# and no leading '=' (zsh's =cmd expansion) or '~'.
_DOTENV_SAFE = re.compile(r"^[A-Za-z0-9_./:,@+-][A-Za-z0-9_./:,@+=-]*$")
_COMMENT_UNSAFE = str.maketrans({"'": "?", '"': "?", "\\": "?", "$": "?", "`": "?"})


def check_shell(name: str) -> str:
    if name not in SHELLS:
        raise UsageError(f"unknown shell {name!r}", hint="use --shell sh (default; bash, zsh, dash), bash, zsh, fish or dotenv (or --json)")
    return name


def _refuse_unsafe(value: str) -> None:
    why = shell_safe(value)
    if why is not None:
        raise UsageError(f"value {one_line(repr(value), 80)} cannot be written for every shell: {why}")


def quote_posix(value: str) -> str:
    """sh/bash/zsh/dash (and fish reading the same text): '...' around a shell-safe value."""
    _refuse_unsafe(value)
    return "'" + value + "'"


def quote_fish(value: str) -> str:
    """fish (and POSIX shells reading the same text): '...' around a shell-safe value."""
    _refuse_unsafe(value)
    return "'" + value + "'"


def quote_dotenv(value: str) -> str:
    """Bare when nothing in it is special to anyone; else single quotes around a shell-safe value."""
    _refuse_unsafe(value)
    if value and _DOTENV_SAFE.match(value):
        return value
    return "'" + value + "'"


def one_line(text: str, limit: int = 300) -> str:
    """A comment's text: printable characters only, never a newline that could end the comment."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in text)
    return clean if len(clean) <= limit else clean[:limit - 3] + "..."


def comment(text: str, limit: int = 300) -> str:
    """A comment line's text: one line, and nothing a shell that did not treat '#' as a comment would expand."""
    return one_line(text, limit).translate(_COMMENT_UNSAFE)


def printable_value(value: str) -> bool:
    """Values that can be written for every shell (see runtime_env.shell_safe)."""
    return shell_safe(value) is None


class CclEnv(NamedTuple):
    """Everything `cpuperf ccl-env` decided; rendered by render() or to_json()."""

    backend: str
    backend_reason: str
    final: Dict[str, str]
    vars: Tuple[EnvVar, ...]
    kept: Tuple[Kept, ...]
    sources: Tuple[Dict[str, Any], ...]
    notes: Tuple[str, ...]
    skipped: Tuple[str, ...] = ()
    placement: Optional[Dict[str, Any]] = None
    header: str = ""
    extra: Optional[Dict[str, Any]] = None
    invalid: Tuple[Invalid, ...] = ()
    levers: Optional[Dict[str, Any]] = None  # each lever applied by this environment or not (cpuperf.plan.applied)
    decisions: Tuple[Dict[str, Any], ...] = ()  # the plan's decisions as JSON, which that report reads
    allocator_missing: str = ""  # --preload: the decided allocator's library is not found here (that report says so)

    def provenance(self, name: str) -> List[EnvVar]:
        return [v for v in self.vars if v.name == name]


def _comment_for(env: CclEnv, name: str) -> str:
    kept = next((k for k in env.kept if k.name == name), None)
    if kept is not None:
        return f"{name}: kept, already set (cpuperf would set {kept.wanted}; --override replaces it)"
    parts = []
    for var in env.provenance(name):
        parts.append(var.source if var.source != "cpuperf" else f"cpuperf: {var.reason}")
    return f"{name}: " + "; ".join(dict.fromkeys(parts))


def checked_name(name: str) -> str:
    """A variable name every shell reads as one plain word and none owns (matched whole: a final newline fails)."""
    if not valid_name(name):
        raise UsageError(f"variable name {one_line(repr(name), 80)} cannot be written: not a plain name, or a shell owns it")
    return name


def line_posix(name: str, value: str) -> str:
    """sh, bash, zsh, dash: `export NAME='value'`."""
    return f"export {checked_name(name)}={quote_posix(value)}"


def line_fish(name: str, value: str) -> str:
    """fish: `set -gx NAME 'value'`."""
    return f"set -gx {checked_name(name)} {quote_fish(value)}"


def line_dotenv(name: str, value: str) -> str:
    """docker --env-file, systemd EnvironmentFile, `set -a; . FILE`: `NAME=value`."""
    return f"{checked_name(name)}={quote_dotenv(value)}"


# One renderer per shell; each checks the name and quotes the value itself, whatever its caller checked.
RENDERERS = {"sh": line_posix, "bash": line_posix, "zsh": line_posix, "fish": line_fish, "dotenv": line_dotenv}


def render(env: CclEnv, shell: str) -> str:
    """Code for `eval` (sh, bash, zsh, dash), `| source` (fish) or a dotenv file: comments + plain assignments."""
    check_shell(shell)
    line = RENDERERS[shell]
    lines = [f"# {comment(env.header)}"] if env.header else []
    for name, value in env.final.items():
        if not valid_name(name) or not printable_value(value):
            continue  # refused earlier with a note; never written
        lines.append(f"# {comment(_comment_for(env, name))}")
        lines.append(line(name, value))
    return "\n".join(lines) + "\n"


def to_json(env: CclEnv) -> Dict[str, Any]:
    """The `--json` object (schema cpuperf.ccl-env/1)."""
    obj: Dict[str, Any] = {
        "schema": SCHEMA,
        "env": {n: v for n, v in env.final.items() if valid_name(n) and printable_value(v)},
        "kept": [k.to_json() for k in env.kept],
        "sources": list(env.sources),
        "backend": env.backend,
        "backend_reason": env.backend_reason,
        "notes": list(env.notes),
        "vars": [v.to_json() for v in env.vars],
        "skipped": list(env.skipped),
        "invalid": [i.to_json() for i in env.invalid],
        "placement": env.placement,
    }
    obj.update(env.extra or {})
    if env.levers is not None:
        obj["levers"] = env.levers
    return obj


def explain_rows(env: CclEnv) -> List[Tuple[str, str, str, str]]:
    """(variable, value, source, reason) rows for --explain."""
    rows = []
    for name, value in env.final.items():
        kept = next((k for k in env.kept if k.name == name), None)
        provs = env.provenance(name)
        source = "you (kept)" if kept else ", ".join(dict.fromkeys(v.source for v in provs))
        reason = (f"already set; cpuperf would set {kept.wanted} (--override)" if kept
                  else "; ".join(dict.fromkeys(v.reason for v in provs)))
        rows.append((name, one_line(value, 400), one_line(source), one_line(reason, 400)))
    return rows
