"""verl's TaskRunner run in the driver's process (verl_compat.task_runner): when it is, that its ``run`` gets what the
actor would have had (the job's runtime environment variables, its own copy of the config) and ``ray.get`` what it
expects back, and that every other case keeps verl's actor class."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import ray
from omegaconf import OmegaConf

from verl_compat import task_runner
from verl_compat.task_runner import VERL_RUNNER, class_path, job_env_vars, runner_class


class Runner:
    """Stands for verl's TaskRunnerV1: records where and with what its ``run`` ran."""

    seen: dict = {}

    def run(self, config):
        import transfer_queue as tq
        from transfer_queue import interface

        Runner.seen.update(pid=os.getpid(), env=os.environ.get("VERL_COMPAT_TEST_JOB_VAR"), config=config)
        Runner.seen["own_tq_init"] = tq.init is interface.init  # verl's run calls tq.init first
        config.trainer.touched = True  # verl's run resolves and edits its config
        return "done"


RemoteRunner = ray.remote(Runner)


def _config(**extra):
    base = {
        "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}, "nnodes": 1, "n_gpus_per_node": 1},
        "actor_rollout_ref": {"hybrid_engine": True, "rollout": {"name": "hf", "tensor_model_parallel_size": 1}},
    }
    return OmegaConf.merge(OmegaConf.create(base), extra)


def test_verls_runner_is_named_by_its_module_also_when_run_as_main(monkeypatch):
    from verl.trainer.main_ppo import TaskRunnerV1

    assert class_path(TaskRunnerV1) == VERL_RUNNER
    # `python -m verl.trainer.main_ppo` defines the class in __main__
    monkeypatch.setattr(Runner, "__module__", "__main__")
    main = SimpleNamespace(__spec__=SimpleNamespace(name="verl.trainer.main_ppo"))
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert class_path(ray.remote(Runner)) == "verl.trainer.main_ppo.Runner"


def test_runtime_environment_of_variables_only(monkeypatch):
    def context(env):
        monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(runtime_env=env))

    context({"env_vars": {"A": "1"}, "working_dir": None})  # what verl's get_ppo_ray_runtime_env passes
    assert job_env_vars() == {"A": "1"}
    context({})
    assert job_env_vars() == {}
    for other in ({"working_dir": "/src"}, {"pip": ["x"]}, {"env_vars": {"A": "1"}, "py_modules": ["m"]}):
        context(other)
        assert job_env_vars() is None, other


def test_verls_actor_class_kept_outside_the_early_start_up(local_ray, monkeypatch):
    monkeypatch.setattr(task_runner, "VERL_RUNNER", class_path(RemoteRunner))
    assert runner_class(_config(), RemoteRunner) is not RemoteRunner
    for change in (
        {"actor_rollout_ref": {"rollout": {"name": "vllm"}}},
        {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"hf": {"prestart": False}}}}},
        {"actor_rollout_ref": {"hybrid_engine": False}},
        {"trainer": {"v1": {"trainer_mode": "separate_async"}}},
        {"trainer": {"nnodes": 2}},
    ):
        assert runner_class(_config(**change), RemoteRunner) is RemoteRunner, change
    monkeypatch.setattr(task_runner, "VERL_RUNNER", VERL_RUNNER)  # a recipe's own runner class
    assert runner_class(_config(), RemoteRunner) is RemoteRunner
    monkeypatch.setattr(task_runner, "VERL_RUNNER", class_path(RemoteRunner))
    monkeypatch.setattr(task_runner, "job_env_vars", lambda: None)  # a working_dir, pip, container...
    assert runner_class(_config(), RemoteRunner) is RemoteRunner


def test_run_in_the_driver_gets_what_the_actor_had(local_ray, monkeypatch):
    monkeypatch.setattr(task_runner, "VERL_RUNNER", class_path(RemoteRunner))
    monkeypatch.setattr(task_runner, "job_env_vars", lambda: {"VERL_COMPAT_TEST_JOB_VAR": "from-runtime-env"})
    monkeypatch.setenv("VERL_COMPAT_TEST_JOB_VAR", "inherited")  # restored after the test
    import transfer_queue as tq
    from transfer_queue import interface

    config = _config()
    runner = runner_class(config, RemoteRunner).remote()
    assert ray.get(runner.run.remote(config)) == "done"
    assert Runner.seen["own_tq_init"] is False  # its tq.init goes through tq_prestart.runner_in_this_process
    assert tq.init is interface.init  # and only while it runs
    assert Runner.seen["pid"] == os.getpid()
    assert Runner.seen["env"] == "from-runtime-env"  # Ray sets the job's variables over inherited ones
    assert Runner.seen["config"].trainer.touched is True
    assert "touched" not in config.trainer  # the driver's config is not the one run edited


def test_run_in_the_driver_raises_the_runners_own_error(local_ray, monkeypatch):
    class Failing(Runner):
        def run(self, config):
            raise ValueError("data.train_files: no such file")

    remote = ray.remote(Failing)
    monkeypatch.setattr(task_runner, "VERL_RUNNER", class_path(remote))
    with pytest.raises(ValueError, match="data.train_files"):
        runner_class(_config(), remote).remote().run.remote(_config())
