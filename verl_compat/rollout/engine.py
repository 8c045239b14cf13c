"""`HFGenerationEngine`: token-in/token-out generation with continuous batching over a static KV cache (no vLLM).

Independent of Ray and verl. ``generate`` queues a request; one batching task runs the decode loop
(:class:`~verl_compat.rollout.scheduler.SlotScheduler`) in a worker thread while anything is running or waiting,
so the event loop keeps accepting requests, and a request that arrives mid-run takes the next free slot. Every
row keeps its own sampling parameters (:mod:`~verl_compat.rollout.device_sampling`), so requests never need to be
grouped. On CUDA one decode step is replayed from a CUDA graph per batch-size bucket unless ``enforce_eager``;
CPU runs the same loop eagerly. Batching concurrent requests is the main speed lever on CPU and small GPUs
(research/cpu-feasibility.md: a one-request-at-a-time server spent 28-34 s of a 38-51 s step generating).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from verl_compat.errors import IncompatibleRequestError
from verl_compat.rollout.fused_weights import pack_model
from verl_compat.rollout.kv_cache import ATTENTION_NAME, check_supported
from verl_compat.rollout.loading import eos_token_ids as collect_eos_ids
from verl_compat.rollout.loading import load_causal_lm, neutral_generation_config, torch_dtype
from verl_compat.rollout.sampling import SamplingSpec
from verl_compat.rollout.scheduler import SlotScheduler
from verl_compat.rollout.weights import WeightLoader

logger = logging.getLogger("verl_compat.rollout.engine")

# The first batch waits at most this many batch windows for a burst of requests to stop growing (engine._settle).
SETTLE_WINDOWS = 20
ENGINE_DESCRIPTION = "the hf rollout engine (transformers models, static KV cache)"


def check_parallel_sizes(tensor_parallel_size: int = 1, data_parallel_size: int = 1, pipeline_parallel_size: int = 1):
    """The hf engine runs one whole model per replica: any model parallelism is a configuration error."""
    for key, value in (
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", tensor_parallel_size),
        ("actor_rollout_ref.rollout.data_parallel_size", data_parallel_size),
        ("actor_rollout_ref.rollout.pipeline_model_parallel_size", pipeline_parallel_size),
    ):
        if int(value) != 1:
            raise IncompatibleRequestError(
                key=key,
                value=value,
                device=ENGINE_DESCRIPTION,
                reason="transformers generate holds the whole model in one process and has no model parallelism; "
                "each trainer rank gets its own replica instead",
                fix=f"set {key}=1",
            )


@dataclass
class GenerationResult:
    request_id: str
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str  # "stop" (EOS / stop token), "length" (max_tokens) or "abort"


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    spec: SamplingSpec
    future: asyncio.Future = field(repr=False)

    @property
    def cost(self) -> int:
        return len(self.prompt_ids) + self.spec.max_tokens


class HFGenerationEngine:
    """Holds one HF causal LM and serves batched generation requests on token ids.

    Args:
        model: a loaded ``PreTrainedModel``, or a path / ``PretrainedConfig`` to load or build one from.
        dtype / attn_implementation: applied when loading (and to a given model: cast / switched).
        device: where the model runs while awake.
        eos_token_ids: stop tokens; defaults to the model's generation config and config.
        pad_token_id: left-padding id (only used under attention mask 0); defaults to the first EOS or 0.
        max_batch_size / max_batch_tokens: limits on the rows running at once (tokens = sum of prompt +
            max_tokens per row); the KV cache holds at most ``max_batch_size`` slots (fewer if memory is short).
        batch_window_s: after the first request of an idle engine arrives, wait this long for more.
        enforce_eager: no CUDA graphs (``rollout.enforce_eager``); always eager on CPU.
        stop_check_interval: decode steps between two reads of the stop flags (the only host syncs).
        prefill_tokens: padded prompt tokens per prefill forward.
        kv_cache_bytes: memory for the KV cache (default: 40% of the free device memory; 4 GiB on CPU).
        default_max_tokens: used when a request carries neither max_tokens nor max_new_tokens (vLLM: 16).
        tensor_parallel_size: must be 1 (checked here so every entry point gives the same error).
        dummy: build from config with random weights (the first ``update_weights`` overwrites them).
    """

    def __init__(
        self,
        model: PreTrainedModel | str | os.PathLike | PretrainedConfig,
        *,
        dtype: torch.dtype | str | None = None,
        attn_implementation: str | None = None,
        device: torch.device | str = "cpu",
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        max_batch_size: int = 256,
        max_batch_tokens: int | None = None,
        batch_window_s: float = 0.0,
        default_max_tokens: int = 16,
        tensor_parallel_size: int = 1,
        dummy: bool = False,
        trust_remote_code: bool = False,
        enforce_eager: bool = False,
        stop_check_interval: int = 8,
        prefill_tokens: int = 8192,
        kv_cache_bytes: int | None = None,
    ):
        check_parallel_sizes(tensor_parallel_size)
        self.device = torch.device(device)
        if isinstance(model, torch.nn.Module):
            if dtype is not None:
                model.to(dtype=torch_dtype(dtype))
            if attn_implementation is not None:
                model.set_attn_implementation(attn_implementation)
            model.to(self.device).eval()
        else:
            model = load_causal_lm(
                model,
                dtype=torch_dtype(dtype or torch.float32),
                attn_implementation=attn_implementation or "sdpa",
                device=self.device,
                dummy=dummy,
                trust_remote_code=trust_remote_code,
            )
        check_supported(model.config)
        pack_model(model)  # one buffer per fused projection group, before the KV cache takes the free memory
        # Prefill and decode read the static slot cache through our attention function (kv_cache.py).
        model.config._attn_implementation = ATTENTION_NAME
        self.model: PreTrainedModel = model
        if eos_token_ids is None:
            eos_token_ids = collect_eos_ids(getattr(model, "generation_config", None), model.config)
        eos_token_ids = tuple(int(t) for t in eos_token_ids)
        if pad_token_id is None:
            pad_token_id = eos_token_ids[0] if eos_token_ids else 0
        self.pad_token_id = int(pad_token_id)
        self.model.generation_config = neutral_generation_config(self.pad_token_id)

        self.batch_window_s = float(batch_window_s)
        self.default_max_tokens = int(default_max_tokens)
        self.enforce_eager = bool(enforce_eager) or self.device.type != "cuda"
        self.asleep = False
        self._weights = WeightLoader(self.model)
        self.scheduler = SlotScheduler(
            self.model,
            eos_token_ids=eos_token_ids,
            pad_token_id=self.pad_token_id,
            max_slots=int(max_batch_size),
            max_batch_tokens=max_batch_tokens,
            use_graphs=not self.enforce_eager,
            check_every=stop_check_interval,
            prefill_tokens=prefill_tokens,
            kv_cache_bytes=kv_cache_bytes,
        )

        # Event-loop bound state, (re)created for the loop that first uses the engine.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: collections.deque[_Request] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._model_lock: asyncio.Lock | None = None
        self._batch_task: asyncio.Task | None = None

    # Limits and stop ids live in the scheduler; these keep them settable on the engine.
    max_batch_size = property(lambda self: self.scheduler.max_slots, lambda self, v: self._set("max_slots", int(v)))
    max_batch_tokens = property(
        lambda self: self.scheduler.max_batch_tokens, lambda self, v: self._set("max_batch_tokens", v)
    )
    eos_token_ids = property(
        lambda self: self.scheduler.eos_token_ids, lambda self, v: self._set("eos_token_ids", tuple(int(t) for t in v))
    )

    def _set(self, name: str, value: Any) -> None:
        setattr(self.scheduler, name, value)

    @property
    def batch_log(self) -> list[tuple[str, ...]]:
        """Request ids admitted (prefilled) together, one tuple per admission round, in order."""
        return self.scheduler.batch_log

    @property
    def events(self) -> list[tuple[int, str, str, int]]:
        """``(decode_step, "admit" | "finish", request_id, slot)`` for every request, in order."""
        return self.scheduler.events

    # ------------------------------------------------------------------ requests
    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | SamplingSpec,
        request_id: str,
    ) -> GenerationResult:
        """Queue one request and wait for its result (response tokens only, EOS included, no padding)."""
        spec = (
            sampling_params
            if isinstance(sampling_params, SamplingSpec)
            else SamplingSpec.from_vllm(sampling_params, default_max_tokens=self.default_max_tokens)
        )
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError(f"request {request_id}: empty prompt")
        self._ensure_loop()
        request = _Request(request_id, ids, spec, self._loop.create_future())
        self._pending.append(request)
        self._wakeup.set()
        return await request.future

    async def abort_all(self) -> list[str]:
        """Abort queued requests (empty result) and stop the running batch at its next step (partial result).
        Returns the ids of the aborted requests."""
        aborted = []
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_result(GenerationResult(request.request_id, [], None, "abort"))
                aborted.append(request.request_id)
        running = self.scheduler.running
        if running:
            self.scheduler.abort.set()
            aborted.extend(r.request_id for r in running)
        return aborted

    @property
    def num_pending(self) -> int:
        return len(self._pending) + len(self.scheduler.rows)

    # ------------------------------------------------------------------ weights and memory
    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs (HF checkpoint names) into the model; waits for the running batch."""
        self._ensure_loop()
        async with self._model_lock:
            return await asyncio.to_thread(self._weights.load, weights)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Synchronous variant for callers without an event loop (no batch may be running)."""
        return self._weights.load(weights)

    async def sleep(self) -> None:
        """Give the accelerator memory back: free the KV cache and the CUDA graphs, move the weights to host
        memory and empty the device cache. On a CPU engine only the KV cache is freed. The next request after
        ``wake_up`` rebuilds the cache (and recaptures graphs)."""
        self._ensure_loop()
        async with self._model_lock:
            if self.asleep:
                return
            self.scheduler.release()
            if self.device.type != "cpu":
                await asyncio.to_thread(self.model.to, "cpu")
                _empty_device_cache(self.device)
            self.asleep = True

    async def wake_up(self) -> None:
        self._ensure_loop()
        async with self._model_lock:
            if not self.asleep:
                return
            if self.device.type != "cpu":
                await asyncio.to_thread(self.model.to, self.device)
                pack_model(self.model)  # the move gave every parameter its own storage
            self.asleep = False

    # ------------------------------------------------------------------ batching
    def _ensure_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._batch_task is not None and not self._batch_task.done():
            return
        if self._loop is not loop:
            self._loop = loop
            self._wakeup = asyncio.Event()
            self._model_lock = asyncio.Lock()
            # Requests queued on an earlier (closed) loop can never be answered there.
            self._pending.clear()
        self._batch_task = loop.create_task(self._batch_loop(), name="hf-rollout-batcher")

    async def _batch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self._settle()
            if self._pending:
                await self._serve()

    async def _settle(self) -> None:
        """Let a burst of requests land before the first batch (asyncio.gather, a step's Ray calls from several
        agent-loop workers): wait one window, and another while requests are still arriving, up to
        SETTLE_WINDOWS. A first batch of one that the rest join later costs a cache growth and graph captures
        per power of two, and their prefills interrupt the decode."""
        if self.batch_window_s <= 0:
            return
        seen = -1
        for _ in range(SETTLE_WINDOWS):
            if len(self._pending) == seen:
                return
            seen = len(self._pending)
            await asyncio.sleep(self.batch_window_s)

    async def _serve(self) -> None:
        loop = self._loop

        def deliver(request: _Request, reason: str, tokens: list[int], logprobs: list[float] | None) -> None:
            result = GenerationResult(request.request_id, tokens, logprobs, reason)
            loop.call_soon_threadsafe(_set_result, request.future, result)

        async with self._model_lock:
            try:
                await asyncio.to_thread(self._decode_run, deliver)
            except Exception as exc:  # noqa: BLE001 - delivered to every waiting caller, the loop keeps serving
                failed = self.scheduler.fail_all()
                logger.exception("hf rollout decode loop failed with %d requests running", len(failed))
                for request in failed:
                    if not request.future.done():
                        request.future.set_exception(exc)

    def _decode_run(self, deliver) -> None:
        """Runs in a worker thread until nothing is running or waiting (benchmarks wrap it)."""
        self.scheduler.run(self._pending, deliver)


def _set_result(future: asyncio.Future, result: GenerationResult) -> None:
    if not future.done():
        future.set_result(result)


def _empty_device_cache(device: torch.device) -> None:
    """Hand the device's cached memory back. On CUDA also torch's cuBLAS workspaces (one per handle and stream,
    kept for the process's life: a worker thread or stream the next wake uses would add one more each time);
    they are made again at the next GEMM, and the graphs that held them are already dropped."""
    if device.type == "cuda":
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # noqa: SLF001 - torch has no public one
        if callable(clear):
            clear()
    module = getattr(torch, device.type, None)
    empty_cache = getattr(module, "empty_cache", None)
    if callable(empty_cache):
        empty_cache()
