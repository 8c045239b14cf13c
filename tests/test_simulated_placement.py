"""A simulated card on a host without that GPU: the card decides the policy, the real platform the placement.

`VERL_COMPAT_DEVICE=p40` on a CPU-only machine (how the README checks a P40 job) must train what the P40 policy
allows (fp32, sdpa, hf rollout) on the CPU platform: trainer.device=cpu and FSDP2, since FSDP1 needs an
accelerator. tests/test_e2e_checkpoints.py trains that way end to end.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_compat.catalog import get_profile
from verl_compat.cpu import host_has_accelerator
from verl_compat.detect import cpu_profile, detect_hardware
from verl_compat.errors import IncompatibleRequestError
from verl_compat.policy import compose_ppo_config, decide, placement_profile

MP = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
STRATEGIES = ("actor_rollout_ref.actor.strategy", "critic.strategy")


@pytest.fixture(scope="module")
def config():
    return compose_ppo_config([])


def test_p40_policy_on_the_cpu_platform(config):
    decisions, writes = decide(config, get_profile("p40"), [], platform=cpu_profile())
    assert writes["trainer.device"] == "cpu"
    assert all(writes[k] == "fsdp2" for k in STRATEGIES)
    assert writes[MP]["param_dtype"] == "fp32"  # the card's policy, not the CPU's defaults by accident
    assert writes["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa_varlen"
    assert writes["actor_rollout_ref.rollout.name"] == "hf"
    assert decisions["platform.strategy"].device == "cpu" and "p40" in decisions["dtype.train"].device


def test_card_on_its_own_platform_keeps_cuda_and_fsdp1(config):
    _, writes = decide(config, get_profile("p40"), [])
    assert "trainer.device" not in writes and not any(k in writes for k in STRATEGIES)


def test_simulated_ampere_on_cpu_keeps_the_cpu_placement(config):
    """sm_80+ writes nothing (identity with upstream) except what the CPU platform needs to run at all."""
    _, writes = decide(config, get_profile("a100"), [], platform=cpu_profile())
    assert writes["trainer.device"] == "cpu" and all(writes[k] == "fsdp2" for k in STRATEGIES)
    assert MP not in writes


def test_fsdp1_typed_for_a_simulated_card_on_cpu_is_refused(config):
    typed = compose_ppo_config(["actor_rollout_ref.actor.strategy=fsdp"])
    with pytest.raises(IncompatibleRequestError) as e:
        decide(typed, get_profile("p40"), ["actor_rollout_ref.actor.strategy"], platform=cpu_profile())
    assert e.value.key == "actor_rollout_ref.actor.strategy" and e.value.device == "cpu"
    assert "FSDP1" in e.value.reason and "actor_rollout_ref.actor.strategy=fsdp2" in e.value.fix


@pytest.mark.skipif(host_has_accelerator(), reason="this host has a GPU: the simulated card runs on it")
def test_this_cpu_host_places_simulated_cards_on_cpu():
    assert placement_profile(get_profile("p40")).is_cpu
    assert placement_profile(get_profile("v100")).is_cpu
    assert placement_profile(cpu_profile()) is None
    assert placement_profile(detect_hardware()) is None  # the real device is never re-placed
    assert OmegaConf.select(compose_ppo_config([]), "trainer.device") == "cuda"  # upstream's default
