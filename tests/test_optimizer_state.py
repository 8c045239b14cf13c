"""An offloaded AdamW state comes back to the card for the optimizer step, not when the engine enters train mode
(below sm_80, verl's FSDP engine; patch 0020), and the memory plan counts it only at the step."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from planner_shapes import config_dict
from torch import nn

from verl_compat import optimizer_state, seams
from verl_compat.catalog import get_profile
from verl_compat.planner import estimate as E
from verl_compat.planner.job import JobSpec
from verl_compat.planner.shape import ModelShape
from verl_compat.policy import compose_ppo_config, decide


@pytest.fixture
def fsdp_engine(monkeypatch):
    """verl's real FSDPEngine class without its build: offload flags, a small model and AdamW, moves recorded."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    def make(cls=FSDPEngine, offload: bool = True):
        engine = object.__new__(cls)
        engine._is_offload_param, engine._is_offload_optimizer, engine._qat_enabled = False, offload, False
        torch.manual_seed(0)
        engine.module = nn.Linear(4, 4)
        engine.optimizer = torch.optim.AdamW(engine.module.parameters(), lr=0.1)
        engine.optimizer_config = SimpleNamespace(clip_grad=1.0)
        engine.moves = []
        engine.to = lambda device, model=True, optimizer=True, grad=True: engine.moves.append((device, optimizer))
        return engine

    return make


def _use(monkeypatch, profile: str) -> None:
    monkeypatch.setattr(seams, "_profile", lambda: get_profile(profile))


@pytest.mark.parametrize(("profile", "at_entry"), [("p40", False), ("t4", False), ("a100", True), ("cpu", True)])
def test_entering_train_mode_leaves_the_state_on_the_host_below_sm80(monkeypatch, fsdp_engine, profile, at_entry):
    """verl's own train-mode context (engine/base.py) asks the seam; leaving moves the state back as upstream."""
    from verl.workers.engine.base import BaseEngineCtx

    _use(monkeypatch, profile)
    engine = fsdp_engine()
    ctx = BaseEngineCtx(engine, "train")
    ctx._context_switch("cuda")
    ctx._context_switch("cpu")
    assert engine.moves == [("cuda", at_entry), ("cpu", True)]
    decisions, _ = decide(compose_ppo_config([]), get_profile(profile), [])  # the doctor's record says the same
    assert decisions["memory.optimizer_load"].value == ("at_entry" if at_entry else "at_step")


def test_an_engine_whose_step_does_not_bring_the_state_keeps_upstreams_load(monkeypatch, fsdp_engine):
    from verl.workers.engine.base import BaseEngineCtx
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    class OwnStep(FSDPEngine):  # like VeOmni's or fsdp_turbo's engines: their own optimizer_step, no seam in it
        def optimizer_step(self):
            return 0.0

    _use(monkeypatch, "p40")
    engine = fsdp_engine(OwnStep)
    BaseEngineCtx(engine, "train")._context_switch("cuda")
    assert engine.moves == [("cuda", True)]
    assert optimizer_state.engine_step(fsdp_engine()) and not optimizer_state.engine_step(engine)


@pytest.mark.parametrize(
    ("profile", "offload", "moved"), [("p40", True, True), ("a100", True, False), ("p40", False, False)]
)
def test_verls_optimizer_step_brings_an_offloaded_state_before_stepping(
    monkeypatch, fsdp_engine, profile, offload, moved
):
    """FSDPEngine.optimizer_step (patch 0020) moves the state to the device first, then clips and steps as before."""
    import verl.utils.device
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    _use(monkeypatch, profile)
    monkeypatch.setattr(verl.utils.device, "get_device_name", lambda: "cuda")
    engine = fsdp_engine(offload=offload)
    engine.module(torch.randn(2, 4)).sum().backward()
    engine.optimizer.step()  # the state exists (on the host here, as after verl's offload)
    before = engine.module.weight.detach().clone()
    engine.module(torch.randn(2, 4)).sum().backward()
    grad_norm = FSDPEngine.optimizer_step(engine)
    assert engine.moves == ([("cuda", True)] if moved else [])
    assert grad_norm > 0 and not torch.equal(before, engine.module.weight)  # the step itself still ran


def test_no_state_yet_or_already_there_moves_nothing(fsdp_engine):
    engine = fsdp_engine()
    assert optimizer_state.state_device(engine.optimizer) is None
    assert not optimizer_state.bring_for_step(engine, "cuda")  # torch creates it on the device at the first step
    engine.module(torch.randn(2, 4)).sum().backward()
    engine.optimizer.step()
    assert optimizer_state.state_device(engine.optimizer) == "cpu"
    assert not optimizer_state.bring_for_step(engine, "cpu")
    assert optimizer_state.bring_for_step(engine, "cuda") and engine.moves == [("cuda", True)]


def _p40_job(**changes) -> JobSpec:
    p, shape = get_profile("p40"), ModelShape.from_config(config_dict("0.5B"))
    job = JobSpec(
        actor=shape, critic=shape, need_ref=True, card_bytes=p.total_memory_bytes, device=p.describe(),
        prompt_len=256, response_len=256, train_batch=32, n=1, mini_batch=32, critic_mini_batch=32,
        rollout_sleeps=True,
    )  # fmt: skip
    return dataclasses.replace(job, **changes)


@pytest.mark.parametrize("micro", [1, 4, 8])
def test_an_update_holds_the_larger_of_its_activations_and_the_state(micro):
    """At the step the activations are freed: the update needs the larger of them and the state (with the step's
    own temporaries) on top of weights and grads, instead of the state beside the activations."""
    choice = E.Choice(micro, micro, micro, micro, micro, False, True, False, True, False, False, 32)
    state = _p40_job().actor.lm_params * 4 * E.ADAM_STATES
    step = E.optimizer_step_bytes(_p40_job(), "update_actor")  # torch's foreach AdamW: one model-size temporary
    totals = {}
    for at_step in (False, True):
        phase = next(
            p for p in E.trainer_phases(_p40_job(optimizer_at_step=at_step), choice) if p.name == "update_actor"
        )
        acts, totals[at_step] = phase.parts["activations"], phase.total
        if at_step:
            assert "actor optimizer" not in phase.parts
            brought = phase.parts.get("actor optimizer, brought for the step, beyond the activations", 0)
            assert brought == max(0, state + step - acts)
        else:
            assert phase.parts["actor optimizer"] == state
    assert totals[False] - totals[True] == state + max(acts, step) - max(acts, state + step)
    assert totals[True] < totals[False]


@pytest.mark.parametrize("changes", [{"mini_batch": 8}, {"epochs": (2, 1)}])
def test_an_update_that_steps_more_than_once_keeps_the_state_counted(changes):
    """From the first step on the state stays on the card for the next mini-batches' passes (as upstream)."""
    choice = E.Choice(4, 4, 4, 4, 4, False, True, False, True, False, False, 32)
    phases = {p.name: p for p in E.trainer_phases(_p40_job(optimizer_at_step=True, **changes), choice)}
    assert "actor optimizer" in phases["update_actor"].parts
    assert "critic optimizer" not in phases["update_critic"].parts  # the critic still steps once
