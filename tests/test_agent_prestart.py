"""Agent-loop workers started by the driver and adopted by verl's manager (verl_compat.rollout.agent_prestart): when
they are started, that the manager's creation call gets the prestarted process with verl's own arguments, that
another worker class gets upstream's creation, and that a worker that cannot be built says so."""

from __future__ import annotations

import inspect
import os

import pytest
import ray
from omegaconf import OmegaConf

from tests.agent_fakes import FakeWorker, OtherWorker
from verl_compat.rollout import agent_prestart
from verl_compat.rollout.agent_prestart import NAME, AgentWorkerHost, worker_class, worker_count

FAKE = "tests.agent_fakes:FakeWorker"


def _config(**agent):
    return OmegaConf.create(
        {
            "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}, "nnodes": 1, "n_gpus_per_node": 1},
            "actor_rollout_ref": {
                "hybrid_engine": True,
                "rollout": {"name": "hf", "tensor_model_parallel_size": 1, "agent": {"num_workers": 2, **agent}},
            },
        }
    )


def test_started_only_where_the_manager_adopts():
    assert worker_count(_config()) == 2
    for change in (
        {"actor_rollout_ref": {"rollout": {"name": "vllm"}}},
        {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"hf": {"prestart": False}}}}},
        {"actor_rollout_ref": {"rollout": {"agent": {"agent_loop_manager_class": "my.Manager"}}}},
        {"trainer": {"v1": {"trainer_mode": "separate_async"}}},
        {"trainer": {"nnodes": 2}},
    ):
        assert worker_count(OmegaConf.merge(_config(), change)) == 0, change


def test_the_host_answers_every_public_method_of_verls_worker():
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    def public(cls):
        return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}

    assert public(AgentLoopWorkerTQ.__ray_actor_class__) <= public(AgentWorkerHost)
    assert agent_prestart.resolve(agent_prestart.DEFAULT_WORKER) is AgentLoopWorkerTQ


def _clear(count=2):
    for i in range(count):
        agent_prestart._kill(NAME.format(i))


async def test_prestarted_processes_become_the_managers_workers(local_ray):
    _clear()
    assert agent_prestart.start(_config(), worker=FAKE) == [NAME.format(0), NAME.format(1)]
    early = [ray.get_actor(NAME.format(i)) for i in range(2)]
    await early[0].warm.remote(FAKE)  # the driver's imports are done
    pids = set()
    for i in range(2):
        creator = worker_class(FakeWorker, i, worker=FAKE)
        handle = creator.options(name=f"agent_loop_worker_{i}_abc", scheduling_strategy=None).remote("cfg", i, tag="t")
        assert handle._actor_id == early[i]._actor_id  # adopted, not a new process
        out = await handle.generate_sequences.remote({"prompt": i})
        assert out["args"] == ("cfg", i, "t") and out["batch"] == {"prompt": i}
        pids.add(out["pid"])
    assert len(pids) == 2 and os.getpid() not in pids
    with pytest.raises(ValueError):
        ray.get_actor("agent_loop_worker_0_abc")  # nothing was created under the manager's own name
    _clear()


async def test_another_worker_class_is_created_as_upstream_does(local_ray):
    _clear()
    agent_prestart.start(_config(num_workers=1), worker=FAKE)
    assert worker_class(OtherWorker, 0, worker=FAKE) is OtherWorker
    with pytest.raises(ValueError):
        ray.get_actor(NAME.format(0))  # the unused early process is gone
    assert worker_class(FakeWorker, 0, worker=FAKE) is FakeWorker  # none left to adopt: upstream's creation


async def test_a_worker_that_cannot_be_built_says_why(local_ray):
    _clear()
    agent_prestart.start(_config(num_workers=1), worker=FAKE)
    handle = worker_class(FakeWorker, 0, worker=FAKE).options().remote("fail", 0)
    with pytest.raises(ray.exceptions.RayTaskError, match="could not be built.*no tokenizer at /nowhere"):
        await handle.generate_sequences.remote({})
    _clear(1)
