"""`HFServer`: the body of the Ray actor that serves one `hf` rollout replica (the vLLMHttpServer of `hf`).

verl's agent loop calls ``server.generate.remote(request_id=, prompt_ids=, sampling_params=, ...)`` and expects
a ``TokenOutput`` (verl/workers/rollout/llm_server.py); the replica and the trainer-side adapter call the
memory / weight / gate methods below. Everything heavy is in :class:`HFGenerationEngine`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from functools import partial
from typing import Any

import torch

from verl_compat.model_config_prebuilt import Prebuilt
from verl_compat.rollout import stats
from verl_compat.rollout.engine import HFGenerationEngine, check_parallel_sizes
from verl_compat.rollout.loading import eos_token_ids
from verl_compat.rollout.sampling import resolve_max_tokens
from verl_compat.rollout.transfer import BucketReceiver
from verl_compat.rollout.weights import ParameterStorage, WeightLoader

logger = logging.getLogger("verl_compat.rollout.server")

# Defaults of `actor_rollout_ref.rollout.engine_kwargs.hf.*` (the only engine-specific knobs of `hf`).
DEFAULT_MAX_BATCH_SIZE = 256
# Requests reach the server one Ray call at a time; a few ms of waiting lets a burst from the agent loop share
# the first batch instead of the first request running alone (measured: without it a 3-request burst split 1+2).
DEFAULT_BATCH_WINDOW_S = 0.01


def _resolve_dtype_and_attn(config: Any, model_config: Any) -> tuple[torch.dtype, str]:
    """Rollout dtype and attention implementation for the hf engine, from the device resolvers."""
    from verl_compat.seams import hf_rollout_dtype_and_attn

    return hf_rollout_dtype_and_attn(config, model_config)


def _rollout_device(cuda_visible_devices: str | None) -> torch.device:
    """The replica's device: the first visible GPU when the replica was given one, else the CPU."""
    if cuda_visible_devices and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def _engine_kwargs(config: Any) -> dict[str, Any]:
    hf_kwargs = dict((getattr(config, "engine_kwargs", None) or {}).get("hf", None) or {})
    return {
        "max_batch_size": int(hf_kwargs.get("max_batch_size", min(config.max_num_seqs, DEFAULT_MAX_BATCH_SIZE))),
        "max_batch_tokens": hf_kwargs.get("max_batch_tokens"),
        "batch_window_s": float(hf_kwargs.get("batch_window_s", DEFAULT_BATCH_WINDOW_S)),
        **({"kv_cache_bytes": int(hf_kwargs["kv_cache_bytes"])} if "kv_cache_bytes" in hf_kwargs else {}),
    }


