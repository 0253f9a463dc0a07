"""A user's own launcher (`cpuperf train --auto -- torchrun --nproc-per-node 2 train.py`): how many ranks it
starts on this node, whether cpuperf may place them, and the command with a per-rank step that does.

Pure planning over the user's argv and the launcher rules in compat/launchers.toml. The line is read as the
launcher reads it: its own argument table says which options take a value, so the program it starts is found
where the launcher finds it; the rank count is parsed as the launcher parses it and refused (exit 2) where the
launcher would start none, refuse it, or start more than this host can hold without oversubscribing. Commands
in front of the launcher (env, taskset, numactl, nice, chrt) are read too: the launcher behind them is found,
and where they place the process they place every rank. cpuperf places the ranks only where it knows their
count and nothing of the user's already decides placement; otherwise it leaves placement to the launcher and
says why. Placing means: the launcher's target becomes `python -m cpuperf.run.rankexec -- <the rank's own
command>`, which pins the rank to its slot by its local rank and execs exactly what the launcher would have run.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from cpuperf.data import load_builtin
from cpuperf.errors import FieldError, UsageError, verbatim
from cpuperf.jsonable import NOT_IN_JSON, as_json, json_key
from cpuperf.knowledge.variables import variables

RANKEXEC = ("-m", "cpuperf.run.rankexec", "--")
MODULE_LAUNCHERS = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
                     "accelerate.commands.launch": "accelerate"}
EXEC_LAUNCHERS = {"torchrun": "torchrun", "mpirun": "mpirun", "mpiexec": "mpirun", "mpiexec.hydra": "mpirun",
                  "prterun": "mpirun", "orterun": "mpirun", "srun": "srun", "deepspeed": "deepspeed"}
# Launchers whose options are an argparse parser: an option not in its table is refused, as the launcher would.
_ARGPARSE = ("torchrun", "accelerate", "deepspeed")
PYTHON_VALUED = {"-X", "-W", "--check-hash-based-pycs"}  # python's own options that take a value
_NAME_VALUE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def rules() -> Dict[str, Any]:
    return load_builtin("launchers.toml")


def is_python(token: str) -> bool:
    return re.search(r"(^|/)python[0-9.]*$", token) is not None


@dataclass(frozen=True)
class Wrapper:
    """A command in front of the launcher (`taskset -c 1`, `env X=1`, `numactl -C 0-3`, `nice -n 5`, `timeout 600`,
    `bash -c 'LINE'`, and inside a shell line `exec` and NAME=VALUE assignments)."""

    name: str
    argv: Tuple[str, ...]  # its words before the command (a shell: up to and with -c)
    env: Tuple[Tuple[str, str], ...] = ()  # env NAME=VALUE assignments, in order
    places: bool = False  # it decides which CPUs the launcher (and so every rank) runs on
    cpus: Optional[Tuple[int, ...]] = None  # taskset's CPU set, where it gives one
    shell: bool = False  # the command behind it is one word: the shell line (`bash -c LINE`)
    tail: Tuple[str, ...] = ()  # a shell's words after LINE ($0 and the positional parameters)

    @property
    def spelled(self) -> str:
        return " ".join(self.argv) + (" '...'" if self.shell else "")

    def around(self, command: Sequence[str]) -> Tuple[str, ...]:
        """This wrapper in front of `command` again (a shell: the command joined back into its one line)."""
        if self.shell:
            return (*self.argv, shlex.join(command), *self.tail)
        return (*self.argv, *command)

    @property
    def clears(self) -> bool:
        """`env -i`: the command behind it starts from an empty environment."""
        return self.name == "env" and bool(set(self.argv[1:]) & set(_ENV_CLEARS))

    def environ(self, environ: Mapping[str, str]) -> Dict[str, str]:
        """`environ` as the command behind this wrapper sees it: env(1)'s -i and -u act before its assignments
        (GNU coreutils env.c)."""
        env = {} if self.clears else dict(environ)
        words = self.argv[1:] if self.name == "env" else ()
        for i, word in enumerate(words):
            if word in ("-u", "--unset") and i + 1 < len(words):
                env.pop(words[i + 1], None)
            elif word.startswith("--unset="):
                env.pop(word.partition("=")[2], None)
            elif word.startswith("-u") and len(word) > 2:
                env.pop(word[2:], None)
        env.update(self.env)
        return env


_ENV_CLEARS = ("-i", "--ignore-environment", "-")  # env(1)'s spellings of an empty start


@dataclass(frozen=True)
class LauncherCommand:
    """The user's launcher command in parts: wrappers, how it is invoked, its own options, what each rank runs."""

    launcher: str  # torchrun | accelerate | mpirun | srun
    prefix: Tuple[str, ...]  # ("torchrun",) | ("python", "-m", "torch.distributed.run") | ("accelerate", "launch")
    options: Tuple[str, ...]  # the launcher's own options, as given
    target: Tuple[str, ...]  # what the launcher starts per rank (its script/program and arguments)
    parsed: Tuple[Tuple[str, Optional[str], Tuple[str, ...]], ...] = ()  # (canonical name, value or None, its words)
    wrappers: Tuple[Wrapper, ...] = ()
    unknown: Tuple[str, ...] = ()  # options the launcher's table lacks (mpirun, srun: their versions differ)
    hidden: str = ""  # why the launcher cannot be read (a shell line cpuperf does not read through), or ''

    def option(self, names: Sequence[str]) -> Optional[str]:
        """The value of the last of `names` given (NAME VALUE or NAME=VALUE); '' for a flag; None: not given."""
        keys = {_key(self.launcher, n) for n in names}
        found: Optional[str] = None
        for name, value, _ in self.parsed:
            if name in keys:
                found = "" if value is None else value
        return found

    def has(self, names: Sequence[str]) -> bool:
        return self.option(names) is not None

    def spelled(self, names: Sequence[str]) -> str:
        """The option as the user wrote it: '--nproc-per-node=2' or '-np 4' (the last one given)."""
        keys = {_key(self.launcher, n) for n in names}
        said = ""
        for name, _, words in self.parsed:
            if name in keys and words:
                said = " ".join(words)
        return said

    def line_env(self, environ: Mapping[str, str]) -> List[Tuple[str, Optional[str], str]]:
        """(name, value, as written) of each variable the launcher line sets for its ranks: Open MPI `-x NAME=V`,
        hydra `-genv NAME V` / `-env NAME=V`, srun `--export=NAME=V,...`; a name forwarded without a value
        (`-x NAME`, `-genvlist A,B`, `--export=NAME`) carries this environment's value, or None."""
        rule = rules().get(self.launcher, {})
        setting = {_key(self.launcher, n) for n in rule.get("env_set", ())}
        forwarding = {_key(self.launcher, n) for n in rule.get("env_forward", ())}
        found: List[Tuple[str, Optional[str], str]] = []
        for name, value, words in self.parsed:
            said = " ".join(words)
            if name in setting and value is not None:
                given = list(words[1:]) if len(words) > 1 else [value]  # NAME=V, NAME (forwarded) or NAME V
                key, eq, val = (given[0], "=", given[1]) if len(given) == 2 else given[0].partition("=")
                found.append((key, val if eq else environ.get(key), said))
            elif name in forwarding and value:
                found.extend((key, environ.get(key), said) for key in value.split(",") if key)
            elif name in setting or name in forwarding:
                continue
            elif self.launcher == "srun" and name == "--export" and value:
                for item in value.split(","):
                    key, eq, val = item.partition("=")
                    if key not in ("ALL", "NONE", "NIL", ""):
                        found.append((key, val if eq else environ.get(key), said))
        return found

    def rebuilt(self, options: Sequence[str], target: Sequence[str]) -> Tuple[str, ...]:
        """The user's command with these launcher options and this target, behind the same wrappers."""
        command: Tuple[str, ...] = (*self.prefix, *options, *target)
        for wrapper in reversed(self.wrappers):
            command = wrapper.around(command)
        return command

    @property
    def wrapper_env(self) -> Dict[str, str]:
        return {k: v for w in self.wrappers for k, v in w.env}


