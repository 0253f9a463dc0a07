"""The user's script read once at the edge's hand: its source (cpuperf.plan.script_source), the framework it is
written for (cpuperf.plan.frameworks) and its arguments read by that framework's parser
(cpuperf.plan.script_args). Everything downstream asks this record; nothing reads the script's words again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

from cpuperf.knowledge.script_parsers import ScriptParser
from cpuperf.plan.frameworks import Framework, framework_of
from cpuperf.plan.script_args import ScriptArgs, read_script_args
from cpuperf.plan.script_source import NO_SOURCE, ScriptSource, read_source

if TYPE_CHECKING:
    from cpuperf.plan.user_script import UserCommand

_ARGS_FILES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class ScriptRead:
    source: ScriptSource
    framework: Framework
    args: ScriptArgs

    @property
    def parser(self) -> ScriptParser:
        return self.args.parser

    def named(self) -> Dict[str, str]:
        """The values the script's parser reads (option -> value), or the arguments file it reads them from
        (cpuperf.probe.hf.script_model reads the model and batch from these)."""
        from cpuperf.probe.hf import ARGS_FILE

        if self.parser.kind == "args-file":
            return {ARGS_FILE: self.args.args[0]}
        return self.args.values()


def read_user_script(command: UserCommand, text: Optional[str]) -> ScriptRead:
    """The script of the user's command (`text`: its source, None where it was not read) and its arguments, each
    read once. A value the script's own parser would refuse exits 2 here (ScriptArgError), before anything runs."""
    source = read_source(text) if (command.script or command.module) and not command.hidden else NO_SOURCE
    framework = framework_of(source)
    args = command.script_args
    if len(args) == 1 and args[0].endswith(_ARGS_FILES):
        parser = ScriptParser("args-file", why=f"the script reads its arguments from {args[0]}")
    elif not source.read:
        parser = ScriptParser("unknown", why=source.why)
    else:
        parser = framework.parser(source)
    return ScriptRead(source, framework, read_script_args(args, parser))
