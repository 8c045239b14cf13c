"""`ModelShape`: what the planner needs to know about a decoder-only transformer, read from its config alone."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """From a transformers PretrainedConfig or a plain dict (config.json); multimodal configs use text_config."""
        get = (
            (lambda k, d=None: config.get(k, d))
            if isinstance(config, Mapping)
            else (lambda k, d=None: getattr(config, k, d))
        )
        text = get("text_config")
        if text is not None:
            return cls.from_config(text)
        needed = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
        missing = [k for k in needed if get(k) is None]
        if missing:
            raise ValueError(f"model config lacks {', '.join(missing)}: not a decoder-only transformer config")
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        return cls(
            layers=int(get("num_hidden_layers")),
            hidden=hidden,
            intermediate=int(get("intermediate_size") or 4 * hidden),
            heads=heads,
            kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or hidden // heads),
            vocab=int(get("vocab_size")),
            tied_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=bool(get("attention_bias", False)) or get("model_type") in ("qwen2",),
        )

    @classmethod
    def from_path(cls, path: str, trust_remote_code: bool = False) -> ModelShape:
        """transformers' AutoConfig on a local folder (config.json only: no weights are read)."""
        from transformers import AutoConfig

        if not os.path.isdir(path):  # a hub id: only what is already in the local cache, never a download here
            try:
                return cls.from_config(AutoConfig.from_pretrained(path, local_files_only=True))
            except Exception as e:
                raise FileNotFoundError(f"no model folder at {path!r} (and no cached hub config: {e})") from e
        return cls.from_config(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))

    # parameter counts --------------------------------------------------------------------------------------------
    @cached_property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @cached_property
    def layer_params(self) -> int:
        q_out = self.heads * self.head_dim
        attn = self.hidden * q_out + 2 * self.hidden * self.kv_dim + q_out * self.hidden
        if self.qkv_bias:
            attn += q_out + 2 * self.kv_dim
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down (SwiGLU)
        return attn + mlp + 2 * self.hidden  # two RMSNorm weights

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @cached_property
    def lm_params(self) -> int:
        """The causal LM (actor, reference, rollout)."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.embedding_params + self.layers * self.layer_params + self.hidden + head

    @cached_property
    def value_params(self) -> int:
        """verl's critic: the same body with a hidden -> 1 value head instead of the LM head."""
        return self.embedding_params + self.layers * self.layer_params + self.hidden + self.hidden + 1

    @cached_property
    def largest_unit_params(self) -> int:
        """The largest FSDP unit (verl wraps each decoder layer; the root holds embeddings and the LM head)."""
        root = self.embedding_params * (1 if self.tied_embeddings else 2)
        return max(root, self.layer_params)

    # per-token sizes ---------------------------------------------------------------------------------------------
    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.layers * 2 * self.kv_dim * dtype_bytes

    def saved_activation_elems_per_token_layer(self) -> int:
        """Elements autograd keeps per token and layer (no recompute). Attention through SDPA's memory-efficient
        or varlen kernels keeps no L x L matrix; K/V are counted once more for the expansion to all heads (GQA)."""
        return 8 * self.hidden + 4 * self.intermediate + 2 * self.kv_dim + 2 * self.heads * self.head_dim

    def forward_transient_elems_per_token(self) -> int:
        """Largest set of live intermediates of one layer in a no-grad forward (the MLP's gate/up/act)."""
        return 2 * self.hidden + 3 * self.intermediate

    def train_flops_per_token(self, params: int) -> float:
        return 6.0 * params

    def describe(self) -> str:
        return (
            f"{self.lm_params / 1e9:.2f}B params ({self.layers} layers, hidden {self.hidden}, "
            f"{self.heads}/{self.kv_heads} heads, vocab {self.vocab})"
        )
