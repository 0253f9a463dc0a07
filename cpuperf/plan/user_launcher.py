"""A user's own launcher (`cpuperf train --auto -- torchrun --nproc-per-node 2 train.py`): how many ranks it
starts on this node, whether cpuperf may place them, and the command with a per-rank step that does.

Pure planning over the user's argv and the launcher rules in compat/launchers.toml. cpuperf places the
ranks only where it knows their count from the launcher's own arguments and nothing of the user's
already decides placement (a binding option, a host list, a config file it cannot read); otherwise it
leaves placement to the launcher and says why. Placing means: the launcher's target becomes
`python -m cpuperf.run.rankexec -- <the rank's own command>`, which pins the rank to its slot by its
local rank (cpuperf.run.rankexec) and execs exactly what the launcher would have run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from cpuperf.data import load_builtin

RANKEXEC = ("-m", "cpuperf.run.rankexec", "--")
_MODULE_LAUNCHERS = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
                     "accelerate.commands.launch": "accelerate"}
_EXEC_LAUNCHERS = {"torchrun": "torchrun", "mpirun": "mpirun", "mpiexec": "mpirun", "mpiexec.hydra": "mpirun",
                   "prterun": "mpirun", "srun": "srun"}


def rules() -> Dict[str, Any]:
    return load_builtin("launchers.toml")


def is_python(token: str) -> bool:
    return re.search(r"(^|/)python[0-9.]*$", token) is not None


@dataclass(frozen=True)
class LauncherCommand:
    """The user's launcher command in three parts: how it is invoked, its own options, what each rank runs."""

    launcher: str  # torchrun | accelerate | mpirun | srun
    prefix: Tuple[str, ...]  # ("torchrun",) | ("python", "-m", "torch.distributed.run") | ("accelerate", "launch")
    options: Tuple[str, ...]  # the launcher's own options, as given
    target: Tuple[str, ...]  # what the launcher starts per rank (its script/program and arguments)

    def option(self, names: Sequence[str]) -> Optional[str]:
        """The value of the last of `names` given (NAME VALUE or NAME=VALUE); '' for a flag."""
        found: Optional[str] = None
        opts = self.options
        for i, item in enumerate(opts):
            key, eq, value = item.partition("=")
            if key in names:
                if eq:
                    found = value
                elif key in _flags(self.launcher):
                    found = ""
                else:
                    found = opts[i + 1] if i + 1 < len(opts) else ""
        return found

    def has(self, names: Sequence[str]) -> bool:
        return self.option(names) is not None

    def spelled(self, names: Sequence[str]) -> str:
        """The option as the user wrote it: '--nproc-per-node=2' or '-np 4'."""
        for i, item in enumerate(self.options):
            key, eq, _ = item.partition("=")
            if key in names:
                return item if eq or i + 1 >= len(self.options) else f"{item} {self.options[i + 1]}"
        return ""


def _flags(launcher: str) -> Tuple[str, ...]:
    return tuple(rules().get(launcher, {}).get("flags", ()))


def split_launcher(argv: Sequence[str]) -> Optional[LauncherCommand]:
    """`torchrun ...`, `python -m torch.distributed.run ...`, `accelerate launch ...`, `mpirun ...`, `srun ...`
    -> its parts; None when the command is not one of these launchers."""
    args = list(argv)
    if not args:
        return None
    base = os.path.basename(args[0])
    if base in _EXEC_LAUNCHERS:
        launcher, start = _EXEC_LAUNCHERS[base], 1
    elif base == "accelerate" and args[1:2] == ["launch"]:
        launcher, start = "accelerate", 2
    elif is_python(args[0]):
        j = 1
        while j < len(args) and args[j].startswith("-") and args[j] != "-m":
            j += 1  # python's own options (-u, -O, -X...)
        if j + 1 < len(args) and args[j] == "-m" and args[j + 1] in _MODULE_LAUNCHERS:
            launcher, start = _MODULE_LAUNCHERS[args[j + 1]], j + 2
        else:
            return None
    else:
        return None
    rule = rules().get(launcher, {})
    flags = set(rule.get("flags", ()))
    two = set(rule.get("two_values", ()))
    i = start
    while i < len(args):
        item = args[i]
        if item == "--":  # an explicit end of the launcher's options
            return LauncherCommand(launcher, tuple(args[:start]), tuple(args[start:i]), tuple(args[i + 1:]))
        if not item.startswith("-") or item == "-":
            break
        if "=" in item or item in flags:
            i += 1
        elif item in two:
            i += 3
        else:
            i += 2  # an option and its value
    i = min(i, len(args))
    return LauncherCommand(launcher, tuple(args[:start]), tuple(args[start:i]), tuple(args[i:]))


