"""Qwen2.5 model shapes (config.json fields only, no weights) for the memory planner's tests."""

from __future__ import annotations

import json
from pathlib import Path

_BASE = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 32768}
QWEN25 = {
    "0.5B": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "1.5B": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "3B": dict(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "7B": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


def config_dict(size: str) -> dict:
    return {**_BASE, **QWEN25[size]}


def write_config(folder: Path, size: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_dict(size)))
    return folder


def ppo_job_overrides(folder: Path) -> list[str]:
    """verl overrides for the benchmark's PPO job (0.5B config, critic and reference, 32 x 256+256, one GPU)."""
    model = write_config(folder / "qwen2.5-0.5b", "0.5B")
    return [
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        "trainer.n_gpus_per_node=1",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "critic.ppo_mini_batch_size=32",
        "data.max_prompt_length=256",
        "data.max_response_length=256",
        "algorithm.use_kl_in_reward=true",
    ]
