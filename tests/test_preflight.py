"""Plain mistakes stop `main_ppo` at start-up, before Ray or any model load, with key, device, reason and fix.

Each case is typed the way a user types it on the command line (plain, `+`, `++`, lists, dict values); the
rest of the job is the quickstart's valid GRPO config on a tiny local model, so only the one mistake can fail.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import huggingface_hub
import pytest
from omegaconf import OmegaConf
from startup_harness import assert_refused, parquet_file, run_main, tiny_model_dir

from verl_compat import preflight
from verl_compat.errors import InvalidSettingError
from verl_compat.quickstart import reward


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("assets")
    return {
        "model": tiny_model_dir(root),
        "train": parquet_file(root / "train.parquet"),
        "val": parquet_file(root / "val.parquet"),
        "root": root,
    }


@pytest.fixture
def job(assets, tmp_path, monkeypatch, capsys):
    """run(*overrides) -> StartupResult for the valid quickstart job plus `overrides` (later ones win)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # an empty hub cache: nothing is "already downloaded" (the hub client reads its cache folder at import)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))

    def run(*overrides: str):
        base = [
            f"actor_rollout_ref.model.path={assets['model']}",
            f"data.train_files={assets['train']}",
            f"data.val_files={assets['val']}",
            f"reward.custom_reward_function.path={reward.__file__}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.total_training_steps=2",
        ]
        return run_main(monkeypatch, capsys, tmp_path, [*base, *overrides])

    return run


def test_valid_job_reaches_ray(job):
    """The control: with nothing wrong the recorders see ray.init, so 'reached == []' below means something."""
    result = job()
    assert result.code is None and result.reached == ["ray.init"], result.message


# Model paths ----------------------------------------------------------------------------------------------------
def test_model_path_missing_folder(job, tmp_path):
    result = job(f"actor_rollout_ref.model.path={tmp_path}/models/Qwen2.5-0.5B")
    assert_refused(result, "actor_rollout_ref.model.path=", "cpu", "no folder", "Fix: set actor_rollout_ref.model.path")


def test_model_path_folder_without_config(job, tmp_path):
    empty = tmp_path / "downloaded-half"
    empty.mkdir()
    (empty / "model.safetensors").write_bytes(b"x")
    result = job(f"actor_rollout_ref.model.path={empty}")
    assert_refused(result, "actor_rollout_ref.model.path=", "cpu", "has no config.json", "Fix:")


def test_model_path_is_a_file(job, assets):
    result = job(f"actor_rollout_ref.model.path={assets['model'] / 'config.json'}")
    assert_refused(result, "actor_rollout_ref.model.path=", "is a file, not a model folder", "Fix:")


