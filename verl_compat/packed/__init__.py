"""Packed sequences (verl's `use_remove_padding`) without flash-attn: a transformers attention implementation,
`sdpa_varlen`, registered with transformers' AttentionInterface (see attention.py)."""

from verl_compat.packed.attention import VARLEN, packed_segments, register, register_if_used, sdpa_varlen_attention

__all__ = ["VARLEN", "packed_segments", "register", "register_if_used", "sdpa_varlen_attention"]
