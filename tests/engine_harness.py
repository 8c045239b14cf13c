"""verl's own FSDP engine workers driven directly, one process, no Ray: the shared part of tests/test_engine_step.py
and benchmarks/audit_simulated_card.py (which runs the same steps on a real GPU). No pytest import here.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import torch
from dtype_audit import HALF_DTYPES, DtypeAudit

# Half-precision dtypes each profile's policy allows in compute (DESIGN.md, default policy per device).
ALLOWED_HALF = {"cpu": set(), "p40": set(), "v100": {torch.float16}, "t4": {torch.float16}}

BATCH, PROMPT_LEN, RESPONSE_LEN = 4, 8, 8

# The only device-related choice written here: FSDP2, because this host really is a CPU (FSDP1 needs an
# accelerator) while the simulated profiles are GPUs; a P40/V100/T4 user may choose FSDP2 too. Everything else
# (dtypes, attention, torch.compile) comes from verl-compat's resolvers, exactly as on the driver.
STRATEGY = ["actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2"]


def overrides(model: Path) -> list[str]:
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
    from verl_compat.user_keys import requested_keys

    config_dir = Path(verl.__file__).resolve().parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    resolve_job_config(config, detect(), requested_keys(overrides))
    OmegaConf.resolve(config)
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """Full (unsharded) copies of every parameter in host memory, so a GPU run's peak holds none of them (world
    size 1: the local shard is the whole tensor)."""
    out = {}
    for name, p in module.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        out[name] = local.detach().to("cpu", copy=True)
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


def actor_update_input(
    fields: dict[str, torch.Tensor], old_log_probs: torch.Tensor, ref_log_prob: torch.Tensor, scale: float = 1.0
) -> Any:
    """One PPO mini-batch for `update_actor`: GRPO-style advantages (one scalar per sequence, broadcast over its
    response), times `scale` (1e30 forces an fp16 overflow)."""
    mask = fields["response_mask"].float()
    advantages = scale * torch.tensor([1.0, -1.0, 0.5, -0.5])[: mask.shape[0], None] * mask
    return to_engine_input(
        {**fields, "old_log_probs": old_log_probs, "ref_log_prob": ref_log_prob, "advantages": advantages},
        calculate_entropy=False,
        global_batch_size=mask.shape[0],
        mini_batch_size=mask.shape[0],
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
