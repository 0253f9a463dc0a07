"""The LM: shapes, tied weights, the FLOP formula's parameter count, gradient checkpointing."""

from __future__ import annotations

import dataclasses

import pytest

from cpuperf.train.model import PRESETS, flops_per_token, make_config, non_embedding_params

torch = pytest.importorskip("torch")

from cpuperf.train.model import build_model  # noqa: E402

CFG = make_config("micro", vocab_size=300)


def test_presets_have_the_documented_shapes() -> None:
    assert PRESETS["tiny"] == dataclasses.replace(PRESETS["tiny"], n_layer=4, n_head=4,
                                                  d_model=256, seq_len=128)
    g = PRESETS["gpt2-small"]
    assert (g.n_layer, g.n_head, g.d_model, g.seq_len) == (12, 12, 768, 1024)
    with pytest.raises(ValueError, match="divisible"):
        make_config("micro", {"n_head": 3})


def test_forward_shapes_and_loss() -> None:
    torch.manual_seed(0)
    m = build_model(CFG)
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len))
    logits, loss = m(x)
    assert logits.shape == (3, CFG.seq_len, CFG.vocab_size) and loss is None
    logits, loss = m(x[:, :10], x[:, 1:11])
    assert logits.shape == (3, 10, CFG.vocab_size)
    # At init the prediction is near uniform: loss ~ ln(vocab).
    assert abs(float(loss.detach()) - torch.log(torch.tensor(float(CFG.vocab_size)))) < 0.3
    with pytest.raises(ValueError, match="longer than seq_len"):
        m(torch.zeros(1, CFG.seq_len + 1, dtype=torch.long))


def test_causal_future_tokens_do_not_change_past_logits() -> None:
    m = build_model(CFG).eval()
    x = torch.randint(0, CFG.vocab_size, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % CFG.vocab_size
    with torch.no_grad():
        a, _ = m(x)
        b, _ = m(y)
    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-6)
    assert not torch.allclose(a[0, 8:], b[0, 8:])


def test_tied_embeddings_and_param_count() -> None:
    m = build_model(CFG)
    assert m.lm_head.weight is m.wte.weight
    total = sum(p.numel() for p in m.parameters())
    emb = CFG.vocab_size * CFG.d_model + CFG.seq_len * CFG.d_model
    assert total - emb == non_embedding_params(CFG)
    n = non_embedding_params(CFG) + CFG.d_model * CFG.vocab_size
    assert flops_per_token(CFG) == 6 * n + 12 * CFG.n_layer * CFG.d_model * CFG.seq_len


def test_gradient_checkpointing_matches() -> None:
    torch.manual_seed(0)
    a = build_model(CFG)
    b = build_model(CFG, grad_checkpointing=True)
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len + 1))
    _, la = a(x[:, :-1], x[:, 1:])
    _, lb = b(x[:, :-1], x[:, 1:])
    la.backward()
    lb.backward()
    assert torch.allclose(la, lb)
    assert torch.allclose(a.blocks[0].fc.weight.grad, b.blocks[0].fc.weight.grad, atol=1e-6)
