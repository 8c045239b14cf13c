"""How many helper processes verl starts: reward-loop and agent-loop workers and TransferQueue storage units.

Each is a fresh Ray process that imports torch and verl during start-up and keeps them in host memory (after
the imports alone: a reward-loop worker 403 MiB, a storage unit 473 MiB, an agent-loop worker 496 MiB;
benchmarks/helper_memory.py).
Upstream's 8 of each is an eight-GPU node's, and the seed recipe offloads parameters and optimizer state into
that same host memory. Below sm_80 and on CPUs: one reward-loop worker and storage unit per GPU, and two
agent-loop workers per GPU (one on a CPU); sm_80+ keeps upstream's (the registry's identity rule); a value the
user set is theirs.

Agent-loop workers prepare a step's requests (chat template, tokenizer) and send them to the rollout: with one
per GPU, a step's 32 requests reached the rollout over 136-148 ms instead of 16-35 ms with eight, and
generation took 23% longer than the engine's own span instead of 8% (benchmarks/results/
p40_h200_ppo_head_to_head_round_{e,d}.json, rollout_stats). But the eight import torch, transformers and verl at
start-up beside the trainer worker, whose imports are on the start-up's critical path: on a 2-core CPU the
trainer's import took 7.8x as long beside twelve such processes, 3.7x with them at the helpers' lower priority
(benchmarks/results/import_contention_cpu.json), and verl's PPO of SmolLM2-135M reached step 1 at 71-76 s with
two agent-loop workers against 114-155 s with eight (benchmarks/results/startup_cpu_smollm2_ppo_agent_workers.json).
On an H100 simulating a P40 (benchmarks/results/p40_h100_ppo_planned_agent_workers_8_vs_2.json and
..._4_8_reward_8.json, rollout_stats), generation ran past the engine's span by 214-218 ms with two, 204-211 ms
with four and 131-168 ms with eight: eight save 45-80 ms of a 5.1-5.5 s step, less than the same setting moves
between machines, for 3.5 GiB more host memory, so two stay. On a CPU the engine's own decode is slower than any
dispatch, so one is enough.
"""

from __future__ import annotations

from typing import NamedTuple

from verl_compat.cpu.sizing import STORAGE_UNITS_KEY, UPSTREAM_STORAGE_UNITS
from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import Option, Registry, Request, choose

AGENT_WORKERS_KEY = "actor_rollout_ref.rollout.agent.num_workers"


class Helper(NamedTuple):
    name: str  # the doctor's decision name
    what: str  # what the key counts
    upstream: int  # upstream's default
    legacy: str | None  # a legacy key that overrides it when set
    per_gpu: int  # how many per GPU below sm_80 (one of each per rank on a CPU)


HELPERS: dict[str, Helper] = {
    "reward.num_workers": Helper(
        "platform.helpers.reward",
        "reward-loop workers",
        8,
        "reward_model.num_workers",  # overrides reward.num_workers when set (reward_loop.py:44)
        per_gpu=1,
    ),
    STORAGE_UNITS_KEY: Helper(
        "platform.helpers.storage", "TransferQueue storage units", UPSTREAM_STORAGE_UNITS, None, per_gpu=1
    ),
    AGENT_WORKERS_KEY: Helper("platform.helpers.agent", "agent-loop workers", 8, None, per_gpu=2),
}


def resolve_helpers(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """One HELPERS key; facts: gpus (config_keys.trainer_gpus), helper (its HELPERS row)."""
    upstream, gpus, helper = int(request.upstream), int(request.facts.get("gpus", 1)), request.facts["helper"]
    each, unit = (1, "CPU rank") if profile.is_cpu else (helper.per_gpu, "GPU")
    count = max(1, min(upstream, each * gpus))
    options = (Option(count, why=f"{helper.what}: {each} per {unit} for {gpus} {unit}(s)", priority=10),)
    if count != upstream:
        options += (Option(upstream, why=f"upstream's {upstream} {helper.what} (an eight-GPU node's)", priority=20),)
    return choose(request, profile, options, registry=registry)
