"""Memory resolvers. The plan (micro-batches, offload, gradient checkpointing, the rollout's batch / KV budget)
comes from `verl_compat.planner` (`resolve_plan`); the single-key resolvers below only report.
"""

from __future__ import annotations

from verl_compat.decision import Decision
from verl_compat.planner.resolve import export_shares, is_auto  # noqa: F401  (used by the policy)
from verl_compat.planner.resolve import plan_decisions as resolve_plan  # noqa: F401
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import Option, Registry, Request, choose, passthrough


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


# After an eval phase verl reshards the root FSDP module only when fsdp_size > 1 (transformer_impl.py, the eval
# context's exit), so on one GPU a forward-only engine (the reference) keeps gathered parameters on the card until
# a later phase reshards them, which for the reference never comes. Measured on a planned P40 step: 1.84 GiB of
# gathered Qwen2.5-0.5B parameters (24 decoder layers and the root) still held after a full step
# (benchmarks/results/p40_h200_resident_after_step.json); the planner counts none of it.
RESHARD_OPTIONS = (
    Option(True, why="reshard every FSDP unit after eval: gathered parameters go back to their shards", priority=10),
    Option(False, why="upstream: the root is resharded after eval only when fsdp_size > 1", priority=20),
)
RESHARD_KEY = "verl's reshard after eval (EngineEvalModeCtx.__exit__)"


def resolve_reshard_after_eval(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """Whether verl-compat reshards all FSDP units after an eval phase; upstream's value is False (its own
    fsdp_size > 1 root reshard is untouched)."""
    return choose(request, profile, RESHARD_OPTIONS, registry=registry)
