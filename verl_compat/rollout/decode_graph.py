"""One decode step over slots ``[0, b)``, eager or replayed from a CUDA graph captured per (batch bucket, mode).

The step reads and writes only preallocated tensors (the slot cache and :class:`SlotState`), so a graph captured
once replays for every later token: input token, position, mask, forward, sampling and the stop flags all run on
the device with no host sync. Recipe and caveats measured in research/graph-decode.md: warm up on a side stream
before capturing, and undo what the warm-up steps wrote (they run for real).

A graph holds the addresses of the model's parameters: after anything that moves them (sleep / wake, a weight
sync that swaps storages, the fast decoder re-laying out its fused projections) the graphs are stale.
:meth:`DecodeRunner.check_weights` compares the addresses and drops the graphs when they changed.
"""

from __future__ import annotations

import logging
import time

import torch

from verl_compat.rollout.device_sampling import SlotState, choose, commit
from verl_compat.rollout.fast_decode import FastDecoder
from verl_compat.rollout.kv_cache import SlotKVCache, decode_mask

logger = logging.getLogger("verl_compat.rollout.decode_graph")
# One side stream per device for every capture's warm-up. torch keeps a cuBLAS workspace per (handle, stream) for
# the life of the process (32 MiB each on sm_90): a fresh torch.cuda.Stream() per capture cycles through torch's
# pool of 32 streams and left one more workspace after every PPO step's wake (+34 MiB per step measured:
# benchmarks/results/rollout_memory_cycles_p40_round_j.json).
_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _CAPTURE_STREAMS[index]


def buckets(max_rows: int) -> list[int]:
    """Batch sizes a graph is captured for: powers of two up to ``max_rows``, and ``max_rows`` itself."""
    out, b = [], 1
    while b < max_rows:
        out.append(b)
        b *= 2
    return out + [max_rows]


def bucket_for(rows: int, sizes: list[int]) -> int:
    return next(b for b in sizes if b >= rows)


class DecodeRunner:
    def __init__(self, model, cache: SlotKVCache, state: SlotState, use_graphs: bool, fast: bool = True, totals=None):
        self.model = model
        # Few-kernel forward for Llama-style models; any other model runs its own HF forward through the cache.
        self.fast = FastDecoder.for_model(model) if fast else None
        self.cache = cache
        self.state = state
        self.use_graphs = bool(use_graphs) and cache.data.device.type == "cuda"
        self.sizes = buckets(cache.slots)
        self._graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._weights_key = self._param_key()
        self.captures = 0  # graphs captured so far (benchmarks and tests read it)
        self.capture_s = 0.0  # wall time of those captures (warm-up steps included)
        # the owner's running totals over every runner it builds ({"captures", "capture_s"}), if it keeps them
        self._totals = totals if totals is not None else {"captures": 0, "capture_s": 0.0}

    def _param_key(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def check_weights(self) -> None:
        if self.fast is not None:
            self.fast.prepare()  # re-lays out fused projections a wake or a discarding sleep gave fresh storage
        key = self._param_key()
        if key != self._weights_key:
            self.drop_graphs()
            self._weights_key = key

    def drop_graphs(self) -> None:
        self._graphs.clear()
        self._pool = None

    @torch.no_grad()
    def _step(self, b: int, mode: str) -> None:
        st, cache = self.state, self.cache
        pos = st.pos[:b]
        cache.for_decode(b, pos)
        mask = decode_mask(pos, cache.max_len + 1, cache.data.dtype)
        if self.fast is not None:
            logits = self.fast(cache, st.tok[:b], pos, mask)
        else:
            logits = self.model(
                input_ids=st.tok[:b].unsqueeze(1),
                position_ids=pos.unsqueeze(1),
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1]
        tok, lp = choose(st, logits, slice(0, b), mode)
        commit(st, slice(0, b), tok, lp)

    def step(self, b: int, mode: str) -> None:
        """One token for every slot in ``[0, b)`` (``b`` a bucket size); rows that are done stay unchanged."""
        if not self.use_graphs:
            self._step(b, mode)
            return
        graph = self._graphs.get((b, mode))
        if graph is None:
            graph = self._capture(b, mode)
        graph.replay()

    def _capture(self, b: int, mode: str) -> torch.cuda.CUDAGraph:
        t0 = time.perf_counter()
        snap = self.state.snapshot(b)
        stream = capture_stream(self.cache.data.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(b, mode)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the capture runs in the engine's worker thread; CUDA calls the server makes meanwhile in
        # other threads must not invalidate it.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._step(b, mode)
        self.state.restore(snap)  # the warm-up steps ran for real; capturing did not
        self._graphs[(b, mode)] = graph
        seconds = time.perf_counter() - t0
        self.captures += 1
        self.capture_s += seconds
        self._totals["captures"] += 1
        self._totals["capture_s"] += seconds
        logger.debug("captured a decode graph for batch %d, mode %s", b, mode)
        return graph
