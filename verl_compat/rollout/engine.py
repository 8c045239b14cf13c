"""`HFGenerationEngine`: batched token-in/token-out generation with transformers ``generate`` (no vLLM).

Independent of Ray and verl. Concurrent ``generate`` calls are queued; one batching task drains the queue into a
batch (bounded by ``max_batch_size`` and ``max_batch_tokens``) and runs one left-padded ``model.generate`` per
batch in a worker thread, so the event loop keeps accepting requests while the model runs. Every row of a batch
keeps its own sampling parameters (see :class:`~verl_compat.rollout.sampling.BatchSampler`), so requests never
need to be grouped. Batching concurrent requests is the main speed lever on CPU and small GPUs
(research/cpu-feasibility.md: a one-request-at-a-time server spent 28-34 s of a 38-51 s step generating).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessorList, PretrainedConfig, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

from verl_compat.errors import IncompatibleRequestError
from verl_compat.rollout.loading import eos_token_ids as collect_eos_ids
from verl_compat.rollout.loading import load_causal_lm, neutral_generation_config, torch_dtype
from verl_compat.rollout.sampling import BatchSampler, SamplingSpec
from verl_compat.rollout.weights import WeightLoader

logger = logging.getLogger("verl_compat.rollout.engine")

ENGINE_DESCRIPTION = "the hf rollout engine (transformers generate)"


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


class _RowStopper(StoppingCriteria):
    """Per-row stop: EOS / stop token (included in the output), the row's own max_tokens, or an abort.

    Records, per row, how many generated tokens belong to it and why it stopped; generate ends when every row
    is done. Rows that finished keep producing throw-away tokens until then, which are cut off afterwards.
    """

    def __init__(self, specs: list[SamplingSpec], eos_ids: Sequence[int], prompt_width: int):
        self.prompt_width = prompt_width
        self.max_tokens = [s.max_tokens for s in specs]
        self.stop_ids = [set(s.stop_token_ids) | (set() if s.ignore_eos else set(eos_ids)) for s in specs]
        self.lengths: list[int | None] = [None] * len(specs)
        self.reasons: list[str | None] = [None] * len(specs)
        self.abort = threading.Event()  # set from the event-loop thread by abort_all

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        step = input_ids.shape[1] - self.prompt_width
        last = input_ids[:, -1].tolist()
        aborting = self.abort.is_set()
        for i, tok in enumerate(last):
            if self.lengths[i] is not None:
                continue
            if tok in self.stop_ids[i]:
                self.lengths[i], self.reasons[i] = step, "stop"
            elif step >= self.max_tokens[i]:
                self.lengths[i], self.reasons[i] = step, "length"
            elif aborting:
                self.lengths[i], self.reasons[i] = step, "abort"
        done = [n is not None for n in self.lengths]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class HFGenerationEngine:
    """Holds one HF causal LM and serves batched generation requests on token ids.

    Args:
        model: a loaded ``PreTrainedModel``, or a path / ``PretrainedConfig`` to load or build one from.
        dtype / attn_implementation: applied when loading (and to a given model: cast / switched).
        device: where the model runs while awake.
        eos_token_ids: stop tokens; defaults to the model's generation config and config.
        pad_token_id: left-padding id (only used under attention mask 0); defaults to the first EOS or 0.
        max_batch_size / max_batch_tokens: limits of one batch (tokens = sum of prompt + max_tokens per row).
        batch_window_s: after the first request of a batch arrives, wait this long for more.
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
        self.model: PreTrainedModel = model
        if eos_token_ids is None:
            eos_token_ids = collect_eos_ids(getattr(model, "generation_config", None), model.config)
        self.eos_token_ids: tuple[int, ...] = tuple(int(t) for t in eos_token_ids)
        if pad_token_id is None:
            pad_token_id = self.eos_token_ids[0] if self.eos_token_ids else 0
        self.pad_token_id = int(pad_token_id)
        self.model.generation_config = neutral_generation_config(self.pad_token_id)

        self.max_batch_size = int(max_batch_size)
        self.max_batch_tokens = max_batch_tokens
        self.batch_window_s = float(batch_window_s)
        self.default_max_tokens = int(default_max_tokens)
        self.batch_log: list[tuple[str, ...]] = []  # request ids of every batch formed, in order
        self.asleep = False
        self._weights = WeightLoader(self.model)

        # Event-loop bound state, (re)created for the loop that first uses the engine.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: collections.deque[_Request] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._model_lock: asyncio.Lock | None = None
        self._batch_task: asyncio.Task | None = None
        self._running: list[_Request] = []
        self._running_stopper: _RowStopper | None = None

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
        if self._running_stopper is not None:
            self._running_stopper.abort.set()
            aborted.extend(r.request_id for r in self._running)
        return aborted

    @property
    def num_pending(self) -> int:
        return len(self._pending) + len(self._running)

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
        """Give the accelerator memory back: move the weights to host memory and empty the device cache.
        On a CPU engine there is nothing to move."""
        self._ensure_loop()
        async with self._model_lock:
            if self.asleep:
                return
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
            # Let requests submitted in the same loop iteration (asyncio.gather, a burst of Ray calls) land.
            await asyncio.sleep(self.batch_window_s)
            while self._pending:
                batch = self._take_batch()
                if batch:
                    await self._run(batch)

    def _take_batch(self) -> list[_Request]:
        batch: list[_Request] = []
        budget = self.max_batch_tokens
        while self._pending and len(batch) < self.max_batch_size:
            request = self._pending[0]
            if request.future.done():  # cancelled by its caller
                self._pending.popleft()
                continue
            if batch and budget is not None and request.cost > budget:
                break
            self._pending.popleft()
            batch.append(request)
            if budget is not None:
                budget -= request.cost
        return batch

    async def _run(self, batch: list[_Request]) -> None:
        self.batch_log.append(tuple(r.request_id for r in batch))
        stopper = _RowStopper([r.spec for r in batch], self.eos_token_ids, max(len(r.prompt_ids) for r in batch))
        async with self._model_lock:
            self._running, self._running_stopper = batch, stopper
            try:
                results = await asyncio.to_thread(self._generate_batch, batch, stopper)
            except Exception as exc:  # noqa: BLE001 - delivered to every waiting caller, the loop keeps serving
                logger.exception("hf rollout batch of %d requests failed", len(batch))
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                return
            finally:
                self._running, self._running_stopper = [], None
        for request, result in zip(batch, results, strict=True):
            if not request.future.done():
                request.future.set_result(result)

    def _generate_batch(self, batch: list[_Request], stopper: _RowStopper) -> list[GenerationResult]:
        device = next(self.model.parameters()).device
        width = stopper.prompt_width
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, request in enumerate(batch):
            n = len(request.prompt_ids)
            input_ids[i, width - n :] = torch.tensor(request.prompt_ids, dtype=torch.long)
            attention_mask[i, width - n :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)

        specs = [r.spec for r in batch]
        sampler = BatchSampler(specs, attention_mask, device)
        self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            # Greedy decoding over the sampler's one-hot scores: the sampler picks every token itself.
            do_sample=False,
            max_new_tokens=max(s.max_tokens for s in specs),
            pad_token_id=self.pad_token_id,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=StoppingCriteriaList([stopper]),
        )

        tokens = torch.stack(sampler.tokens, dim=1).cpu()
        logprobs = torch.stack(sampler.logprobs, dim=1).cpu()
        results = []
        for i, request in enumerate(batch):
            n = stopper.lengths[i] if stopper.lengths[i] is not None else tokens.shape[1]
            reason = stopper.reasons[i] or "length"
            results.append(
                GenerationResult(
                    request_id=request.request_id,
                    token_ids=tokens[i, :n].tolist(),
                    log_probs=logprobs[i, :n].tolist() if request.spec.logprobs else None,
                    finish_reason=reason,
                )
            )
        return results


def _empty_device_cache(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    empty_cache = getattr(module, "empty_cache", None)
    if callable(empty_cache):
        empty_cache()
