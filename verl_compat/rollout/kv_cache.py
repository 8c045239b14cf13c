"""A static, slot-addressed KV cache for the hf rollout engine, and the attention function that reads it.

One preallocated tensor ``[layers, 2, slots, kv_heads, max_len + 1, head_dim]`` holds every running sequence; a
request owns one slot for its whole life, so continuous batching only rewrites a slot's rows. Column ``max_len``
is scratch: padding tokens of a batched prefill write there and no mask ever lets a query read it.

The HF model is driven unchanged: its attention modules call ``past_key_values.update(k, v, layer_idx)`` (duck
typed, transformers 5.x) and then the registered attention function below, which receives our 4D additive mask
(transformers returns a prepared 4D mask as-is). Decode (one query per row) attends over the slot's whole static
row with grouped matmuls, ``[b, kv, group, d] @ [b, kv, d, L]``, so GQA never materialises repeated K/V and the
shapes are fixed per batch size, which a CUDA graph needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig

ATTENTION_NAME = "verl_compat_slots"


def slot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query ``[b, h, q, d]``, key/value ``[b, kv, k, d]``, additive mask ``[b, 1, q, k]`` -> ``[b, q, h, d]``."""
    b, h, q, d = query.shape
    kv = key.shape[1]
    scale = scaling if scaling is not None else d**-0.5
    if q == 1:
        qg = query.reshape(b, kv, h // kv, d)
        scores = torch.matmul(qg, key.transpose(-1, -2)) * scale
        if attention_mask is not None:
            scores = scores + attention_mask  # [b, 1, 1, k] broadcasts over kv heads and the group
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        out = torch.matmul(probs, value)  # [b, kv, group, d]
        return out.reshape(b, 1, h, d), None
    # Prefill: a fresh prompt attends to itself only (the cache holds nothing before it).
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scale, enable_gqa=kv != h)
    return out.transpose(1, 2), None


AttentionInterface.register(ATTENTION_NAME, slot_attention)


def check_supported(config: PretrainedConfig) -> None:
    """The slot cache assumes full causal attention in every layer and plain softmax attention."""
    from verl_compat.errors import IncompatibleRequestError

    text = getattr(config, "text_config", None) or config
    layer_types = set(getattr(text, "layer_types", None) or ["full_attention"])
    unsupported = layer_types - {"full_attention"}
    if getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None):
        unsupported.add("sliding_attention")
    if getattr(text, "attn_logit_softcapping", None) or getattr(text, "final_logit_softcapping", None):
        unsupported.add("logit softcapping")
    if unsupported:
        raise IncompatibleRequestError(
            key="actor_rollout_ref.rollout.name",
            value="hf",
            device=f"the model in actor_rollout_ref.model.path ({type(config).__name__})",
            reason=f"the hf rollout engine's static KV cache supports full causal attention only; the model uses "
            f"{sorted(unsupported)}",
            fix="use a model with full attention in every layer, or rollout.name=vllm on a device that runs vLLM",
        )


def kv_shape(config: PretrainedConfig) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder config."""
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, kv_heads, head_dim


def bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    layers, kv_heads, head_dim = kv_shape(config)
    return layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class SlotKVCache:
    """The cache object handed to the model as ``past_key_values``. Before each forward the caller says which
    slots and positions the forward's tokens go to (:meth:`for_decode` / :meth:`for_prefill`)."""

    def __init__(self, config: PretrainedConfig, slots: int, max_len: int, dtype: torch.dtype, device):
        self.layers, self.kv_heads, self.head_dim = kv_shape(config)
        self.slots, self.max_len = int(slots), int(max_len)
        self.scratch = self.max_len  # index of the scratch column
        self.data = torch.zeros(
            self.layers, 2, self.slots, self.kv_heads, self.max_len + 1, self.head_dim, dtype=dtype, device=device
        )
        self._decode_rows = 0
        self._positions: torch.Tensor | None = None  # decode: [b]; prefill: [u, q] write columns
        self._slot_index: torch.Tensor | None = None  # prefill: [u, 1]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    # transformers reads these on some paths; the engine always passes position_ids and a 4D mask.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    @property
    def is_compileable(self) -> bool:
        return False

    def for_decode(self, rows: int, positions: torch.Tensor) -> None:
        """Slots ``[0, rows)`` each write one token at ``positions[i]`` and read their whole row."""
        self._decode_rows, self._positions, self._slot_index = rows, positions, None

    def for_prefill(self, slot_index: torch.Tensor, write_columns: torch.Tensor) -> None:
        """Row ``i`` of the forward writes its tokens into slot ``slot_index[i]`` at ``write_columns[i]``."""
        self._decode_rows, self._positions, self._slot_index = 0, write_columns, slot_index.view(-1, 1)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        k_cache, v_cache = self.data[layer_idx, 0], self.data[layer_idx, 1]
        if self._decode_rows:
            b = self._decode_rows
            rows = torch.arange(b, device=key.device)
            k_cache[rows, :, self._positions] = key[:, :, 0]
            v_cache[rows, :, self._positions] = value[:, :, 0]
            return k_cache[:b], v_cache[:b]
        # Advanced indices on dims 0 and 2 around a slice put the indexed dims first: [u, q, kv, d].
        k_cache[self._slot_index, :, self._positions] = key.transpose(1, 2)
        v_cache[self._slot_index, :, self._positions] = value.transpose(1, 2)
        return key, value

    def copy_slot(self, src: int | torch.Tensor, dst: torch.Tensor) -> None:
        """Give slots ``dst`` the cache contents of ``src`` (prefix sharing, compaction)."""
        self.data[:, :, dst] = self.data[:, :, src].unsqueeze(2) if isinstance(src, int) else self.data[:, :, src]


def decode_mask(positions: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[b, 1, 1, width]``: row ``i`` sees columns ``0..positions[i]`` (never the scratch one)."""
    cols = torch.arange(width, device=positions.device)
    visible = cols.unsqueeze(0) <= positions.unsqueeze(1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min).view(-1, 1, 1, width)


def prefill_mask(lengths: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal mask ``[u, 1, q, q]`` for left-padded prompts. Padding queries see themselves only, so no
    row is fully masked (that would give NaN, which the scratch column would then carry)."""
    device = lengths.device
    cols = torch.arange(width, device=device)
    real = cols.unsqueeze(0) >= (width - lengths).unsqueeze(1)  # [u, q]
    causal = cols.unsqueeze(1) >= cols.unsqueeze(0)  # [q, k]
    visible = (causal.unsqueeze(0) & real.unsqueeze(1)) | torch.eye(width, dtype=torch.bool, device=device)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min).unsqueeze(1)
