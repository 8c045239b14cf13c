"""A forward-only FSDP1 model under CPUOffload (verl's reference) set up in the background after the wrap: the first
forward waits for it and gives the same outputs, the unused pinned gradient is freed, a failure surfaces at that
forward; only where memory.offload_init says 'at_build' (below sm_80 on a GPU).

On a CPU nothing can be pinned, so `Tensor.pin_memory` is replaced by a copy here: FSDP1's own lazy init then runs
as on a GPU host (the pinned copy, the gradient buffer), which is what the background initialisation moves. The copy
is made through numpy so that, like pinned memory, its storage cannot be resized (freeing by resizing failed on the
H100 host, in the planned P40 job's reference pass).
"""

from __future__ import annotations

import threading

import psutil
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffload, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from verl_compat import offload_init, seams
from verl_compat.catalog import get_profile
from verl_compat.policy import compose_ppo_config, decide


@pytest.fixture(autouse=True)
def pin_as_copy(monkeypatch):
    def pin(self, *args, **kwargs):
        return torch.from_numpy(self.detach().numpy().copy())  # a fixed-size storage, as pinned memory's

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _fsdp(offload: bool = True) -> FSDP:
    return FSDP(
        _model(),
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.NO_SHARD,
        cpu_offload=CPUOffload(offload_params=offload),
    )


def _grads(module: FSDP) -> list[torch.Tensor]:
    return [h.flat_param._cpu_grad for h in offload_init.handles(module)]


def test_upstreams_lazy_init_allocates_a_gradient_the_forward_never_uses(one_rank):
    module = _fsdp()
    with torch.no_grad():
        module(torch.randn(2, 8))
    flat = offload_init.handles(module)[0].flat_param
    grad = _grads(module)[0]
    assert grad.numel() == flat.numel() and grad.sum() == 0  # a model-size buffer for a backward that never comes
    with pytest.raises(RuntimeError, match="not resizable"):
        grad.untyped_storage().resize_(0)  # as pinned memory


def test_background_init_is_joined_by_the_first_forward_and_frees_the_gradient(one_rank, monkeypatch):
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = _model()(x)
    module = _fsdp()
    assert offload_init.offloaded_root(module)
    allocated = []
    real_zeros_like = torch.zeros_like

    def zeros_like(*args, **kwargs):
        allocated.append(real_zeros_like(*args, **kwargs))
        return allocated[-1]

    monkeypatch.setattr(torch, "zeros_like", zeros_like)
    thread = offload_init.start(module)
    assert isinstance(thread, threading.Thread)
    with torch.no_grad():
        out = module(x)
    assert not thread.is_alive() and module._is_root is True
    torch.testing.assert_close(out, expected)
    (upstreams,) = allocated  # FSDP1's pinned zero gradient
    (grad,) = _grads(module)
    assert grad.untyped_storage().data_ptr() != upstreams.untyped_storage().data_ptr()  # not the pinned buffer
    assert grad.shape == upstreams.shape == offload_init.handles(module)[0].flat_param.shape
    assert grad.dtype == upstreams.dtype and grad.device.type == "cpu"
    assert not grad.is_pinned() and torch.count_nonzero(grad) == 0  # upstream's zeros, unpinned
    assert not module._forward_pre_hooks  # the join hook removed itself
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected)  # later forwards as upstream's
    assert _grads(module)[0] is grad and len(allocated) == 1  # FSDP1 allocates no new buffer before a forward
    assert not offload_init.offloaded_root(module)  # initialised: nothing left to start


def test_a_failure_in_the_background_is_raised_by_the_first_forward(one_rank, monkeypatch):
    from torch.distributed.fsdp import _runtime_utils

    def broken(state, root):
        raise RuntimeError("lazy init failed")

    monkeypatch.setattr(_runtime_utils, "_lazy_init", broken)
    module = _fsdp()
    offload_init.start(module)
    with pytest.raises(RuntimeError, match="lazy init failed"), torch.no_grad():
        module(torch.randn(2, 8))


def test_nothing_to_do_without_offload_or_fsdp(one_rank):
    assert offload_init.start(_fsdp(offload=False)) is None
    assert offload_init.start(_model()) is None


@pytest.mark.parametrize(("profile", "runs"), [("p40", True), ("v100", True), ("t4", True), ("cpu", False),
                                               ("a100", False)])  # fmt: skip
def test_the_seam_starts_it_below_sm80_on_a_gpu_for_forward_only_models(one_rank, monkeypatch, profile, runs):
    started = []
    monkeypatch.setattr(seams, "_profile", lambda: get_profile(profile))
    monkeypatch.setattr(offload_init, "start", started.append)
    module = _fsdp()
    seams.offload_init(module, forward_only=False)  # a trained model: FSDP1 needs its gradient buffer
    assert started == []
    seams.offload_init(module, forward_only=True)
    assert started == ([module] if runs else [])
    decisions, _ = decide(compose_ppo_config([]), get_profile(profile), [])  # the doctor's record says the same
    assert decisions["memory.offload_init"].value == ("at_build" if runs else "first_forward")


def test_the_replacement_zeros_hold_no_host_memory_until_written():
    """The claim behind the replacement: a model-size buffer of zeros that the host commits only when written."""

    def rss_mib() -> int:
        return psutil.Process().memory_info().rss // 2**20

    before = rss_mib()
    zeros = offload_init._zeros_committed_when_written(torch.empty((256, 1024, 1024), device="meta"))  # 1 GiB
    assert zeros.shape == (256, 1024, 1024) and zeros.dtype == torch.float32
    assert rss_mib() - before < 64  # not 1024
    zeros[0].fill_(1.0)  # written pages are committed as usual
    assert rss_mib() - before >= 4 and zeros[0].sum() == 1024 * 1024 and zeros[1].sum() == 0
