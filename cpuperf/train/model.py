"""A small decoder-only transformer LM (GPT-2 shape): pre-LN, causal SDPA, GELU MLP, tied embeddings.

The shapes live in cpuperf.knowledge.models (torch-free); build_model() imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple, Type

from cpuperf.knowledge.models import (  # noqa: F401  (the worker's names for the shapes)
    PRESETS,
    ModelConfig,
    flops_per_token,
    make_config,
    non_embedding_params,
)

if TYPE_CHECKING:
    from torch import nn


def _block_class(cfg: ModelConfig) -> Type[nn.Module]:
    """The transformer block for `cfg` (pre-LN causal self-attention + GELU MLP), as an nn.Module class."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class CausalSelfAttention(nn.Module):  # type: ignore[misc]  # nn.Module is Any to mypy where torch is missing
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            hd = c // cfg.n_head
            q, k, v = self.qkv(x).view(b, t, 3, cfg.n_head, hd).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, c))
            return out

    class Block(nn.Module):  # type: ignore[misc]  # (as above)
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.d_model)
            self.attn = CausalSelfAttention()
            self.ln2 = nn.LayerNorm(cfg.d_model)
            self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
            self.fc_proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            out: torch.Tensor = x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            return out

    return Block


def build_model(cfg: ModelConfig, grad_checkpointing: bool = False) -> nn.Module:
    """A torch nn.Module LM for `cfg`: forward(idx, targets=None) -> (logits, loss or None)."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    Block = _block_class(cfg)

    class GPT(nn.Module):  # type: ignore[misc]  # nn.Module is Any to mypy where torch is missing
        def __init__(self) -> None:
            super().__init__()
            self.config = cfg
            self.grad_checkpointing = grad_checkpointing
            self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight  # tied embeddings
            self.apply(self._init)
            # GPT-2: scale residual projections by 1/sqrt(2 * n_layer) at init.
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

        @staticmethod
        def _init(m: nn.Module) -> None:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

        def forward(self, idx: torch.Tensor,
                    targets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
            t = idx.shape[1]
            if t > cfg.seq_len:
                raise ValueError(f"sequence of {t} tokens is longer than seq_len {cfg.seq_len}")
            pos = torch.arange(t, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            logits = self.lm_head(self.ln_f(x))
            loss = None
            if targets is not None:
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                       targets.reshape(-1))
            return logits, loss

    return GPT()