def _key(launcher: str, name: str) -> str:
    """Open MPI and hydra take a long option with one dash or two: their names are compared without dashes."""
    return name.lstrip("-") if launcher == "mpirun" else name


class _Table:
    """One launcher's argument table (compat/launchers.toml), keyed as the launcher compares names."""

    def __init__(self, launcher: str, rule: Mapping[str, Any]) -> None:
        self.launcher = launcher

        def key(name: str) -> str:
            return _key(launcher, name)

        self.flags = {key(n) for n in (*rule.get("flags", ()), *rule.get("optional", ()))}
        self.valued = {key(n) for n in rule.get("valued", ())}
        self.families = tuple(rule.get("valued_families", ()))
        self.two = {key(n) for n in rule.get("two_values", ())}
        self.env_pair = {key(n) for n in rule.get("env_pair", ())}
        self.abbrev = bool(rule.get("abbrev", launcher == "srun"))  # getopt_long takes unique prefixes too

    def known(self) -> List[str]:
        return sorted(self.flags | self.valued | self.two | self.env_pair)

    def arity(self, name: str) -> Optional[int]:
        """0, 1, 2 (two values), -1 (hydra's NAME=VALUE or NAME VALUE) or None (not in the table)."""
        if name in self.flags:
            return 0
        if name in self.valued or (self.families and name.startswith(self.families)):
            return 1
        if name in self.two:
            return 2
        if name in self.env_pair:
            return -1
        return None

    def resolve(self, name: str) -> Optional[str]:
        """The option `name` stands for: itself, or (argparse, getopt_long) the one long option it uniquely begins."""
        if self.arity(name) is not None:
            return name
        if not self.abbrev or not name.startswith("--"):
            return None
        matches = [n for n in self.known() if n.startswith(name)]
        if len(matches) > 1:
            raise UsageError(f"{self.launcher} {name}: ambiguous, it could be " + ", ".join(matches[:4]),
                             hint="write the option in full, as your launcher would also ask")
        return matches[0] if matches else None


def _launcher_at(args: Sequence[str], i: int) -> Optional[Tuple[str, int]]:
    """(launcher, index of its first option) when args[i:] starts a launcher."""
    base = os.path.basename(args[i])
    if base in EXEC_LAUNCHERS:
        return EXEC_LAUNCHERS[base], i + 1
    if base == "accelerate" and list(args[i + 1:i + 2]) == ["launch"]:
        return "accelerate", i + 2
    if not is_python(args[i]):
        return None
    j = i + 1
    while j < len(args) and args[j].startswith("-") and not args[j].startswith("-m"):
        j += 2 if args[j] in PYTHON_VALUED else 1
    if j < len(args) and args[j].startswith("-m"):
        module, start = (args[j][2:], j + 1) if len(args[j]) > 2 else ((args[j + 1] if j + 1 < len(args) else ""), j + 2)
        if module in MODULE_LAUNCHERS:
            return MODULE_LAUNCHERS[module], start
    return None


def launcher_of(args: Sequence[str], wrappers: Sequence[Wrapper], hidden: str) -> Optional[LauncherCommand]:
    """The launcher part of a command already unwrapped (`unwrap`): its words behind `wrappers`, and why a shell
    line is not read through ('' where it is)."""
    found = _launcher_at(args, 0) if args and not hidden else None
    if found is None:
        named, hidden = _named_launcher(args, wrappers, hidden)
        if named is None:
            return None
        return LauncherCommand(named, (), (), tuple(args), (), tuple(wrappers), (), hidden)
    launcher, start = found
    table = _Table(launcher, rules().get(launcher, {}))
    parsed, unknown, end, rest = _read_options(table, args, start)
    return LauncherCommand(launcher, tuple(args[:start]), tuple(args[start:end]), tuple(args[rest:]), tuple(parsed),
                           tuple(wrappers), tuple(unknown))


