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

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from dtype_audit import HALF_DTYPES, DtypeAudit, audit_compile
from tiny_model import build_tiny_model

PROFILES = ["cpu", "p40", "v100", "t4"]
# Half-precision dtypes each profile's policy allows in compute (DESIGN.md, default policy per device).
ALLOWED_HALF = {"cpu": set(), "p40": set(), "v100": {torch.float16}, "t4": {torch.float16}}

BATCH, PROMPT_LEN, RESPONSE_LEN = 4, 8, 8

# The only device-related choice written here: FSDP2, because this host really is a CPU (FSDP1 needs an
# accelerator) while the simulated profiles are GPUs; a P40/V100/T4 user may choose FSDP2 too. Everything else
# (dtypes, attention, torch.compile) comes from verl-compat's resolvers, exactly as on the driver.
STRATEGY = ["actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2"]


def _overrides(model: Path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "critic.model.enable_gradient_checkpointing=false",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"critic.ppo_mini_batch_size={BATCH}",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.optim.lr=1e-3",
        *STRATEGY,
    ]


def compose_ppo_config(overrides: list[str]) -> Any:
    """verl's ppo_trainer config with `overrides`, composed the way `python -m verl.trainer.main_ppo` does, then
    resolved for the (simulated) device by the same call the driver makes (patches/0007)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import verl
    from verl_compat.detect import detect
    from verl_compat.policy import resolve_job_config
    from verl_compat.requests import requested_keys

    config_dir = Path(verl.__file__).resolve().parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    resolve_job_config(config, detect(), requested_keys(overrides))
    OmegaConf.resolve(config)
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def single_rank() -> Iterator[None]:
    """The environment a Ray worker of a one-GPU pool gets: rank 0 of 1 (verl's Worker reads it)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }.items():
            mp.setenv(key, value)
        yield
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.fixture
def profile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    from verl_compat.detect import reset_cache

    name: str = request.param
    monkeypatch.setenv("VERL_COMPAT_DEVICE", name)
    reset_cache()
    yield name
    reset_cache()


def padded_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts + right-padded responses of varied lengths, as the agent loop hands them over."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.tensor([8, 6, 5, 7])[:BATCH]
    response_lens = torch.tensor([8, 5, 3, 6])[:BATCH]
    prompts = torch.zeros(BATCH, PROMPT_LEN, dtype=torch.long)
    responses = torch.zeros(BATCH, RESPONSE_LEN, dtype=torch.long)
    prompt_mask = torch.zeros(BATCH, PROMPT_LEN, dtype=torch.long)
    response_mask = torch.zeros(BATCH, RESPONSE_LEN, dtype=torch.long)
    for i in range(BATCH):
        p, r = int(prompt_lens[i]), int(response_lens[i])
        prompts[i, PROMPT_LEN - p :] = torch.randint(3, vocab_size, (p,), generator=g)
        prompt_mask[i, PROMPT_LEN - p :] = 1
        responses[i, :r] = torch.randint(3, vocab_size, (r,), generator=g)
        response_mask[i, :r] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
    }


def to_engine_input(fields: dict[str, torch.Tensor], **meta: Any) -> Any:
    """Padded fields -> verl's no-padding TensorDict with metadata (ray_trainer.py's steps 1-3)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(tu.get_tensordict(dict(fields)))
    tu.assign_non_tensor(td, **{"temperature": 1.0, **meta})  # the trainers put the rollout temperature here
    return td


def padded(output: Any, key: str, td: Any) -> torch.Tensor:
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(tu.get(output, key), td)


def params_snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) copies of every parameter (world size 1: the local shard is the whole tensor)."""
    out = {}
    for name, p in module.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        out[name] = local.detach().clone()
    return out


