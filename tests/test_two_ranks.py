"""`trainer.n_gpus_per_node=2` (issue 11): the policy under every profile keeps 2 FSDP ranks with one hf replica
each (TP 1), TP > 1 is refused for hf with the key and the fix, and the CPU host sizing fits 2 ranks on 2 cores
(or names the key and the count to set). The run itself: tests/test_e2e_two_ranks.py."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_compat import cpu
from verl_compat.catalog import get_profile
from verl_compat.errors import IncompatibleRequestError
from verl_compat.policy import compose_ppo_config, resolve_job_config
from verl_compat.user_keys import requested_keys

TWO = ["trainer.n_gpus_per_node=2"]
TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
NUM_CPUS_KEY = "ray_kwargs.ray_init.num_cpus"
PROFILES = ["cpu", "p40", "p100", "v100", "t4", "gtx1660"]


def _resolved(profile: str, overrides: list[str]):
    config = compose_ppo_config(overrides)
    resolve_job_config(config, get_profile(profile), requested_keys(overrides))
    return config


@pytest.mark.parametrize("profile", PROFILES)
def test_two_ranks_one_hf_replica_per_rank_under_every_profile(profile: str) -> None:
    config = _resolved(profile, TWO)
    assert OmegaConf.select(config, "trainer.n_gpus_per_node") == 2
    assert OmegaConf.select(config, "actor_rollout_ref.rollout.name") == "hf"
    # rollout world size 1: verl's LLMServerManager starts n_gpus / (tp * dp * pp) = 2 replicas
    assert OmegaConf.select(config, TP_KEY) == 1
    assert OmegaConf.select(config, "actor_rollout_ref.rollout.data_parallel_size") == 1


@pytest.mark.parametrize("profile", ["cpu", "t4"])
def test_tensor_parallel_over_the_two_cards_is_refused_for_hf(profile: str) -> None:
    overrides = [*TWO, "actor_rollout_ref.rollout.name=hf", f"{TP_KEY}=2"]
    with pytest.raises(IncompatibleRequestError, match="no tensor parallelism") as err:
        _resolved(profile, overrides)
    assert f"{TP_KEY}=2" in str(err.value) and f"set {TP_KEY}=1" in str(err.value)


def test_two_ranks_fit_a_two_core_host() -> None:
    config = compose_ppo_config(TWO)
    result = cpu.size_for_host(config, requested=[], host_cpus=2)
    # TQ controller 1 + storage 1 + 2 worker processes x max_colocate_count 3 + scheduling headroom 1
    assert result.demand["worker pools"] == 6 and result.needed == 9
    assert OmegaConf.select(config, NUM_CPUS_KEY) == 9
    assert OmegaConf.select(config, "transfer_queue.backend.SimpleStorage.num_data_storage_units") == 1


def test_two_ranks_with_too_few_logical_cpus_set_names_the_key_and_count() -> None:
    config = compose_ppo_config([*TWO, f"{NUM_CPUS_KEY}=6"])  # enough for one rank, not for two
    with pytest.raises(IncompatibleRequestError) as err:
        cpu.size_for_host(config, requested=[NUM_CPUS_KEY], host_cpus=2)
    message = str(err.value)
    assert f"{NUM_CPUS_KEY}=6" in message and "worker pools 6" in message
    assert f"set {NUM_CPUS_KEY}=9" in message
