"""verl's v1 trainer (the default) sizes both critic passes by one token budget and never reads the critic's row
keys: the plan's critic micro-batch must reach verl as that budget, and a budget the user set is what is planned."""

from __future__ import annotations

import pytest
from planner_shapes import ppo_job_overrides

from verl_compat.catalog import get_profile
from verl_compat.planner import keys as K
from verl_compat.policy import compose_ppo_config, decide, resolve_job_config
from verl_compat.user_keys import RequestedKeys


@pytest.fixture(scope="module")
def overrides(tmp_path_factory) -> list[str]:
    return ppo_job_overrides(tmp_path_factory.mktemp("m"))


def _requested(overrides: list[str]) -> RequestedKeys:
    return RequestedKeys(o.split("=", 1)[0].lstrip("+") for o in overrides)


def _decide(profile: str, overrides: list[str]):
    return decide(compose_ppo_config(overrides), get_profile(profile), _requested(overrides))


def _critic_budget_as_verl_reads_it(config) -> int:
    """What verl 0.9.1's v1 trainer_base hands the critic engine (its own dataclass and assignment)."""
    from verl.utils.config import omega_conf_to_dataclass

    critic = omega_conf_to_dataclass(config.critic)
    critic.engine.max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
    return critic.engine.max_token_len_per_gpu


def test_the_planned_critic_micro_batch_reaches_verls_v1_critic_as_its_token_budget(overrides):
    decisions, writes = _decide("p40", overrides)
    rows = writes[K.CRITIC_MICRO]
    assert writes[K.CRITIC_FWD_MICRO] == rows  # one budget for both passes
    assert writes[K.CRITIC_TOKENS] == rows * 512 < K.CRITIC_TOKENS_DEFAULT
    assert any("critic micro-batches by token budget" in r for r in decisions["memory.plan"].reasons)
    config = compose_ppo_config(overrides)
    resolve_job_config(config, get_profile("p40"), _requested(overrides))
    assert _critic_budget_as_verl_reads_it(config) == rows * 512


def test_a_critic_budget_the_user_set_is_kept_and_planned_at(overrides):
    mine = [*overrides, f"+{K.CRITIC_TOKENS}=1024"]
    decisions, writes = _decide("p40", mine)
    assert K.CRITIC_TOKENS not in writes
    assert decisions[f"memory.{K.CRITIC_MICRO}"].value == 2  # 1024 tokens of 256 + 256
    assert any("1024 tokens, as set" in r for r in decisions["memory.plan"].reasons)


def test_verls_default_budget_is_what_an_unplanned_critic_is_estimated_at(overrides):
    # the user fixed both row keys, which v1 ignores: the estimate is at verl's 32768-token default (64 rows)
    rows = [f"{K.CRITIC_MICRO}=1", f"{K.CRITIC_FWD_MICRO}=1"]
    decisions, writes = _decide("v100", [*overrides, *rows, "critic.ppo_mini_batch_size=32"])
    assert K.CRITIC_TOKENS not in writes
    assert any("32768 tokens, verl's default" in r for r in decisions["memory.plan"].reasons)


def test_the_v0_trainer_keeps_the_critics_row_counts(overrides):
    _, writes = _decide("p40", [*overrides, "trainer.use_v1=false"])
    assert K.CRITIC_TOKENS not in writes and writes[K.CRITIC_MICRO] >= 1


def test_a_critic_budget_too_large_for_the_card_is_refused_with_one_that_fits(overrides):
    from verl_compat.planner.search import PlanError

    with pytest.raises(PlanError, match=rf"Smallest change that fits: set {K.CRITIC_TOKENS}=\d+ "):
        big = ["data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=256"]
        _decide("p40", [*overrides, *big, "critic.ppo_mini_batch_size=256", f"+{K.CRITIC_TOKENS}=131072"])
