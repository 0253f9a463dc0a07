"""A script's own arguments read by the rules of the parser the script uses: the one walk of them.

argparse's rules (CPython 3.9-3.13 argparse.py `_parse_optional`, `_get_option_tuples`, `_get_values`;
HfArgumentParser is an ArgumentParser with allow_abbrev left True): an option string written in full is that
option; `--opt=VALUE` attaches a value; otherwise a long option that begins exactly one option string is that option
(two or more: "ambiguous option", exit 2); `--` ends the options; the last occurrence of an option is the value the
script gets; a value the option's type refuses ends the script with exit 2. Where the table is not the whole
parser's (the script hands HfArgumentParser a dataclass cpuperf cannot read), only options written in full are read,
and what could be another option is said, never guessed.

Everything after `read_command` that needs a value of the script's arguments asks the `ScriptArgs` made here:
the batch the script trains, the flags it already gives, where a value is replaced, a tuning run's arguments and the
values each rank read back. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from cpuperf.errors import UsageError, verbatim
from cpuperf.knowledge.script_parsers import ScriptOption, ScriptParser

_TRUE = ("yes", "true", "t", "y", "1")
_FALSE = ("no", "false", "f", "n", "0")
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher


class ScriptArgError(UsageError):
    """The script's own parser would refuse its arguments (argparse exits 2): said before anything runs."""


@dataclass(frozen=True)
class GivenOption:
    """One option as the command gives it: its destination, its value (None: a switch), where its words are."""

    dest: str
    value: Optional[str]
    start: int
    end: int  # args[start:end] are its words
    spelled: str  # the option as written: '--per_device_train_batch' (an abbreviation) or '--bf16'
    guessed: bool = False  # not in the parser's table (which is not the whole parser's): read as --name VALUE


@dataclass(frozen=True)
class ScriptArgs:
    """A script's arguments as its parser reads them."""

    args: Tuple[str, ...]
    parser: ScriptParser
    given: Tuple[GivenOption, ...] = ()
    # option words the table does not place: not in it, or a prefix that could be an option cpuperf cannot see
    unread: Tuple[str, ...] = ()

    def value(self, dest: str) -> Optional[str]:
        """The value the script gets for `dest` (the last occurrence; '' for a switch); None: not given."""
        found: Optional[str] = None
        for g in self.given:
            if g.dest == dest:
                found = "" if g.value is None else g.value
        return found

    def has(self, dest: str) -> bool:
        return any(g.dest == dest for g in self.given)

    def spelled(self, dest: str) -> str:
        """The last occurrence of `dest` as written ('--per_device_train_batch 16')."""
        words = [" ".join(self.args[g.start:g.end]) for g in self.given if g.dest == dest]
        return words[-1] if words else ""

    def values(self) -> Dict[str, str]:
        """{dest: the value the script gets} for every option given."""
        return {g.dest: ("" if g.value is None else g.value) for g in self.given}

    def could_be(self, dest: str) -> str:
        """Why an option cpuperf could not place may be `dest` (''): an unread word that begins one of its option
        strings, or any unread word where the table is not the whole parser's."""
        opt = self.parser.option(dest)
        names = opt.names if opt is not None else (f"--{dest}",)
        for word in self.unread:
            key = word.split("=", 1)[0]
            if any(n.startswith(key) for n in names):
                return f"{word} may be --{dest} ({self.parser.why or 'the parser is not read whole'})"
        return ""

    def with_value(self, dest: str, words: Sequence[str]) -> Tuple[str, ...]:
        """The arguments with `words` (an option and its value, '--per_device_train_batch_size 4') in place of every
        occurrence of `dest` (the first one's place keeps it; the later ones go), or appended where none is given."""
        hits = [g for g in self.given if g.dest == dest]
        if not hits:
            return (*self.args, *words)
        out: List[str] = []
        at = 0
        for n, g in enumerate(hits):
            out += self.args[at:g.start]
            if n == 0:
                out += words
            at = g.end
        return (*out, *self.args[at:])

    def without(self, dests: Sequence[str]) -> Tuple[str, ...]:
        """The arguments with every occurrence of these options taken out."""
        drop = [g for g in self.given if g.dest in dests]
        out: List[str] = []
        at = 0
        for g in drop:
            out += self.args[at:g.start]
            at = g.end
        return (*out, *self.args[at:])


