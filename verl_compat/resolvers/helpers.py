"""How many helper processes verl starts: reward-loop workers and TransferQueue storage units.

Each is a fresh Ray process that imports torch and verl during start-up and keeps them in host memory (after
the imports alone: a reward-loop worker 403 MiB, a storage unit 473 MiB; benchmarks/helper_memory.py).
Upstream's 8 of each is an eight-GPU node's, and the seed recipe offloads parameters and optimizer state into
that same host memory. One of each per GPU below sm_80 and on CPUs; sm_80+ keeps upstream's (the registry's
identity rule); a value the user set is theirs. Agent-loop workers are not in the table: with one, a step's 32
requests reached the rollout over 136-148 ms instead of 16-35 ms and generation took 23% longer than the
engine's own span instead of 8% (benchmarks/results/p40_h200_ppo_head_to_head_round_{e,d}.json, rollout_stats).
"""

from __future__ import annotations

from verl_compat.cpu.sizing import STORAGE_UNITS_KEY, UPSTREAM_STORAGE_UNITS
from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import Option, Registry, Request, choose

# config key -> (doctor name, what it counts, upstream's default, a legacy key that overrides it when set)
HELPERS: dict[str, tuple[str, str, int, str | None]] = {
    "reward.num_workers": (
        "platform.helpers.reward",
        "reward-loop workers",
        8,
        "reward_model.num_workers",  # overrides reward.num_workers when set (reward_loop.py:44)
    ),
    STORAGE_UNITS_KEY: ("platform.helpers.storage", "TransferQueue storage units", UPSTREAM_STORAGE_UNITS, None),
}


def resolve_helpers(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """One HELPERS key; facts: gpus (config_keys.trainer_gpus), what (what the key counts)."""
    upstream, gpus, what = int(request.upstream), int(request.facts.get("gpus", 1)), request.facts.get("what", "")
    count = max(1, min(upstream, gpus))
    options = (Option(count, why=f"{what}: one per GPU for {gpus} GPU(s)", priority=10),)
    if count != upstream:
        options += (Option(upstream, why=f"upstream's {upstream} {what} (an eight-GPU node's)", priority=20),)
    return choose(request, profile, options, registry=registry)
