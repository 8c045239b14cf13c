"""Release the GPU copy FSDP1 leaves behind when a one-GPU model moves its parameters to the host.

With NO_SHARD (FSDP1 on one rank) and no param mixed precision (fp32 compute, the P40 policy), moving a flat
parameter to the host (the reference's CPUOffload after each forward, verl's offload_fsdp_model_to_cpu for actor
and critic) makes a new tensor, but views of the old GPU tensor survive: the module's parameter attributes with
use_orig_params=False, the views FSDP saves for a backward (`FlatParameter._tensors`) with use_orig_params=True,
which a forward-only pass never runs. Each keeps a whole model on the card (the P40 trainer's snapshots:
benchmarks/results/p40_h200_resident_*_round_e.json, blocks allocated at FSDP's pre_unshard and at verl's
load_fsdp_model_to_gpu). Under bf16/fp16 the views point into the low-precision copy FSDP frees itself, and
sharded strategies free the unsharded storage: nothing to release there.
"""

from __future__ import annotations

from typing import Any


def stale_handles(module: Any) -> list[Any]:
    """FSDP1 handles whose full-precision, unsharded flat parameter now lives on the host."""
    out = []
    for handle in getattr(module, "_all_handles", None) or ():  # FSDP1 only; FSDP2 moves its own DTensors
        if handle.uses_sharded_strategy or handle._uses_param_mixed_precision:
            continue
        if handle.flat_param.device.type == "cpu":
            out.append(handle)
    return out


def release_moved_views(module: Any) -> int:
    """Point every view of a moved flat parameter at its host tensor, so the old GPU tensor is freed. Returns
    the number of handles re-pointed."""
    handles = stale_handles(module)
    for handle in handles:
        flat = handle.flat_param
        if handle._use_orig_params:
            handle._use_unsharded_views(as_params=True)
            if flat._tensors is not None:  # saved for a backward a forward-only pass never runs
                flat._tensors = [None] * len(flat._tensors)
        else:
            handle._use_unsharded_views(as_params=False)
    return len(handles)