@dataclass(frozen=True)
class LauncherRanks:
    """How many ranks the user's launcher starts here, and whether cpuperf places them."""

    launcher: str
    count: Optional[int]  # local ranks (None: cpuperf cannot tell)
    source: str  # where the count comes from, in the user's words
    place: bool  # cpuperf pins each rank and sets its threads through the per-rank step
    why: str  # why not (place False), or how (place True)

    def to_json(self) -> Dict[str, Any]:
        return {"launcher": self.launcher, "ranks": self.count, "from": self.source, "placed_by_cpuperf": self.place,
                "why": self.why}


def _int(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and text.strip().isdigit() else None


def _torchrun_count(cmd: LauncherCommand, logical_cpus: int, gpus: int) -> Tuple[Optional[int], str]:
    rule = rules()["torchrun"]
    raw = cmd.option(rule["nproc"])
    if raw is None:
        return int(rule["nproc_default"]), f"torchrun's default --nproc-per-node ({rule['nproc_default']})"
    said = cmd.spelled(rule["nproc"])
    if _int(raw) is not None:
        return _int(raw), said
    word = raw.strip().lower()
    if word == "cpu" or (word == "auto" and gpus == 0):
        return logical_cpus, f"{said}: one rank per logical CPU (os.cpu_count() = {logical_cpus})"
    if word in ("gpu", "auto") and gpus:
        return gpus, f"{said}: one rank per visible GPU ({gpus})"
    return None, said


def _accelerate_count(cmd: LauncherCommand, has_default_config: bool) -> Tuple[Optional[int], str, str]:
    """(count, source, why not placeable or '')."""
    rule = rules()["accelerate"]
    if cmd.has(rule["config"]) or has_default_config:
        return None, "accelerate's config file", "the rank count is in an accelerate config file cpuperf does not read"
    raw = cmd.option(rule["nproc"])
    if not cmd.has(rule["multi_process"]):
        if raw is not None and (_int(raw) or 1) > 1:
            return 1, f"{cmd.spelled(rule['nproc'])} without --multi_gpu", ""
        return 1, "accelerate's simple launcher (one process)", ""
    count = _int(raw)
    if count is None:
        return None, "accelerate --multi_gpu", "--multi_gpu without --num_processes: the count is accelerate's own choice"
    return count, cmd.spelled(rule["nproc"]), ""


def _mpirun_count(cmd: LauncherCommand, physical_cores: int) -> Tuple[Optional[int], str, str]:
    rule = rules()["mpirun"]
    if cmd.has(rule["hosts"]):
        return None, cmd.spelled(rule["hosts"]), "your mpirun names hosts: cpuperf places ranks only on this node"
    per_node = _int(cmd.option(rule["per_node"]))
    count = _int(cmd.option(rule["nproc"]))
    if per_node is not None:
        return per_node, cmd.spelled(rule["per_node"]), ""
    if count is not None:
        return count, cmd.spelled(rule["nproc"]), ""
    return physical_cores, f"mpirun's default (one rank per core: {physical_cores})", ""


def launcher_ranks(cmd: LauncherCommand, *, logical_cpus: int, physical_cores: int, gpus: int = 0,
                   has_default_config: bool = False, environ: Optional[Mapping[str, str]] = None,
                   interpreter: Optional[str] = None) -> LauncherRanks:
    """The ranks the user's launcher starts on this node and whether cpuperf may place them.

    interpreter: the Python the launcher runs a script with (None: unknown; then a script cannot be
    wrapped without changing which Python runs it).
    """
    environ = environ or {}
    rule = rules().get(cmd.launcher, {})
    name = cmd.launcher
    if name == "srun":
        count = _int(cmd.option(rule["nproc"]))
        return LauncherRanks(name, count, cmd.spelled(rule["nproc"]) or "srun", False,
                             rule["why_not"] + ": placement is left to the launcher")
    why = ""
    if name == "torchrun":
        count, source = _torchrun_count(cmd, logical_cpus, gpus)
        if cmd.has(rule["unsupported"]):
            why = f"{cmd.spelled(rule['unsupported'])}: the script runs inside torchrun's own interpreter"
    elif name == "accelerate":
        count, source, why = _accelerate_count(cmd, has_default_config)
        if not why and cmd.has(rule["threads"]):
            why = f"you set {cmd.spelled(rule['threads'])}"
    else:
        count, source, why = _mpirun_count(cmd, physical_cores)
        env_bound = [v for v in rule["env_binding"] if environ.get(v)]
        if not why and env_bound:
            why = f"your environment binds the ranks ({env_bound[0]})"
    binding = rule.get("binding", ())
    if not why and binding and cmd.has(binding):
        why = f"your launcher binds the ranks itself ({cmd.spelled(binding)})"
    if not why and count is None:
        why = f"the rank count ({source}) is not a number cpuperf can plan with"
    if not why and not cmd.target:
        why = "no command for the ranks was found in your launcher's arguments"
    if not why and count is not None and count > physical_cores:
        why = (f"{count} ranks on {physical_cores} usable physical core(s): they cannot each have cores of their own, "
               "so cpuperf neither pins them nor sets their threads")
    if not why and name in ("torchrun", "accelerate") and count and count > 1 and not _no_python(cmd) \
            and interpreter is None:
        why = f"the Python that {name} runs the script with could not be found"
    if why:
        return LauncherRanks(name, count, source, False, why + ": placement is left to the launcher")
    return LauncherRanks(name, count, source, True,
                         "each rank is pinned to its own cores by a per-rank step keyed on its local rank")


def _no_python(cmd: LauncherCommand) -> bool:
    return cmd.has(rules()[cmd.launcher].get("no_python", ()))


def _drop(options: Sequence[str], names: Sequence[str]) -> Tuple[str, ...]:
    return tuple(o for o in options if o.partition("=")[0] not in names)


def with_rank_step(cmd: LauncherCommand, python: str, interpreter: Optional[str]) -> Tuple[str, ...]:
    """The user's launcher command with `python -m cpuperf.run.rankexec --` in front of each rank's command.

    torchrun / accelerate: their --no-python runs our interpreter per rank, which then execs the rank's
    command as the launcher would have run it (`INTERPRETER -u script ...`, `-m module`, or the program
    itself under the user's own --no-python). mpirun: the step goes in front of the program.
    """
    step = (python, *RANKEXEC)
    if cmd.launcher == "mpirun":
        return (*cmd.prefix, *cmd.options, *step, *cmd.target)
    rule = rules()[cmd.launcher]
    module, no_python = rule["module"], rule["no_python"]
    if cmd.has(no_python):
        rank_cmd: Tuple[str, ...] = cmd.target
    elif cmd.has(module):
        rank_cmd = (interpreter or python, "-u", "-m", *cmd.target)
    else:
        rank_cmd = (interpreter or python, "-u", *cmd.target)
    options = _drop(cmd.options, (*module, *no_python))
    return (*cmd.prefix, *options, no_python[0], *step, *rank_cmd)
