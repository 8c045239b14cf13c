"""Every value the user wrote counts as requested, wherever it sits: the command line in each Hydra form and
every user config file pulled in through `defaults:`, `+group=option`, `# @package _global_` or `@pkg`, at any
depth. verl's own packaged configs are the defaults."""

from __future__ import annotations

import json
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


# Through main_ppo and the doctor: a file's value is refused like a typed one, never silently replaced ---------
JOB_TREE = {
    "job.yaml": """\
hydra:
  searchpath:
    - pkg://verl.trainer.config
    - pkg://verl_compat.quickstart.config
defaults:
  - ppo_trainer
  - quickstart_base
  - site/cluster
  - _self_
algorithm:
  adv_estimator: grpo
""",
    "site/cluster.yaml": """\
# @package _global_
actor_rollout_ref:
  rollout:
    dtype: bfloat16
""",
    "experiment/v100_bf16.yaml": """\
# @package _global_
actor_rollout_ref:
  actor:
    fsdp_config:
      mixed_precision:
        param_dtype: BF16
""",
}


@pytest.fixture
def user_job(tmp_path, monkeypatch, capsys):
    import huggingface_hub
    from startup_harness import parquet_file, run_main, tiny_model_dir

    from verl_compat.detect import reset_cache
    from verl_compat.quickstart import reward

    conf = write_tree(tmp_path / "conf", JOB_TREE)
    data = parquet_file(tmp_path / "d.parquet")
    paths = [f"actor_rollout_ref.model.path={tiny_model_dir(tmp_path)}", f"data.train_files={data}"]
    paths += [f"data.val_files={data}", f"reward.custom_reward_function.path={reward.__file__}"]
    paths.append(f"trainer.default_local_dir={tmp_path / 'ckpt'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def run(*overrides: str, device: str | None = None):
        if device is not None:
            monkeypatch.setenv("VERL_COMPAT_DEVICE", device)
        reset_cache()
        return run_main(monkeypatch, capsys, tmp_path, [*paths, *overrides], config_path=conf, config_name="job")

    run.conf = conf
    return run


def test_defaults_list_file_value_is_refused_not_replaced(user_job):
    """site/cluster.yaml (a `# @package _global_` file in the job's defaults list) asks for bf16 rollouts: on a
    P40 that stops the job, naming the key and the file, instead of silently becoming float32."""
    from startup_harness import assert_refused

    assert user_job().code is None  # the control: on this CPU bf16 rollouts are allowed, the job reaches Ray
    result = user_job(device="p40")
    assert_refused(result, f"{ROLLOUT}.dtype='bfloat16'", "p40 (sm_61", "needs native bf16", f"set {ROLLOUT}.dtype=")
    assert f"the key is set in {user_job.conf / 'site' / 'cluster.yaml'}" in result.err


def test_plus_experiment_group_value_is_refused(user_job):
    from startup_harness import assert_refused

    result = user_job("+experiment=v100_bf16", f"{ROLLOUT}.dtype=float16", device="v100")
    assert_refused(result, f"{MP}.param_dtype='BF16'", "v100 (sm_70", "needs native bf16", f"set {MP}.param_dtype=fp16")
    assert "experiment/v100_bf16.yaml" in result.err


def test_doctor_config_reads_the_same_files(user_job, capsys, monkeypatch):
    from verl_compat import doctor
    from verl_compat.detect import reset_cache

    monkeypatch.setenv("VERL_COMPAT_DEVICE", "p40")
    reset_cache()
    code = doctor.main(["--json", "--config", str(user_job.conf / "job.yaml")])
    out = capsys.readouterr().out
    assert code == 1 and f"{ROLLOUT}.dtype='bfloat16' cannot run on p40" in out
    monkeypatch.setenv("VERL_COMPAT_DEVICE", "v100")
    reset_cache()
    code = doctor.main(["--json", "--config", str(user_job.conf / "job.yaml"), f"{ROLLOUT}.dtype=float16"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report.get("errors")
    assert report["policy"]["dtype.rollout"]["defaulted"] is False  # requested on the command line
    assert report["policy"]["dtype.train"]["defaulted"] is True
