"""FSDP1's stale views keep a moved model's old storage alive (NO_SHARD, full precision); the seam re-points them
at the moved tensor so the old one is freed, below sm_80 only; the planner counts the copy only where it stays."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

from verl_compat import fsdp_views, seams
from verl_compat.catalog import get_profile
from verl_compat.planner.resolve import stale_views
from verl_compat.policy import compose_ppo_config, decide


def _fsdp(orig: bool, mixed: MixedPrecision | None = None) -> FSDP:
    torch.manual_seed(0)
    return FSDP(
        nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)),
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.NO_SHARD,
        use_orig_params=orig,
        mixed_precision=mixed,
    )


def _move(fsdp: FSDP) -> tuple[int, int]:
    """A forward-only pass, then a move of the flat parameter to a new tensor (as a move to the host does on a
    GPU). Returns (old, new) storage pointers."""
    with torch.no_grad():
        fsdp(torch.randn(2, 8))
    handle = fsdp._all_handles[0]
    old = handle.flat_param.untyped_storage().data_ptr()
    handle.flat_param_to(torch.device("cpu"), copy=True)
    return old, handle.flat_param.untyped_storage().data_ptr()


def _weight_ptr(fsdp: FSDP) -> int:
    return fsdp.module[0].weight.untyped_storage().data_ptr()


@pytest.mark.parametrize("orig", [False, True])
def test_a_move_leaves_views_of_the_old_tensor_and_the_seam_repoints_them(one_rank, orig):
    """What the P40 trainer's snapshots showed on the GPU, on the CPU: with flat-parameter views the module's
    weight still references the old storage after the move; with original-parameter views the weight follows,
    but FSDP keeps the forward's views for a backward that a forward-only pass never runs."""
    fsdp = _fsdp(orig)
    x = torch.randn(3, 8)
    with torch.no_grad():
        before = fsdp(x)
    old, new = _move(fsdp)
    assert old != new
    flat = fsdp._all_handles[0].flat_param
    stale = [t.untyped_storage().data_ptr() for t in (flat._tensors or []) if t is not None]
    assert (_weight_ptr(fsdp) == old) if not orig else (stale and set(stale) == {old})

    assert fsdp_views.release_moved_views(fsdp) == 1
    assert _weight_ptr(fsdp) == new
    assert not any(t is not None for t in (flat._tensors or []))
    with torch.no_grad():
        assert torch.equal(fsdp(x), before)  # the next forward unshards as usual


def test_low_precision_compute_is_left_to_fsdp(one_rank):
    """Under param mixed precision the views point into the low-precision copy that FSDP frees itself."""
    fsdp = _fsdp(False, MixedPrecision(param_dtype=torch.bfloat16))
    _move(fsdp)
    assert fsdp_views.stale_handles(fsdp) == [] and fsdp_views.release_moved_views(fsdp) == 0


def test_an_fsdp2_or_plain_module_has_nothing_to_release():
    assert fsdp_views.release_moved_views(nn.Linear(2, 2)) == 0


@pytest.mark.parametrize(("profile", "runs"), [("p40", True), ("t4", True), ("cpu", True), ("a100", False)])
def test_the_seam_runs_below_sm80_only(monkeypatch, profile, runs):
    calls = []
    monkeypatch.setattr(seams, "_profile", lambda: get_profile(profile))
    monkeypatch.setattr(fsdp_views, "release_moved_views", lambda m: calls.append(m))
    seams.release_moved_views("module")
    assert calls == (["module"] if runs else [])
    decisions, _ = decide(compose_ppo_config([]), get_profile(profile), [])  # the doctor's record says the same
    assert decisions["memory.moved_views"].value == ("release" if runs else "keep")


def test_the_planner_counts_the_copy_only_where_it_stays():
    fp32, bf16 = {"train": "fp32", "train.critic": "fp32"}, {"train": "bf16", "train.critic": "bf16"}
    for profile, stale in (("p40", frozenset()), ("a100", {"actor", "ref", "critic"})):
        decisions, _ = decide(compose_ppo_config([]), get_profile(profile), [])
        assert stale_views(decisions, fp32) == stale
        assert stale_views(decisions, bf16) == frozenset()
    assert stale_views({}, fp32) == {"actor", "ref", "critic"}  # no decision: upstream's behaviour


def test_verls_own_offload_asks_the_seam(one_rank, monkeypatch):
    """patch 0016: verl's offload_fsdp_model_to_cpu ends by releasing the moved model's views."""
    from verl.utils.fsdp_utils import offload_fsdp_model_to_cpu

    released = []
    real = fsdp_views.release_moved_views
    monkeypatch.setattr(seams, "_profile", lambda: get_profile("p40"))
    monkeypatch.setattr(fsdp_views, "release_moved_views", lambda m: released.append(real(m)))
    fsdp = _fsdp(False)
    with torch.no_grad():
        fsdp(torch.randn(2, 8))
    offload_fsdp_model_to_cpu(fsdp, empty_cache=False)
    assert released == [1]