def _named_launcher(words: Sequence[str], wrappers: Sequence[Wrapper], hidden: str
                    ) -> Tuple[Optional[str], str]:
    """(the launcher a command names where cpuperf cannot read it, why) or (None, '') when it names none.
    A Python program is one process whatever its arguments say (`python t.py --launcher torchrun`)."""
    if not words or (not hidden and is_python(words[0])):
        return None, ""
    if any(" " in w or "\t" in w for w in words):  # a command line as one word (`sudo sh -c 'LINE'`): its words too
        words = [part for w in words for part in (_words_anyway(w) if " " in w or "\t" in w else [w]) if part]
    for i, word in enumerate(words):
        base = os.path.basename(word)
        name = EXEC_LAUNCHERS.get(base) or ("accelerate" if base == "accelerate" and
                                             list(words[i + 1:i + 2]) == ["launch"] else None)
        if name is None and word in MODULE_LAUNCHERS and i > 0 and words[i - 1] == "-m":
            name = MODULE_LAUNCHERS[word]
        if name is not None:
            shown = _shown(words[0])
            return name, hidden or f"`{shown}` runs {base}, and cpuperf does not know how {shown} reads its arguments"
        if word.endswith(".py"):
            break  # a script's own arguments from here on
    return None, ""


def _shown(word: str) -> str:
    return word if len(word) <= 40 else word[:37] + "..."


def _read_options(table: _Table, args: Sequence[str], start: int
                  ) -> Tuple[List[Tuple[str, Optional[str], Tuple[str, ...]]], List[str], int, int]:
    """(parsed options, unknown ones, end of the options, start of the target)."""
    parsed: List[Tuple[str, Optional[str], Tuple[str, ...]]] = []
    unknown: List[str] = []
    i = start
    while i < len(args):
        item = args[i]
        if item == "--":  # an explicit end of the launcher's options
            return parsed, unknown, i, i + 1
        if not item.startswith("-") or item == "-":
            break
        step = _one_option(table, args, i, parsed, unknown)
        i += step
    i = min(i, len(args))
    return parsed, unknown, i, i


def _one_option(table: _Table, args: Sequence[str], i: int, parsed: List[Tuple[str, Optional[str], Tuple[str, ...]]],
                unknown: List[str]) -> int:
    """Reads the option at args[i] into `parsed`; returns how many words it took."""
    item = args[i]
    launcher = table.launcher
    name, eq, attached = _key(launcher, item).partition("=")
    if not eq and (launcher == "srun" or launcher in _ARGPARSE) and not item.startswith("--") and len(item) > 2:
        name, attached, eq = item[:2], item[2:], "="  # -n4, -r3: a short option with its value attached
        if table.arity(name) == 0 and launcher == "srun":
            for n, letter in enumerate(item[1:]):  # -lv: short flags together
                parsed.append((f"-{letter}", None, (item,) if n == 0 else ()))
            return 1
    resolved = table.resolve(name)
    if resolved is None:
        if launcher in _ARGPARSE:
            raise UsageError(f"{launcher} has no option {item.partition('=')[0]} (its parser refuses it)",
                             hint=f"`{launcher} --help` lists its options; your script's own go after the script")
        unknown.append(item)
        takes = 0 if eq or i + 1 >= len(args) or args[i + 1].startswith("-") else 1
        parsed.append((name, attached if eq else (args[i + 1] if takes else None), tuple(args[i:i + 1 + takes])))
        return 1 + takes
    arity = table.arity(resolved) or 0  # resolve() returns only names the table has
    if eq or arity == 0:
        if eq and arity == 0 and launcher in _ARGPARSE:
            raise UsageError(f"{launcher} {item}: {resolved} takes no value")
        parsed.append((resolved, attached if eq else None, (item,)))
        return 1
    if arity == -1:  # hydra -genv NAME=VALUE | NAME VALUE
        arity = 1 if i + 1 < len(args) and "=" in args[i + 1] else 2
    words = list(args[i + 1:i + 1 + arity])
    if len(words) < arity:
        raise UsageError(f"{launcher} {item}: the option needs {arity} value(s) and your command ends there")
    if launcher in _ARGPARSE and words[0].startswith("-") and not _negative_number(words[0]):
        raise UsageError(f"{launcher} {item}: expected one argument (argparse reads {words[0]} as an option)")
    parsed.append((resolved, " ".join(words), tuple(args[i:i + 1 + arity])))
    return 1 + arity


def _negative_number(word: str) -> bool:
    return re.fullmatch(r"-\d+$|-\d*\.\d+", word) is not None  # argparse's _negative_number_matcher


def opens_session(wrappers: Sequence[Wrapper]) -> bool:
    """The command, by its wrappers, makes its own session (`setsid torchrun ...`, behind `env`, `nice`...): the
    launcher does not start it in one. setsid(1) in a process group's leader forks and its parent exits at once: the run would end as
    it began, and the job it left behind would be ended with it. Not a leader, it calls setsid() and execs: the
    same process. `setsid --fork` forks anyway: a usage error, in --dry-run as at the launch."""
    from itertools import takewhile

    setsids = [w for w in takewhile(lambda w: not w.shell, wrappers) if w.name == "setsid"]  # in front of any shell line
    if any(o in ("-f", "--fork") for w in setsids for o in w.argv[1:]):
        raise UsageError("`setsid --fork` detaches your command from cpuperf: the run would end as it starts, and "
                         "what it started be ended with it", hint="drop --fork: cpuperf runs the command in a session "
                         "of its own already")
    return bool(setsids)


