"""RMSNorm through torch's fused ``F.rms_norm`` (the ``kernels.rms_norm`` decision, applied at the FSDP engine's
model build by ``seams.model_kernels``).

Why: HF's RMSNorm classes (``Qwen2RMSNorm``, ``LlamaRMSNorm``, ...) compute pow, mean, add, rsqrt, mul, mul in
eager ops, with the input upcast to fp32: six kernels and six passes over the activations per norm, more in the
backward and again in a checkpointed layer's recompute. ``F.rms_norm`` is one kernel each way on CUDA (torch
registers a fused backward for CUDA, not for the CPU). Measured on the H200 in one run
(``benchmarks/rms_norm_kernels.py``, ``benchmarks/results/rms_norm_kernels_h200_{p40,t4}.json``): a Qwen2
decoder layer's forward + backward at 2,048 tokens 0.97x in fp32 and 0.81x in fp16.

Which classes: any module whose class name ends in ``RMSNorm`` and whose own forward gives ``F.rms_norm``'s
values on a probe (random input and weight, fp32, on the CPU) within fp32 rounding. A variant with other math
(Gemma's ``1 + weight``, a norm without a weight, extra attributes) fails the probe and keeps its forward; each
class is probed once per process.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger("verl_compat.norms")

_PROBE_WIDTH = 64
_probed: dict[type, bool] = {}


def _eps(norm: Any) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(norm, name, None)
        if isinstance(value, int | float):
            return float(value)
    return None


class FusedForward:
    """One norm's forward through ``F.rms_norm``, set as that module's ``forward``; an object rather than a bound
    method so that a model holding it pickles (``torch.save(model)``) and deep-copies like any other. A weight in
    another dtype than the input (HF's classes then return the promoted dtype) goes through the class's forward."""

    def __init__(self, norm: torch.nn.Module, eps: float):
        self.norm, self.eps = norm, eps

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        if norm.weight.dtype != hidden_states.dtype:
            return type(norm).forward(norm, hidden_states)
        return F.rms_norm(hidden_states, (hidden_states.shape[-1],), norm.weight, self.eps)


def is_fused(module: torch.nn.Module) -> bool:
    return isinstance(module.__dict__.get("forward"), FusedForward)


def _probe(cls: type, eps: float) -> bool:
    """True when ``cls.forward`` computes ``F.rms_norm`` (weight scaled, this eps) on a probe instance."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(_PROBE_WIDTH, generator=gen)
    x = torch.randn(3, _PROBE_WIDTH, generator=gen) * 3
    probe = cls.__new__(cls)
    torch.nn.Module.__init__(probe)
    probe.weight = torch.nn.Parameter(weight)
    probe.variance_epsilon = probe.eps = eps
    try:
        with torch.no_grad():
            theirs = cls.forward(probe, x)
    except Exception:  # noqa: BLE001 - a forward that needs more than weight and eps is not the plain RMSNorm
        return False
    if not isinstance(theirs, torch.Tensor) or theirs.shape != x.shape:
        return False
    ours = F.rms_norm(x, (_PROBE_WIDTH,), weight, eps)
    return bool(torch.allclose(theirs.float(), ours, rtol=1e-5, atol=1e-6))


def is_plain_rms_norm(module: torch.nn.Module) -> bool:
    cls = type(module)
    if not cls.__name__.endswith("RMSNorm") or is_fused(module):
        return False
    weight = getattr(module, "weight", None)
    eps = _eps(module)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None:
        return False
    if cls not in _probed:
        _probed[cls] = _probe(cls, eps)
        if not _probed[cls]:
            log.info("%s keeps its own forward: it does not compute F.rms_norm's values", cls.__qualname__)
    return _probed[cls]


def fuse_rms_norms(model: torch.nn.Module) -> int:
    """Route every plain RMSNorm of ``model`` through ``F.rms_norm`` (an instance-level forward: parameters,
    state dict and FSDP wrapping are untouched); returns how many modules now use it."""
    count = 0
    for module in model.modules():
        if is_plain_rms_norm(module):
            module.forward = FusedForward(module, _eps(module))
            count += 1
    return count


def fused_count(model: torch.nn.Module) -> int:
    return sum(is_fused(m) for m in model.modules())
