"""An accelerate workload: the same small GPT-2 in a plain loop with Accelerator, argparse arguments."""

import argparse
import json
import time

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch-size", type=int, default=8)
ap.add_argument("--lr", type=float, default=3e-4)
a = ap.parse_args()
acc = Accelerator()
torch.manual_seed(0)
# ~5M parameters: small, yet compute-bound like real models (a 0.9M toy is dominated by per-op overhead,
# where one thread beats one per core and no launcher setting can show a gain).
SEQ = 128
cfg = GPT2Config(n_layer=4, n_head=4, n_embd=256, n_positions=SEQ, vocab_size=8192)
model = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=a.lr)  # the script's own optimizer: cpuperf leaves it
model, opt = acc.prepare(model, opt)
g = torch.Generator().manual_seed(0)
times = []
for _ in range(a.steps):
    ids = torch.randint(0, cfg.vocab_size, (a.batch_size, SEQ), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter())
sps = (len(times) - 3) * a.batch_size / (times[-1] - times[2])
print(json.dumps({"samples_per_s": sps, "optimizer": "AdamW (torch default, the script's own)",
                  "threads": torch.get_num_threads(), "mixed_precision": acc.mixed_precision}))
