"""Continuous batching over the slot cache: the host side of the hf rollout engine's decode loop.

Runs in the engine's worker thread. Each round it admits waiting requests into free slots (one batched prefill;
requests with the same prompt, e.g. GRPO's n samples, share one prefilled row whose KV is copied to their
slots), then runs up to ``check_every`` decode steps without looking at the device, then reads the stop flags
once, hands finished rows back, and compacts the running rows into the lowest slots so the smallest batch-size
bucket covers them. A finished row's slot takes the next waiting request in the next round, so stragglers and
the n samples of one prompt never hold a batch.

Every admission round is one entry of ``batch_log`` (the request ids prefilled together); ``events`` records
``(decode_step, "admit" | "finish", request_id, slot)``.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verl_compat.rollout.decode_graph import DecodeRunner, bucket_for
from verl_compat.rollout.device_sampling import SlotState, choose, commit, mode_for
from verl_compat.rollout.kv_cache import SlotKVCache, bytes_per_token, prefill_mask

logger = logging.getLogger("verl_compat.rollout.scheduler")

LEN_QUANTUM = 128  # cache length grows in these steps (each growth drops the captured graphs)


@dataclass
class _Row:
    request: Any  # the engine's _Request: request_id, prompt_ids, spec, future
    slot: int
    cost: int


def _round_up(n: int, q: int) -> int:
    return max(q, int(math.ceil(n / q)) * q)


class SlotScheduler:
    def __init__(
        self,
        model,
        *,
        eos_token_ids: tuple[int, ...],
        pad_token_id: int,
        max_slots: int,
        max_batch_tokens: int | None,
        use_graphs: bool,
        check_every: int = 8,
        prefill_tokens: int = 8192,
        kv_cache_bytes: int | None = None,
        fast_decode: bool = True,
    ):
        self.model = model
        self.fast_decode = fast_decode
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.max_slots = int(max_slots)
        self.max_batch_tokens = max_batch_tokens
        self.use_graphs = use_graphs
        self.check_every = max(1, int(check_every))
        self.prefill_tokens = int(prefill_tokens)
        self.kv_cache_bytes = kv_cache_bytes
        self.batch_log: list[tuple[str, ...]] = []
        self.events: list[tuple[int, str, str, int]] = []
        self.steps = 0  # decode steps run so far
        self.prefill_rows = 0  # prompt rows prefilled so far (a prompt shared by n requests counts once)
        # One entry per busy period (run): wall seconds, decode steps and requests served; the engine's own time.
        self.runs: list[dict[str, float]] = []
        self.abort = threading.Event()
        self.rows: dict[int, _Row] = {}
        self._remaining: dict[int, int] = {}  # slot -> tokens it may still generate, as of the last check
        self.cache: SlotKVCache | None = None
        self.state: SlotState | None = None
        self.runner: DecodeRunner | None = None
        self._slot_limit = 0  # slots the memory budget allowed at the last allocation
        self.allocations = 0  # KV cache (re)builds so far; each one starts a new set of graphs
        self.graph_totals = {"captures": 0, "capture_s": 0.0}  # over every DecodeRunner built here

    # ------------------------------------------------------------------ memory
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def counters(self) -> dict[str, float]:
        """Totals since the engine started: decode steps, admission rounds, cache builds, graph captures."""
        return {
            "decode_steps": self.steps,
            "admission_rounds": len(self.batch_log),
            "allocations": self.allocations,
            **self.graph_totals,
        }

    def release(self) -> None:
        """Free the KV cache, the slot state and the graphs (sleep); they are rebuilt on the next request."""
        assert not self.rows, "release with running requests"
        self.cache = self.state = self.runner = None

    def _fit_slots(self, max_len: int) -> int:
        """How many slots of ``max_len`` tokens the memory budget holds (at most ``max_slots``)."""
        per_row = bytes_per_token(self.model.config, self.dtype) * (max_len + 1)
        budget = self.kv_cache_bytes
        if budget is None:
            if self.device.type == "cuda":
                free, total = torch.cuda.mem_get_info(self.device)
                allocated = torch.cuda.memory_allocated(self.device)
                free += torch.cuda.memory_reserved(self.device) - allocated  # our allocator's cached free blocks
                # A per-process cap (a simulated card) limits this process below what the device reports free.
                fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _device: 1.0)
                free = min(free, max(0, int(fraction(self.device) * total) - allocated))
                budget = int(free * 0.4)
            else:
                budget = 4 << 30
        return max(1, min(self.max_slots, budget // per_row))

    def _allocate(self, max_len: int, want_slots: int) -> bool:
        """(Re)build the cache with ``want_slots`` slots (as far as memory allows) of ``max_len`` tokens, taking
        only what the workload asks for (the trainer shares the card). Running rows keep their slots: their cache
        rows and state are copied over, so the cache can grow mid-run. False when it could not grow."""
        old = (self.cache, self.state, self.runner)
        keep = max(self.rows) + 1 if self.rows else 0
        self.cache = self.state = self.runner = None
        self._slot_limit = self._fit_slots(max_len)
        slots = max(keep, min(self._slot_limit, want_slots))
        vocab = self.model.get_output_embeddings().weight.shape[0]
        while True:
            try:
                cache = SlotKVCache(self.model.config, slots, max_len, self.dtype, self.device)
                state = SlotState(slots, max_len, vocab, self.device)
                break
            except torch.OutOfMemoryError:
                if slots <= max(keep, 1):
                    if keep:  # keep serving with the old cache; the waiting requests wait for free slots
                        self.cache, self.state, self.runner = old
                        return False
                    raise
                slots = max(keep, 1, slots // 2)
        if keep:
            old_cache, old_state = old[0], old[1]
            width = old_cache.max_len
            cache.data[:, :, :keep, :, :width] = old_cache.data[:, :, :keep, :, :width]
            state.copy_rows(old_state, keep)
        self.cache, self.state = cache, state
        self.allocations += 1
        self.runner = DecodeRunner(
            self.model, self.cache, self.state, self.use_graphs, fast=self.fast_decode, totals=self.graph_totals
        )
        logger.info(
            "hf rollout KV cache: %d slots x %d tokens, %.1f MiB; decode: %s, %s",
            slots,
            max_len,
            self.cache.nbytes / 2**20,
            "CUDA graphs" if self.runner.use_graphs else "eager",
            "fast Llama-style forward" if self.runner.fast is not None else "the model's own forward",
        )
        return True

    # ------------------------------------------------------------------ the loop
    @property
    def running(self) -> list[Any]:
        # list() copies in one C call under the GIL: safe while the worker thread changes the dict.
        return [row.request for row in list(self.rows.values())]

    def run(self, pending: collections.deque, deliver: Callable[[Any, str, list[int], list[float] | None], None]):
        """Serve until no request is running or waiting. ``deliver(request, reason, tokens, logprobs)``."""
        if self.runner is not None:
            self.runner.check_weights()
        start, steps, admitted = time.perf_counter(), self.steps, len(self.events)
        while True:
            self._admit(pending)
            if not self.rows:
                self.abort.clear()  # an abort only ever concerns the rows running when it came
                served = sum(1 for e in self.events[admitted:] if e[1] == "finish")
                wall = time.perf_counter() - start
                self.runs.append({"wall_s": wall, "steps": self.steps - steps, "requests": served})
                return
            top = max(self.rows) + 1
            b = bucket_for(top, self.runner.sizes)
            mode = mode_for([row.request.spec for row in self.rows.values()])
            # Host view of the counts (exact as of the last check): no row can end by length before this.
            n = min(self.check_every, self._min_remaining)
            for _ in range(n):
                self.runner.step(b, mode)
            self.steps += n
            self._collect(deliver, aborting=self.abort.is_set())

    def _admit(self, pending: collections.deque) -> None:
        new: list[Any] = []
        budget = None
        if self.max_batch_tokens is not None:
            budget = self.max_batch_tokens - sum(row.cost for row in self.rows.values())
        live = [r for r in list(pending) if not r.future.done()]
        if live:
            # Size the cache for what runs and waits now, rounded up (a power of two of slots); it only grows.
            need = max(r.cost for r in live)
            want = min(self.max_slots, 1 << max(0, len(self.rows) + len(live) - 1).bit_length())
            cache = self.cache
            if cache is None or need > cache.max_len or (want > cache.slots and cache.slots < self._slot_limit):
                max_len = max(_round_up(need, LEN_QUANTUM), cache.max_len if cache is not None else 0)
                self._allocate(max_len, max(want, cache.slots if cache is not None else 1))
        if self.cache is None:
            return
        free = min(self.cache.slots, self.max_slots) - len(self.rows)
        while pending and len(new) < free:
            request = pending[0]
            if request.future.done():  # cancelled by its caller
                pending.popleft()
                continue
            cost = request.cost
            if cost > self.cache.max_len:
                break  # the cache could not grow (memory): waits for the running rows
            if budget is not None and (new or self.rows) and cost > budget:
                break
            pending.popleft()
            new.append(request)
            if budget is not None:
                budget -= cost
        if new:
            self._prefill(new)

    @property
    def _min_remaining(self) -> int:
        # 0 when a row may already be done (first token was a stop token, or max_tokens=1): check first.
        return min(self._remaining[s] for s in self.rows)

    @torch.no_grad()
    def _prefill(self, new: list[Any]) -> None:
        cache = self.cache
        used = set(self.rows)
        free = [s for s in range(cache.slots) if s not in used]
        groups: dict[tuple[int, ...], list[tuple[Any, int]]] = collections.defaultdict(list)
        for request, slot in zip(new, free, strict=False):
            groups[tuple(request.prompt_ids)].append((request, slot))
            self.rows[slot] = _Row(request, slot, request.cost)
            self.events.append((self.steps, "admit", request.request_id, slot))
        self.batch_log.append(tuple(r.request_id for r in new))

        prompts = list(groups)
        chunk: list[tuple[int, ...]] = []
        for prompt in sorted(prompts, key=len):
            if chunk and (len(chunk) + 1) * len(prompt) > self.prefill_tokens:
                self._prefill_chunk(chunk, groups)
                chunk = []
            chunk.append(prompt)
        if chunk:
            self._prefill_chunk(chunk, groups)
        # A row may have stopped on its first token: 0 makes the loop check before stepping.
        self._remaining.update({slot: 0 for rows in groups.values() for _, slot in rows})

    @torch.no_grad()
    def _prefill_chunk(self, prompts: list[tuple[int, ...]], groups) -> None:
        st, cache, device = self.state, self.cache, self.device
        width = max(len(p) for p in prompts)
        u = len(prompts)
        self.prefill_rows += u
        ids = torch.full((u, width), self.pad_token_id, dtype=torch.long)
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        ids, lengths = ids.to(device), lengths.to(device)
        positions = torch.arange(width, device=device).unsqueeze(0) - (width - lengths).unsqueeze(1)
        write = torch.where(positions >= 0, positions, torch.full_like(positions, cache.scratch))
        primary = torch.tensor([groups[p][0][1] for p in prompts], device=device)
        cache.for_prefill(primary, write)
        out = self.model(
            input_ids=ids,
            position_ids=positions.clamp(min=0),
            attention_mask=prefill_mask(lengths, width, cache.data.dtype),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1]

        slots, specs, stops, seeds, source = [], [], [], [], []
        for i, p in enumerate(prompts):
            rows = groups[p]
            siblings = [slot for _, slot in rows[1:]]
            if siblings:  # prefix sharing: one prefill, the KV copied into every sample's slot
                cache.copy_slot(rows[0][1], torch.tensor(siblings, device=device))
            for request, slot in rows:
                spec = request.spec
                slots.append(slot)
                specs.append(spec)
                stop = tuple(dict.fromkeys(spec.stop_token_ids + (() if spec.ignore_eos else self.eos_token_ids)))
                stops.append(stop)
                seeds.append(spec.seed if spec.seed is not None else int(torch.randint(0, 2**62, ()).item()))
                source.append(i)
        st.admit(slots, specs, stops, seeds)
        idx = torch.tensor(slots, device=device)
        st.pos[idx] = lengths[torch.tensor(source, device=device)]
        for slot, spec, i in zip(slots, specs, source, strict=True):
            if spec.repetition_penalty != 1.0:
                st.mark_seen(slot, list(prompts[i]))
        row_logits = logits[torch.tensor(source, device=device)]
        tok, lp = choose(st, row_logits, idx, mode_for(specs))
        commit(st, idx, tok, lp, advance=False)

    @torch.no_grad()
    def _collect(self, deliver, aborting: bool) -> None:
        st = self.state
        slots = sorted(self.rows)
        idx = torch.tensor(slots, device=st.device)
        flags = torch.stack([st.done[idx].long(), st.stopped[idx].long(), st.count[idx]]).cpu()
        finished, reasons = [], []
        for j, slot in enumerate(slots):
            done, stopped, count = (int(v) for v in flags[:, j])
            self._remaining[slot] = self.rows[slot].request.spec.max_tokens - count
            if done or aborting:
                finished.append((slot, count))
                reasons.append("stop" if (done and stopped) else "length" if done else "abort")
        if aborting:
            self.abort.clear()
        if not finished:
            return
        fidx = torch.tensor([s for s, _ in finished], device=st.device)
        width = max(c for _, c in finished)
        toks = st.out_tok[fidx, :width].cpu()
        lps = st.out_lp[fidx, :width].cpu()
        for j, ((slot, count), reason) in enumerate(zip(finished, reasons, strict=True)):
            row = self.rows.pop(slot)
            self._remaining.pop(slot, None)
            self.events.append((self.steps, "finish", row.request.request_id, slot))
            logprobs = lps[j, :count].tolist() if row.request.spec.logprobs else None
            deliver(row.request, reason, toks[j, :count].tolist(), logprobs)
        st.release([s for s, _ in finished])
        self._compact()

    @torch.no_grad()
    def _compact(self) -> None:
        """Move the highest running rows into free low slots when that lets a smaller bucket cover them."""
        if not self.rows:
            return
        sizes = self.runner.sizes
        target = bucket_for(len(self.rows), sizes)
        if max(self.rows) < target:
            return
        free = [s for s in range(target) if s not in self.rows]
        movers = sorted((s for s in self.rows if s >= target), reverse=True)
        src, dst = movers[: len(free)], free[: len(movers)]
        st, cache, device = self.state, self.cache, self.state.device
        cache.copy_slot(torch.tensor(src, device=device), torch.tensor(dst, device=device))
        st.move(src, dst)
        st.release(src)
        for s, d in zip(src, dst, strict=True):
            row = self.rows.pop(s)
            row.slot = d
            self.rows[d] = row
            self._remaining[d] = self._remaining.pop(s)

    def fail_all(self) -> list[Any]:
        """After an error: forget every running row (the caller answers their futures)."""
        requests = self.running
        self.rows.clear()
        self._remaining.clear()
        if self.state is not None:
            self.state.done.fill_(True)
        return requests
