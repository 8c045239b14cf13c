"""`HFServerAdapter`: the trainer-side handle of an `hf` rollout server (verl's ``_ROLLOUT_REGISTRY`` entry).

Instantiated inside every trainer worker (``engine_workers.py`` init_model) and in checkpoint-engine workers.
It finds its replica's ``HFServer`` actor by name and drives it: wake/sleep around training, and weight sync.

Weight sync (rollout/transfer.py) stays on the host: through one CUDA IPC bucket on the card the trainer and the
rollout share, or a shared-memory bucket on a CPU; only metadata travels in Ray calls, never the tensors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import torch

from verl.workers.rollout.base import BaseRollout
from verl_compat.rollout import stats
from verl_compat.rollout.engine import check_parallel_sizes
from verl_compat.rollout.transfer import BucketSender, SyncReport

logger = logging.getLogger("verl_compat.rollout.adapter")

SERVER_NAME_PREFIX = "hf_"
DEFAULT_BUCKET_MB = 512


def server_name(replica_rank: int, node_rank: int) -> str:
    """The Ray actor name of a policy rollout replica's server on one node (its replica creates it under it)."""
    return f"{SERVER_NAME_PREFIX}server_{replica_rank}_{node_rank}"


class HFServerAdapter(BaseRollout):
    """Client of one ``HFServer``; the rank arithmetic is vLLM's ServerAdapter's (vllm_rollout.py:65-123)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        check_parallel_sizes(
            self.config.tensor_model_parallel_size,
            self.config.data_parallel_size,
            self.config.pipeline_model_parallel_size,
        )
        rank = int(os.environ.get("RANK", "0"))
        local_world_size = int(os.environ.get("RAY_LOCAL_WORLD_SIZE", "1"))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self.node_rank = self.rollout_rank // local_world_size
        self.is_leader_rank = self.rollout_rank == 0
        # engine_workers.update_weights assigns sleep_level (to 1 for LoRA adapters); the hf server decides what
        # sleep frees itself (server._discards_weights), so the value is recorded but changes nothing.
        self.sleep_level = 1
        self.server_handle = None
        self._sync_info: dict | None = None
        self.last_sync: SyncReport | None = None  # what the last update_weights moved, and how

    def _server(self):
        """The replica's server actor, looked up lazily: servers start after the trainer workers."""
        if not self.is_leader_rank:
            return None
        if self.server_handle is None:
            import ray

            self.server_handle = ray.get_actor(server_name(self.replica_rank, self.node_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        if self.config.free_cache_engine and (server := self._server()) is not None:
            await server.wake_up.remote(tags=tags)

    async def release(self) -> None:
        if self.config.free_cache_engine and (server := self._server()) is not None:
            await server.sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        *,
        peft_config: dict | None = None,
        base_sync_done: bool = True,
        global_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"the hf rollout engine receives wire_format='named_tensors' only, got {wire_format!r}; "
                "use actor_rollout_ref.rollout.checkpoint_engine.backend=naive"
            )
        if peft_config is not None:
            raise NotImplementedError(
                "the hf rollout engine cannot load LoRA adapters; set actor_rollout_ref.model.lora.merge=True "
                "so the trainer sends merged weights"
            )
        server = self._server()
        if server is None:
            # Non-leader ranks still drain the generator: producing each full tensor is a collective
            # (FSDP all-gather) that every rank must join.
            for _ in weights:
                pass
            return

        if self._sync_info is None:
            self._sync_info = await server.weight_sync_info.remote()
        sender = BucketSender(_bucket_megabytes(self.config) << 20, max_total_numel=self._sync_info["total_numel"])
        report = await sender.send(weights, server.receive_bucket.remote, server.finish_weight_sync.remote)
        await server.clear_kv_cache.remote()
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)
        self.last_sync = report
        stats.record("trainer_weights_sent", global_steps=global_steps, **report.to_dict())
        if self.replica_rank == 0:
            logger.info(
                "hf rollout update_weights: %d tensors, %.0f MiB via %s in %d bucket(s), %.3fs",
                report.tensors,
                report.bytes / 2**20,
                report.transport,
                report.buckets,
                report.seconds,
            )


def _bucket_megabytes(config: Any) -> int:
    checkpoint_engine = getattr(config, "checkpoint_engine", None)
    value = getattr(checkpoint_engine, "update_weights_bucket_megabytes", None) if checkpoint_engine else None
    return int(value or DEFAULT_BUCKET_MB)
