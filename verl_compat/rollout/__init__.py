"""The `hf` rollout engine: transformers ``generate`` behind verl's rollout-server interface (no vLLM).

verl needs two registry entries, in every process that builds rollouts (driver, trainer workers, checkpoint
workers); both functions are idempotent and import nothing heavy:

- ``register_adapters(verl.workers.rollout.base._ROLLOUT_REGISTRY)`` adds ``("hf", "async")``;
- ``register_replicas(verl.workers.rollout.replica.RolloutReplicaRegistry)`` adds ``"hf"``.

Modules: ``engine`` (batched generation, Ray/verl independent; scheduler, kv_cache, decode_graph,
device_sampling below it), ``sampling`` (vLLM sampling semantics), ``weights`` (names -> the model's tensors, and
the storage a sleep frees), ``transfer`` (trainer -> server weight sync: CUDA IPC or shared memory, metadata only
through Ray), ``loading``, ``server`` (Ray actor body), ``adapter`` (trainer side), ``replica`` (server launch),
``poll`` (the ReplayBuffer's poll interval, patch 0013), ``stats`` (per-step records, VERL_COMPAT_ROLLOUT_STATS).
"""

from __future__ import annotations

from typing import Any

ROLLOUT_NAME = "hf"
ADAPTER_FQN = "verl_compat.rollout.adapter.HFServerAdapter"


def register_adapters(rollout_registry: dict) -> dict:
    """Add the `hf` server adapter to verl's ``_ROLLOUT_REGISTRY`` (``{(name, mode): class FQN}``)."""
    rollout_registry[(ROLLOUT_NAME, "async")] = ADAPTER_FQN
    return rollout_registry


def _load_hf_replica() -> type:
    from verl_compat.rollout.replica import HFReplica

    return HFReplica


def register_replicas(replica_registry: Any) -> None:
    """Register ``HFReplica`` under "hf" with verl's ``RolloutReplicaRegistry`` (lazy: imported on first use)."""
    replica_registry.register(ROLLOUT_NAME, _load_hf_replica)


def __getattr__(name: str) -> Any:
    # Lazy re-exports: importing this package (done by the registry hooks) must not import torch or ray.
    if name in ("HFGenerationEngine", "GenerationResult", "check_parallel_sizes"):
        from verl_compat.rollout import engine

        return getattr(engine, name)
    if name == "SamplingSpec":
        from verl_compat.rollout.sampling import SamplingSpec

        return SamplingSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADAPTER_FQN",
    "ROLLOUT_NAME",
    "GenerationResult",
    "HFGenerationEngine",
    "SamplingSpec",
    "check_parallel_sizes",
    "register_adapters",
    "register_replicas",
]
