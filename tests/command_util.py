"""The user's command read the way cpuperf reads it, in the short forms the tests ask it in: each reads the command
once (cpuperf.plan.command.read_command) and, where a script's text is given, the script once
(cpuperf.plan.script_read.read_user_script), then asks the record. Not cpuperf's code: the product reads a command
once at its edge, and these only spare the tests the two lines."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.plan.command import read_command
from cpuperf.plan.script_args import read_script_args
from cpuperf.plan.script_read import read_user_script
from cpuperf.plan.user_launcher import LauncherCommand
from cpuperf.plan.user_script import (
    Flag,
    ScriptPlan,
    UserCommand,
    _merge,
    _sets_optim,
    key_of_command,
    plan_command,
    script_kind,
    trainer_parser,
)


def parse_command(argv: Sequence[str]) -> UserCommand:
    return read_command(argv).script


def split_launcher(argv: Sequence[str]) -> Optional[LauncherCommand]:
    return read_command(argv).launcher


def command_environ(argv: Sequence[str], environ: Mapping[str, str]) -> Dict[str, str]:
    return read_command(argv).environ(environ) if argv else dict(environ)


def _script(args: Sequence[str], source: Optional[str]):
    return read_user_script(UserCommand(("python", "s.py", *args), None, None, "s.py", tuple(args)), source)


def detect_parser(source: Optional[str], script_args: Sequence[str]) -> Tuple[str, str]:
    return script_kind(_script(script_args, source))


def plan_script(user_argv: Sequence[str], ours: Sequence[Flag], mode: str, source: Optional[str],
                transformers: Optional[str] = None, skipped: Sequence[Tuple[str, str]] = ()) -> ScriptPlan:
    command = read_command(user_argv)
    return plan_command(command, ours, mode, read_user_script(command.script, source), transformers, skipped)


def merge_flags(user_args: Sequence[str], ours: Sequence[Flag], source: Optional[str] = None
                ) -> Tuple[List[Flag], List[Tuple[str, str]]]:
    read = _script(user_args, source) if source is not None else None
    args = read.args if read is not None and read.parser.kind == "hf" else read_script_args(user_args, trainer_parser())
    return _merge(args, ours, _sets_optim(read))


def command_key(argv: Sequence[str], script_text: Optional[str]) -> str:
    cmd = read_command(argv).script
    return key_of_command(cmd, read_user_script(cmd, script_text), script_text)
