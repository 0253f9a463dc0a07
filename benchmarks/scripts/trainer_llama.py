"""A plain Hugging Face Trainer script for the GPU check (benchmarks/device_check.sh): a causal LM built from a local
config, trained on random tokens. The recorded H100 check's script (tests/fixtures/hosts/h100-emeraldrapids-16c/trainer)
with its length named --block_size, the name cpuperf reads from a command, so the memory plan sees it.

Prints one line at the end, `TRAINER_RESULT {json}`: the Trainer's metrics, its arguments, and rank 0's peak GPU memory
(torch.cuda.max_memory_allocated / max_memory_reserved, GiB).
"""
import json
import sys
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArgs:
    model_name_or_path: str = field(default="llama1b")
    block_size: int = field(default=1024)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, vocab, seq):
        self.vocab, self.seq = vocab, seq

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": x, "labels": x.clone()}


def main():
    m, args = HfArgumentParser((ModelArgs, TrainingArguments)).parse_args_into_dataclasses()
    cfg = AutoConfig.from_pretrained(m.model_name_or_path)
    model = AutoModelForCausalLM.from_config(cfg)
    tr = Trainer(model=model, args=args, train_dataset=Tokens(cfg.vocab_size, m.block_size))
    out = tr.train()
    res = {"metrics": out.metrics, "argv": sys.argv[1:], "dtype_param": str(next(model.parameters()).dtype)}
    if torch.cuda.is_available():
        res["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
        res["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    print("TRAINER_RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
