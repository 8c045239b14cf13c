"""Every value the user wrote counts as requested, wherever it sits: the command line in each Hydra form and
every user config file pulled in through `defaults:`, `+group=option`, `# @package _global_` or `@pkg`, at any
depth. verl's own packaged configs are the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from verl_compat.config_sources import COMMAND_LINE, command_line_keys, user_config_keys
from verl_compat.quickstart.run import CONFIG_DIR as QUICKSTART_CONFIG

ROLLOUT = "actor_rollout_ref.rollout"
MP = "actor_rollout_ref.actor.fsdp_config.mixed_precision"


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# A user's job folder the way Hydra users lay them out
USER_TREE = {
    "job.yaml": """\
hydra:
  searchpath:
    - pkg://verl.trainer.config
defaults:
  - ppo_trainer
  - site/cluster
  - _self_
trainer:
  project_name: mine
""",
    "site/cluster.yaml": """\
# @package _global_
defaults:
  - precision: halfish
actor_rollout_ref:
  rollout:
    dtype: bfloat16
""",
    "site/precision/halfish.yaml": """\
# @package _global_
actor_rollout_ref:
  model:
    override_config:
      attn_implementation: flash_attention_2
""",
    "experiment/p40.yaml": """\
# @package _global_
actor_rollout_ref:
  actor:
    fsdp_config:
      mixed_precision:
        param_dtype: BF16
""",
    "tweaks/compile.yaml": "use_torch_compile: true\n",
}


@pytest.fixture
def keys_for(tmp_path):
    root = write_tree(tmp_path / "conf", USER_TREE)

    def keys(overrides: list[str], config_dir: Path = root, name: str = "job") -> dict[str, str]:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return user_config_keys(GlobalHydra.instance().config_loader(), name, overrides)

    yield keys
    GlobalHydra.instance().clear()


def test_files_pulled_in_at_any_depth_are_requested(keys_for, tmp_path):
    keys = keys_for([])
    conf = tmp_path / "conf"
    assert keys["trainer.project_name"] == str(conf / "job.yaml")
    assert keys[f"{ROLLOUT}.dtype"] == str(conf / "site" / "cluster.yaml")  # defaults: list, @package _global_
    attn = "actor_rollout_ref.model.override_config.attn_implementation"
    assert keys[attn] == str(conf / "site" / "precision" / "halfish.yaml")  # two levels down
    assert "hydra.searchpath" not in keys and not any(k.startswith("hydra") for k in keys)


def test_verl_packaged_defaults_are_not_requested(keys_for):
    keys = keys_for([])
    assert "actor_rollout_ref.actor.strategy" not in keys and "data.train_batch_size" not in keys
    assert f"{MP}.param_dtype" not in keys


def test_group_selected_on_the_command_line(keys_for, tmp_path):
    keys = keys_for(["+experiment=p40", "+tweaks@actor_rollout_ref.actor.fsdp_config=compile"])
    assert keys[f"{MP}.param_dtype"] == str(tmp_path / "conf" / "experiment" / "p40.yaml")
    assert keys["actor_rollout_ref.actor.fsdp_config.use_torch_compile"].endswith("tweaks/compile.yaml")
    assert "experiment" not in keys and "tweaks" not in keys  # a group selection is not a config key


def test_command_line_forms(keys_for):
    keys = keys_for(
        [
            f"{ROLLOUT}.name=hf",
            f"+{ROLLOUT}.new_key=1",
            f"++{ROLLOUT}.gpu_memory_utilization=0.4",
            f"++{MP}={{param_dtype: fp16, reduce_dtype: fp32}}",
            "~trainer.logger",
        ]
    )
    for key in (f"{ROLLOUT}.name", f"{ROLLOUT}.new_key", f"{ROLLOUT}.gpu_memory_utilization", "trainer.logger"):
        assert keys[key] == COMMAND_LINE
    assert keys[MP] == keys[f"{MP}.param_dtype"] == keys[f"{MP}.reduce_dtype"] == COMMAND_LINE


def test_command_line_wins_over_a_file(keys_for):
    assert keys_for([f"{ROLLOUT}.dtype=float32"])[f"{ROLLOUT}.dtype"] == COMMAND_LINE


def test_quickstart_configs_are_the_users(keys_for):
    """verl-compat's quickstart job is a user config like any other: its batch sizes are choices, not defaults."""
    keys = keys_for([], QUICKSTART_CONFIG, "grpo")
    assert keys["data.train_batch_size"].endswith("quickstart_base.yaml")
    assert keys["algorithm.adv_estimator"].endswith("grpo.yaml")
    assert "actor_rollout_ref.rollout.dtype" not in keys


def test_command_line_keys_without_a_repository():
    keys = command_line_keys(["a.b=1", "+c=2", "hydra.run.dir=x", "d@e=3"])
    assert keys == {"a.b": COMMAND_LINE, "c": COMMAND_LINE, "e.d": COMMAND_LINE}
