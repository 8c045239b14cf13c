"""platform.helpers: one reward-loop worker and TransferQueue storage unit per GPU below sm_80 and on CPUs
(upstream's 8 each is an eight-GPU node's), upstream's on sm_80+, the user's where they set it; agent-loop
workers stay upstream's everywhere."""

from __future__ import annotations

import pytest

from verl_compat.catalog import get_profile
from verl_compat.policy import compose_ppo_config, decide
from verl_compat.resolvers.helpers import HELPERS
from verl_compat.user_keys import RequestedKeys

REWARD, STORAGE = HELPERS
AGENT = "actor_rollout_ref.rollout.agent.num_workers"


def _decide(profile: str, overrides: list[str]):
    config = compose_ppo_config(overrides)
    requested = RequestedKeys(o.split("=", 1)[0].lstrip("+") for o in overrides)
    return decide(config, get_profile(profile), requested)


@pytest.mark.parametrize(("profile", "gpus"), [("p40", 1), ("t4", 2), ("v100", 1), ("cpu", 1)])
def test_one_helper_of_each_kind_per_gpu_below_sm80(profile, gpus):
    decisions, writes = _decide(profile, [f"trainer.n_gpus_per_node={gpus}"])
    for key, (name, _, upstream, _) in HELPERS.items():
        assert writes[key] == gpus and decisions[name].value == gpus and decisions[name].upstream == upstream


def test_sm80_keeps_upstreams_eight():
    decisions, writes = _decide("a100", ["trainer.n_gpus_per_node=1"])
    for key, (name, _, upstream, _) in HELPERS.items():
        assert key not in writes and decisions[name].value == upstream == 8 and decisions[name].identity


def test_a_node_of_eight_old_cards_keeps_eight():
    _, writes = _decide("p40", ["trainer.n_gpus_per_node=8"])
    assert not any(key in writes for key in HELPERS)


def test_agent_loop_workers_stay_upstreams():
    """One agent-loop worker spread a step's requests over 136-148 ms instead of 16-35 ms (round E vs D)."""
    _, writes = _decide("p40", ["trainer.n_gpus_per_node=1"])
    assert AGENT not in writes


def test_values_the_user_set_are_kept_including_the_legacy_reward_key():
    decisions, writes = _decide("p40", ["reward_model.num_workers=3", "trainer.n_gpus_per_node=1"])
    assert REWARD not in writes and decisions[HELPERS[REWARD][0]].value == 3  # verl copies the legacy key over
    assert not decisions[HELPERS[REWARD][0]].defaulted
    assert writes[STORAGE] == 1
