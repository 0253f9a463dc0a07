"""The built-in model's shapes (GPT-2 style presets), parameter counts and FLOPs per token. Pure.

Shared by the planner (workload, memory plan) and the worker (cpuperf.train.model builds the module).
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
    # The built-in model on hosts with many cores (compat/tuning.toml [builtin_model]): ~19M parameters, 4096-row
    # GEMMs of width 512 at batch 16, ~12x tiny's FLOPs per step.
    "small": ModelConfig(n_layer=6, n_head=8, d_model=512, seq_len=256),
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
