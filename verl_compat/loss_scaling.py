"""fp16 loss scaling for verl's FSDP engines (the V100 / T4 / P100 policies train in fp16).

verl builds torch's ``ShardedGradScaler``. Its overflow flags are one-element tensors (shape ``[1]``) where the
plain ``GradScaler``'s are 0-d; torch's fused AdamW (CUDA's and the host's) takes that flag and, after a skipped
step, subtracts it from its 0-d step counters in place, which fails on the shape (``output with shape []
doesn't match the broadcast shape [1]``; pytorch/pytorch#140514). So under fp16 only the per-parameter loop could
step, and on the host (FSDP2's CPU offload policy) the loop is about 5x the fused kernel's time
(benchmarks/host_adamw.py). Here the same scaler hands 0-d views of the same flags: values and the all-reduce are
unchanged, and every AdamW implementation accepts them.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


class ScalarFlagShardedGradScaler(ShardedGradScaler):
    """torch's ShardedGradScaler whose per-device overflow flags are 0-d (views of its own one-element flags)."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):  # type: ignore[override]
        flags = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        return {device: flag.view(()) for device, flag in flags.items()}


def sharded_grad_scaler(**kwargs: Any) -> ShardedGradScaler:
    """The scaler verl's FSDP engine builds for fp16 (its own arguments, e.g. ``growth_interval``), on the device
    that keeps it enabled on this platform (``verl_compat.cpu.grad_scaler_device``)."""
    from verl_compat.cpu import grad_scaler_device

    kwargs.setdefault("device", grad_scaler_device())
    return ScalarFlagShardedGradScaler(**kwargs)
