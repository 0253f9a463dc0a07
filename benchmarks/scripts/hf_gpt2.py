"""A Hugging Face Trainer workload: a small GPT-2 from a GPT2Config, synthetic data, no downloads.

Arguments are TrainingArguments (HfArgumentParser). Prints (rank 0) one JSON line: samples/s over the
timed steps (the first steps, warm-up, are excluded) and the optimizer implementation the Trainer built.
Runs as one process or under torchrun.
"""

import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report, world_size  # noqa: E402

WARMUP = 3


class Clock(TrainerCallback):
    def __init__(self):
        self.t = []

    def on_step_end(self, args, state, control, **kw):
        self.t.append(time.perf_counter())


(args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()
torch.manual_seed(0)
# ~5M parameters: small, yet compute-bound like real models (a 0.9M toy is dominated by per-op overhead,
# where one thread beats one per core and no launcher setting can show a gain).
SEQ = 128
cfg = GPT2Config(n_layer=4, n_head=4, n_embd=256, n_positions=SEQ, vocab_size=8192)
model = GPT2LMHeadModel(cfg)
g = torch.Generator().manual_seed(0)
data = [{"input_ids": t, "labels": t} for t in torch.randint(0, cfg.vocab_size, (512, SEQ), generator=g)]
clock = Clock()
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[clock])
trainer.train()
opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
steps = len(clock.t) - WARMUP
sps = steps * args.per_device_train_batch_size / (clock.t[-1] - clock.t[WARMUP - 1])
impl = "fused" if opt.defaults.get("fused") else ("foreach" if opt.defaults.get("foreach") else "default")
# Each process trains the same steps: the job's rate is the process's times the processes launched, whether
# the Trainer ran them as one DDP job (args.world_size > 1) or as independent copies.
report({"samples_per_s": sps * world_size(), "per_process_samples_per_s": sps, "world_size": world_size(),
        "ddp": args.world_size > 1, "optimizer": f"{type(opt).__name__} ({impl})", "optim": str(args.optim),
        "bf16": args.bf16, "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()})