def test_model_path_broken_config_json(job, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama",')
    result = job(f"actor_rollout_ref.model.path={broken}")
    assert_refused(result, "actor_rollout_ref.model.path=", "cannot be read as JSON", "Fix:")


def test_hub_id_offline_not_cached(job):
    result = job("actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct")
    assert_refused(result, "'Qwen/Qwen2.5-0.5B-Instruct'", "HF_HUB_OFFLINE=1", "not in the local hub cache", "Fix:")


def test_hub_id_online_that_does_not_exist(job, monkeypatch):
    """Online: one hub lookup. Without a network the hub cannot be reached; with one the id does not exist."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    result = job("actor_rollout_ref.model.path=verl-compat-tests/no-such-model-3f9a")
    assert_refused(result, "actor_rollout_ref.model.path=", "as a hub id:", "Fix:")
    assert "cannot be reached" in result.err or "has no such model" in result.err


def test_tokenizer_path_typo(job, assets):
    result = job(f"actor_rollout_ref.model.tokenizer_path={assets['model']}-tokenizer")
    assert_refused(result, "actor_rollout_ref.model.tokenizer_path=", "Fix:")


def test_critic_model_path_checked_only_for_ppo(job, tmp_path):
    missing = f"critic.model.path={tmp_path}/critic-model"
    assert job(missing).code is None  # GRPO trains no critic: its model path is never loaded
    result = job(missing, "algorithm.adv_estimator=gae")
    assert_refused(result, "critic.model.path=", "no folder", "Fix:")


def test_model_path_in_a_hub_cache_offline(job, tmp_path, assets, monkeypatch):
    """A hub id already downloaded is fine offline: the check reads the hub cache, as transformers would."""
    cache = tmp_path / "hf" / "hub" / "models--someone--tiny"
    snap = cache / "snapshots" / "0"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((assets["model"] / "config.json").read_text())
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("0")
    assert preflight.model_path_problem("someone/tiny") is None
    assert preflight.model_path_problem("someone/other") is not None


# Data files -----------------------------------------------------------------------------------------------------
def test_train_file_missing(job, tmp_path):
    result = job(f"data.train_files={tmp_path}/data/gsm8k/train.parquet")
    assert_refused(result, "data.train_files=", "does not exist", "Fix: set data.train_files")


def test_val_file_missing_in_a_list(job, assets, tmp_path):
    result = job(f"data.val_files=[{assets['val']},{tmp_path}/val2.parquet]")
    assert_refused(result, "data.val_files=", "val2.parquet does not exist", "Fix:")


def test_train_file_truncated_parquet(job, assets, tmp_path):
    cut = tmp_path / "cut.parquet"
    data = assets["train"].read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    result = job(f"++data.train_files={cut}")
    assert_refused(result, "data.train_files=", "not a complete parquet file", "Fix:")


def test_train_file_wrong_format(job, tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("prompt,answer\n1+1,2\n")
    result = job(f"data.train_files={csv}")
    assert_refused(result, "data.train_files=", "train.csv is none of these", "Fix:")


def test_train_file_is_a_folder(job, assets):
    result = job(f"data.train_files={assets['root']}")
    assert_refused(result, "data.train_files=", "is not a file", "Fix:")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_train_file_unreadable(job, assets, tmp_path):
    locked = tmp_path / "locked.parquet"
    locked.write_bytes(assets["train"].read_bytes())
    locked.chmod(0)
    result = job(f"data.train_files={locked}")
    assert_refused(result, "data.train_files=", "cannot be read", "Fix:")


def test_reward_function_file_missing(job, tmp_path):
    result = job(f"reward.custom_reward_function.path={tmp_path}/my_reward.py")
    assert_refused(result, "reward.custom_reward_function.path=", "does not exist", "Fix:")


# Fractions and sizes --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, key, why",
    [
        ("actor_rollout_ref.rollout.gpu_memory_utilization=1.5", "gpu_memory_utilization", "(0, 1]; 1.5 is out of"),
        ("++actor_rollout_ref.rollout.gpu_memory_utilization=0", "gpu_memory_utilization", "0 is out of range"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization=-0.3", "gpu_memory_utilization", "-0.3 is out of range"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization=90%", "gpu_memory_utilization", "'90%' is not a number"),
        ("actor_rollout_ref.rollout.top_p=0", "rollout.top_p", "must be a fraction in (0, 1]; 0 is out of range"),
        ("actor_rollout_ref.rollout.temperature=-1", "rollout.temperature", ">= 0; -1 is out of range"),
        ("actor_rollout_ref.rollout.n=0", "rollout.n", "must be a whole number >= 1; 0 is out of range"),
        ("data.train_batch_size=0", "data.train_batch_size", "must be a whole number >= 1; 0 is out"),
        ("data.max_response_length=2.5", "data.max_response_length", "2.5 is not a whole number"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0", "ppo_micro_batch_size_per_gpu", "0 is out of range"),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=1.5", "lr_warmup_steps_ratio", "[0, 1]; 1.5 is out"),
        ("trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node", "must be a whole number >= 1; 0 is out"),
        ("trainer.total_training_steps=0", "trainer.total_training_steps", "0 is out of range"),
    ],
)
def test_out_of_range(job, override, key, why):
    assert_refused(job(override), key, "cpu", why, "Fix: set")


def test_reward_model_fraction_only_when_enabled(job):
    bad = "reward.reward_model.rollout.gpu_memory_utilization=2"
    assert job(bad).code is None  # no reward model: the key is never read
    assert preflight.Range("x", 0, 1, low_open=True).problem(2) == "out of range"


def test_range_texts():
    frac = preflight.Range("k", 0, 1, low_open=True)
    assert [frac.problem(v) is None for v in (1, 0.5, 1e-9)] == [True, True, True]
    assert [frac.problem(v) is None for v in (0, 1.0001, math.nan, True, "0.5", None)] == [False] * 6
    assert preflight.Range("k", 1, integer=True, nullable=True).problem(None) is None


# Devices per node -----------------------------------------------------------------------------------------------
def _config(**trainer) -> object:
    return OmegaConf.create({"trainer": {"nnodes": 1, "n_gpus_per_node": 8, **trainer}, "ray_kwargs": {}})


def test_more_gpus_per_node_than_the_host_has(monkeypatch):
    monkeypatch.setattr(preflight, "host_gpu_count", lambda: 2)
    with pytest.raises(InvalidSettingError) as e:
        preflight._check_devices_per_node(_config(), "a100 (sm_80, 80.0 GiB)")
    msg = str(e.value)
    assert "trainer.n_gpus_per_node=8" in msg and "this host (2 GPUs; a100" in msg
    assert "Fix: set trainer.n_gpus_per_node=2" in msg
    preflight._check_devices_per_node(_config(n_gpus_per_node=2), "a100")  # fits
    preflight._check_devices_per_node(_config(nnodes=2), "a100")  # other hosts: Ray's business
    cluster = {"trainer": {"nnodes": 1, "n_gpus_per_node": 8}, "ray_kwargs": {"ray_init": {"address": "auto"}}}
    preflight._check_devices_per_node(OmegaConf.create(cluster), "a100")


def test_cpu_platform_counts_processes_not_gpus():
    """On this CPU host n_gpus_per_node is the number of worker processes: any number can run."""
    assert preflight.host_gpu_count() is None
    preflight._check_devices_per_node(_config(n_gpus_per_node=64), "cpu")
