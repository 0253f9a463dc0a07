"""Plain PyTorch DDP (gloo), as a user writes it: the same ~5M-parameter GPT-2 as the other scripts,
synthetic data, a fixed number of timed steps after warm-up. Run under torchrun (or as one process).

Prints (rank 0) one JSON line: the job's samples/s (all ranks) over the timed steps.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=30, help="timed steps")
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--batch-size", type=int, default=8, help="per rank")
ap.add_argument("--lr", type=float, default=3e-4)
a = ap.parse_args()

distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    dist.init_process_group("gloo")
world = dist.get_world_size() if distributed else 1
rank = dist.get_rank() if distributed else 0
torch.manual_seed(0)
SEQ = 128
cfg = GPT2Config(n_layer=4, n_head=4, n_embd=256, n_positions=SEQ, vocab_size=8192)
model = GPT2LMHeadModel(cfg)
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
g = torch.Generator().manual_seed(1 + rank)
t0 = None
for step in range(a.warmup + a.steps):
    if step == a.warmup:
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
    ids = torch.randint(0, cfg.vocab_size, (a.batch_size, SEQ), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if distributed:
    dist.barrier()
elapsed = time.perf_counter() - t0
report({"samples_per_s": a.steps * a.batch_size * world / elapsed, "world_size": world, "ddp": distributed,
        "steps": a.steps, "loss": float(loss), "params": sum(p.numel() for p in model.parameters())})
if distributed:
    dist.destroy_process_group()
