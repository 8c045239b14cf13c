"""Start verl's agent-loop and reward-loop worker processes and its request router from the driver right after
``ray.init``; verl adopts them where it would create them.

Why: verl's v1 TaskRunner creates the reward-loop manager at the end of the trainer's set-up and the agent-loop
manager after it, and each manager starts fresh processes (``reward.num_workers``; ``rollout.agent.num_workers``,
8) that import torch, transformers and verl before they answer. Step 1 waits for them, where the start-up figure
(time before step 1) does not show it: on the H100 host at 32d9ca7 step 1 took 33.1 s against 5.2-5.6 s for later
steps; the reward-loop worker imported from 78.6 s to 94 s and the eight agent-loop workers from 82.5 s to 100 s,
and the first prefill came at 101.2 s (``benchmarks/results/p40_h100_ppo_head_to_head_32d9ca7.json``,
``raw.startup_trace``). Started from the driver, the same imports overlap the trainer's start-up. With those
prestarted, step 1 still waited for one more process: the request router (``GlobalRequestLoadBalancer``), which
verl's LLMServerManager creates once the servers are up; on the H100 host at b8a240e it imported from 52.9 s to
about 61.5 s of a job whose step 1 began at 53.1 s, the first prefill came at 64.0 s, and step 1's generation took
10.4 s against 1.5 s for step 2 (``benchmarks/results/p40_h100_ppo_planned_task_runner_in_driver_b8a240e.json``).

A prestarted process is a host (:class:`AgentWorkerHost`, :class:`RewardWorkerHost`, :class:`BalancerHost`): it
imports the worker's module (``warm``), and builds the real worker, verl's own class with verl's own arguments,
where verl would have created it (``configure``); verl's calls are passed through. Only where the adoption is
certain (the rollout servers' prestart conditions: `hf` engine, v1 synchronous trainer, one node), only for verl's
default worker classes (any other class is created as upstream does, and the early processes are removed), not for a
reward model's workers and not for a router plugin (``rollout.router_config_path``). Same switch as the other
early starts: ``actor_rollout_ref.rollout.engine_kwargs.hf.prestart=false``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from verl_compat.ray_nodes import only_node
from verl_compat.resolvers.helpers import AGENT_WORKERS_KEY, HELPERS
from verl_compat.rollout.prestart import get_key, server_names

logger = logging.getLogger("verl_compat.helper_prestart")


HELPER_NICE = 10  # a prestarted helper's CPU priority below the job's other processes (Unix nice steps)


def lower_priority() -> None:
    """This thread (an async host's event loop: ``warm``'s imports, then verl's worker built and run in it, and the
    threads it starts) yields the CPU to the job's other processes. The hosts import torch, transformers and verl
    from the moment ``ray.init`` returns, when the trainer worker does the same on the start-up's critical path; its
    imports ended only 1-7 s after the ten hosts' on the H100 host, and taking 2 s off the start of the trainer
    worker left its model builds starting no sooner (``docs/measurements.md``, patch 0026). The hosts are needed at
    step 1 and do little then (requests, a rule-based score), so where the CPUs are shared they can wait; where
    they are not, niceness changes nothing."""
    try:
        os.nice(HELPER_NICE)
    except (AttributeError, OSError):  # no nice on this platform, or not permitted: run as before
        logger.debug("helper priority not lowered", exc_info=True)


class _Host:
    """A Ray actor (async: verl's workers' methods are coroutines) that becomes one worker of ``KINDS``."""

    def __init__(self) -> None:
        self.worker: Any = None
        self.error: BaseException | None = None
        self._configured = asyncio.Event()  # Ray runs an async actor's __init__ on its event loop

    def warm(self, worker: str) -> None:
        """The driver's first call: import the worker's module, at a lower priority (``lower_priority``). Never
        raises: a failure here comes back from ``configure``, where the manager sees it."""
        lower_priority()
        try:
            importlib.import_module(worker.partition(":")[0])
        except Exception:  # noqa: BLE001 - the construction imports it again and reports
            logger.debug("%s not imported early", worker, exc_info=True)

    def configure(self, worker: str, args: tuple, kwargs: dict) -> None:
        """Build verl's worker in this process, as Ray would have built the actor (same thread, loop running)."""
        try:
            self.worker = plain_class(resolve(worker))(*args, **kwargs)
        except BaseException as exc:  # raised again by every call, as by an actor whose constructor failed
            self.error = exc
            raise
        finally:
            self._configured.set()

    async def _ready(self) -> Any:
        await self._configured.wait()
        if self.error is not None:
            raise RuntimeError(f"the {type(self).__name__} worker could not be built: {self.error!r}") from self.error
        return self.worker


