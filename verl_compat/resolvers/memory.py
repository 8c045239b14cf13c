"""Memory resolvers: report-only for now (upstream values kept, with the reason), so the doctor shows them.

Changing offload, micro-batch or gpu_memory_utilization needs measurements per card (DESIGN.md: "measure before
changing"); until then these decisions keep the config's value and say what it means on this device.
"""

from __future__ import annotations

from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import Request, passthrough


def _gib(profile: DeviceProfile) -> str:
    return f"{profile.total_memory_bytes / 2**30:.1f} GiB" if profile.total_memory_bytes else "unknown memory"


def resolve_gpu_memory_utilization(request: Request, profile: DeviceProfile) -> Decision:
    """rollout.gpu_memory_utilization; fact: engine."""
    engine = request.facts.get("engine")
    if engine == "hf":
        why = "the hf engine allocates its KV cache per request and does not read this value"
    elif profile.is_cpu:
        why = "no GPU memory to reserve on a CPU"
    else:
        why = f"{engine} reserves this fraction of {_gib(profile)} for weights + KV cache (upstream value kept)"
    return passthrough(request, profile, [why])


def resolve_param_offload(request: Request, profile: DeviceProfile) -> Decision:
    """fsdp_config.param_offload (actor)."""
    why = "parameters live in host memory already" if profile.is_cpu else f"upstream value kept on {_gib(profile)}"
    return passthrough(request, profile, [why])


def resolve_gradient_checkpointing(request: Request, profile: DeviceProfile) -> Decision:
    """model.enable_gradient_checkpointing."""
    return passthrough(request, profile, ["upstream value kept: recomputes activations to save memory"])
