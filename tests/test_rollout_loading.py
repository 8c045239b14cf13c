"""The rollout's random-weight build (load_format=dummy): tied weights allocated once, every tensor initialised,
RoPE buffers as the model's own init computes them."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from verl_compat.rollout.loading import load_causal_lm


def _small(cls, tied: bool):
    return cls(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=tied,
    )


def test_tied_embedding_is_one_tensor_and_nothing_is_left_unset():
    model = load_causal_lm(_small(Qwen2Config, True), dtype=torch.float32, attn_implementation="sdpa", dummy=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len({t.data_ptr() for t in model.parameters()}) == len(list(model.parameters()))
    assert not any(t.isnan().any() for t in [*model.parameters(), *model.buffers()])
    assert torch.equal(model.model.norm.weight, torch.ones(64))
    plain = AutoModelForCausalLM.from_config(_small(Qwen2Config, True))
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq)
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 512) and torch.isfinite(logits).all()


def test_untied_model_keeps_two_matrices():
    model = load_causal_lm(_small(LlamaConfig, False), dtype=torch.float32, attn_implementation="sdpa", dummy=True)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert not any(t.isnan().any() for t in model.parameters())
