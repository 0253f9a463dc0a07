"""Deterministic, resumable, rank-sharded batches from a token stream.

The batch a rank sees at (step, micro-step) is a pure function of (seed, step, micro, rank, world,
batch size), so resuming needs only the step number, and DistributedSampler-style sharding falls
out of the indexing: global sample g = ((step * accum + micro) * world + rank) * batch + j.
Each epoch visits every non-overlapping seq_len window once, in a seeded random order, with a
seeded start offset per epoch so windows do not always begin at the same tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


class TokenBatches:
    """Map micro-step number -> (inputs, targets) LongTensors of shape (batch, seq_len)."""

    def __init__(self, tokens: list[int], seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1, grad_accum_steps: int = 1,
                 start_micro: int = 0, length: int = 2**40) -> None:
        import torch

        self.data = torch.tensor(tokens, dtype=torch.long)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.grad_accum_steps = grad_accum_steps
        self.start_micro = start_micro
        self.length = length
        # Leave room for the per-epoch offset (< seq_len) and the shifted target.
        self.n_windows = (len(tokens) - 1 - seq_len) // seq_len
        if self.n_windows < 1:
            raise ValueError(f"the corpus ({len(tokens)} tokens) is too short for seq_len {seq_len}")
        self._perms: dict[int, tuple[Tensor, int]] = {}

    def __len__(self) -> int:
        return self.length

    def _epoch(self, epoch: int) -> tuple[Tensor, int]:
        import torch

        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.n_windows, generator=g)
            offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
            self._perms[epoch] = (perm, offset)
        return self._perms[epoch]

    def window(self, g: int) -> tuple[Tensor, Tensor]:
        """Inputs and targets of global sample number `g`."""
        epoch, i = divmod(g, self.n_windows)
        perm, offset = self._epoch(epoch)
        start = offset + int(perm[i]) * self.seq_len
        chunk = self.data[start:start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]

    def __getitem__(self, k: int) -> tuple[Tensor, Tensor]:
        """Batch for this rank at micro-step start_micro + k (DataLoader index)."""
        import torch

        micro = self.start_micro + k
        base = (micro * self.world_size + self.rank) * self.batch_size
        xs, ys = zip(*(self.window(base + j) for j in range(self.batch_size)))
        return torch.stack(xs), torch.stack(ys)


def eval_batches(tokens: list[int], seq_len: int, batch_size: int, n_batches: int, rank: int,
                 world_size: int) -> list[tuple[Tensor, Tensor]]:
    """The fixed evaluation batches for this rank: windows i with i % world == rank."""
    import torch

    data = torch.tensor(tokens, dtype=torch.long)
    n = min((len(tokens) - 1) // seq_len, batch_size * n_batches)
    mine = [i for i in range(n) if i % world_size == rank]
    out = []
    for b in range(0, len(mine), batch_size):
        idx = mine[b:b + batch_size]
        x = torch.stack([data[i * seq_len:(i + 1) * seq_len] for i in idx])
        y = torch.stack([data[i * seq_len + 1:(i + 1) * seq_len + 1] for i in idx])
        out.append((x, y))
    return out