def _option_like(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE.match(word)


def _checked(opt: ScriptOption, spelled: str, value: str) -> str:
    """`value` where the option's type takes it; argparse's own refusal (exit 2) where it does not."""
    ok = True
    if opt.kind == "int":
        try:
            int(value)
        except ValueError:
            ok = False
    elif opt.kind == "float":
        try:
            float(value)
        except ValueError:
            ok = False
    elif opt.kind == "bool":
        ok = value.lower() in _TRUE + _FALSE
    if not ok:
        raise ScriptArgError(f"your script's parser refuses {verbatim(spelled)} {verbatim(repr(value))}: not a valid "
                             f"{'whole number' if opt.kind == 'int' else opt.kind} (argparse would exit 2)",
                             hint=f"give {spelled} a {'whole number' if opt.kind == 'int' else opt.kind} value, as your "
                                  "script expects; cpuperf runs nothing it would refuse")
    return value


def _resolve(parser: ScriptParser, key: str, unread: List[str], word: str) -> Optional[Tuple[str, ScriptOption]]:
    """(the option string `key` stands for, its option), or None where the table cannot place it."""
    exact = parser.exact(key)
    if exact is not None:
        return key, exact
    if not (parser.abbrev and key.startswith("--")):
        unread.append(word)
        return None
    matches = parser.starting(key)
    if len(matches) > 1 and parser.complete:
        raise ScriptArgError(f"your script's parser refuses {verbatim(key)}: ambiguous option, it could match "
                             + ", ".join(n for n, _ in matches[:4]) + (" ..." if len(matches) > 4 else ""),
                             hint="write the option in full, as your script's parser would also ask")
    if len(matches) == 1 and parser.complete:
        return matches[0]
    unread.append(word)  # not in the table, or it may begin an option the table lacks
    return None


def read_script_args(args: Sequence[str], parser: ScriptParser) -> ScriptArgs:
    """The one walk of a script's arguments, by its parser's rules (the module's docstring)."""
    words = tuple(args)
    given: List[GivenOption] = []
    unread: List[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            break  # the rest are positional
        if not _option_like(word):
            i += 1
            continue
        key, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        found = _resolve(parser, key, unread, word)
        if found is None:
            i = _guess(parser, words, i, key, (attached if eq else None), given)
            continue
        spelled, opt = found
        i = _take(opt, spelled, words, i, (attached if eq else None), given)
    return ScriptArgs(words, parser, tuple(given), tuple(unread))


def _guess(parser: ScriptParser, words: Tuple[str, ...], i: int, key: str, attached: Optional[str],
           given: List[GivenOption]) -> int:
    """An option the table does not hold. Where the table is the whole parser's, the script itself refuses it (or
    leaves it to code of its own): nothing is read from it. Where it is not, an option written in full and not an
    abbreviation of a known one is read as `--name VALUE` (guessed: `GivenOption.guessed`), for what cpuperf only
    reports (the model a script names); it never decides a batch."""
    if parser.complete or not key.startswith("--") or parser.starting(key):
        return i + 1
    nxt = words[i + 1] if i + 1 < len(words) else None
    takes = attached is None and nxt is not None and nxt != "--" and not _option_like(nxt)
    value = attached if attached is not None else (nxt if takes else None)
    given.append(GivenOption(key[2:].replace("-", "_"), value, i, i + (2 if takes else 1), key, guessed=True))
    return i + (2 if takes else 1)


def _take(opt: ScriptOption, spelled: str, words: Tuple[str, ...], i: int, attached: Optional[str],
          given: List[GivenOption]) -> int:
    """Reads the option at words[i] (its values by its arity) into `given`; returns the index after it."""
    if opt.arity == "none":
        if attached is not None:
            raise ScriptArgError(f"your script's parser refuses {verbatim(words[i])}: {spelled} takes no value "
                                 "(argparse: ignored explicit argument)", hint=f"write {spelled} alone")
        given.append(GivenOption(opt.dest, None, i, i + 1, spelled))
        return i + 1
    if attached is not None:
        given.append(GivenOption(opt.dest, _checked(opt, spelled, attached), i, i + 1, spelled))
        return i + 1
    nxt = words[i + 1] if i + 1 < len(words) else None
    takes = nxt is not None and nxt != "--" and not _option_like(nxt)
    if opt.arity == "optional":
        value = _checked(opt, spelled, nxt) if takes and nxt is not None else None
        given.append(GivenOption(opt.dest, value, i, i + (2 if takes else 1), spelled))
        return i + (2 if takes else 1)
    if not takes or nxt is None:
        raise ScriptArgError(f"your script's parser refuses {verbatim(words[i])}: expected "
                             f"{'one argument' if opt.arity == 'one' else 'at least one argument'}",
                             hint=f"give {spelled} its value, as your script expects")
    if opt.arity == "many":
        j = i + 1
        while j < len(words) and words[j] != "--" and not _option_like(words[j]):
            _checked(opt, spelled, words[j])
            j += 1
        given.append(GivenOption(opt.dest, " ".join(words[i + 1:j]), i, j, spelled))
        return j
    given.append(GivenOption(opt.dest, _checked(opt, spelled, nxt), i, i + 2, spelled))
    return i + 2


UNREAD = ScriptParser("unknown", why="the script's parser is not read")


def bounded_int(args: ScriptArgs, dest: str, bound: str = "batch_size") -> Tuple[Optional[int], str]:
    """(the value of an int option where it is a count a run can take: within cpuperf's bound for `bound`
    (cpuperf.worker_settings.BOUNDS), why not ''). A value the type takes but no run can (0, -4, 2**62) is the
    script's own to refuse: passed to it unchanged, and cpuperf builds nothing on it."""
    from cpuperf.worker_settings import out_of_bounds

    text = args.value(dest)
    if text is None:
        return None, ""
    if any(g.guessed for g in args.given if g.dest == dest):
        return None, f"{args.spelled(dest)}: not an option of the parser cpuperf read ({args.parser.why})"
    value = int(text)  # read_script_args refused what int() refuses
    problem = out_of_bounds(bound, value)
    if problem is not None:
        return None, (f"{args.spelled(dest)}: not a count cpuperf plans with ({problem}): passed to your script "
                      "unchanged, its own to refuse")
    return value, ""