class HFServer:
    """One rollout server per replica (TP=1, so one per trainer rank in hybrid mode).

    Args follow ``vLLMHttpServer`` so ``HFReplica`` launches it the same way; ``engine`` lets tests inject a
    prebuilt engine instead of loading ``model_config``.
    """

    def __init__(self, config: Any = None, model_config: Any = None, **kwargs: Any):
        # Without a config this is a prestarted process (rollout/prestart.py) that HFReplica configures later.
        self.engine: HFGenerationEngine | None = None
        self.configured = False
        if config is not None:
            self.configure(config, model_config, **kwargs)

    def configure(
        self,
        config: Any,
        model_config: Any,
        rollout_mode: Any = None,
        workers: list | None = None,
        replica_rank: int = 0,
        node_rank: int = 0,
        gpus_per_node: int = 1,
        nnodes: int = 1,
        cuda_visible_devices: str | None = None,
        engine: HFGenerationEngine | None = None,
    ) -> None:
        """The server's configuration (the constructor's arguments of ``vLLMHttpServer``), before any CUDA work."""
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        if cuda_visible_devices:
            # Must precede the first CUDA call in this process; the actor was started with Ray's
            # "don't set CUDA_VISIBLE_DEVICES" switch because it requests no GPU of its own.
            from verl.utils.device import get_visible_devices_keyword

            os.environ[get_visible_devices_keyword()] = cuda_visible_devices
        self.config = omega_conf_to_dataclass(config)
        prebuilt = self.__dict__.pop("_prebuilt", None)  # warm's HFModelConfig, for the same model section only
        built = prebuilt.take(model_config) if prebuilt is not None else None
        self.model_config_from_warm = built is not None
        if built is None:
            built = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.model_config = built
        check_parallel_sizes(
            self.config.tensor_model_parallel_size,
            self.config.data_parallel_size,
            self.config.pipeline_model_parallel_size,
        )
        self.rollout_mode = rollout_mode
        self.workers = workers or []
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        self.cuda_visible_devices = cuda_visible_devices
        self.global_steps: int | None = None
        self.engine = engine
        # Submission gate (vLLM semantics): abort_all_requests closes it, resume_generation opens it; requests
        # arriving while closed wait, or are answered "aborted" when the abort asked to reject them.
        self._gate_open = asyncio.Event()
        self._gate_open.set()
        self._rejecting = False
        # Weight sync (rollout/transfer.py) and the storage a discarding sleep frees; set up with the engine.
        self._names: WeightLoader | None = None
        self._storage: ParameterStorage | None = None
        self._total_numel = 0
        self._receiver: BucketReceiver | None = None
        self._sync_start = 0.0
        self._sync_tensors = 0
        # The engine's own time for one step's batch: first request in -> last result out, between sleeps.
        self._span: dict[str, Any] = {}
        self.configured = True

    def warm(self, model_config: Any = None) -> None:
        """A prestarted server's first call, while the trainer starts: import what configure and the engine build
        import, and build the ``HFModelConfig`` of the driver's model section (tokenizer, processor, generation and
        model config: 2.2 s of configure on the H100 host, on the start-up's critical path); configure takes it
        when its own section is the same. Touches no device (CUDA_VISIBLE_DEVICES comes with configure)."""
        import verl.utils.config  # noqa: F401
        import verl.workers.config  # noqa: F401
        import verl.workers.engine_workers  # noqa: F401  (imported as configure's arguments arrive: 1.4 s on the H100 host)
        import verl.workers.rollout.replica  # noqa: F401

        if model_config is None:
            return
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        prebuilt = Prebuilt(model_config, partial(omega_conf_to_dataclass, dataclass_type=HFModelConfig))
        built = prebuilt.value
        if built is None:  # configure builds it again and reports the error where verl would
            return
        self._prebuilt = prebuilt  # taken by configure only for an equal section (Prebuilt.take)
        if type(built.hf_config) in MODEL_FOR_CAUSAL_LM_MAPPING:
            MODEL_FOR_CAUSAL_LM_MAPPING[type(built.hf_config)]  # imports the modeling module

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    # ------------------------------------------------------------------ lifecycle
    async def launch_server(self) -> None:
        """Load the model (in a thread: it can take a while) and start the engine."""
        if self.engine is None:
            self.engine = await asyncio.to_thread(self._build_engine)
        self._weight_state()

    def _weight_state(self) -> tuple[WeightLoader, ParameterStorage]:
        """Name resolution and releasable storage over the engine's model (made once, while the weights exist)."""
        if self._storage is None:
            self._names = WeightLoader(self.engine.model)
            self._storage = ParameterStorage(self.engine.model)
            self._total_numel = self._names.total_numel()
        return self._names, self._storage

    def _build_engine(self) -> HFGenerationEngine:
        dtype, attn = _resolve_dtype_and_attn(self.config, self.model_config)
        mc = self.model_config
        dummy = "dummy" in str(self.config.load_format)
        tokenizer = getattr(mc, "tokenizer", None)
        eos = eos_token_ids(mc.generation_config, tokenizer, mc.hf_config)
        pad = getattr(tokenizer, "pad_token_id", None)
        return HFGenerationEngine(
            mc.hf_config if dummy else mc.local_path,
            dtype=dtype,
            attn_implementation=attn,
            device=_rollout_device(self.cuda_visible_devices),
            eos_token_ids=eos,
            pad_token_id=pad,
            dummy=dummy,
            trust_remote_code=mc.trust_remote_code,
            tensor_parallel_size=self.config.tensor_model_parallel_size,
            # CUDA graphs unless rollout.enforce_eager (as for vLLM); the engine is always eager on a CPU.
            enforce_eager=bool(self.config.enforce_eager),
            **_engine_kwargs(self.config),
        )

    def _max_model_len(self) -> int | None:
        if self.config.max_model_len is not None:
            return int(self.config.max_model_len)
        hf_config = self.model_config.hf_config
        text_config = getattr(hf_config, "text_config", None) or hf_config
        value = getattr(text_config, "max_position_embeddings", None)
        return int(value) if value is not None else None

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        priority: int = 0,
        **kwargs: Any,
    ):
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None or audio_data is not None:
            raise NotImplementedError(
                "the hf rollout engine is text-only; multimodal prompts need rollout.name=vllm or sglang"
            )
        prompt = [int(t) for t in prompt_ids]
        if self._storage is not None and self._storage.unloaded:
            raise RuntimeError(
                f"hf rollout server {self.replica_rank}: generate called after a sleep discarded the weights and "
                f"before a weight sync refilled them ({len(self._storage.unloaded)} tensors missing, e.g. "
                f"{self._storage.unloaded[0]!r}); the trainer must call update_weights after wake_up"
            )
        while not self._gate_open.is_set():
            if self._rejecting:
                steps = {"global_steps": self.global_steps}
                return TokenOutput(token_ids=[], stop_reason="aborted", extra_fields=steps)
            await self._gate_open.wait()

        params = dict(sampling_params)
        params["max_tokens"] = resolve_max_tokens(
            params,
            len(prompt),
            prompt_length=self.config.prompt_length,
            response_length=self.config.response_length,
            max_model_len=self._max_model_len(),
        )
        params.pop("max_new_tokens", None)
        params.setdefault("repetition_penalty", self.config.repetition_penalty)
        params.setdefault("ignore_eos", self.config.ignore_eos)
        if self.config.full_determinism:
            params.setdefault("seed", self.replica_rank + self.config.seed)

        loop = asyncio.get_running_loop()
        self._span.setdefault("start", loop.time())
        self._span.setdefault("first_request_time", time.time())
        self._span.setdefault("counters", self.engine.scheduler.counters())
        self._span["last_request_time"] = time.time()
        result = await self.engine.generate(prompt, params, request_id)
        self._span["end"], self._span["last_result_time"] = loop.time(), time.time()
        self._span["requests"] = self._span.get("requests", 0) + 1
        self._span["tokens"] = self._span.get("tokens", 0) + len(result.token_ids)
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs,
            stop_reason="aborted" if result.finish_reason == "abort" else "completed",
            extra_fields={"global_steps": self.global_steps},
        )

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        self._gate_open.clear()
        self._rejecting = reject_request
        request_ids = await self.engine.abort_all() if self.engine is not None else []
        return {"aborted_count": len(request_ids), "request_ids": request_ids}

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._gate_open.set()

    async def wait_for_requests_to_drain(self, poll_s: float = 0.01) -> None:
        while self.engine is not None and self.engine.num_pending:
            await asyncio.sleep(poll_s)

    # ------------------------------------------------------------------ memory and weights
    def _discards_weights(self) -> bool:
        """Sleep frees the weights instead of copying them to host memory when they live on an accelerator and
        the trainer refills them after every wake (hybrid mode: engine_workers.update_weights resumes "weights"
        and then syncs). A colocated server (e.g. a reward model) has no trainer to refill it: it keeps them."""
        from verl.workers.rollout.replica import RolloutMode

        return self.engine.device.type != "cpu" and self.rollout_mode == RolloutMode.HYBRID

    async def wake_up(self, tags: list[str] | None = None) -> None:
        if self._skip_memory_ops():
            return
        # The engine rebuilds its KV cache at the first request after a wake, so only "weights" needs work.
        if tags is None or "weights" in tags:
            await self.engine.wake_up()
            if self._storage is not None and self._storage.released:
                await asyncio.to_thread(self._storage.allocate, self.engine.device)

    async def sleep(self) -> None:
        called = time.time()  # the trainer ends a step's sampling with this call
        self._record_span()
        if self._skip_memory_ops() or not self.config.free_cache_engine:
            return
        freed = 0
        storage = self._weight_state()[1]
        if not storage.released and self._discards_weights():
            await self.wait_for_requests_to_drain()  # no batch may read the weights while they are freed
            freed = storage.release()
        await self.engine.sleep()
        memory = stats.device_memory(self.engine.device)
        stats.record("rollout_sleep", called_time=called, discarded_bytes=freed, memory=memory)

    def _record_span(self) -> None:
        span, self._span = self._span, {}
        if "end" in span:
            stats.record(
                "rollout_batch",
                requests=span["requests"],
                tokens=span["tokens"],
                engine_span_s=span["end"] - span["start"],
                first_request_time=span["first_request_time"],
                last_request_time=span["last_request_time"],
                last_result_time=span["last_result_time"],
                global_steps=self.global_steps,
                # the engine's own work in the span: decode steps, batches formed, cache builds, graph captures
                **{k: v - span["counters"][k] for k, v in self.engine.scheduler.counters().items()},
            )

    def _skip_memory_ops(self) -> bool:
        from verl.workers.rollout.replica import RolloutMode

        # A standalone server owns its device; nothing to hand back to a trainer (same as vLLM).
        return self.rollout_mode == RolloutMode.STANDALONE

    async def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Receive ``(HF checkpoint name, tensor)`` pairs by value (tests, small callers); the trainer's sync uses
        receive_bucket."""
        names, storage = self._weight_state()
        count = await self.engine.update_weights(weights)
        storage.mark_loaded(names.targets(name for name, _ in weights))
        return count

    async def weight_sync_info(self) -> dict[str, Any]:
        """What the sender sizes its bucket by: the model's element count and where it runs."""
        self._weight_state()
        return {"total_numel": self._total_numel, "device": str(self.engine.device)}

    async def receive_bucket(self, meta: dict[str, Any]) -> int:
        """Copy one bucket (rollout/transfer.py) into the model; returns once the copies have completed, so the
        sender may reuse the bucket."""
        loader, storage = self._weight_state()
        if self._receiver is None:
            self._receiver = BucketReceiver(self.engine.device)
            self._sync_start, self._sync_tensors = time.perf_counter(), 0
        pairs = self._receiver.tensors(meta)
        try:
            count = await self.engine.update_weights(pairs)
            if self.engine.device.type == "cuda":
                await asyncio.to_thread(torch.cuda.synchronize, self.engine.device)
        except BaseException:
            pairs = None
            receiver, self._receiver = self._receiver, None
            receiver.close()  # the sender gives up on this sync; the next one opens its own segments
            raise
        finally:
            names = [entry[0] for entry in meta["tensors"]]
            pairs = None  # no view of the bucket may outlive the call (a shared-memory segment cannot close)
            if meta.get("transient") and self._receiver is not None:
                self._receiver.done_with(meta["key"])
        storage.mark_loaded(loader.targets(names))
        self._sync_tensors += count
        return count

    async def finish_weight_sync(self) -> dict[str, Any]:
        """Close the sync's segments and check that a discarded model was refilled completely."""
        receiver, self._receiver = self._receiver, None
        transports = sorted(receiver.transports) if receiver is not None else []
        if receiver is not None:
            receiver.close()
        missing = self._storage.unloaded if self._storage is not None else []
        if missing:
            raise RuntimeError(
                f"hf rollout server {self.replica_rank}: the weight sync after wake_up did not send "
                f"{len(missing)} of the model's tensors (e.g. {missing[:3]}); the rollout would generate from "
                "uninitialised memory. The actor and rollout must load the same architecture."
            )
        report = {
            "transports": transports,
            "tensors": self._sync_tensors,
            "receive_s": time.perf_counter() - self._sync_start if receiver is not None else 0.0,
            "memory": stats.device_memory(self.engine.device),
            "weight_bytes_on_device": self._weight_bytes_on_device(),
        }
        stats.record("rollout_weights_received", **report)
        return report

    def _weight_bytes_on_device(self) -> int:
        if self.engine.device.type == "cpu":
            return 0
        return sum(p.numel() * p.element_size() for p in self.engine.model.parameters() if p.device.type != "cpu")

    async def clear_kv_cache(self) -> None:
        """No prefix cache survives a batch, so there is nothing stale to drop after a weight update."""

    async def release_kv_cache(self) -> None:
        """The KV cache is allocated per generate call and freed with it."""

    async def resume_kv_cache(self) -> None:
        """See release_kv_cache."""

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def start_profile(self, **kwargs: Any) -> None:
        logger.debug("hf rollout: profiling is not implemented; start_profile ignored")

    async def stop_profile(self) -> None:
        logger.debug("hf rollout: profiling is not implemented; stop_profile ignored")

    async def get_batch_log(self) -> list[tuple[str, ...]]:
        """The request ids of every batch formed so far (for tests and debugging)."""
        return list(self.engine.batch_log) if self.engine is not None else []
