"""A Lightning workload: the Transformer LM Lightning ships for its own examples (lightning.pytorch.demos.Transformer,
the model of examples/pytorch/basics/transformer.py), trained by L.Trainer with the example's settings (SGD lr 20,
gradient clipping 0.25, batch 20 of 35 tokens) on random tokens of WikiText-2's vocabulary size: no download, no
precision= passed, so Lightning's own defaults (and PL_TRAINER_* variables) decide it."""

import argparse
import json
import time

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
a = ap.parse_args()
VOCAB, SEQ, BATCH = 33278, 35, 20


class LanguageModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = Transformer(vocab_size=VOCAB)

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        return F.nll_loss(self.model(inputs, target), target.view(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=20.0)


class Clock(L.Callback):
    def __init__(self):
        self.times = []

    def on_train_batch_end(self, *args):
        self.times.append(time.perf_counter())


g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, VOCAB, (BATCH * (a.steps + 1), SEQ + 1), generator=g)
data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=BATCH)
clock = Clock()
trainer = L.Trainer(max_steps=a.steps, gradient_clip_val=0.25, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
torch.manual_seed(0)
trainer.fit(LanguageModel(), data)
t = clock.times
sps = (len(t) - 3) * BATCH / (t[-1] - t[2])
print(json.dumps({"samples_per_s": sps, "optimizer": "SGD (the script's own)", "threads": torch.get_num_threads(),
                  "precision": str(trainer.precision)}))
