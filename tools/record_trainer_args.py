"""Records the options HfArgumentParser builds for TrainingArguments and Seq2SeqTrainingArguments in the installed
transformers into compat/trainer_args.toml: the table cpuperf reads a Trainer script's arguments with (prefixes,
aliases, arity and type as argparse applies them). Run in a venv with transformers:

    python -m tools.record_trainer_args            # writes compat/trainer_args.toml
    python -m tools.record_trainer_args --check    # exit 1 where the file differs from the installed release
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Tuple

OUT = Path(__file__).resolve().parent.parent / "compat" / "trainer_args.toml"
_ARITY = {0: "none", None: "one", "?": "optional", "+": "many", "*": "many"}


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "none"
    name = getattr(action.type, "__name__", "")
    return {"int": "int", "float": "float", "string_to_bool": "bool"}.get(name, "str")


def _table(dataclass_type: type) -> List[Tuple[str, Tuple[str, ...], str, str]]:
    from transformers import HfArgumentParser

    parser = HfArgumentParser((dataclass_type,))
    return [(a.dest, tuple(a.option_strings), _ARITY[a.nargs], _kind(a)) for a in parser._actions]


def render() -> str:
    import transformers
    from transformers import Seq2SeqTrainingArguments, TrainingArguments

    base = _table(TrainingArguments)
    seen = {names for _, names, _, _ in base}
    extra = [row for row in _table(Seq2SeqTrainingArguments) if row[1] not in seen]
    lines = ["# The options HfArgumentParser builds for TrainingArguments (and the ones Seq2SeqTrainingArguments adds),",
             "# as argparse holds them: every option string (the field, its dash alias, the --no_ complement of a",
             "# field whose default is True), how many values it takes and the type its values must parse as.",
             "# cpuperf reads a Trainer script's arguments with this table (cpuperf.plan.script_args): a prefix means the",
             "# one option it begins (allow_abbrev), the last occurrence wins, and a value the type refuses is refused.",
             "# Written by `python -m tools.record_trainer_args` from the installed release; do not edit by hand.",
             'schema = "cpuperf.trainer_args/1"',
             f'transformers = "{transformers.__version__}"',
             f'source = "transformers {transformers.__version__} wheel: hf_argparser.py HfArgumentParser._parse_dataclass_field '
             'over TrainingArguments and Seq2SeqTrainingArguments (parser._actions: option_strings, nargs, type)"', ""]
    for seq2seq, rows in ((False, base), (True, extra)):
        for dest, names, arity, kind in rows:
            lines += ["[[option]]", f'dest = "{dest}"', "names = [" + ", ".join(f'"{n}"' for n in names) + "]",
                      f'arity = "{arity}"', f'kind = "{kind}"'] + (["seq2seq = true"] if seq2seq else []) + [""]
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    text = render()
    if "--check" in argv:
        same = OUT.read_text(encoding="utf-8") == text if OUT.exists() else False
        print("compat/trainer_args.toml " + ("matches" if same else "differs from") + " the installed transformers",
              file=sys.stderr)
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
