"""Start verl's agent-loop worker processes from the driver right after ``ray.init``; verl's agent-loop manager
adopts them where it would create its workers.

Why: verl's v1 TaskRunner creates the agent-loop manager after the trainer's models and the rollout servers are up,
and the manager starts ``actor_rollout_ref.rollout.agent.num_workers`` (8) fresh processes that each import torch,
transformers and verl before the first prompt can reach the rollout. That wait lands inside step 1, where the
start-up figure (time before step 1) does not show it: on the H100 host at 32d9ca7 step 1 took 33.1 s against
5.2-5.6 s for later steps, and ten processes imported from 82.5 s to 100 s while the first prefill waited until
101.2 s (``benchmarks/results/p40_h100_ppo_head_to_head_32d9ca7.json``, ``raw.startup_trace``). Started from the
driver, the same imports overlap the trainer's start-up.

A prestarted process is an :class:`AgentWorkerHost`: it imports what the worker needs (``warm``), and builds the
real worker, verl's own class with verl's own arguments, when the manager would have created it (``configure``);
the manager's calls are passed through. Only where the adoption is certain (the rollout servers' prestart
conditions: `hf` engine, v1 synchronous trainer, one node) and only for verl's default worker class; any other
class gets upstream's own creation and the prestarted processes are removed. Same switch as the other early
starts: ``actor_rollout_ref.rollout.engine_kwargs.hf.prestart=false``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from verl_compat.rollout.prestart import get_key, server_names

logger = logging.getLogger("verl_compat.rollout.agent_prestart")

# verl's v1 TaskRunner's manager (AgentLoopManagerTQ) creates this class; "module:attribute".
DEFAULT_WORKER = "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ"
NAME = "verl_compat_agent_loop_worker_{}"
# What the worker's construction and its first batch import besides its own module (measured on the H100 host's
# trace: verl.workers.config and the tokenizer's modules come with the worker's arguments).
WARM_IMPORTS = (
    "verl.experimental.agent_loop.single_turn_agent_loop",
    "verl.workers.config",
    "transformers.models.auto.tokenization_auto",
)

# The driver keeps the handles, by name: Ray collects a named actor that no handle refers to.
_PRESTARTED: dict[str, Any] = {}


def resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def worker_count(config: Any) -> int:
    """How many workers to start early: verl's manager's ``rollout.agent.num_workers`` where the adoption is
    certain (the servers' prestart conditions and verl's default manager class), else 0."""
    if not server_names(config) or get_key(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class"):
        return 0
    return max(0, int(get_key(config, "actor_rollout_ref.rollout.agent.num_workers", 0) or 0))


def start(config: Any, worker: str = DEFAULT_WORKER) -> list[str]:
    """Driver, after ``ray.init``: create the hosts and let them import; returns their names."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    count = worker_count(config)
    nodes = [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0]
    if not count or len(nodes) != 1:
        return []
    host_class = ray.remote(AgentWorkerHost)
    # The manager's own placement for one node: soft affinity to it (agent_loop.py, _init_agent_loop_workers).
    strategy = NodeAffinitySchedulingStrategy(node_id=nodes[0]["NodeID"], soft=True)
    names = [NAME.format(i) for i in range(count)]
    for name in names:
        _kill(name)  # a previous job of this driver left its hosts
        handle = host_class.options(name=name, scheduling_strategy=strategy).remote()
        handle.warm.remote(worker)
        _PRESTARTED[name] = handle
    logger.info("agent loop: started %d worker process(es) early", count)
    return names


def worker_class(cls: Any, index: int, worker: str = DEFAULT_WORKER) -> Any:
    """The manager's seam: what ``cls.options(...).remote(*args)`` should go through for worker ``index``. The
    prestarted host's adopter where one runs and ``cls`` is the class it was started for; else ``cls`` itself
    (upstream's creation), removing any prestarted host that will not be used."""
    import ray

    name = NAME.format(index)
    try:
        handle = ray.get_actor(name)
    except ValueError:
        return cls
    if cls is not resolve(worker):
        _kill(name)
        logger.info("agent loop: %s is not %s; its early process %s is removed", cls, worker, name)
        return cls
    return _Adopter(handle, worker)


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


class AgentWorkerHost:
    """A Ray actor (async: verl's worker's methods are coroutines) that becomes one agent-loop worker."""

    def __init__(self) -> None:
        self.worker: Any = None
        self.error: BaseException | None = None
        self._configured = asyncio.Event()  # Ray runs an async actor's __init__ on its event loop

    def warm(self, worker: str = DEFAULT_WORKER) -> None:
        """The driver's first call: import the worker's module and what its construction imports. Never raises: a
        failure here comes back from ``configure``, where the manager sees it."""
        for name in (worker.partition(":")[0], *WARM_IMPORTS):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - another verl or transformers layout: the construction imports it
                logger.debug("agent loop: %s not imported early", name, exc_info=True)

    def configure(self, worker: str, args: tuple, kwargs: dict) -> None:
        """Build verl's worker in this process, as Ray would have built the actor (same thread, loop running)."""
        try:
            self.worker = resolve(worker).__ray_actor_class__(*args, **kwargs)
        except BaseException as exc:  # raised again by every call, as an actor whose constructor failed
            self.error = exc
            raise
        finally:
            self._configured.set()

    async def _ready(self) -> Any:
        await self._configured.wait()
        if self.error is not None:
            raise RuntimeError(f"the agent-loop worker could not be built: {self.error!r}") from self.error
        return self.worker

    # verl's AgentLoopWorkerTQ's public methods (tests/test_agent_prestart.py checks the list is complete).
    async def generate_sequences(self, *args: Any, **kwargs: Any) -> Any:
        return await (await self._ready()).generate_sequences(*args, **kwargs)


def _kill(name: str) -> None:
    """Remove the host named ``name``, if any, and wait until Ray has freed the name (a new one may take it)."""
    import time

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
    raise RuntimeError(f"agent loop: the early worker process {name} did not go away within 10 s")
