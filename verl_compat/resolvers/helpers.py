"""How many helper processes verl starts: agent-loop workers, reward-loop workers, TransferQueue storage units.

Each is a fresh Ray process that imports torch, transformers and verl (7-15 s, all of them at once, competing
with the rollout server's and the trainer's own imports: the start-up timelines in
benchmarks/results/p40_h200_ppo_head_to_head_round_d.json) and holds its own host memory. Upstream's 8 of each
is sized for an eight-GPU node; a one- or two-card machine needs one per GPU. sm_80+ keeps upstream's (the
registry's identity rule); a value the user set is theirs.
"""

from __future__ import annotations

from verl_compat.cpu.sizing import STORAGE_UNITS_KEY, UPSTREAM_STORAGE_UNITS
from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import Option, Registry, Request, choose

# config key -> (doctor name, what it counts, upstream's default, a legacy key that overrides it when set)
HELPERS: dict[str, tuple[str, str, int, str | None]] = {
    "actor_rollout_ref.rollout.agent.num_workers": ("platform.helpers.agent", "agent-loop workers", 8, None),
    "reward.num_workers": (
        "platform.helpers.reward",
        "reward-loop workers",
        8,
        "reward_model.num_workers",  # overrides reward.num_workers when set (reward_loop.py:44)
    ),
    STORAGE_UNITS_KEY: ("platform.helpers.storage", "TransferQueue storage units", UPSTREAM_STORAGE_UNITS, None),
}


def per_gpu(upstream: int, gpus: int) -> int:
    return max(1, min(upstream, gpus))


def resolve_helpers(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """One HELPERS key; fact: gpus (trainer.n_gpus_per_node x trainer.nnodes)."""
    _, what, upstream, _ = HELPERS.get(request.key, (None, request.key, request.upstream, None))
    count = per_gpu(int(upstream), int(request.facts.get("gpus", 1)))
    options = (Option(count, why=f"{what}: one per GPU for {request.facts.get('gpus', 1)} GPU(s)", priority=10),)
    if count != upstream:
        options += (Option(upstream, why=f"upstream's {upstream} {what} (an eight-GPU node's)", priority=20),)
    return choose(request, profile, options, registry=registry)