def wrapped_environ(wrappers: Sequence[Wrapper], environ: Mapping[str, str]) -> Dict[str, str]:
    """`environ` through the wrappers in front of the user's command, in order (`env NAME=VALUE`, `env -u NAME`, a
    shell line's own assignments): `env CUDA_VISIBLE_DEVICES=0 python x.py` sees one GPU, however many this process
    sees, and the ranks cpuperf plans for it must too."""
    env = dict(environ)
    for w in wrappers:
        _check_wrapper_threads(w)
        env = w.environ(env)
    return env


def _check_wrapper_threads(wrapper: Wrapper) -> None:
    """`env OMP_NUM_THREADS=abc` in front of a command: the command gets that value whatever cpuperf sets (the
    wrapper runs inside cpuperf's environment), so a count no OpenMP reads exits 2, as on a launcher's line
    (`mpirun -x OMP_NUM_THREADS=abc`) and in a saved plan."""
    from cpuperf.decide.runtime_env import user_value_problem

    for name, value in wrapper.env:
        problem = user_value_problem(name, value) if name == "OMP_NUM_THREADS" else None
        if problem:
            raise UsageError(f"`{_shown(wrapper.spelled)}`: OMP_NUM_THREADS={value[:40]!r}: {problem}",
                             hint="give a positive whole number of threads, e.g. env OMP_NUM_THREADS=4")


# -- wrappers in front of the launcher -----------------------------------------------------------------

def unwrap(args: List[str]) -> Tuple[List[Wrapper], List[str], str]:
    """(the wrappers in front, the words of the command behind them, why a shell line is not read through or '').
    A shell's `-c LINE` that is one simple command is read through: its words are the command behind."""
    found: List[Wrapper] = []
    table = rules().get("wrappers", {})
    shells = rules().get("shells", {})
    in_shell = False
    while args:
        name = os.path.basename(args[0])
        if name in shells.get("names", ()):
            line = _shell_line(args, shells)
            if line is None:
                break  # `bash script.sh`: a program like any other
            argv, text, tail = line
            words = _simple_command(text, shells)
            if words is None:
                return found, _words_anyway(text), (f"`{' '.join(argv)}` runs a shell line that cpuperf does not read "
                                                     "through (it chains commands or expands something)")
            found.append(Wrapper(name, argv, shell=True, tail=tail))
            args, in_shell = words, True
            continue
        if in_shell and (name == "exec" or _NAME_VALUE.match(args[0])):
            taken = 1 if name == "exec" else next((k for k, w in enumerate(args) if not _NAME_VALUE.match(w)), len(args))
            if taken >= len(args):
                break
            env = () if name == "exec" else tuple((w.partition("=")[0], w.partition("=")[2]) for w in args[:taken])
            found.append(Wrapper(name if name == "exec" else "assignments", tuple(args[:taken]), env))
            args = args[taken:]
            continue
        if name not in table:
            break
        end, env2, places, cpus = _read_wrapper(name, table[name], args, 1)
        if end is None:
            break
        found.append(Wrapper(name, tuple(args[:end]), tuple(env2), places, cpus))
        args = args[end:]
    return found, args, ""


def _shell_line(args: Sequence[str], rule: Mapping[str, Any]) -> Optional[Tuple[Tuple[str, ...], str, Tuple[str, ...]]]:
    """(the shell's words up to and with -c, the line, the words after it) for `SHELL [OPTIONS] -c LINE [...]`."""
    valued = set(rule.get("valued", ()))
    i = 1
    while i < len(args) and args[i][:1] in "-+" and args[i] not in ("-", "--"):
        word = args[i]
        if word in valued:
            i += 2
            continue
        i += 1
        if not word.startswith("--") and "c" in word[1:]:  # -c, -lc, -ec: the next word is the line
            return (tuple(args[:i]), args[i], tuple(args[i + 1:])) if i < len(args) else None
    return None


def _simple_command(text: str, rule: Mapping[str, Any]) -> Optional[List[str]]:
    """The words of a shell line that is one simple command, as the shell splits them; None for anything the
    shell would expand, chain or redirect (read conservatively: such a character even in quotes)."""
    if any(c in text for c in str(rule.get("expands", ""))):
        return None
    try:
        words = shlex.split(text)
    except ValueError:  # an unclosed quote: the shell refuses the line
        return None
    return words or None


def _words_anyway(text: str) -> List[str]:
    """The words of a shell line cpuperf does not read through, only to see whether it names a launcher."""
    return re.split(r"[\s;&|()<>`'\"]+", text)


def _read_wrapper(name: str, rule: Mapping[str, Any], args: Sequence[str], i: int
                  ) -> Tuple[Optional[int], List[Tuple[str, str]], bool, Optional[Tuple[int, ...]]]:
    """(index of the wrapped command or None, env assignments, places the CPUs, its CPU set)."""
    flags, valued = set(rule.get("flags", ())), set(rule.get("valued", ()))
    places = bool(rule.get("places"))
    given: Dict[str, str] = {}
    patterns: Mapping[str, str] = rule.get("patterns", {})
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        key, eq, value = args[i].partition("=")
        if key in valued and not eq and i + 1 < len(args):
            given[key] = args[i + 1]
            i += 2
            continue
        if key in valued or key in flags or (name == "nice" and re.fullmatch(r"-\d+", key)):
            given[key] = value
            i += 1
            continue
        if not key.startswith("--") and key[:2] in valued:  # -oL, -k5, -n10: a short option with its value attached
            given[key[:2]] = args[i][2:]
            i += 1
            continue
        return None, [], False, None  # -p PID (no command), or an option this table lacks: not read as a wrapper
    i += 1 if i < len(args) and args[i] == "--" else 0
    if any(k in patterns and not re.fullmatch(patterns[k], v) for k, v in given.items()):
        return None, [], False, None  # `nice -n mpirun ...`: nice would refuse it, so this is no nice line
    places = places or any(k in given for k in rule.get("places_with", ()))
    positional: List[str] = list(args[i:i + int(rule.get("positional", 0))])
    if positional and rule.get("positional_pattern") and not re.fullmatch(rule["positional_pattern"], positional[0]):
        return None, [], False, None  # `timeout mpirun ...`: no duration, timeout refuses the line
    i += len(positional)
    env: List[Tuple[str, str]] = []
    while rule.get("assignments") and i < len(args) and _NAME_VALUE.match(args[i]):
        k, _, v = args[i].partition("=")
        env.append((k, v))
        i += 1
    cpus = _taskset_cpus(positional[0], "-c" in given or "--cpu-list" in given) if name == "taskset" and positional \
        else None
    return (i if i < len(args) else None), env, places, cpus


