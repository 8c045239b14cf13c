"""The memory planner: from the card's memory, the model's shape (config.json only, no weights), the sequence
lengths, batch sizes, algorithm, dtypes and rollout engine, choose micro-batch sizes, offload, gradient
checkpointing and the rollout's batch / KV budget so that every process on the card fits with stated headroom.

- `shape.ModelShape`: parameter counts and per-token sizes from a transformers config.
- `estimate`: bytes of each part (weights, grads, optimizer state, activations, KV cache, contexts) per phase.
- `search.plan_job`: the fastest plan that fits (by a small step-time model), keeping every value the user set.
- `job.JobSpec.from_verl_config` / `verl_keys`: what a verl config asks for, and where a plan is written.
"""

from verl_compat.planner.job import JobSpec
from verl_compat.planner.search import MemoryPlan, PlanError, plan_job
from verl_compat.planner.shape import ModelShape

__all__ = ["JobSpec", "MemoryPlan", "ModelShape", "PlanError", "plan_job"]
