"""One adapter per kind of training script, behind one small interface (`Framework`).

An adapter says how it recognises a script (its imports and calls, read from the syntax tree by
cpuperf.plan.script_source, never a substring), which parser reads its command line (so cpuperf.plan.script_args
reads the user's arguments by that parser's rules), how the dtype lever reaches it (a flag, an environment default
the framework itself reads, or not at all, said), and what it allows of ranks (whether cpuperf can split it keeping
its global batch). The first adapter in `FRAMEWORKS` that recognises a script is its framework; `plain` takes the
rest. A new framework is one module here plus its rows in compat/. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Tuple

from cpuperf.knowledge.script_parsers import ScriptParser
from cpuperf.plan.script_args import ScriptArgs
from cpuperf.plan.script_source import ScriptSource


@dataclass(frozen=True)
class Reach:
    """How one lever reaches the script: an environment default it reads, flags on its command line, or not at all
    (`why` says why; `applied` False)."""

    lever: str
    value: str
    env: Tuple[Tuple[str, str], ...] = ()
    flags: Tuple[str, ...] = ()
    why: str = ""
    applied: bool = True


class Framework(Protocol):
    """A kind of training script."""

    @property
    def name(self) -> str: ...  # hf-trainer | lightning | plain

    @property
    def title(self) -> str: ...  # in words: "a Lightning script"

    def recognises(self, source: ScriptSource) -> bool: ...

    def parser(self, source: ScriptSource) -> ScriptParser: ...

    def dtype(self, source: ScriptSource, args: ScriptArgs, dtype: str, why: str) -> Optional[Reach]:
        """How the plan's dtype (bf16, fp16: autocast; fp32: nothing to do) reaches the script, or what is said where
        it does not."""
        ...


def framework_of(source: ScriptSource) -> Framework:
    """The script's framework: the first adapter that recognises it."""
    from cpuperf.plan.frameworks.registry import FRAMEWORKS

    return next(f for f in FRAMEWORKS if f.recognises(source))
