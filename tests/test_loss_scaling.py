"""verl_compat.loss_scaling: under fp16 loss scaling torch's fused AdamW steps with verl's sharded scaler and gives
the per-parameter loop's values, overflowing steps skipped alike (torch's own ShardedGradScaler's one-element
overflow flags make the fused step fail: pytorch/pytorch#140514)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from verl_compat.loss_scaling import ScalarFlagShardedGradScaler, sharded_grad_scaler

# the third step's gradients overflow fp16's range once scaled (1e38 in fp32 times the scale is inf)
LOSS_FACTORS = (1.0, 1.0, 1e38, 1.0, 1.0)


@pytest.fixture
def gloo_group(single_rank: None):
    """The scaler all-reduces its flags over the default group: rank 0 of 1 over gloo."""
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)


def _train(scaler_cls: type[ShardedGradScaler], impl: dict) -> tuple[list[torch.Tensor], list[float], float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **impl)
    scaler = scaler_cls(device="cpu", init_scale=2.0**12, growth_interval=2)
    for factor in LOSS_FACTORS:
        loss = model(torch.randn(8, 16)).pow(2).mean() * factor
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # verl's order: unscale, clip, step, update
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    steps = [float(s["step"]) for s in optimizer.state.values()]
    return [p.detach().clone() for p in model.parameters()], steps, float(scaler.get_scale())


def test_the_fused_step_under_the_scaler_gives_the_loops_values(gloo_group) -> None:
    loop_params, loop_steps, loop_scale = _train(ShardedGradScaler, {"foreach": False})
    params, steps, scale = _train(ScalarFlagShardedGradScaler, {"fused": True})
    assert steps == loop_steps == [4.0] * 4  # five steps, the overflowing one skipped
    assert scale == loop_scale  # backed off once, grown after two clean steps, alike
    for ours, theirs in zip(params, loop_params, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # and the other implementations still step as before under it
    foreach_params, foreach_steps, _ = _train(ScalarFlagShardedGradScaler, {"foreach": True})
    assert foreach_steps == loop_steps
    for ours, theirs in zip(foreach_params, loop_params, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_overflow_flags_are_0d_and_still_found(gloo_group) -> None:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = ScalarFlagShardedGradScaler(device="cpu")
    scaler.scale(model(torch.randn(2, 4)).sum() * 1e38).backward()
    scaler.unscale_(optimizer)
    flags = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
    assert flags and all(f.dim() == 0 and float(f) == 1.0 for f in flags.values())
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(optimizer)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_the_factory_keeps_verls_arguments_and_an_enabled_device(monkeypatch) -> None:
    monkeypatch.setattr("verl_compat.cpu.grad_scaler_device", lambda: "cpu")
    scaler = sharded_grad_scaler(growth_interval=400)
    assert isinstance(scaler, ScalarFlagShardedGradScaler) and scaler.is_enabled()
    assert scaler.get_growth_interval() == 400 and scaler._device == "cpu"
