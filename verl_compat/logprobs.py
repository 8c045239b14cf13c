"""Per-token log-probabilities over the vocabulary in blocks of tokens: verl's torch fallback without its loop.

Where flash-attn's Triton cross-entropy cannot run (no Triton below sm_80, none on CPU), upstream verl computes
log-probs with `logprobs_from_logits_v2`, one `logsumexp` (or `log_softmax`) per token to bound memory. With
packed sequences the logits are (total tokens, vocab), so a micro-batch of 2,000 tokens is 2,000 small kernels
forward and 2,000 autograd nodes backward: measured the largest part of a planned P40 step's log-prob and
update phases (benchmarks/logprob_kernels.py). Here each block of rows is one kernel; the block's working tensor
is bounded by BLOCK_BYTES, so peak memory stays the logits' own (the backward's full-size gradient is the same
as upstream's). Same math as upstream per row: logit[label] - logsumexp(row) in fp32/fp64, log_softmax + gather
in half precision (logsumexp is unstable there, as upstream notes).
"""

from __future__ import annotations

import torch

# The block's transient (its exp or log_softmax copy); 64 MiB is 110 rows of a 151,936-entry fp32 vocabulary.
BLOCK_BYTES = 64 << 20


def block_rows(vocab: int, element_size: int, block_bytes: int = BLOCK_BYTES) -> int:
    """Rows per block so that one block's working tensor stays within `block_bytes` (at least one row)."""
    return max(1, block_bytes // max(1, vocab * element_size))


def logprobs_blocked(logits: torch.Tensor, labels: torch.Tensor, block_bytes: int = BLOCK_BYTES) -> torch.Tensor:
    """log p(label) for logits (..., vocab) and labels (...): the values of upstream's row loop, per block."""
    vocab = logits.shape[-1]
    flat, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    if flat.shape[0] == 0:
        return flat.new_empty(labels.shape)
    rows = block_rows(vocab, flat.element_size(), block_bytes)
    exact_lse = flat.dtype in (torch.float32, torch.float64)
    out = []
    for block, block_labels in zip(flat.split(rows), flat_labels.split(rows), strict=True):
        index = block_labels.unsqueeze(-1)
        if exact_lse:
            out.append(block.gather(-1, index).squeeze(-1) - torch.logsumexp(block, dim=-1))
        else:
            out.append(torch.log_softmax(block, dim=-1).gather(-1, index).squeeze(-1))
    return torch.cat(out).view(labels.shape)
