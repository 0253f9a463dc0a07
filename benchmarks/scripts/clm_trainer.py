"""A causal-LM Trainer script shaped like transformers' examples/pytorch/language-modeling/run_clm.py, offline.

Its own ModelArguments and DataTrainingArguments beside TrainingArguments (HfArgumentParser); the model from
--model_type with --config_overrides (CONFIG_MAPPING, from_config: no weights downloaded), a tokenizer trained
here on --train_file (the `tokenizers` library, a byte-level BPE: no hub), the text tokenized and grouped into
--block_size chunks. Prints (rank 0) one JSON line: the Trainer's train_samples_per_second, and the wall time of
the script from its first line to its last and its CPU time (what it does itself, cpuperf's start and end not
included).
"""

import time

BEGAN = time.time()

import json  # noqa: E402
import os  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Optional  # noqa: E402

import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    default_data_collator,
)


@dataclass
class ModelArguments:
    model_type: Optional[str] = field(default=None, metadata={"help": "a model type to train from scratch"})
    config_overrides: Optional[str] = field(default=None, metadata={"help": "n_embd=10,resid_pdrop=0.2,..."})
    vocab_size: int = field(default=2048, metadata={"help": "the BPE vocabulary trained on the training file"})


@dataclass
class DataTrainingArguments:
    train_file: Optional[str] = field(default=None, metadata={"help": "a text file"})
    block_size: Optional[int] = field(default=128)


def main() -> None:
    model_args, data_args, training_args = HfArgumentParser(
        (ModelArguments, DataTrainingArguments, TrainingArguments)).parse_args_into_dataclasses()
    torch.manual_seed(training_args.seed)
    with open(data_args.train_file, encoding="utf-8") as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=model_args.vocab_size, special_tokens=["<unk>", "<eos>"],
                                                       show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<eos>")

    config = CONFIG_MAPPING[model_args.model_type]()
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
    config.vocab_size = len(tokenizer)
    config.bos_token_id = config.eos_token_id = tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_config(config)

    ids = [i for ln in tokenizer(lines)["input_ids"] for i in ln + [tokenizer.eos_token_id]]
    block = data_args.block_size
    chunks = [ids[i:i + block] for i in range(0, len(ids) - block + 1, block)]
    train = [{"input_ids": c, "labels": list(c), "attention_mask": [1] * block} for c in chunks]

    trainer = Trainer(model=model, args=training_args, train_dataset=train, data_collator=default_data_collator)
    metrics = trainer.train().metrics
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"train_samples_per_second": metrics.get("train_samples_per_second"),
                          "script_s": round(time.time() - BEGAN, 3), "began": BEGAN, "ended": time.time(),
                          "cpu_s": time.process_time(),
                          "bf16": training_args.bf16, "blocks": len(train)}), flush=True)


if __name__ == "__main__":
    main()
