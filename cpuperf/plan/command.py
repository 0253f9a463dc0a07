"""The user's command after `cpuperf train ... --`, read once into one typed record (`read_command`).

Everything later (the request's checks, the planner, the script's flags, the launcher's ranks, the report of
what was applied) reads the `CommandLine` made here, never the argv again: the wrappers in front (env, nice,
taskset, `bash -c 'LINE'`...), the user's launcher with its options and where its rank count comes from
(cpuperf.plan.user_launcher), the script or module and its arguments (cpuperf.plan.user_script). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

from cpuperf.plan.user_launcher import LauncherCommand, Wrapper, launcher_of, opens_session, unwrap, wrapped_environ
from cpuperf.plan.user_script import UserCommand, script_of


@dataclass(frozen=True)
class CommandLine:
    """The user's command in its parts, read once."""

    given: Tuple[str, ...]  # the argv as the user gave it
    wrappers: Tuple[Wrapper, ...]  # what is in front of the command (`env X=1`, `nice -n 5`, `bash -c 'LINE'`)
    words: Tuple[str, ...]  # the command behind the wrappers (inside a shell line: the line's words)
    hidden: str  # why a shell line is not read through, or ''
    script: UserCommand  # the script or module, its arguments, the launcher's name and its -nproc if a number
    launcher: Optional[LauncherCommand]  # the user's own launcher, its options and target; None: none
    # the command makes its own session (`setsid ...`, cpuperf.plan.user_launcher.opens_session): a launch that runs
    # it directly starts it in none of cpuperf's; `setsid --fork` is refused as the command is read (exit 2)
    own_session: bool = False

    def environ(self, environ: Mapping[str, str]) -> Dict[str, str]:
        """The environment the command runs in: `environ` through its wrappers (`env NAME=VALUE`, `env -u`...)."""
        return wrapped_environ(self.wrappers, environ)

    def launcher_with(self, words: Sequence[str]) -> Optional[LauncherCommand]:
        """The user's launcher as it starts `words` (this command behind the same wrappers, with the flags cpuperf
        added): the planned command, read with the launcher's own table."""
        return launcher_of(words, self.wrappers, self.hidden)


def read_command(argv: Sequence[str]) -> CommandLine:
    """The one reading of the user's command: its wrappers, its launcher (an option the launcher would refuse
    exits 2, as `setsid --fork` does), its script or module and their arguments."""
    wrappers, inner, hidden = unwrap(list(argv))
    launcher = launcher_of(inner, wrappers, hidden)
    return CommandLine(tuple(argv), tuple(wrappers), tuple(inner), hidden,
                       script_of(argv, wrappers, inner, hidden, launcher), launcher,
                       own_session=opens_session(wrappers))
