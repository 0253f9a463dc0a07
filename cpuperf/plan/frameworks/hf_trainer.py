"""Hugging Face Trainer scripts: recognised by what they import from transformers and call (Trainer,
TrainingArguments, HfArgumentParser and their Seq2Seq kin). Their command line is read with HfArgumentParser's
table (compat/trainer_args.toml for TrainingArguments, the script's own dataclasses read from its source); the dtype
and every other lever reach them as TrainingArguments flags (cpuperf.plan.user_script.speed_flags), and their batch
is passable, so cpuperf can split them into ranks keeping the global batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from cpuperf.knowledge.script_parsers import FieldSpec, ScriptParser, hf_parser
from cpuperf.plan.frameworks import Reach
from cpuperf.plan.frameworks.plain import argparse_parser
from cpuperf.plan.script_args import ScriptArgs
from cpuperf.plan.script_source import DataclassSpec, ScriptSource

TRAINER_ARGUMENTS = ("TrainingArguments", "Seq2SeqTrainingArguments")
_MARKS = ("Trainer", "Seq2SeqTrainer", *TRAINER_ARGUMENTS, "HfArgumentParser")


def _from_transformers(name: str) -> bool:
    return name.startswith("transformers.") and name.rsplit(".", 1)[-1] in _MARKS


def _fields(spec: DataclassSpec, source: ScriptSource, depth: int = 0) -> Tuple[List[FieldSpec], str, bool]:
    """(a dataclass's fields with its in-script bases', the Trainer arguments class it extends or '', whether every
    base was read)."""
    fields: List[FieldSpec] = []
    trainer, whole = "", True
    for base in spec.bases:
        short = base.rsplit(".", 1)[-1]
        parent = source.dataclass_named(short)
        if short in TRAINER_ARGUMENTS:
            trainer = short
        elif parent is not None and depth < 8:
            more, t, w = _fields(parent, source, depth + 1)
            fields += more
            trainer, whole = trainer or t, whole and w
        elif short != "object":
            whole = False
    return fields + list(spec.fields), trainer, whole


@dataclass(frozen=True)
class HfTrainer:
    name: str = "hf-trainer"
    title: str = "a Hugging Face Trainer script"

    def recognises(self, source: ScriptSource) -> bool:
        return source.read and any(_from_transformers(c) for c in source.calls) or \
            (source.read and source.hf_parser_types is not None and source.imports("transformers"))

    def parser(self, source: ScriptSource) -> ScriptParser:
        types = source.hf_parser_types
        if types is None:
            return argparse_parser(source)
        fields: List[FieldSpec] = []
        trainer, missing = "", []
        for name in types:
            if name in TRAINER_ARGUMENTS:
                trainer = "Seq2SeqTrainingArguments" if "Seq2Seq" in (trainer + name) else name
                continue
            spec = source.dataclass_named(name)
            if spec is None:
                missing.append(name)
                continue
            more, extends, whole = _fields(spec, source)
            fields += more
            trainer = trainer or extends
            if not whole:
                missing.append(name)
        complete = not missing and not source.unread_arguments
        why = ("HfArgumentParser over " + ", ".join(types) if complete else
               f"HfArgumentParser over {', '.join(missing)}, which cpuperf cannot read from the script")
        return hf_parser(fields, trainer, source.arguments, complete, why)

    def dtype(self, source: ScriptSource, args: ScriptArgs, dtype: str, why: str) -> Optional[Reach]:
        return None  # a TrainingArguments flag (--bf16), decided with the other Trainer flags


HF_TRAINER = HfTrainer()
