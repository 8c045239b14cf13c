"""A real verl FSDP2 engine step on the CPU, one process, no Ray (research/cpu-feasibility.md, last section).

verl's own config (Hydra-composed ppo_trainer.yaml), verl's own workers (`ActorRolloutRefWorker` for the actor and
the reference, `TrainingWorker` for the critic, as `trainer/ppo/v1/trainer_base.py` builds it) and verl's own
data path (`left_right_2_no_padding`, as `trainer/ppo/ray_trainer.py` calls it) on a tiny random Llama, with a
gloo process group of world size 1. Every aten op's floating dtypes are recorded (tests/dtype_audit.py).

Profiles: VERL_COMPAT_DEVICE selects the simulated device for verl-compat's resolvers; verl's platform stays the
real one (the CPU platform: this process has no GPU). Under cpu and p40 no half-precision op runs at all; under
v100 and t4 compute is fp16 with fp32 master weights and loss scaling, and an overflowing step is skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from dtype_audit import DtypeAudit, audit_compile
from engine_harness import (
    BATCH,
    RESPONSE_LEN,
    actor_update_input,
    assert_policy_held,
    compose_ppo_config,
    overrides,
    padded,
    padded_batch,
    params_snapshot,
    to_engine_input,
)

from verl_compat.norms import fused_count
from verl_compat.quickstart.model import tiny_llama

PROFILES = ["cpu", "p40", "v100", "t4"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def profile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The simulated device for the resolvers (tests/conftest.py restores the real one afterwards)."""
    from verl_compat.detect import ENV_VAR, reset_cache

    monkeypatch.setenv(ENV_VAR, request.param)
    reset_cache()
    return request.param


@pytest.mark.parametrize("profile", PROFILES, indirect=True)
def test_actor_update_and_ref_log_prob(
    profile: str, tiny_model: Path, single_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_device_name
    from verl.workers.engine_workers import ActorRolloutRefWorker

    assert get_device_name() == "cpu"  # the real hardware decides the platform, whatever the simulated profile
    config = compose_ppo_config(overrides(tiny_model))
    fields = padded_batch(vocab_size=90)
    audit = DtypeAudit()
    with audit_compile(monkeypatch) as compile_audit:
        actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
        ref = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="ref")
        actor.init_model()
        ref.init_model()
        module = actor.actor.engine.module
        # kernels.rms_norm at the engine's model build (patch 0018): torch's fused norm on the GPU profiles
        assert (fused_count(module) > 0) is (profile != "cpu")
        assert (fused_count(ref.ref.engine.module) > 0) is (profile != "cpu")
        # AdamW without foreach's whole-model temporary (memory.optimizer_step): the fused kernel on every GPU
        # profile, under fp16 loss scaling too (verl_compat.loss_scaling); the CPU keeps torch's default
        defaults = actor.actor.engine.optimizer.defaults
        assert bool(defaults.get("fused")) is (profile != "cpu")
        assert defaults.get("foreach") is None
        before = params_snapshot(module)
        assert all(t.dtype == torch.float32 for t in before.values()), "master weights must stay fp32"

        with audit:
            # old log-probs (actor, forward only) and reference log-probs (ref engine: forward_only, CPU offload)
            old_td = to_engine_input(fields, calculate_entropy=True, compute_loss=False)
            old_out = actor.compute_log_prob(old_td)
            ref_td = to_engine_input(fields, calculate_entropy=False, compute_loss=False)
            ref_out = ref.compute_ref_log_prob(ref_td)
            old_log_probs = padded(old_out, "log_probs", old_td).float()
            ref_log_prob = padded(ref_out, "log_probs", ref_td).float()

            update_td = actor_update_input(fields, old_log_probs, ref_log_prob)
            update_out = actor.update_actor(update_td)

    mask = fields["response_mask"].bool()
    assert torch.isfinite(old_log_probs[mask]).all() and (old_log_probs[mask] < 0).all()
    assert torch.isfinite(ref_log_prob[mask]).all()
    # same initial weights: actor and reference agree before the update
    torch.testing.assert_close(old_log_probs[mask], ref_log_prob[mask], rtol=1e-5, atol=1e-5)
    metrics = tu.get(update_out, "metrics")
    losses = [float(v) for v in _flatten(metrics["loss"])]
    assert losses and all(torch.isfinite(torch.tensor(losses))), metrics
    after = params_snapshot(module)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed, "no parameter changed after the actor update"
    assert all(t.dtype == torch.float32 for t in after.values())
    assert_policy_held(audit, compile_audit, profile)


