"""`sdpa_varlen`: transformers' SDPA, plus packed variable-length attention for verl's remove-padding path.

verl packs a micro-batch into one row (attention_mask=None, position_ids restarting at 0 for each sequence) and
relies on flash-attn's varlen kernel. Without flash-attn, transformers' sdpa/eager turn the packing into a dense
N x N block-diagonal mask. This implementation instead finds the sequences from position_ids (or from
cu_seq_lens_q when the caller passes them) and runs:
- on CUDA: torch's own memory-efficient kernel, `aten::_efficient_attention_forward` with cu_seqlens (fp32 and
  fp16 from sm_50; bf16 from sm_80; autograd runs `_efficient_attention_backward`). It has no grouped-query
  support, so K/V heads are expanded to the query heads first (research/varlen-attention.md);
- elsewhere (CPU), or where that op is missing from the torch build: causal SDPA per sequence, O(sum L^2).
Everything that is not packed (padded batches, generation with a KV cache) is plain transformers SDPA with the
mask transformers builds for sdpa. The mask builder registered beside it returns no mask for an unpadded single
row without cache, which is the only case the packed path can be.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger("verl_compat.packed")

VARLEN = "sdpa_varlen"
_registered = False


def packed_segments(position_ids: torch.Tensor | None, length: int, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """cu_seqlens (int32, starting at 0, ending at `length`) when one row holds several sequences, else None."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        cu = cu.to(torch.int32)
        return cu if cu.numel() > 2 else None
    if position_ids is None:
        return None
    pos = position_ids.reshape(-1) if position_ids.dim() == 2 else position_ids[0].reshape(-1)  # mrope: (3, 1, N)
    if pos.numel() != length:
        return None
    starts = torch.nonzero(pos[1:] != pos[:-1] + 1).flatten() + 1
    if starts.numel() == 0:
        return None
    zero = torch.zeros(1, dtype=torch.int32, device=pos.device)
    end = torch.full((1,), length, dtype=torch.int32, device=pos.device)
    return torch.cat([zero, starts.to(torch.int32), end])


_last: tuple[Any, torch.Tensor | None, int] | None = None


def _segments_once(position_ids: Any, length: int, kwargs: dict[str, Any]) -> tuple[torch.Tensor | None, int]:
    """packed_segments for this forward pass: every layer sees the same position_ids tensor, so the segments
    (and the host sync for their longest length) are computed once per forward, not once per layer."""
    global _last
    if _last is not None and position_ids is not None and _last[0] is position_ids and "cu_seq_lens_q" not in kwargs:
        return _last[1], _last[2]
    cu = packed_segments(position_ids, length, kwargs)
    max_len = int((cu[1:] - cu[:-1]).max()) if cu is not None else length
    _last = (position_ids, cu, max_len)
    return cu, max_len


def _expand_kv(t: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    groups = heads // t.shape[dim]
    return t if groups == 1 else t.repeat_interleave(groups, dim=dim)


def _varlen_cuda(q, k, v, cu: torch.Tensor, max_len: int, scale: float | None, dropout: float) -> torch.Tensor:
    """q/k/v (1, heads, N, d) -> (1, N, heads, d) through the memory-efficient kernel's varlen mode."""
    heads = q.shape[1]
    qb = q.transpose(1, 2)  # (1, N, heads, d): the kernel's BMHK layout
    kb = _expand_kv(k, heads, 1).transpose(1, 2)
    vb = _expand_kv(v, heads, 1).transpose(1, 2)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))  # backward needs logsumexp
    # custom_mask_type 1: causal from the top-left of each sequence
    return torch.ops.aten._efficient_attention_forward(
        qb, kb, vb, None, cu, cu, max_len, max_len, dropout, 1, grad, scale=scale
    )[0]


def _varlen_loop(q, k, v, cu: torch.Tensor, scale: float | None, dropout: float) -> torch.Tensor:
    """The same result by causal SDPA over each sequence in turn (CPU, or a torch without the varlen op)."""
    heads = q.shape[1]
    k, v = _expand_kv(k, heads, 1), _expand_kv(v, heads, 1)
    bounds = cu.tolist()
    outs = [
        F.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True, scale=scale, dropout_p=dropout
        )
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
        if e > s
    ]
    return torch.cat(outs, dim=2).transpose(1, 2)


def _cuda_varlen_usable(q: torch.Tensor) -> bool:
    return q.is_cuda and hasattr(torch.ops.aten, "_efficient_attention_forward")


def sdpa_varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function (AttentionInterface signature): returns (output (b, q_len, heads, d), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, _, q_len, _ = query.shape
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    cu = None
    if attention_mask is None and b == 1 and causal and key.shape[2] == q_len:
        cu, max_len = _segments_once(kwargs.get("position_ids"), q_len, kwargs)
    if cu is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError(
            f"attn_implementation={VARLEN}: packed sequences with a sliding window are not supported; "
            "set use_remove_padding=false or attn_implementation=sdpa for this model"
        )
    cu = cu.to(query.device)
    if _cuda_varlen_usable(query):
        out = _varlen_cuda(query, key, value, cu, max_len, scaling, dropout)
    else:
        out = _varlen_loop(query, key, value, cu, scaling, dropout)
    return out, None


def _mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """SDPA's mask, except for one unpadded row without cache (maybe packed): no mask, the attention decides."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and batch_size == 1 and isinstance(q_offset, int) and q_offset == 0:
        return None
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        **kwargs,
    )


def register_if_used(attn_implementation: Any) -> None:
    """Register before a model is built with this implementation: only then, because importing transformers'
    modeling code costs seconds in a process that would not otherwise need it (the driver)."""
    if attn_implementation == VARLEN:
        register()


def register() -> None:
    """Make `attn_implementation="sdpa_varlen"` known to transformers in this process (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, sdpa_varlen_attention)
    AttentionMaskInterface.register(VARLEN, _mask)
    _registered = True
    log.debug("registered attn_implementation=%s", VARLEN)
