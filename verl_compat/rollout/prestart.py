"""Start the `hf` rollout servers' processes right after ``ray.init`` instead of after the trainer's models load.

Why: verl creates a job's processes one after another (TaskRunner, TransferQueue, trainer worker, then the rollout
server), and each fresh process imports torch, transformers and verl before it does anything. The rollout server
is last: its imports (12 s of the H200 host's 115 s start-up in round I, `benchmarks/results/
p40_h200_ppo_head_to_head_round_i.json`, `raw.startup_trace`) waited for the trainer's model builds. Started from
the driver, the same process imports while the others start, and ``HFReplica.launch_servers`` adopts it by name
and hands it its configuration (``HFServer.configure``) where it would have created it.

Only where the adoption is certain: verl's v1 synchronous trainer with hybrid replicas (the default layout), the
`hf` engine, one node. ``actor_rollout_ref.rollout.engine_kwargs.hf.prestart=false`` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from verl_compat.ray_nodes import only_node

logger = logging.getLogger("verl_compat.rollout.prestart")

# The driver keeps the handles: Ray collects a named actor that no handle refers to.
_PRESTARTED: list[Any] = []


def get_key(cfg: Any, dotted: str, default: Any = None) -> Any:
    for part in dotted.split("."):
        if cfg is None:
            return default
        cfg = cfg.get(part, None) if hasattr(cfg, "get") else getattr(cfg, part, None)
    return default if cfg is None else cfg


def enabled(config: Any) -> bool:
    """Early start-up at all: verl's v1 trainer with the `hf` engine (verl-compat's own path; vLLM and SGLang jobs
    start as upstream does), unless ``actor_rollout_ref.rollout.engine_kwargs.hf.prestart=false``."""
    rollout = get_key(config, "actor_rollout_ref.rollout")
    if get_key(rollout, "name") != "hf" or get_key(rollout, "engine_kwargs.hf.prestart", True) is False:
        return False
    return bool(get_key(config, "trainer.use_v1", False))


def server_names(config: Any) -> list[str]:
    """The servers this job's ``HFReplica.launch_servers`` will create, when it is certain to adopt prestarted
    ones; [] otherwise (another engine or trainer mode, several nodes, or turned off)."""
    rollout = get_key(config, "actor_rollout_ref.rollout")
    if not enabled(config) or get_key(config, "trainer.v1.trainer_mode") != "sync":
        return []
    if not get_key(config, "actor_rollout_ref.hybrid_engine", True) or int(get_key(config, "trainer.nnodes", 1)) != 1:
        return []
    width = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        width *= int(get_key(rollout, key, 1))
    replicas = int(get_key(config, "trainer.n_gpus_per_node", 1)) // max(1, width)
    from verl_compat.rollout.adapter import server_name  # imports torch: not at module import (helper_prestart)

    return [server_name(rank, 0) for rank in range(replicas)]


def max_concurrency(config: Any) -> int:
    """The option the replica would pass: verl's own ``RolloutReplica.max_concurrency`` for this rollout config."""
    from types import SimpleNamespace

    from verl.workers.rollout.replica import RolloutReplica

    replica = SimpleNamespace(
        config=SimpleNamespace(max_num_seqs=int(get_key(config, "actor_rollout_ref.rollout.max_num_seqs")))
    )
    return RolloutReplica.max_concurrency.fget(replica)


def prestart_servers(config: Any) -> list[str]:
    """Driver, after ``ray.init``: create the job's `hf` server actors with no configuration yet and let them
    import what serving needs (``HFServer.warm``). Returns the names started."""
    import ray

    names = server_names(config)
    if not names:
        return []
    node_id = only_node()
    if node_id is None:  # the replica pins each server to its trainer workers' node, unknown here
        return []
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from verl_compat.rollout.replica import server_env_vars
    from verl_compat.rollout.server import HFServer

    options: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        "max_concurrency": max_concurrency(config),
    }
    env_vars = server_env_vars()
    if env_vars:
        options["runtime_env"] = {"env_vars": env_vars}
    model_section = get_key(config, "actor_rollout_ref.model")
    server_class = ray.remote(HFServer)
    for name in names:
        handle = server_class.options(name=name, **options).remote()
        handle.warm.remote(model_section)
        _PRESTARTED.append(handle)
    logger.info("hf rollout: started %d server process(es) early: %s", len(names), ", ".join(names))
    return names


async def adopt(name: str, node_id: str) -> Any | None:
    """The prestarted server named ``name`` when it runs on ``node_id`` (the replica's trainer workers' node);
    None when there is none. One on another node is killed, and the replica creates the server itself."""
    import ray

    try:
        handle = ray.get_actor(name)
    except ValueError:
        return None
    if await handle.node_id.remote() == node_id:
        return handle
    ray.kill(handle)
    logger.warning("hf rollout: prestarted server %s ran on another node than its trainer workers; replaced", name)
    for _ in range(100):  # the name is free once Ray has removed the actor
        try:
            ray.get_actor(name)
        except ValueError:
            return None
        await asyncio.sleep(0.1)
    raise RuntimeError(f"hf rollout: the prestarted server {name} on the wrong node did not go away within 10 s")