@pytest.mark.parametrize("profile", PROFILES, indirect=True)
def test_critic_update(profile: str, tiny_model: Path, single_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from functools import partial

    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import value_loss

    config = compose_ppo_config(overrides(tiny_model))
    fields = padded_batch(vocab_size=90, seed=1)
    audit = DtypeAudit()
    with audit_compile(monkeypatch) as compile_audit:
        # as trainer/ppo/v1/trainer_base.py builds the critic worker
        critic_cfg = omega_conf_to_dataclass(config.critic)
        critic_cfg.engine.infer_max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
        critic_cfg.engine.max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
        critic = TrainingWorker(
            config=TrainingWorkerConfig(
                model_type="value_model",
                model_config=critic_cfg.model,
                engine_config=critic_cfg.engine,
                optimizer_config=critic_cfg.optim,
                checkpoint_config=critic_cfg.checkpoint,
            )
        )
        critic.reset()
        assert (fused_count(critic.engine.module) > 0) is (profile != "cpu")  # the value model's norms too
        critic.set_loss_fn(partial(value_loss, config=critic_cfg))
        before = params_snapshot(critic.engine.module)

        with audit:
            values_td = to_engine_input(fields, compute_loss=False)
            values = padded(critic.infer_batch(values_td), "values", values_td).float()
            returns = torch.linspace(-1.0, 1.0, RESPONSE_LEN).expand(BATCH, -1) * fields["response_mask"]
            update_td = to_engine_input(
                {**fields, "values": values, "returns": returns},
                global_batch_size=BATCH,
                mini_batch_size=BATCH,
                epochs=1,
                seed=42,
                dataloader_kwargs={"shuffle": False},
            )
            update_out = critic.train_mini_batch(update_td)

    mask = fields["response_mask"].bool()
    assert torch.isfinite(values[mask]).all()
    metrics = tu.get(update_out, "metrics")
    losses = [float(v) for v in _flatten(metrics["loss"])]
    assert losses and all(torch.isfinite(torch.tensor(losses))), metrics
    after = params_snapshot(critic.engine.module)
    assert any(not torch.equal(before[n], after[n]) for n in before), "no critic parameter changed"
    assert_policy_held(audit, compile_audit, profile)


def _adam_steps(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(state["step"]) for state in optimizer.state.values() if "step" in state]


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flatten(v)]
    return [value]


