"""platform.helpers: one reward-loop worker and TransferQueue storage unit and two agent-loop workers per GPU
below sm_80, one of each on CPUs (upstream's 8 each is an eight-GPU node's), upstream's on sm_80+, the user's
where they set it."""

from __future__ import annotations

import pytest

from verl_compat.catalog import get_profile
from verl_compat.policy import compose_ppo_config, decide
from verl_compat.resolvers.helpers import AGENT_WORKERS_KEY as AGENT
from verl_compat.resolvers.helpers import HELPERS
from verl_compat.user_keys import RequestedKeys

REWARD, STORAGE, _ = HELPERS


def _decide(profile: str, overrides: list[str]):
    config = compose_ppo_config(overrides)
    requested = RequestedKeys(o.split("=", 1)[0].lstrip("+") for o in overrides)
    return decide(config, get_profile(profile), requested)


@pytest.mark.parametrize(("profile", "gpus"), [("p40", 1), ("t4", 2), ("v100", 1)])
def test_each_kind_per_gpu_below_sm80(profile, gpus):
    decisions, writes = _decide(profile, [f"trainer.n_gpus_per_node={gpus}"])
    assert writes[REWARD] == writes[STORAGE] == gpus and writes[AGENT] == 2 * gpus
    for key, helper in HELPERS.items():
        assert decisions[helper.name].value == writes[key] and decisions[helper.name].upstream == helper.upstream == 8


def test_one_of_each_kind_on_a_cpu():
    decisions, writes = _decide("cpu", ["trainer.n_gpus_per_node=1"])
    for key, helper in HELPERS.items():
        assert writes[key] == 1 and decisions[helper.name].value == 1


def test_sm80_keeps_upstreams_eight():
    decisions, writes = _decide("a100", ["trainer.n_gpus_per_node=1"])
    for key, helper in HELPERS.items():
        assert key not in writes and decisions[helper.name].value == helper.upstream == 8
        assert decisions[helper.name].identity


def test_a_node_of_eight_old_cards_keeps_eight():
    _, writes = _decide("p40", ["trainer.n_gpus_per_node=8"])
    assert not any(key in writes for key in HELPERS)


def test_agent_loop_workers_are_capped_at_upstreams_eight():
    decisions, writes = _decide("p40", ["trainer.n_gpus_per_node=4"])
    assert AGENT not in writes and decisions[HELPERS[AGENT].name].value == 8
    assert writes[REWARD] == 4


def test_agent_loop_workers_the_user_set_are_kept():
    decisions, writes = _decide("p40", [f"{AGENT}=8", "trainer.n_gpus_per_node=1"])
    assert AGENT not in writes and decisions[HELPERS[AGENT].name].value == 8
    assert not decisions[HELPERS[AGENT].name].defaulted


def test_values_the_user_set_are_kept_including_the_legacy_reward_key():
    decisions, writes = _decide("p40", ["reward_model.num_workers=3", "trainer.n_gpus_per_node=1"])
    assert REWARD not in writes and decisions[HELPERS[REWARD].name].value == 3  # verl copies the legacy key over
    assert not decisions[HELPERS[REWARD].name].defaulted
    assert writes[STORAGE] == 1
