"""The trainer's HFModelConfig built during ray.init in the driver, taken only for the same model section."""

from __future__ import annotations

import pytest
import ray
from omegaconf import OmegaConf
from test_rollout_server import make_tiny_model_dir

from verl_compat import model_config_ahead
from verl_compat.model_config_ahead import section_key, start_in_driver, trainer_model_config

TARGET = "verl.workers.config.HFModelConfig"  # as in verl's packaged config: the trainer instantiates it


@pytest.fixture(scope="module")
def runner():
    """verl's own TaskRunner class, the one run in the driver (verl_compat.task_runner)."""
    from verl.trainer.main_ppo import TaskRunnerV1

    return TaskRunnerV1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen"))


def _job(model_dir, engine="hf", **model):
    return OmegaConf.create(
        {
            "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}, "nnodes": 1, "n_gpus_per_node": 1},
            "actor_rollout_ref": {
                "hybrid_engine": True,
                "model": {"_target_": TARGET, "path": str(model_dir), "trust_remote_code": False, **model},
                "rollout": {"name": engine, "tensor_model_parallel_size": 1},
            },
        }
    )


@pytest.fixture(autouse=True)
def no_leftover_build():
    yield
    model_config_ahead._DRIVER = None


def test_driver_build_taken_by_the_trainer_for_the_same_section(model_dir, runner):
    job = _job(model_dir)
    assert start_in_driver(job, runner)
    ahead = model_config_ahead._DRIVER
    ahead._thread.join()
    early = ahead._built
    assert early is not None
    # the TaskRunner works on its own copy of the config, as it would in its own process
    taken = trainer_model_config(OmegaConf.create(OmegaConf.to_container(job)).actor_rollout_ref.model)
    assert taken is early
    assert taken.tokenizer is not None and taken.hf_config.model_type == "qwen2"
    assert model_config_ahead._DRIVER is None  # handed over once: a second call builds its own
    assert trainer_model_config(job.actor_rollout_ref.model) is not early


def test_changed_section_is_built_again(model_dir, runner):
    job = _job(model_dir)
    assert start_in_driver(job, runner)
    early = model_config_ahead._DRIVER
    changed = _job(model_dir, use_shm=False).actor_rollout_ref.model
    taken = trainer_model_config(changed)
    early._thread.join()
    assert taken is not early._built and not taken.use_shm
    assert taken.local_path == str(model_dir)


def test_failed_early_build_raises_where_verl_builds(model_dir, runner):
    job = _job(model_dir / "missing")
    assert start_in_driver(job, runner)  # the thread's failure is kept, not raised
    model_config_ahead._DRIVER._thread.join()
    assert model_config_ahead._DRIVER._error is not None
    with pytest.raises(Exception) as raised:
        trainer_model_config(job.actor_rollout_ref.model)
    assert "missing" in str(raised.value)


def test_only_where_the_trainer_runs_in_the_driver(model_dir, runner):
    assert not start_in_driver(_job(model_dir, engine="vllm"), runner)
    off = _job(model_dir)
    off.actor_rollout_ref.rollout.engine_kwargs = {"hf": {"prestart": False}}
    assert not start_in_driver(off, runner)

    class RecipeRunner(runner.__ray_actor_class__):  # a recipe's TaskRunner runs as a Ray actor, builds its own
        pass

    assert not start_in_driver(_job(model_dir), ray.remote(RecipeRunner))
    assert model_config_ahead._DRIVER is None


def test_section_key_is_plain_content_or_none():
    assert section_key(OmegaConf.create({"path": "${oc.env:VERL_COMPAT_TEST_UNSET_VAR}"})) is None  # never reused
    assert section_key(OmegaConf.create({"a": 1, "b": "${a}"})) == {"a": 1, "b": 1}
    assert section_key({"path": "m"}) == {"path": "m"} and section_key(object()) is None  # a built dataclass
