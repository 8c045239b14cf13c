"""The shipped configs (quickstart and per-card examples) compose, and leave every device decision to the
resolvers: no file sets a key that the policy writes, so the same file runs on any card."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl_compat.catalog import get_profile
from verl_compat.policy import decide
from verl_compat.quickstart.run import CONFIG_DIR
from verl_compat.user_keys import keys_from_config_file, requested_keys

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "config"
PATHS = ["actor_rollout_ref.model.path=/m", "reward.custom_reward_function.path=/r.py", "data.train_files=/t"]
CONFIGS = [
    (CONFIG_DIR / "grpo.yaml", ["cpu", "p40", "v100", "t4", "a100"]),
    (CONFIG_DIR / "ppo.yaml", ["cpu", "p40", "v100", "t4", "a100"]),
    (EXAMPLES / "grpo_p40.yaml", ["p40"]),
    (EXAMPLES / "grpo_v100.yaml", ["v100"]),
    (EXAMPLES / "grpo_t4.yaml", ["t4"]),
]


def _compose(path: Path):
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        return compose(path.stem, overrides=PATHS)


@pytest.mark.parametrize("path,profiles", CONFIGS, ids=lambda x: x.stem if isinstance(x, Path) else None)
def test_config_leaves_device_choices_to_the_resolvers(path: Path, profiles: list[str]):
    config = _compose(path)
    own_keys = keys_from_config_file(path) | (keys_from_config_file(CONFIG_DIR / "quickstart_base.yaml"))
    for name in profiles:
        decisions, writes = decide(config, get_profile(name), requested_keys(PATHS, path))
        repeated = {k for k in own_keys if k in writes or any(w.startswith(k + ".") for w in writes)}
        assert not repeated, f"{path.name} sets {sorted(repeated)}, which the resolvers decide on {name}"
        assert decisions["rollout.engine"].value in ("hf", "vllm")


def test_per_card_examples_change_only_batch_and_offload():
    allowed_prefixes = (
        "algorithm.",
        "data.",
        "trainer.",
        "actor_rollout_ref.actor.ppo_",
        "actor_rollout_ref.rollout.n",
    )
    allowed_prefixes += ("actor_rollout_ref.rollout.log_prob_", "actor_rollout_ref.ref.log_prob_")
    allowed_prefixes += (
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.actor.fsdp_config.optim",
    )
    for path in sorted(EXAMPLES.glob("grpo_*.yaml")):
        extra = [k for k in keys_from_config_file(path) if not k.startswith(allowed_prefixes)]
        assert not extra, f"{path.name} sets {extra}"
