"""A micro-batch moved to the device without rebuilding its per-sample non-tensor fields (kernels.batch_moves).

verl's FSDP engine moves every micro-batch with `TensorDict.to(device)` (transformer_impl.py forward_step). The
batches of verl's v1 trainer carry about twenty per-sample non-tensor fields (raw_prompt, reward_model,
extra_info, tools_kwargs, ...) as NonTensorStacks, and `TensorDict.to` rebuilds each of their elements as a new
NonTensorData: 23-31 ms for a 32-row batch on a 2-core CPU, where moving it here takes 0.26-0.57 ms
(`python benchmarks/batch_moves.py`, benchmarks/results/batch_moves_cpu.json), in every pass of every step, with
the GPU idle. Non-tensor data has no device, so here the tensors (nested ones included) are moved as
`TensorDict.to` moves them and the non-tensor entries are kept as they are; the result is a TensorDict on
`device` with the same keys, batch size and values.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.tensorclass import NonTensorData, NonTensorStack


def to_device(batch: TensorDictBase, device: Any) -> TensorDictBase:
    """`batch.to(device)` with its non-tensor entries shared instead of rebuilt.

    Only a plain TensorDict is taken apart (lazy stacks and other TensorDict kinds go through their own `.to`);
    its tensors, nested TensorDicts and anything else are moved exactly as `TensorDict.to` would move them.
    """
    if type(batch) is not TensorDict:
        return batch.to(device)
    device = torch.device(device)
    moved: dict[str, Any] = {}
    for key, value in batch.items():  # non-tensor entries come as their NonTensorData / NonTensorStack wrappers
        if isinstance(value, (NonTensorData, NonTensorStack)):
            moved[key] = value  # no device: nothing to move
        elif type(value) is TensorDict:
            moved[key] = to_device(value, device)
        else:
            moved[key] = value.to(device)
    # every value is already on `device` (or has none): tensordict's unchecked constructor, as its own .to uses
    # (the checked one would move, that is rebuild, the non-tensor entries again)
    return TensorDict._new_unsafe(moved, batch_size=batch.batch_size, device=device, names=_names(batch))


def _names(batch: TensorDict) -> Any:
    return batch.names if batch._has_names() else None
