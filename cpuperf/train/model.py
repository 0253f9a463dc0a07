"""A small decoder-only transformer LM (GPT-2 shape): pre-LN, causal SDPA, GELU MLP, tied embeddings.

ModelConfig and flops_per_token() are torch-free; build_model() imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model. vocab_size is normally taken from the tokenizer."""

    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    seq_len: int = 128
    vocab_size: int = 768
    mlp_ratio: int = 4

    def validate(self) -> None:
        """ValueError when the heads do not divide the width."""
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}")


PRESETS: dict[str, ModelConfig] = {
    # CPU default: ~3.3M parameters; ~20+ samples/s fp32 at batch 16 on 2 Zen 3 cores.
    "tiny": ModelConfig(n_layer=4, n_head=4, d_model=256, seq_len=128),
    # GPT-2 small's shape (Radford et al. 2019): for GPUs. With our 768-id BPE it has ~85M params.
    "gpt2-small": ModelConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024),
    # For tests and smoke runs: fast on any machine.
    "micro": ModelConfig(n_layer=2, n_head=2, d_model=64, seq_len=32),
}


def make_config(preset: str, overrides: Optional[dict[str, Any]] = None,
                vocab_size: Optional[int] = None) -> ModelConfig:
    """Preset shape with `overrides` applied; vocab_size (from the tokenizer) wins unless overridden."""
    cfg = PRESETS[preset]
    if vocab_size is not None:
        cfg = dataclasses.replace(cfg, vocab_size=vocab_size)
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    cfg.validate()
    return cfg


def non_embedding_params(cfg: ModelConfig) -> int:
    """Parameters outside the token/position embeddings (weights + biases + LayerNorms)."""
    d, h = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    per_layer = (
        2 * 2 * d  # two LayerNorms
        + 3 * d * d + 3 * d  # qkv
        + d * d + d  # attention output projection
        + d * h + h + h * d + d  # MLP
    )
    return cfg.n_layer * per_layer + 2 * d  # + final LayerNorm


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token (forward + backward): 6 * N + 12 * n_layer * d_model * seq_len.

    The formula is PaLM's (Chowdhery et al. 2022, arXiv:2204.02311, Appendix B): 6N for the dense
    matmuls plus 12 * L * H * Q * T (= 12 * L * d_model * T) for attention scores and the weighted
    sum, counting the full T x T matrix as PaLM does (no credit for the causal mask). N here is the
    non-embedding parameters plus the output projection (d_model * vocab), because the tied
    un-embedding is a real matmul on every token even though its weights are shared with the
    lookup table (as in Kaplan et al. 2020, arXiv:2001.08361, Table 1, which counts n_vocab * d).
    """
    n = non_embedding_params(cfg) + cfg.d_model * cfg.vocab_size
    return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * cfg.seq_len


def build_model(cfg: ModelConfig, grad_checkpointing: bool = False) -> Any:
    """A torch nn.Module LM for `cfg`: forward(idx, targets=None) -> (logits, loss or None)."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            hd = c // cfg.n_head
            q, k, v = self.qkv(x).view(b, t, 3, cfg.n_head, hd).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.d_model)
            self.attn = CausalSelfAttention()
            self.ln2 = nn.LayerNorm(cfg.d_model)
            self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
            self.fc_proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
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

        def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
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
