"""`HFReplica`: starts the ``HFServer`` actors of one `hf` rollout replica (verl's ``RolloutReplicaRegistry``).

Follows ``vLLMReplica.launch_servers`` (vllm_async_server.py:1336-1416): one server per node of the replica,
pinned to the node of its trainer workers, requesting no GPU from Ray (the trainer worker holds it). On a GPU the
server is told which accelerator its worker holds and Ray is asked not to overwrite CUDA_VISIBLE_DEVICES; on a
CPU host there is no accelerator to look up.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from verl.workers.rollout.replica import RolloutReplica
from verl_compat.rollout import prestart
from verl_compat.rollout.adapter import SERVER_NAME_PREFIX, server_name
from verl_compat.rollout.engine import check_parallel_sizes
from verl_compat.rollout.server import HFServer


def _worker_location(_worker_self: Any) -> tuple[str, str | None]:
    """Run inside a trainer worker: its node id and the accelerator id Ray gave it (None on a CPU worker)."""
    from verl.utils.device import get_resource_name

    context = ray.get_runtime_context()
    ids = context.get_accelerator_ids().get(get_resource_name(), [])
    return context.get_node_id(), (str(ids[0]) if ids else None)


def _uses_accelerator() -> bool:
    from verl.utils.device import get_device_name

    return get_device_name() != "cpu"


def server_env_vars() -> dict[str, str]:
    """Ray's "don't touch CUDA_VISIBLE_DEVICES" switches plus the platform's rollout env, as for vLLM."""
    if not _uses_accelerator():
        return {}
    from verl.plugin.platform import get_platform

    platform = get_platform()
    noset = getattr(platform, "ray_noset_envvars", lambda: ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"])()
    rollout_env = getattr(platform, "rollout_env_vars", dict)()
    return {**{var: "1" for var in noset}, **rollout_env}


class HFReplica(RolloutReplica):
    def __init__(
        self,
        replica_rank: int,
        config: Any,
        model_config: Any,
        gpus_per_node: int = 8,
        is_reward_model: bool = False,
        is_teacher_model: bool = False,
        name_suffix: str = "",
    ):
        super().__init__(
            replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model, name_suffix
        )
        check_parallel_sizes(
            self.config.tensor_model_parallel_size,
            self.config.data_parallel_size,
            self.config.pipeline_model_parallel_size,
        )
        self.server_class = ray.remote(HFServer)

    def rollout_worker_use_gpu(self) -> bool:
        return _uses_accelerator()

    def _get_server_name_prefix(self) -> str:
        return SERVER_NAME_PREFIX

    @property
    def is_hybrid_server(self) -> bool:
        """A policy rollout server (not a reward or teacher model's): the kind prestart_servers starts."""
        return not (self.is_reward_model or self.is_teacher_model or self.name_suffix)

    def _server_name(self, node_rank: int) -> str:
        prefix = self._get_server_name_prefix()
        if self.is_reward_model:
            return f"{prefix}server_reward_{self.replica_rank}_{node_rank}{self.name_suffix}"
        if self.is_teacher_model:
            return f"{prefix}server_teacher_{self.replica_rank}_{node_rank}{self.name_suffix}"
        return server_name(self.replica_rank, node_rank) + self.name_suffix

    async def launch_servers(self) -> None:
        assert len(self.workers) == self.world_size, (
            f"worker number {len(self.workers)} not equal to world size {self.world_size}"
        )
        infos = await asyncio.gather(*[w.__ray_call__.remote(_worker_location) for w in self.workers])
        per_node = self.gpus_per_replica_node
        env_vars = server_env_vars()
        configuring = []
        for node_rank in range(self.nnodes):
            node_infos = infos[node_rank * per_node : (node_rank + 1) * per_node]
            accelerators = [acc for _, acc in node_infos if acc is not None]
            name = self._server_name(node_rank)
            options: dict[str, Any] = {
                "scheduling_strategy": ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_infos[0][0], soft=False
                ),
                "name": name,
                "max_concurrency": self.max_concurrency,
            }
            if env_vars:
                options["runtime_env"] = {"env_vars": env_vars}
            arguments = dict(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                workers=self.workers[node_rank * per_node : (node_rank + 1) * per_node],
                replica_rank=self.replica_rank,
                node_rank=node_rank,
                gpus_per_node=per_node,
                nnodes=self.nnodes,
                cuda_visible_devices=",".join(accelerators) if accelerators else None,
            )
            # A server the driver started early (rollout/prestart.py) has imported what it needs meanwhile.
            server = await prestart.adopt(name, node_infos[0][0]) if self.is_hybrid_server else None
            if server is not None:
                configuring.append(server.configure.remote(**arguments))
            else:
                server = self.server_class.options(**options).remote(**arguments)
            self.servers.append(server)

        await asyncio.gather(*configuring)
        await asyncio.gather(*[server.launch_server.remote() for server in self.servers])
        self._server_handle = self.servers[0]
        # Only a load-balancer key unless Prometheus / rl-insight scrape it (llm_server.py:489-504).
        self._server_address = self._server_name(0)

    async def sleep(self) -> None:
        # Let running batches finish before the weights move (vLLMReplica drains the same way).
        await asyncio.gather(*[server.wait_for_requests_to_drain.remote() for server in self.servers])
        await asyncio.gather(*[server.sleep.remote() for server in self.servers])
