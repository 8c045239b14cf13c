"""Memory resolvers. The plan (micro-batches, offload, gradient checkpointing, the rollout's batch / KV budget)
comes from `verl_compat.planner` (`resolve_plan`); the single-key resolvers below only report.
"""

from __future__ import annotations

from verl_compat.decision import Decision
from verl_compat.planner.resolve import export_shares, is_auto  # noqa: F401  (used by the policy)
from verl_compat.planner.resolve import plan_decisions as resolve_plan  # noqa: F401
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
