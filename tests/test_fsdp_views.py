"""FSDP1's flat-parameter views keep a moved model's old storage alive; memory.orig_params turns on original-
parameter views where that costs a GPU copy (fp32 compute, FSDP1, a GPU), and the planner counts the copy where
the user keeps flat-parameter views."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_planner_policy import _decide, job_overrides  # noqa: F401  (the module's fixture)
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

VIEWS = "GPU copies of offloaded models kept by FSDP1 views"
KEYS = {
    "memory.orig_params": "actor_rollout_ref.actor.fsdp_config.use_orig_params",
    "memory.orig_params.ref": "actor_rollout_ref.ref.fsdp_config.use_orig_params",
    "memory.orig_params.critic": "critic.fsdp.use_orig_params",
}


@pytest.fixture
def one_rank(tmp_path):
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.mark.parametrize("orig", [False, True])
def test_a_moved_flat_parameter_leaves_stale_views_without_orig_params(one_rank, orig):
    """What the P40 trainer's snapshot showed on the GPU, on the CPU: a move of the flat parameter (as FSDP1's
    CPUOffload and verl's offload do, there to the host) makes a new tensor; with flat-parameter views the
    module's weight still references the old storage, which therefore cannot be freed."""
    fsdp = FSDP(
        nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)),
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.NO_SHARD,
        use_orig_params=orig,
    )
    with torch.no_grad():
        fsdp(torch.randn(2, 8))
    handle = fsdp._all_handles[0]
    old = handle.flat_param.untyped_storage().data_ptr()
    handle.flat_param_to(torch.device("cpu"), copy=True)  # a new tensor, like a device move
    new = handle.flat_param.untyped_storage().data_ptr()
    weight = fsdp.module[0].weight.untyped_storage().data_ptr()
    assert new != old
    assert weight == (new if orig else old)


def test_p40_turns_on_original_parameter_views_and_counts_no_kept_copy(job_overrides):  # noqa: F811
    _, decisions, writes = _decide("p40", job_overrides)
    for name, key in KEYS.items():
        assert decisions[name].value is True and writes[key] is True, name
    assert not any(VIEWS in r for r in decisions["memory.plan"].reasons)


@pytest.mark.parametrize("profile", ["t4", "v100", "a100", "cpu"])
def test_mixed_precision_and_cpus_keep_upstreams_views(job_overrides, profile):  # noqa: F811
    """fp16/bf16: FSDP frees the low-precision copy the views point into; a CPU has no GPU copy."""
    _, decisions, writes = _decide(profile, job_overrides)
    for name, key in KEYS.items():
        assert decisions[name].value is False and key not in writes, (profile, name)
    assert not any(VIEWS in r for r in decisions["memory.plan"].reasons)


def test_the_users_flat_parameter_views_are_kept_and_their_copy_counted(job_overrides):  # noqa: F811
    ref_key = KEYS["memory.orig_params.ref"]
    _, decisions, writes = _decide("p40", [*job_overrides, f"{ref_key}=false"])
    assert ref_key not in writes and decisions["memory.orig_params.ref"].value is False
    assert not decisions["memory.orig_params.ref"].defaulted
    assert writes[KEYS["memory.orig_params"]] is True  # the actor's is still resolved
    kept = [r for r in decisions["memory.plan"].reasons if VIEWS in r]
    assert kept and all(f"{VIEWS} 1.84 GiB" in r for r in kept)  # the reference's fp32 copy, in every phase


def test_a_user_set_true_is_kept_on_a_cpu(job_overrides):  # noqa: F811
    _, decisions, writes = _decide("cpu", [*job_overrides, f"{KEYS['memory.orig_params']}=true"])
    assert decisions["memory.orig_params"].value is True and KEYS["memory.orig_params"] not in writes
