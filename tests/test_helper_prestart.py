"""Agent- and reward-loop workers started by the driver and adopted by verl's managers (verl_compat.helper_prestart):
when they are started, that a manager's creation call gets the prestarted process with verl's own arguments, that
another worker class gets upstream's creation, and that a worker that cannot be built says so."""

from __future__ import annotations

import inspect
import os
from dataclasses import replace

import pytest
import ray
from omegaconf import OmegaConf

from tests.helper_fakes import FakeWorker, OtherWorker, PlainActor
from verl_compat import helper_prestart
from verl_compat.helper_prestart import KINDS, count, worker_class

AGENT, REWARD, BALANCER = KINDS["agent"], KINDS["reward"], KINDS["balancer"]
FAKES = {"agent": replace(AGENT, worker="tests.helper_fakes:FakeWorker", name="test_helper_{}")}
NAME = FAKES["agent"].name


def _config(agents=2, rewards=1, **extra):
    base = {
        "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}, "nnodes": 1, "n_gpus_per_node": 1},
        "actor_rollout_ref": {
            "hybrid_engine": True,
            "rollout": {"name": "hf", "tensor_model_parallel_size": 1, "agent": {"num_workers": agents}},
        },
        "reward": {"num_workers": rewards, "reward_model": {"enable": False}},
        "reward_model": {"num_workers": None},
    }
    return OmegaConf.merge(OmegaConf.create(base), extra)


def test_started_only_where_the_managers_adopt():
    assert (count(AGENT, _config()), count(REWARD, _config()), count(BALANCER, _config())) == (2, 1, 1)
    assert count(BALANCER, _config(actor_rollout_ref={"rollout": {"router_config_path": "router.yaml"}})) == 0
    assert count(REWARD, _config(reward_model={"num_workers": 3})) == 3  # verl's legacy key wins when set
    assert count(REWARD, _config(reward={"reward_model": {"enable": True}})) == 0
    assert count(AGENT, _config(actor_rollout_ref={"rollout": {"agent": {"agent_loop_manager_class": "m.M"}}})) == 0
    for change in (
        {"actor_rollout_ref": {"rollout": {"name": "vllm"}}},
        {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"hf": {"prestart": False}}}}},
        {"trainer": {"v1": {"trainer_mode": "separate_async"}}},
        {"trainer": {"nnodes": 2}},
    ):
        assert count(AGENT, _config(**change)) == count(REWARD, _config(**change)) == 0, change
        assert count(BALANCER, _config(**change)) == 0, change


def test_each_host_answers_every_public_method_of_its_worker():
    def public(cls):
        return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}

    for kind in KINDS.values():
        worker = helper_prestart.plain_class(helper_prestart.resolve(kind.worker))
        assert public(worker) <= public(kind.host), kind.worker


def _clear(count=2):
    for i in range(count):
        helper_prestart._kill(NAME.format(i))


async def test_prestarted_processes_become_the_managers_workers(local_ray):
    _clear()
    assert helper_prestart.start(_config(), kinds=FAKES) == [NAME.format(0), NAME.format(1)]
    early = [ray.get_actor(NAME.format(i)) for i in range(2)]
    await early[0].warm.remote(FAKES["agent"].worker)  # the driver's imports are done
    pids = set()
    for i in range(2):
        creator = worker_class("agent", FakeWorker, i, kinds=FAKES)
        handle = creator.options(name=f"agent_loop_worker_{i}_abc", scheduling_strategy=None).remote("cfg", i, tag="t")
        assert handle._actor_id == early[i]._actor_id  # adopted, not a new process
        out = await handle.generate_sequences.remote({"prompt": i})
        assert out["args"] == ("cfg", i, "t") and out["batch"] == {"prompt": i}
        pids.add(out["pid"])
    assert len(pids) == 2 and os.getpid() not in pids
    with pytest.raises(ValueError):
        ray.get_actor("agent_loop_worker_0_abc")  # nothing was created under the manager's own name
    assert worker_class("agent", FakeWorker, 0, kinds=FAKES) is FakeWorker  # a second creation: upstream's
    _clear()


async def test_a_host_runs_below_the_jobs_other_processes(local_ray):
    """The trainer worker's start-up is the critical path; the hosts' imports and work yield the CPU to it."""
    _clear()
    helper_prestart.start(_config(agents=1), kinds=FAKES)
    await ray.get_actor(NAME.format(0)).warm.remote(FAKES["agent"].worker)
    handle = worker_class("agent", FakeWorker, 0, kinds=FAKES).options().remote("cfg", 0)
    out = await handle.generate_sequences.remote({})
    plain = PlainActor.remote()
    base = await plain.nice.remote()
    assert out["nice"] == min(19, base + helper_prestart.HELPER_NICE) and out["nice"] > base
    ray.kill(plain)
    _clear(1)


def test_the_hosts_module_imports_no_torch():
    """Ray imports the host's module before ``warm`` lowers its priority: torch, transformers and verl come after."""
    import subprocess
    import sys

    heavy = "{'torch', 'transformers', 'verl'}"
    probe = f"import sys, verl_compat.helper_prestart; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_another_worker_class_is_created_as_upstream_does(local_ray):
    _clear()
    helper_prestart.start(_config(agents=1), kinds=FAKES)
    assert worker_class("agent", OtherWorker, 0, kinds=FAKES) is OtherWorker
    with pytest.raises(ValueError):
        ray.get_actor(NAME.format(0))  # the unused early process is gone
    assert worker_class("agent", FakeWorker, 0, kinds=FAKES) is FakeWorker  # none left to adopt: upstream's


async def test_a_worker_that_cannot_be_built_says_why(local_ray):
    _clear()
    helper_prestart.start(_config(agents=1), kinds=FAKES)
    handle = worker_class("agent", FakeWorker, 0, kinds=FAKES).options().remote("fail", 0)
    with pytest.raises(ray.exceptions.RayTaskError, match="could not be built.*no tokenizer at /nowhere"):
        await handle.generate_sequences.remote({})
    _clear(1)


async def test_verls_request_router_is_the_prestarted_process(local_ray):
    """verl's own router factory (router.py, patch 0023) hands its servers to the driver's early process."""
    from verl.workers.rollout.router import get_router_handle

    name = BALANCER.name.format(0)
    helper_prestart._kill(name)
    assert helper_prestart.start(_config(agents=0, rewards=0)) == [name]
    early = ray.get_actor(name)
    router = get_router_handle(servers={"10.0.0.1:8000": "server-0"})
    assert router._actor_id == early._actor_id
    assert await router.acquire_server.remote(request_id="r1") == ("10.0.0.1:8000", "server-0")
    assert await router.get_total_inflight.remote() == 1
    await router.release_server.remote("10.0.0.1:8000", request_id="r1")
    assert await router.get_all_servers.remote() == ["10.0.0.1:8000"]
    helper_prestart._kill(name)
