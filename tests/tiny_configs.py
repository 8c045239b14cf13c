"""The tiny causal-LM shape the rollout tests share: 2 layers, hidden 64, GQA 4/2 heads, vocab 300, EOS 2."""

from __future__ import annotations

from typing import Any

EOS = 2
VOCAB = 300


def tiny_config(config_cls: type, **overrides: Any) -> Any:
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    return config_cls(**{**kwargs, **overrides})
