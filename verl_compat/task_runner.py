"""verl's v1 TaskRunner run in the driver's own process, where verl-compat's early start-up applies.

Why: verl's driver imports torch, transformers and verl, calls ``ray.init`` and then creates the TaskRunner, a Ray
actor whose fresh process imports all of them again before its ``run`` starts the trainer: 17.6 s of the H100
host's start-up at 32d9ca7 (the TaskRunner's process from 26.3 s, its trainer set-up from 43.9 s;
``benchmarks/results/p40_h100_ppo_head_to_head_32d9ca7.json``, ``raw.startup_trace``), all before the trainer's
worker is even created. The driver has those modules already, so here ``run`` is called in the driver; its
``tq.init`` goes on beside the driver's early TransferQueue start instead of waiting for it
(verl_compat.tq_prestart.runner_in_this_process).

What the actor would have had, the driver gets: the job's runtime environment variables (verl's
``get_ppo_ray_runtime_env`` and ``ray_kwargs.ray_init.runtime_env.env_vars``) are set before ``run``, and ``run``
gets its own copy of the config, as the actor got one through Ray. Only where the rest of the early start-up applies
(``verl_compat.rollout.prestart.server_names``: the `hf` engine, verl's v1 synchronous trainer, hybrid replicas,
one node), only for verl's own ``TaskRunnerV1`` (a recipe's class runs as an actor, as upstream), and only where
the job's runtime environment holds nothing but environment variables (a ``working_dir``, ``pip`` or container
would make the actor's process differ from the driver's). Same switch as the other early starts:
``actor_rollout_ref.rollout.engine_kwargs.hf.prestart=false``.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from typing import Any

from verl_compat.helper_prestart import plain_class
from verl_compat.rollout.prestart import server_names

logger = logging.getLogger("verl_compat.task_runner")

VERL_RUNNER = "verl.trainer.main_ppo.TaskRunnerV1"


def job_env_vars() -> dict[str, str] | None:
    """The job's runtime-environment variables; None where that environment holds more than variables."""
    import ray

    env = dict(ray.get_runtime_context().runtime_env or {})
    variables = env.pop("env_vars", None) or {}
    if any(value is not None for value in env.values()):  # verl passes working_dir=None for "none"
        return None
    return {str(k): str(v) for k, v in variables.items()}


def class_path(cls: Any) -> str:
    """``module.qualname`` of the class under a Ray actor class; ``python -m verl.trainer.main_ppo`` defines it in
    ``__main__``, named here by the module that ran."""
    plain = plain_class(cls)
    module = plain.__module__
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = getattr(spec, "name", None) or module
    return f"{module}.{plain.__qualname__}"


def in_driver(config: Any, cls: Any) -> bool:
    if class_path(cls) != VERL_RUNNER or not server_names(config):
        return False
    return job_env_vars() is not None


def runner_class(config: Any, cls: Any) -> Any:
    """What ``run_ppo`` calls ``.remote()`` on: ``cls`` (verl's actor) or one that runs it here."""
    if not in_driver(config, cls):
        return cls
    logger.info("verl's TaskRunner runs in the driver's process (it has imported verl already)")
    return _InDriver(plain_class(cls))


class _InDriver:
    """``cls.remote()`` -> a handle whose ``run.remote(config)`` runs the TaskRunner here, returning an ObjectRef."""

    def __init__(self, cls: type) -> None:
        self._cls = cls

    def remote(self) -> _Handle:
        return _Handle(self._cls())


class _Handle:
    def __init__(self, runner: Any) -> None:
        self.run = _Run(runner)


class _Run:
    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def remote(self, config: Any) -> Any:
        import ray

        from verl_compat import tq_prestart

        os.environ.update(job_env_vars() or {})  # Ray sets them over the inherited ones in the actor's process
        with tq_prestart.runner_in_this_process():
            return ray.put(self._runner.run(copy.deepcopy(config)))
