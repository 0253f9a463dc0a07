"""The option tables of the parsers a training script reads its command line with, as data: HfArgumentParser over
TrainingArguments (compat/trainer_args.toml, recorded from the real parser), the fields of a script's own
dataclasses as HfArgumentParser turns them into options, and a script's own `add_argument` calls.

A table says every option string the parser registers, how many values each takes and the type its values must
parse as; cpuperf.plan.script_args reads a command with it by argparse's rules. Pure."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from cpuperf.data import load_builtin
from cpuperf.errors import BadDataError

ARITIES = ("none", "one", "optional", "many")
KINDS = ("none", "int", "float", "bool", "str")


@dataclass(frozen=True)
class ScriptOption:
    """One argparse action: its destination, every option string that reaches it, its arity and value type."""

    dest: str
    names: Tuple[str, ...]
    arity: str = "one"  # none | one | optional (nargs='?') | many (nargs='+')
    kind: str = "str"  # none | int | float | bool (HfArgumentParser's string_to_bool) | str


@dataclass(frozen=True)
class FieldSpec:
    """A dataclass field as read from a script's source: its name, the annotation as written, its default as written
    ('' where it has none), and whether it is an __init__ argument (HfArgumentParser skips the others)."""

    name: str
    annotation: str
    default: str = ""
    init: bool = True


@dataclass(frozen=True)
class ScriptParser:
    """The parser a script reads its command line with, as far as cpuperf can tell it.

    kind: hf (HfArgumentParser), argparse, lightning-cli (LightningCLI / jsonargparse), none (the script reads no
    command line), unknown (it does, with something cpuperf cannot read). complete: every option the parser has is in
    `options`, so a prefix (allow_abbrev) can be told; where not, only options written in full are read."""

    kind: str
    options: Tuple[ScriptOption, ...] = ()
    abbrev: bool = True
    complete: bool = False
    why: str = ""

    @functools.cached_property
    def _by_name(self) -> Dict[str, ScriptOption]:
        return {name: opt for opt in self.options for name in opt.names}

    def exact(self, name: str) -> Optional[ScriptOption]:
        return self._by_name.get(name)

    def starting(self, prefix: str) -> Tuple[Tuple[str, ScriptOption], ...]:
        """(option string, its option) for every long option string that begins with `prefix`."""
        return tuple((n, o) for n, o in self._by_name.items() if n.startswith("--") and n.startswith(prefix))

    def option(self, dest: str) -> Optional[ScriptOption]:
        return next((o for o in self.options if o.dest == dest), None)


@functools.lru_cache(maxsize=1)
def trainer_table() -> Tuple[Tuple[ScriptOption, ...], Tuple[ScriptOption, ...], str]:
    """(TrainingArguments' options, the ones Seq2SeqTrainingArguments adds, the transformers release recorded)."""
    return parse_trainer_table(load_builtin("trainer_args.toml"))


def parse_trainer_table(data: Mapping[str, object]) -> Tuple[Tuple[ScriptOption, ...], Tuple[ScriptOption, ...], str]:
    """A parsed trainer_args.toml as option tables; BadDataError naming the first row that is not as the header says."""
    base: List[ScriptOption] = []
    extra: List[ScriptOption] = []
    rows = data.get("option")
    if data.get("schema") != "cpuperf.trainer_args/1" or not isinstance(rows, list) or not rows:
        raise _bad("no [[option]] rows under schema cpuperf.trainer_args/1")
    for i, row in enumerate(rows):
        names = row.get("names") if isinstance(row, dict) else None
        if not isinstance(row, dict) or not isinstance(row.get("dest"), str) or not isinstance(names, list) \
                or not names or not all(isinstance(n, str) and n.startswith("-") for n in names) \
                or row.get("arity") not in ARITIES or row.get("kind") not in KINDS:
            raise _bad(f"option[{i}] needs dest, names (option strings), arity ({'/'.join(ARITIES)}) and kind "
                       f"({'/'.join(KINDS)})")
        opt = ScriptOption(row["dest"], tuple(names), row["arity"], row["kind"])
        (extra if row.get("seq2seq") else base).append(opt)
    return tuple(base), tuple(extra), str(data.get("transformers", "?"))


def _bad(what: str) -> BadDataError:
    return BadDataError(f"malformed data file compat/trainer_args.toml: {what}",
                        hint="regenerate it (python -m tools.record_trainer_args), or reinstall cpuperf")


def _unwrapped(annotation: str) -> str:
    """'Optional[int]' / 'int | None' / 'Union[int, None]' -> 'int'; anything else as written."""
    text = annotation.replace(" ", "")
    for head in ("Optional[", "typing.Optional["):
        if text.startswith(head) and text.endswith("]"):
            return text[len(head):-1]
    parts = text.split("|")
    if len(parts) == 2 and "None" in parts:
        return parts[0] if parts[1] == "None" else parts[1]
    if text.startswith("Union[") and text.endswith("]"):
        inner = [p for p in text[6:-1].split(",") if p != "None"]
        return inner[0] if len(inner) == 1 else text
    return text


def field_options(fields: Iterable[FieldSpec]) -> Tuple[ScriptOption, ...]:
    """The options HfArgumentParser makes of dataclass fields (transformers hf_argparser.py _parse_dataclass_field):
    --name and, for a name with '_', --name-with-dashes; a bool takes an optional value (nargs='?', string_to_bool)
    and, where its default is True, gets --no_name / --no-name; a list takes one or more values."""
    out = []
    for f in fields:
        if not f.init:
            continue
        names = (f"--{f.name}",) + ((f"--{f.name.replace('_', '-')}",) if "_" in f.name else ())
        base = _unwrapped(f.annotation)
        if base == "bool":
            optional = f.annotation.replace(" ", "") == "bool" or f.default not in ("", "None")
            out.append(ScriptOption(f.name, names, "optional" if optional else "one", "bool"))
            if f.default == "True":
                out.append(ScriptOption(f.name, (f"--no_{f.name}", f"--no-{f.name.replace('_', '-')}"), "none", "none"))
        elif base.lower().startswith(("list[", "typing.list[")):
            inner = base[base.index("[") + 1:-1]
            out.append(ScriptOption(f.name, names, "many", inner if inner in ("int", "float") else "str"))
        else:
            out.append(ScriptOption(f.name, names, "one", base if base in ("int", "float") else "str"))
    return tuple(out)


HELP = ScriptOption("help", ("-h", "--help"), "none", "none")


def hf_parser(script_fields: Sequence[FieldSpec], trainer: str, extra: Sequence[ScriptOption], complete: bool,
              why: str) -> ScriptParser:
    """HfArgumentParser over the script's own dataclasses and `trainer` (TrainingArguments, Seq2SeqTrainingArguments
    or '' where the script hands its parser no Trainer arguments class of transformers')."""
    base, seq2seq, _ = trainer_table()
    options = [*base] if trainer else [HELP]
    if trainer == "Seq2SeqTrainingArguments":
        options += seq2seq
    options += field_options(script_fields)
    options += extra
    return ScriptParser("hf", tuple(options), abbrev=True, complete=complete, why=why)