def assert_policy_held(audit: DtypeAudit, compile_audit: Any, profile: str) -> None:
    assert audit.op_count > 0
    if ALLOWED_HALF[profile]:
        assert torch.float16 in audit.dtypes, f"{profile} must compute in fp16"
    assert torch.bfloat16 not in audit.dtypes, f"bf16 ops under {profile}: {audit.half_precision_ops()}"
    unexpected = {d for d in audit.dtypes & HALF_DTYPES if d not in ALLOWED_HALF[profile]}
    assert not unexpected, f"half-precision ops under {profile}: {audit.half_precision_ops()}"
    assert "flash_attn" not in sys.modules
    assert compile_audit.compile_calls == [], f"torch.compile called for {compile_audit.compile_calls}"
    assert compile_audit.dynamo_frames == 0


@pytest.mark.parametrize("profile", PROFILES, indirect=True)
def test_actor_update_and_ref_log_prob(
    profile: str, tiny_model: Path, single_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_device_name
    from verl.workers.engine_workers import ActorRolloutRefWorker

    assert get_device_name() == "cpu"  # the real hardware decides the platform, whatever the simulated profile
    config = compose_ppo_config(_overrides(tiny_model))
    fields = padded_batch(vocab_size=90)
    audit = DtypeAudit()
    with audit_compile(monkeypatch) as compile_audit:
        actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
        ref = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="ref")
        actor.init_model()
        ref.init_model()
        module = actor.actor.engine.module
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

            # one PPO update (GRPO-style advantages: one scalar per sequence, broadcast over its response)
            mask = fields["response_mask"].float()
            advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:BATCH, None] * mask
            update_td = to_engine_input(
                {**fields, "old_log_probs": old_log_probs, "ref_log_prob": ref_log_prob, "advantages": advantages},
                calculate_entropy=False,
                global_batch_size=BATCH,
                mini_batch_size=BATCH,
                epochs=1,
                seed=42,
                dataloader_kwargs={"shuffle": False},
                compute_loss=True,
            )
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

    config = compose_ppo_config(_overrides(tiny_model))
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


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flatten(v)]
    return [value]


def _update_td(fields: dict[str, torch.Tensor], log_probs: torch.Tensor, advantage_scale: float) -> Any:
    mask = fields["response_mask"].float()
    advantages = advantage_scale * torch.tensor([1.0, -1.0, 0.5, -0.5])[:BATCH, None] * mask
    return to_engine_input(
        {**fields, "old_log_probs": log_probs, "ref_log_prob": log_probs, "advantages": advantages},
        calculate_entropy=False,
        global_batch_size=BATCH,
        mini_batch_size=BATCH,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )


@pytest.mark.parametrize("profile", ["v100", "t4"], indirect=True)
def test_fp16_overflow_step_is_skipped_and_master_weights_stay_fp32(
    profile: str, tiny_model: Path, single_rank: None
) -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from verl.workers.engine_workers import ActorRolloutRefWorker

    config = compose_ppo_config(_overrides(tiny_model))
    actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
    actor.init_model()
    engine = actor.actor.engine
    assert isinstance(engine.scaler, ShardedGradScaler) and engine.scaler.is_enabled(), "fp16 needs loss scaling"
    fields = padded_batch(vocab_size=90, seed=2)
    log_probs = padded(
        actor.compute_log_prob(to_engine_input(fields, calculate_entropy=False, compute_loss=False)),
        "log_probs",
        to_engine_input(fields, calculate_entropy=False, compute_loss=False),
    ).float()

    before = params_snapshot(engine.module)
    scale_before = float(engine.scaler.get_scale())
    # advantages of 1e30: the scaled loss is finite in fp32, its gradients overflow in fp16
    actor.update_actor(_update_td(fields, log_probs, advantage_scale=1e30))
    after = params_snapshot(engine.module)
    assert all(torch.equal(before[n], after[n]) for n in before), "an overflowing step must not touch the weights"
    assert all(torch.isfinite(t).all() and t.dtype == torch.float32 for t in after.values())
    assert float(engine.scaler.get_scale()) < scale_before, "the scaler must back off after an overflow"

    # the next, ordinary step trains again
    actor.update_actor(_update_td(fields, log_probs, advantage_scale=1.0))
    trained = params_snapshot(engine.module)
    assert any(not torch.equal(after[n], trained[n]) for n in after)
    assert all(torch.isfinite(t).all() and t.dtype == torch.float32 for t in trained.values())
