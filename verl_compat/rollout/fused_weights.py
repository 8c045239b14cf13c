"""One storage for the projections the fast decoder fuses: each layer's q|k|v and gate|up weights (and biases)
as adjacent views of one buffer, so one GEMM reads what three or two did.

Why: a graphed decode step at small batch costs about one kernel's minimum time per kernel; fusing these cut it
by 13-17% on the H200 for the Qwen2.5-0.5B shape in fp32 (batch 1-64) and fp16 at batch 1, 5% in fp16 at 64
(``benchmarks/decode_step_kernels.py``, results in ``benchmarks/results/decode_step_kernels_h200.json``).

The parameters stay the modules' own objects (only their ``.data`` becomes a view), so weight sync (``copy_`` in
place), ``state_dict`` and the HF forward see no difference and no weight is held twice. Anything that gives a
parameter fresh storage (a move between devices, a sleep that discards the weights) undoes the layout: ``pack``
restores it by copying, and ``fused`` answers None for a group that is not adjacent, so the caller falls back
to one GEMM per projection.
"""

from __future__ import annotations

import torch
from torch import nn


def _adjacent(tensors: list[torch.Tensor]) -> bool:
    """Contiguous, same storage, each starting where the previous one ends, same trailing shape."""
    first = tensors[0]
    if any(t.numel() == 0 for t in tensors):  # released by a discarding sleep: nothing to fuse
        return False
    end = first.data_ptr()
    for t in tensors:
        if (
            not t.is_contiguous()
            or t.shape[1:] != first.shape[1:]
            or t.dtype != first.dtype
            or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or t.data_ptr() != end
        ):
            return False
        end += t.numel() * t.element_size()
    return True


def fused(params: list[nn.Parameter] | None) -> torch.Tensor | None:
    """One tensor over ``params`` stacked along dim 0 (a view, no copy), or None when they are not adjacent."""
    if not params:
        return None
    data = [p.data for p in params]
    if not _adjacent(data):
        return None
    rows = sum(t.shape[0] for t in data)
    shape = (rows, *data[0].shape[1:])
    return data[0].as_strided(shape, torch.empty(shape, device="meta").stride())


def bind(params: list[nn.Parameter], shapes: list[torch.Size], buffer: torch.Tensor) -> None:
    """Make ``params`` consecutive views of the flat ``buffer``, in order, with ``shapes``."""
    start = 0
    for param, shape in zip(params, shapes, strict=True):
        param.data = buffer[start : start + shape.numel()].view(shape)
        start += shape.numel()


@torch.no_grad()
def pack(params: list[nn.Parameter]) -> bool:
    """Give ``params`` adjacent storage holding their current values; True when anything moved."""
    if not params or any(p.numel() == 0 for p in params) or _adjacent([p.data for p in params]):
        return False
    bind(params, [p.shape for p in params], torch.cat([p.data.reshape(-1) for p in params]))
    return True


class Projections:
    """Linears that read one input (a layer's q, k, v; or gate, up), fused as one GEMM when their storage allows."""

    def __init__(self, linears: list[nn.Linear]):
        self.weights = [lin.weight for lin in linears]
        biases = [lin.bias for lin in linears]
        # a mixed set (some with a bias, some without) keeps one GEMM per projection
        self.biases = biases if all(b is not None for b in biases) else None
        self.fusable = self.biases is not None or all(b is None for b in biases)

    def groups(self) -> list[list[nn.Parameter]]:
        """The parameter lists that must each be adjacent for ``fused``."""
        if not self.fusable:
            return []
        return [self.weights] + ([self.biases] if self.biases else [])

    def pack(self) -> bool:
        """Adjacent storage for the weights (and biases); True when anything moved."""
        moved = [pack(group) for group in self.groups()]
        return any(moved)

    def fused(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``(weight [sum out, in], bias [sum out] or None)`` as views, or None when the storage is not adjacent."""
        if not self.fusable:
            return None
        weight = fused(self.weights)
        bias = fused(self.biases) if self.biases else None
        if weight is None or (self.biases and bias is None):
            return None
        return weight, bias


def decoder_projections(model: nn.Module) -> list[tuple[Projections, Projections]]:
    """``(q|k|v, gate|up)`` of every layer of a Llama-style decoder (``model.model.layers[i].self_attn.q_proj`` ...),
    or ``[]`` for any other layout."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return []
    out = []
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        qkv = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
        gate_up = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj")]
        if not all(isinstance(lin, nn.Linear) for lin in qkv + gate_up):
            return []
        out.append((Projections(qkv), Projections(gate_up)))
    return out


def adjacent_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """Every parameter list the fast decoder fuses, for allocating them adjacently in the first place."""
    return [group for layer in decoder_projections(model) for proj in layer for group in proj.groups()]


def pack_model(model: nn.Module) -> int:
    """Lay out every fused group of ``model`` adjacently (copying); the number of groups that moved. Called where
    the weights get fresh storage and before the KV cache takes the free memory."""
    return sum(pack(group) for group in adjacent_groups(model))