def _taskset_cpus(spec: str, is_list: bool) -> Optional[Tuple[int, ...]]:
    """taskset's mask (hex) or CPU list (0-3,5) as CPUs; None where it cannot be read."""
    try:
        if not is_list:
            mask = int(spec, 16)
            return tuple(c for c in range(mask.bit_length()) if mask >> c & 1)
        cpus: List[int] = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        return tuple(sorted(set(cpus)))
    except ValueError:
        return None


# -- the rank count ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LauncherRanks:
    """How many ranks the user's launcher starts here, and whether cpuperf places them."""

    launcher: str
    count: Optional[int] = field(metadata=json_key("ranks"))  # local ranks (None: cpuperf cannot tell)
    source: str = field(metadata=json_key("from"))  # where the count comes from, in the user's words
    # cpuperf pins each rank and sets its threads through the per-rank step
    place: bool = field(metadata=json_key("placed_by_cpuperf"))
    why: str  # why not (place False), or how (place True)
    oversubscribed: bool = False  # the launcher may start more ranks than cores (--oversubscribe, or hosts)
    notes: Tuple[str, ...] = field(default=())  # what cpuperf read from wrappers and the user's variables
    # How the step runs each rank, not part of the plan's JSON: the user's own OMP_NUM_THREADS, which every rank
    # keeps; whether the per-rank step goes in front of every rank (placed or not: it ties the rank to cpuperf).
    user_threads: Optional[str] = field(default=None, metadata=NOT_IN_JSON)
    step: bool = field(default=False, metadata=NOT_IN_JSON)
    # The nodes the launcher's job spans (torchrun --nnodes, accelerate --num_machines; the most of a MIN:MAX
    # range): with several, the job has a process group however many ranks start here.
    nodes: int = field(default=1, metadata=NOT_IN_JSON)

    def to_json(self) -> Dict[str, Any]:
        return as_json(self)


def _python_int(text: str) -> Optional[int]:
    """int(text) as Python reads it (torchrun and accelerate do): None where int() raises."""
    try:
        return int(text)
    except ValueError:
        return None


def _plain_int(text: str) -> Optional[int]:
    """A count in ASCII digits (mpirun, srun): anything else is refused rather than read as atoi would."""
    return int(text) if re.fullmatch(r"\s*[0-9]+\s*", text) else None


def _refuse_count(said: str, meaning: str, hint: str = "give a whole number of ranks, at least 1") -> UsageError:
    return UsageError(f"{said}: {meaning}", hint=hint)


def _torchrun_count(cmd: LauncherCommand, cpus: int, gpus: int, environ: Mapping[str, str]) -> Tuple[int, str]:
    rule = rules()["torchrun"]
    raw = cmd.option(rule["nproc"])
    said = cmd.spelled(rule["nproc"])
    if raw is None and environ.get(rule["nproc_env"]):
        raw, said = environ[rule["nproc_env"]], f"{rule['nproc_env']}={environ[rule['nproc_env']]}"
    if raw is None:
        return int(rule["nproc_default"]), f"torchrun's default --nproc-per-node ({rule['nproc_default']})"
    count = _python_int(raw)
    if count is not None:
        if count < 1:
            raise _refuse_count(f"torchrun {said}" if not said.startswith(rule["nproc_env"]) else said,
                                f"torchrun starts that many worker processes on this node; {count} starts none")
        return count, said
    word = raw.strip().lower()
    if word == "cpu" or (word == "auto" and gpus == 0):
        return cpus, f"{said}: one rank per CPU torchrun may run on (torch._utils.cpu_count() = {cpus})"
    if word in ("gpu", "auto", "xpu") and gpus:
        return gpus, f"{said}: one rank per visible GPU ({gpus})"
    if word in ("gpu", "xpu"):
        raise _refuse_count(f"torchrun {said}", f"one rank per {word.upper()}, and this host has none (torchrun "
                            "stops: not available)", hint="give a number of ranks")
    raise _refuse_count(f"torchrun {said}", f"torchrun reads it with int() and refuses {raw!r} "
                        "(Unsupported nproc_per_node value)", hint="a whole number of ranks, or cpu / gpu / auto")


