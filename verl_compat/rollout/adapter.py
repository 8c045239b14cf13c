"""`HFServerAdapter`: the trainer-side handle of an `hf` rollout server (verl's ``_ROLLOUT_REGISTRY`` entry).

Instantiated inside every trainer worker (``engine_workers.py`` init_model) and in checkpoint-engine workers.
It finds its replica's ``HFServer`` actor by name and drives it: wake/sleep around training, and weight sync.

Weight transport is deliberately simple: the full tensors are moved to host memory, grouped into buckets of
``checkpoint_engine.update_weights_bucket_megabytes`` and handed to the server through Ray's object store.
vLLM's ZMQ/CUDA-IPC sender cannot even be imported without vLLM (hook-points D7), and for the model sizes that
old GPUs and CPUs train, a host copy per sync is cheap next to the step.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from verl.workers.rollout.base import BaseRollout
from verl_compat.rollout.engine import check_parallel_sizes

logger = logging.getLogger("verl_compat.rollout.adapter")

SERVER_NAME_PREFIX = "hf_"
DEFAULT_BUCKET_MB = 512


def host_buckets(
    weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs into lists of at most ``bucket_bytes`` (one oversized tensor forms its own
    bucket), each tensor detached, made whole and contiguous on the CPU."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # a DTensor that slipped through
        host = full.detach().to("cpu").contiguous()
        nbytes = host.numel() * host.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, host))
        size += nbytes
    if bucket:
        yield bucket


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
        # engine_workers.update_weights assigns sleep_level (to 1 for LoRA adapters); the hf server always keeps
        # its weights when asleep (moved to host memory), so the value is recorded but changes nothing.
        self.sleep_level = 1
        self.server_handle = None

    def _server(self):
        """The replica's server actor, looked up lazily: servers start after the trainer workers."""
        if not self.is_leader_rank:
            return None
        if self.server_handle is None:
            import ray

            self.server_handle = ray.get_actor(f"{SERVER_NAME_PREFIX}server_{self.replica_rank}_{self.node_rank}")
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
        start = time.time()
        if server is None:
            # Non-leader ranks still drain the generator: producing each full tensor is a collective
            # (FSDP all-gather) that every rank must join.
            for _ in weights:
                pass
            return

        import ray

        bucket_mb = _bucket_megabytes(self.config)
        count = 0
        for bucket in host_buckets(weights, bucket_mb << 20):
            count += await server.load_weights.remote(ray.put(bucket))
        await server.clear_kv_cache.remote()
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)
        if self.replica_rank == 0:
            logger.info("hf rollout update_weights: %d tensors in %.2fs", count, time.time() - start)


def _bucket_megabytes(config: Any) -> int:
    checkpoint_engine = getattr(config, "checkpoint_engine", None)
    value = getattr(checkpoint_engine, "update_weights_bucket_megabytes", None) if checkpoint_engine else None
    return int(value or DEFAULT_BUCKET_MB)
