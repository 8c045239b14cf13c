"""verl's torch log-prob fallback per block of tokens (verl_compat.logprobs) against upstream's per-token loop
(the seam that picks between them: tests/test_seams.py)."""

from __future__ import annotations

import pytest
import torch

from verl.utils import torch_functional as verl_F
from verl_compat.logprobs import block_rows, logprobs_blocked


def _case(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype).requires_grad_(True)
    labels = torch.randint(0, vocab, (rows,), generator=g)
    return logits, labels


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 0.0)])
def test_values_and_gradients_equal_upstreams_loop(dtype: torch.dtype, tol: float) -> None:
    # a block size that splits the rows unevenly (3 blocks of 7 and one of 2)
    logits, labels = _case(23, 1000, dtype)
    block = 7 * 1000 * logits.element_size()
    ours = logprobs_blocked(logits, labels, block_bytes=block)
    (g_ours,) = torch.autograd.grad(ours.float().sum(), logits)
    theirs = verl_F.logprobs_from_logits_v2(logits, labels)
    (g_theirs,) = torch.autograd.grad(theirs.float().sum(), logits)
    assert ours.shape == theirs.shape == (23,) and ours.dtype == theirs.dtype
    # half precision: the same log_softmax per row, so the same bits
    assert (ours.double() - theirs.double()).abs().max().item() <= tol
    assert (g_ours.double() - g_theirs.double()).abs().max().item() <= max(tol, 1e-7)


def test_keeps_the_leading_shape_and_handles_empty_input() -> None:
    logits, labels = _case(12, 50, torch.float32)
    out = logprobs_blocked(logits.view(3, 4, 50), labels.view(3, 4), block_bytes=1)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    assert out.shape == (3, 4) and torch.allclose(out.reshape(-1), ref, atol=1e-6)
    empty = logprobs_blocked(torch.zeros(0, 50), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


def test_block_rows_bounds_the_working_tensor() -> None:
    # Qwen2.5's vocabulary in fp32: 110 rows of 151,936 entries fit 64 MiB; a single row always fits
    assert block_rows(151936, 4) == 110 and 110 * 151936 * 4 <= 64 << 20 < 111 * 151936 * 4
    assert block_rows(151936, 4, block_bytes=16) == 1