def _passed_through(method: str) -> Any:
    async def call(self: _Host, *args: Any, **kwargs: Any) -> Any:
        result = getattr(await self._ready(), method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result  # verl's loop workers' methods are coroutines

    call.__name__ = call.__qualname__ = method
    return call


def _host(name: str, methods: tuple[str, ...]) -> type[_Host]:
    """A host class answering ``methods`` by its worker's; a module attribute under ``name``, so that Ray finds it
    by reference in the host's process."""
    cls = type(name, (_Host,), {m: _passed_through(m) for m in methods})
    cls.__module__ = __name__
    return cls


# Each host answers its worker class's public methods (tests/test_helper_prestart.py checks the lists are complete).
AgentWorkerHost = _host("AgentWorkerHost", ("generate_sequences",))
RewardWorkerHost = _host("RewardWorkerHost", ("compute_score", "compute_score_batch", "compute_score_disrm"))
BalancerHost = _host(
    "BalancerHost",
    (
        "acquire_server",
        "release_server",
        "require_acquire_fields",
        "require_release_fields",
        "add_servers",
        "remove_servers",
        "get_inflight_count",
        "get_all_servers",
        "clear_sticky_cache",
        "get_status",
        "get_total_inflight",
    ),
)


@dataclass(frozen=True)
class Kind:
    worker: str  # verl's worker class the manager creates, "module:attribute"
    name: str  # the prestarted processes' Ray names
    host: type[_Host]
    counts: tuple[str, ...]  # config keys of the manager's worker count, the first one set wins
    not_when: str  # a config key that, when set, makes the manager create other workers (or none of these)
    default: int = 0  # the count where none of ``counts`` is set


KINDS = {
    # verl's v1 TaskRunner's agent-loop manager (AgentLoopManagerTQ) creates this class; a manager class of the
    # user's own may create others
    "agent": Kind(
        "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ",
        "verl_compat_agent_loop_worker_{}",
        AgentWorkerHost,
        counts=(AGENT_WORKERS_KEY,),
        not_when="actor_rollout_ref.rollout.agent.agent_loop_manager_class",
    ),
    # verl's legacy count key overrides the current one when set (platform.helpers' table has both); a reward
    # model's workers wait for its router, left to verl
    "reward": Kind(
        "verl.experimental.reward_loop.reward_loop:RewardLoopWorker",
        "verl_compat_reward_loop_worker_{}",
        RewardWorkerHost,
        counts=(HELPERS["reward.num_workers"].legacy, "reward.num_workers"),
        not_when="reward.reward_model.enable",
    ),
    # verl's LLMServerManager creates one request router for its servers once they are up (router.py); the first
    # generation waits for its process's imports. A router YAML plugin is left to verl.
    "balancer": Kind(
        "verl.workers.rollout.router:GlobalRequestLoadBalancer",
        "verl_compat_load_balancer_{}",
        BalancerHost,
        counts=(),
        not_when="actor_rollout_ref.rollout.router_config_path",
        default=1,
    ),
}

# The driver keeps the handles, by name: Ray collects a named actor that no handle refers to.
_PRESTARTED: dict[str, Any] = {}
# Hosts this process has handed to a creation call: a second call for the same index (a distillation teacher's
# router beside the rollout's) creates its own worker, as upstream.
_ADOPTED: set[str] = set()


def resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def plain_class(cls: Any) -> Any:
    """The class under a Ray actor class (``ray.remote(C)`` makes a new wrapper on every call)."""
    return getattr(cls, "__ray_actor_class__", cls)


def count(kind: Kind, config: Any) -> int:
    """How many workers of ``kind`` to start early: the manager's own count where the adoption is certain (the
    servers' prestart conditions and nothing set that changes what the manager creates), else 0."""
    if not server_names(config) or get_key(config, kind.not_when):
        return 0
    workers = next((v for v in (get_key(config, key) for key in kind.counts) if v is not None), kind.default)
    return max(0, int(workers))


def start(config: Any, kinds: dict[str, Kind] | None = None) -> list[str]:
    """Driver, after ``ray.init``: create the hosts and let them import; returns their names."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    kinds = KINDS if kinds is None else kinds
    node_id = only_node(require_cpu=True)
    if node_id is None:
        return []
    # The managers' own placement on one node: soft affinity to it (agent_loop.py and reward_loop.py).
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=True)
    names = []
    for kind in kinds.values():
        host_class = ray.remote(kind.host)
        for i in range(count(kind, config)):
            name = kind.name.format(i)
            _kill(name)  # a previous job of this driver left it
            _ADOPTED.discard(name)
            handle = host_class.options(name=name, scheduling_strategy=strategy).remote()
            handle.warm.remote(kind.worker)
            _PRESTARTED[name] = handle
            names.append(name)
    if names:
        logger.info("started %d agent-/reward-loop worker process(es) early", len(names))
    return names


def worker_class(kind: str, cls: Any, index: int, kinds: dict[str, Kind] | None = None) -> Any:
    """The managers' seam: what ``cls.options(...).remote(*args)`` should go through for worker ``index`` of
    ``kind``: the prestarted host's adopter where one runs and ``cls`` is the class it was started for; else
    ``cls`` itself (upstream's creation), removing a prestarted host that will not be used."""
    import ray

    spec = (KINDS if kinds is None else kinds)[kind]
    name = spec.name.format(index)
    if name in _ADOPTED:
        return cls
    try:
        handle = ray.get_actor(name)
    except ValueError:
        return cls
    if plain_class(cls) is not plain_class(resolve(spec.worker)):
        _kill(name)
        logger.info("%s is not %s: its early process %s is removed", cls, spec.worker, name)
        return cls
    _ADOPTED.add(name)
    return _Adopter(handle, spec.worker)


class _Adopter:
    """Stands in for ``cls.options(...)``: ``.remote(*args)`` hands the host verl's constructor arguments and returns
    the host's handle. The options' name and placement are the manager's per-creation ones; the host was placed by
    the same rule when it started."""

    def __init__(self, handle: Any, worker: str):
        self.handle, self.worker = handle, worker

    def options(self, **_: Any) -> _Adopter:
        return self

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.handle.configure.remote(self.worker, args, kwargs)  # its outcome is awaited by every later call
        return self.handle


def _kill(name: str) -> None:
    """Remove the host named ``name``, if any, and wait until Ray has freed the name (a new one may take it)."""
    import ray

    _PRESTARTED.pop(name, None)
    try:
        ray.kill(ray.get_actor(name))
    except ValueError:
        return
    for _ in range(100):
        try:
            ray.get_actor(name)
        except ValueError:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the early worker process {name} did not go away within 10 s")