@pytest.mark.parametrize("profile", ["v100", "t4"], indirect=True)
def test_fp16_overflow_step_is_skipped_and_master_weights_stay_fp32(
    profile: str, tiny_model: Path, single_rank: None
) -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from verl.workers.engine_workers import ActorRolloutRefWorker

    config = compose_ppo_config(overrides(tiny_model))
    actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
    actor.init_model()
    engine = actor.actor.engine
    assert isinstance(engine.scaler, ShardedGradScaler) and engine.scaler.is_enabled(), "fp16 needs loss scaling"
    assert engine.optimizer.defaults.get("fused") is True  # the fused kernel under the scaler (memory.optimizer_step)
    fields = padded_batch(vocab_size=90, seed=2)
    log_probs = padded(
        actor.compute_log_prob(to_engine_input(fields, calculate_entropy=False, compute_loss=False)),
        "log_probs",
        to_engine_input(fields, calculate_entropy=False, compute_loss=False),
    ).float()

    before = params_snapshot(engine.module)
    scale_before = float(engine.scaler.get_scale())
    # advantages of 1e30: the scaled loss is finite in fp32, its gradients overflow in fp16
    actor.update_actor(actor_update_input(fields, log_probs, log_probs, scale=1e30))
    after = params_snapshot(engine.module)
    assert all(torch.equal(before[n], after[n]) for n in before), "an overflowing step must not touch the weights"
    assert all(torch.isfinite(t).all() and t.dtype == torch.float32 for t in after.values())
    assert float(engine.scaler.get_scale()) < scale_before, "the scaler must back off after an overflow"
    # the fused kernel ran and took its step back: a skipped step must not count in AdamW's bias correction
    assert _adam_steps(engine.optimizer) and set(_adam_steps(engine.optimizer)) == {0.0}

    # the next, ordinary step trains again
    actor.update_actor(actor_update_input(fields, log_probs, log_probs))
    trained = params_snapshot(engine.module)
    assert any(not torch.equal(after[n], trained[n]) for n in after)
    assert set(_adam_steps(engine.optimizer)) == {1.0}
    assert all(torch.isfinite(t).all() and t.dtype == torch.float32 for t in trained.values())


@pytest.mark.parametrize("profile", ["p40", "t4"], indirect=True)
def test_the_fused_head_gives_upstreams_log_probs_and_trains(
    profile: str, tiny_model: Path, single_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kernels.fused "torch" (the memory plan's choice where it lets micro-batches grow): verl's FusedLinearForPPO
    through verl's own engine gives the unfused path's log-probs and entropy, and its update trains."""
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    from verl.workers.engine_workers import ActorRolloutRefWorker

    # verl patches the model CLASS's forward for the fused head (one config per worker process); here both
    # variants share a process, so each starts from transformers' forward and the test leaves it restored
    original = LlamaForCausalLM.forward
    import verl.utils.experimental.torch_functional as fused_module

    chunks = []
    built = fused_module.FusedLinearForPPO.__init__

    def recording_init(self, *args, **kwargs):  # the chunk verl's call site asks of verl-compat (patch 0017)
        built(self, *args, **kwargs)
        chunks.append(self.chunk_size)

    monkeypatch.setattr(fused_module.FusedLinearForPPO, "__init__", recording_init)
    fields = padded_batch(vocab_size=90, seed=3)
    results = {}
    for fused in (False, True):
        monkeypatch.setattr(LlamaForCausalLM, "forward", original)
        extra = [f"actor_rollout_ref.model.use_fused_kernels={str(fused).lower()}"]
        extra += ["actor_rollout_ref.model.fused_kernel_options.impl_backend=torch"]
        config = compose_ppo_config([*overrides(tiny_model), *extra])
        actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
        actor.init_model()
        assert (getattr(actor.actor.engine.module, "_verl_fused_kernels_backend", None) == "torch") is fused
        td = to_engine_input(fields, calculate_entropy=True, compute_loss=False)
        out = actor.compute_log_prob(td)
        results[fused] = (padded(out, "log_probs", td).float(), padded(out, "entropy", td).float())
        if fused:
            before = params_snapshot(actor.actor.engine.module)
            actor.update_actor(actor_update_input(fields, results[fused][0], results[fused][0]))
            after = params_snapshot(actor.actor.engine.module)
            assert any(not torch.equal(before[n], after[n]) for n in before)
    assert chunks and set(chunks) == {128}  # kernels.fused_chunk below sm_80
    mask = fields["response_mask"].bool()
    tol = {"rtol": 1e-5, "atol": 1e-5} if profile == "p40" else {"rtol": 2e-2, "atol": 2e-2}  # t4: fp16 compute
    torch.testing.assert_close(results[True][0][mask], results[False][0][mask], **tol)
    torch.testing.assert_close(results[True][1][mask], results[False][1][mask], **tol)