def _accelerate_count(cmd: LauncherCommand, has_default_config: bool) -> Tuple[Optional[int], str, str]:
    """(count, source, why not placeable or '')."""
    rule = rules()["accelerate"]
    raw = cmd.option(rule["nproc"])
    said = cmd.spelled(rule["nproc"])
    if raw is not None:
        count = _python_int(raw)
        if count is None:
            raise _refuse_count(f"accelerate launch {said}", f"--num_processes is an int; accelerate's parser "
                                f"refuses {raw!r}")
        if count < 1:
            raise _refuse_count(f"accelerate launch {said}", f"the number of processes to start; {count} starts none")
    if cmd.has(rule["config"]) or has_default_config:
        return None, "accelerate's config file", "the rank count is in an accelerate config file cpuperf does not read"
    if not cmd.has(rule["multi_process"]):
        if raw is not None and (_python_int(raw) or 1) > 1:
            return 1, f"{said} without --multi_gpu", ""
        return 1, "accelerate's simple launcher (one process)", ""
    if raw is None:
        return None, "accelerate --multi_gpu", "--multi_gpu without --num_processes: the count is accelerate's own choice"
    total, machines = _python_int(raw) or 1, _nodes(cmd)
    if machines > 1:  # --num_processes is the whole job's: each machine starts its share (prepare_multi_gpu_env)
        return max(1, total // machines), f"{said} over {cmd.spelled(rule['machines'])}", ""
    return total, said, ""


def _mpirun_count(cmd: LauncherCommand, physical_cores: int) -> Tuple[Optional[int], str, str]:
    rule = rules()["mpirun"]
    if ":" in cmd.target:  # MPMD: several programs, each with its own options (mpirun(1), hydra's usage line)
        return None, "an MPMD line (`:`)", "your mpirun starts several programs (`:`): cpuperf plans one"
    for names, meaning in ((rule["per_node"], "processes per node"), (rule["nproc"], "processes to start")):
        raw = cmd.option(names)
        if raw is None:
            continue
        said = f"mpirun {cmd.spelled(names)}"
        count = _plain_int(raw)
        if count is None:
            raise _refuse_count(said, f"the number of {meaning} must be a whole number (hydra would read "
                                f"{raw!r} with atoi, Open MPI refuses it)")
        if count < 1:
            raise _refuse_count(said, f"the number of {meaning}; {count} starts none")
        hosts = cmd.spelled(rule["hosts"])
        return count, cmd.spelled(names), (f"your mpirun names hosts ({hosts}): cpuperf places ranks only on this node"
                                           if hosts else "")
    hosts = cmd.spelled(rule["hosts"])
    if hosts:
        return None, hosts, f"your mpirun names hosts ({hosts}) and no rank count: the launcher decides it"
    if cmd.has(rule["one_per_node"]):
        return 1, cmd.spelled(rule["one_per_node"]), ""
    return physical_cores, f"mpirun's default (one rank per core: {physical_cores})", ""


def _srun_count(cmd: LauncherCommand) -> Tuple[Optional[int], str]:
    rule = rules()["srun"]
    for names in (rule["per_node"], rule["nproc"]):
        raw = cmd.option(names)
        if raw is not None:
            count = _plain_int(raw)
            if count is None or count < 1:
                raise _refuse_count(f"srun {cmd.spelled(names)}", "the number of tasks must be a whole number, at "
                                    "least 1 (srun refuses it)")
            return count, cmd.spelled(names)
    return None, "srun"


def _deepspeed_count(cmd: LauncherCommand) -> Tuple[Optional[int], str]:
    """DeepSpeed's local ranks: --num_gpus / --num_accelerators where given (argparse's int; -1, its default, and a
    count below 1 mean the accelerator's devices); None: the runner counts them itself."""
    names = rules()["deepspeed"]["nproc"]
    raw = cmd.option(names)
    if raw is None:
        return None, "deepspeed (its accelerator's device count)"
    count = _python_int(raw)
    if count is None:
        raise _refuse_count(f"deepspeed {cmd.spelled(names)}", "DeepSpeed's runner refuses it (argparse: invalid int "
                            "value)")
    return (count, cmd.spelled(names)) if count >= 1 else (None, f"deepspeed {cmd.spelled(names)} (all its devices)")


def _count_and_source(cmd: LauncherCommand, logical_cpus: int, physical_cores: int, gpus: int,
                      has_default_config: bool, environ: Mapping[str, str]) -> Tuple[Optional[int], str, str]:
    """(count, where it comes from, why cpuperf cannot place the ranks or '') for each launcher."""
    rule = rules().get(cmd.launcher, {})
    if cmd.launcher == "srun":
        count, source = _srun_count(cmd)
        return count, source, rule["why_not"]
    if cmd.launcher == "deepspeed":
        return (*_deepspeed_count(cmd), rule["why_not"])
    if cmd.launcher == "torchrun":
        taskset = next((w.cpus for w in cmd.wrappers if w.cpus), None)
        count, source = _torchrun_count(cmd, len(taskset) if taskset else logical_cpus, gpus, environ)
        why = ""
        if cmd.has(rule["unsupported"]):
            why = f"{cmd.spelled(rule['unsupported'])}: the script runs inside torchrun's own interpreter"
        elif (_python_int(cmd.option(rule["hosts"]) or "1") or 2) > 1:
            why = f"{cmd.spelled(rule['hosts'])}: your torchrun spans several nodes"
        return count, source, why
    if cmd.launcher == "accelerate":
        count2, source, why = _accelerate_count(cmd, has_default_config)
        if not why and cmd.has(rule["threads"]):
            why = f"you set {cmd.spelled(rule['threads'])}"
        if not why and _nodes(cmd) > 1:  # as torchrun --nnodes: the job's other nodes run without cpuperf
            why = f"{cmd.spelled(rule['machines'])}: your accelerate spans several nodes"
        return count2, source, why
    count3, source, why = _mpirun_count(cmd, physical_cores)
    env_bound = [v for v in variables().names(binds_ranks=True) if environ.get(v)]
    if not why and env_bound:
        why = f"your environment binds the ranks ({env_bound[0]})"
    if not why and cmd.unknown:
        why = f"cpuperf's table of mpirun options lacks {cmd.unknown[0]}, so it cannot be sure where your program starts"
    return count3, source, why


def _oversubscribes(cmd: LauncherCommand) -> bool:
    """The user's launcher line itself allows more ranks than cores (Open MPI --oversubscribe, :OVERSUBSCRIBE)."""
    if cmd.launcher != "mpirun":
        return False
    rule = rules()["mpirun"]
    return cmd.has(rule["oversubscribe"]) or "OVERSUBSCRIBE" in (cmd.option(["map-by"]) or "").upper().replace(
        "NOOVERSUBSCRIBE", "")


def _too_many(cmd: LauncherCommand, count: int, source: str, physical_cores: int) -> UsageError:
    what = {"torchrun": "worker processes torchrun starts", "accelerate": "processes accelerate starts",
            "mpirun": "processes mpirun starts (Open MPI gives each a slot, one per core, and refuses more)",
            "srun": "tasks srun starts", "deepspeed": "ranks DeepSpeed's runner starts"}[cmd.launcher]
    hint = ("add --oversubscribe to your mpirun (ranks then share cores), or start fewer" if cmd.launcher == "mpirun"
            else "start fewer ranks, or pass cpuperf {set.oversubscribe}=true to share cores")
    return FieldError("oversubscribe", None, f"{cmd.launcher} {verbatim(source)}: {count} {what}, and this host has "
                      f"{physical_cores} usable core(s)", hint, setting=True)


def launcher_ranks(cmd: LauncherCommand, *, logical_cpus: int, physical_cores: int, gpus: int = 0,
                   has_default_config: bool = False, environ: Optional[Mapping[str, str]] = None,
                   interpreter: Optional[str] = None, oversubscribe: bool = False) -> LauncherRanks:
    """The ranks the user's launcher starts on this node and whether cpuperf may place them.

    A count the launcher would refuse, or that would start no rank, or more ranks than usable cores without
    consent (the line's --oversubscribe, a host list, or cpuperf's --set oversubscribe=true), exits 2.
    interpreter: the Python the launcher runs a script with (None: unknown; then a script cannot be
    wrapped without changing which Python runs it).
    """
    environ = {**(environ or {}), **cmd.wrapper_env}
    name = cmd.launcher
    if cmd.hidden:
        notes, user_threads = _wrapper_notes(cmd, environ)
        return LauncherRanks(name, None, f"{name}, behind a command cpuperf does not read", False,
                             f"{cmd.hidden}: cpuperf cannot tell how many ranks {name} starts, so it neither pins them "
                             "nor sets their threads: placement is left to the launcher", False, tuple(notes),
                             user_threads, False)
    count, source, why = _count_and_source(cmd, logical_cpus, physical_cores, gpus, has_default_config, environ)
    spread = name == "mpirun" and bool(cmd.has(rules()["mpirun"]["hosts"]))
    over = oversubscribe or _oversubscribes(cmd) or spread
    if count is not None and count > physical_cores and not over and name != "srun":  # srun: Slurm's allocation
        raise _too_many(cmd, count, source, physical_cores)
    notes, user_threads = _wrapper_notes(cmd, environ)
    line_threads, line_binds, line_notes = _line_variables(cmd, environ)
    notes += line_notes
    user_threads = line_threads or user_threads
    step = _steppable(cmd, interpreter)
    why = why or _left_to_launcher(cmd, count, source, physical_cores, interpreter, step, line_binds)
    nodes = _nodes(cmd)
    if why:
        return LauncherRanks(name, count, source, False, why + ": placement is left to the launcher", over,
                             tuple(notes), user_threads, step, nodes)
    return LauncherRanks(name, count, source, True,
                         "each rank is pinned to its own cores by a per-rank step keyed on its local rank", over,
                         tuple(notes), user_threads, step, nodes)


def _left_to_launcher(cmd: LauncherCommand, count: Optional[int], source: str, physical_cores: int,
                      interpreter: Optional[str], step: bool, line_binds: str) -> str:
    """Why cpuperf may not place the ranks the launcher starts ('' it may): the first that holds of a wrapper or
    option that places, binds or clears their environment, a count it cannot plan with, no command, more ranks
    than cores, or a per-rank step that cannot run them as the launcher would."""
    name = cmd.launcher
    placing = next((w for w in cmd.wrappers if w.places), None)
    rule = rules().get(name, {})
    binding = rule.get("binding", ())
    cleared = next((w for w in cmd.wrappers if w.clears), None)
    if cleared is not None:
        return f"`{cleared.spelled}` clears the environment that carries cpuperf's per-rank settings"
    if cmd.has(rule.get("env_none", ())):
        return f"`{cmd.spelled(rule['env_none'])}` passes none of the launcher's environment (cpuperf's per-rank " \
               "settings included) to the ranks"
    if line_binds:
        return f"your launcher line binds the ranks itself ({line_binds})"
    if placing is not None:
        cpus = f" (CPUs {','.join(map(str, placing.cpus))})" if placing.cpus else ""
        return f"`{placing.spelled}` in front of {name} places every rank it starts{cpus}"
    if binding and cmd.has(binding):
        return f"your launcher binds the ranks itself ({cmd.spelled(binding)})"
    if count is None:
        return f"the rank count ({source}) is not a number cpuperf can plan with"
    if not cmd.target:
        return "no command for the ranks was found in your launcher's arguments"
    if count > physical_cores:
        return (f"{count} ranks on {physical_cores} usable physical core(s): they cannot each have cores of their own, "
                "so cpuperf neither pins them nor sets their threads")
    if name in ("torchrun", "accelerate") and count > 1 and not _no_python(cmd) and interpreter is None:
        return f"the Python that {name} runs the script with could not be found"
    if count > 1 and not step:
        return f"cpuperf's per-rank step cannot run {name}'s ranks exactly as {name} would (it refuses --no-python here)"
    return ""


def _nodes(cmd: LauncherCommand) -> int:
    """How many nodes the user's launcher spans: torchrun's --nnodes (N or MIN:MAX, the most counted),
    accelerate's --num_machines; 1 where it gives none or none cpuperf can read."""
    rule = rules().get(cmd.launcher, {})
    names = rule.get("hosts", ()) if cmd.launcher == "torchrun" else rule.get("machines", ())
    given = cmd.option(names) if names else None
    if given is None:
        return 1
    parts = given.split(":") if cmd.launcher == "torchrun" else [given]
    counts = [_python_int(part) if len(part) <= 12 else None for part in parts]  # as torchrun and argparse read them
    low, high = (counts[0], counts[-1]) if len(counts) <= 2 else (None, None)
    if low is None or high is None or low < 1 or high < low or high > MAX_NODES:
        said = f"{cmd.spelled(names)}"
        form = "N or MIN:MAX, " if cmd.launcher == "torchrun" else ""
        raise UsageError(f"{cmd.launcher} {_shown(said)}: not a count of nodes {cmd.launcher} can start "
                         f"({form}1 to {MAX_NODES})", hint=f"give the nodes as a whole number, e.g. "
                         f"{names[0]} 2" + (" or 1:4" if form else ""))
    return high


# The most nodes a plan is made for (knowledge/knobs.py: --set nnodes past it is refused).
MAX_NODES = 4096


def _steppable(cmd: LauncherCommand, interpreter: Optional[str]) -> bool:
    """The per-rank step can run every rank as the launcher would have (it then dies with the launcher,
    PR_SET_PDEATHSIG): mpirun always; torchrun / accelerate where the script's Python is known. srun's tasks
    are children of slurmd, which ends them with the step."""
    if not cmd.target or cmd.launcher in ("srun", "deepspeed"):
        return False
    if cmd.launcher == "mpirun":
        return ":" not in cmd.target  # the step runs one program, not an MPMD line
    rule = rules()[cmd.launcher]
    if cmd.has(rule.get("unsupported", ())) or cmd.has(rule.get("no_python_refused", ())):
        return False
    return _no_python(cmd) or interpreter is not None


def _wrapper_notes(cmd: LauncherCommand, environ: Mapping[str, str]) -> Tuple[List[str], Optional[str]]:
    """What the wrappers and the user's thread variable do to every rank, in words; the user's OMP_NUM_THREADS."""
    notes = [f"`{w.spelled}` runs {cmd.launcher}" + (": cpuperf reads the command line inside it" if w.shell
                                                      else ": its setting applies to every rank")
             for w in cmd.wrappers if not w.places and w.name not in ("exec", "assignments")]
    threads = environ.get("OMP_NUM_THREADS") or None
    if cmd.wrapper_env.get("OMP_NUM_THREADS"):
        notes.append(f"your OMP_NUM_THREADS={threads} (set in front of {cmd.launcher}) is what every rank gets")
    return notes, threads


def _binding_variables(launcher: str) -> Tuple[str, ...]:
    """The variables that bind ranks set on the launcher line (compat/variables.toml): an MPI launcher's own
    (binds_ranks) and OpenMP's binding of each rank's threads (the affinity lever's OpenMP rows)."""
    table = variables()
    mpi = table.names(binds_ranks=True) if launcher == "mpirun" else ()
    return (*mpi, *table.names(lever="affinity", runtime=("openmp", "gnu-openmp", "intel-openmp")))


def _line_variables(cmd: LauncherCommand, environ: Mapping[str, str]) -> Tuple[Optional[str], str, List[str]]:
    """(the OMP_NUM_THREADS the launcher line gives the ranks, how the line binds them ('' none), notes).
    A thread count that no OpenMP reads exits 2, as the same value in the environment would."""
    from cpuperf.decide.runtime_env import user_value_problem

    binding_vars = _binding_variables(cmd.launcher)
    threads: Optional[str] = None
    binds = ""
    notes: List[str] = []
    for name, value, said in cmd.line_env(environ):
        if value is None:
            continue  # forwarded, and this environment has none: cpuperf's own value is what it forwards
        shown = said if len(said) <= 80 else said[:77] + "..."
        if name == "OMP_NUM_THREADS":
            problem = user_value_problem(name, value)
            if problem:
                raise UsageError(f"{cmd.launcher} {shown}: OMP_NUM_THREADS={value[:40]!r}: {problem}",
                                 hint="give a positive whole number of threads per rank, e.g. OMP_NUM_THREADS=4")
            threads = value  # the launch plan says it is kept, and how many CPUs each rank has for it
        elif name in binding_vars:
            binds = binds or f"{shown}"
            notes.append(f"your {name}={value[:60]} ({shown}) reaches every rank: cpuperf keeps it and sets no "
                         "placement variable of its own")
    if cmd.launcher == "srun":
        export = cmd.option(["--export"])
        if export is not None and "ALL" not in export.split(","):
            notes.append(f"srun {cmd.spelled(['--export'])}: only the variables it names (and SLURM_*) reach the "
                         "tasks, so those cpuperf sets do not")
    return threads, binds, notes


def _no_python(cmd: LauncherCommand) -> bool:
    return cmd.has(rules()[cmd.launcher].get("no_python", ()))


def _drop(cmd: LauncherCommand, names: Sequence[str]) -> Tuple[str, ...]:
    """The launcher's options as written, less those named (each with the words it took)."""
    keys = {_key(cmd.launcher, n) for n in names}
    return tuple(word for name, _, words in cmd.parsed if name not in keys for word in words)


def with_rank_step(cmd: LauncherCommand, python: str, interpreter: Optional[str]) -> Tuple[str, ...]:
    """The user's launcher command with `python -m cpuperf.run.rankexec --` in front of each rank's command.

    torchrun / accelerate: their --no-python runs our interpreter per rank, which then execs the rank's
    command as the launcher would have run it (`INTERPRETER -u script ...`, `-m module`, or the program
    itself under the user's own --no-python). mpirun, srun: the step goes in front of the program.
    """
    step = (python, *RANKEXEC)
    if cmd.launcher in ("mpirun", "srun"):
        return cmd.rebuilt(cmd.options, (*step, *cmd.target))
    rule = rules()[cmd.launcher]
    module, no_python = rule["module"], rule["no_python"]
    if cmd.has(no_python):
        rank_cmd: Tuple[str, ...] = cmd.target
    elif cmd.has(module):
        rank_cmd = (interpreter or python, "-u", "-m", *cmd.target)
    else:
        rank_cmd = (interpreter or python, "-u", *cmd.target)
    options = _drop(cmd, (*module, *no_python))
    return cmd.rebuilt((*options, no_python[0]), (*step, *rank_cmd))
