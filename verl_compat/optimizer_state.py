"""AdamW's offloaded state brought to the card for the optimizer step, not for the whole update.

Under `optimizer_offload` verl moves an engine's optimizer state to the GPU when the engine enters train mode
(`BaseEngineCtx`, engine/base.py) and back to the host when it leaves. The micro-batches' forward and backward
passes never read the state, yet they run with it on the card: weights, gradients, two fp32 moments of every
parameter and the activations together make an update the trainer's largest phase (a 0.5B model's moments are
3.7 GiB in fp32). `optimizer.step()` runs after the last backward, when the activations are gone; bringing the
state there takes those bytes off the update's peak, and the memory plan gives them to larger micro-batches
(verl_compat.planner.estimate). Leaving train mode moves the state back to the host as upstream does; an update
of several mini-batches (or epochs) keeps it on the card from its first step on, as upstream would.

Only verl's FSDP engine's `optimizer_step` carries the seam that brings the state (patch 0020); an engine that
overrides it (VeOmni, fsdp_turbo, Megatron, ...) keeps upstream's load at entry (`engine_step` below).
"""

from __future__ import annotations

from typing import Any

SEAMED_STEP = "FSDPEngine.optimizer_step"  # the qualified name of the patched method


def engine_step(engine: Any) -> bool:
    """Does this engine's optimizer_step bring the state itself (the patched FSDPEngine method, not an override)?"""
    step = getattr(type(engine), "optimizer_step", None)
    return getattr(step, "__qualname__", "") == SEAMED_STEP


def state_device(optimizer: Any) -> str | None:
    """The device type of the optimizer's state tensors ("cpu", "cuda"), None before the first step."""
    for state in getattr(optimizer, "state", {}).values():
        for value in state.values():
            if hasattr(value, "device") and value.dim() > 0:  # AdamW's scalar `step` may stay on the host
                return value.device.type
    return None


def bring_for_step(engine: Any, device: str) -> bool:
    """Move the state onto `device` for the step (verl's own mover; the seam asks only under optimizer offload).
    True when something moved."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return False
    where = state_device(optimizer)
    if where is None or where == device:  # no state yet (torch creates it on the device at the first step)
        return False
    engine.to(device=device, model=False, optimizer=True, grad=False)
    return True
