"""Per-slot decode state and sampling on the device, without a host sync per token.

Every slot carries its own sampling parameters as device tensors, so one step samples a whole batch of rows
with different temperature / top-k / top-p / repetition penalty / seed in a fixed set of kernels (a CUDA graph
can hold them). Semantics are vLLM's (as the engine's generate-based sampler had them): greedy rows take
the argmax and report log-probs at temperature 1; top-k keeps ties with the k-th value; top-p drops the tail whose
ascending cumulative mass is <= 1 - top_p, always keeping the most likely token; log-probs are those of the
processed distribution.

Randomness is counter based: a row's uniform for its t-th token is a hash of (its seed, t), and the token is the
inverse CDF at that uniform (cumsum + searchsorted: an exact categorical draw). A seeded request therefore gives
the same tokens whatever batch it lands in, and no RNG state lives in a graph. Unseeded requests get a seed drawn
from torch's global RNG when they are admitted (``torch.manual_seed`` makes a run reproducible).
"""

from __future__ import annotations

import torch

from verl_compat.rollout.sampling import SamplingSpec

MODES = ("greedy", "sample", "full")
_M32 = 0xFFFFFFFF


def mode_for(specs: list[SamplingSpec]) -> str:
    """The cheapest step variant that serves every row: argmax only; temperature only; or the sorted path with
    top-k / top-p / repetition penalty."""
    if any(s.repetition_penalty != 1.0 for s in specs):
        return "full"
    sampled = [s for s in specs if not s.greedy]
    if not sampled:
        return "greedy"
    if any(s.top_k > 0 or s.top_p < 1.0 for s in sampled):
        return "full"
    return "sample"


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # A 32-bit integer finaliser (xor-shift-multiply); products stay below 2**63 in int64.
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per row from (seed, counter), both int64 tensors."""
    x = _mix32((seeds ^ (seeds >> 32)) & _M32)
    x = _mix32(x ^ (counters & _M32))
    x = _mix32(x ^ ((seeds >> 32) & _M32))
    return (x.to(torch.float64) + 0.5) / 4294967296.0


class SlotState:
    """Device tensors, one row per slot: the decode loop's whole state, updated in place."""

    def __init__(self, slots: int, out_len: int, vocab: int, device, max_stop_ids: int = 16):
        self.slots, self.out_len, self.vocab, self.max_stop_ids = slots, out_len, vocab, max_stop_ids
        self.device = torch.device(device)

        def z(*shape, dtype=torch.long, fill=0):
            return torch.full(shape, fill, dtype=dtype, device=self.device)

        self.tok = z(slots)  # the token to feed next
        self.pos = z(slots)  # the cache column that token goes to
        self.count = z(slots)  # tokens generated so far
        self.max_tokens = z(slots, fill=1)
        self.done = z(slots, dtype=torch.bool, fill=True)
        self.stopped = z(slots, dtype=torch.bool)  # ended on a stop token (else by length)
        self.stop_ids = z(slots, max_stop_ids, fill=-1)
        self.out_tok = z(slots, out_len + 1)
        self.out_lp = z(slots, out_len + 1, dtype=torch.float32)
        self.greedy = z(slots, dtype=torch.bool, fill=True)
        self.temp = z(slots, dtype=torch.float32, fill=1.0)
        self.top_k = z(slots, fill=vocab)
        self.top_p = z(slots, dtype=torch.float32, fill=1.0)
        self.rep = z(slots, dtype=torch.float32, fill=1.0)
        self.seed = z(slots)
        self.seen: torch.Tensor | None = None  # [slots, vocab] bool, only once a row asks for a repetition penalty

    # ------------------------------------------------------------------ host side (admission)
    def admit(self, slots: list[int], specs: list[SamplingSpec], stop_sets: list[tuple[int, ...]], seeds: list[int]):
        """Write the parameters of newly admitted rows (one small host->device copy per field)."""
        idx = torch.tensor(slots, device=self.device)
        for stops in stop_sets:
            if len(stops) > self.max_stop_ids:
                raise ValueError(
                    f"a request has {len(stops)} stop token ids (EOS ids included); the hf rollout engine "
                    f"checks at most {self.max_stop_ids}: pass fewer stop_token_ids"
                )
        stop = torch.full((len(slots), self.max_stop_ids), -1, dtype=torch.long)
        for i, stops in enumerate(stop_sets):
            stop[i, : len(stops)] = torch.tensor(stops, dtype=torch.long)

        def put(t: torch.Tensor, values):
            values = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=t.dtype)
            t[idx] = values.to(self.device)

        put(self.stop_ids, stop)
        put(self.max_tokens, [s.max_tokens for s in specs])
        put(self.greedy, [s.greedy for s in specs])
        put(self.temp, [1.0 if s.greedy else s.temperature for s in specs])
        put(self.top_k, [s.top_k if (not s.greedy and 0 < s.top_k < self.vocab) else self.vocab for s in specs])
        put(self.top_p, [1.0 if s.greedy else s.top_p for s in specs])
        put(self.rep, [s.repetition_penalty for s in specs])
        put(self.seed, seeds)
        self.count[idx] = 0
        self.done[idx] = False
        self.stopped[idx] = False

    def mark_seen(self, slot: int, prompt: list[int]) -> None:
        if self.seen is None:
            self.seen = torch.zeros(self.slots, self.vocab, dtype=torch.bool, device=self.device)
        self.seen[slot] = False
        self.seen[slot, torch.tensor(prompt, device=self.device)] = True

    def release(self, slots: list[int]) -> None:
        idx = torch.tensor(slots, device=self.device)
        self.done[idx] = True
        self.pos[idx] = 0

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy rows ``src`` to ``dst`` (compaction); the cache rows are moved by the caller."""
        s, d = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        for name in ("tok", "pos", "count", "max_tokens", "done", "stopped", "stop_ids", "out_tok", "out_lp",
                     "greedy", "temp", "top_k", "top_p", "rep", "seed"):  # fmt: skip
            t = getattr(self, name)
            t[d] = t[s]
        if self.seen is not None:
            self.seen[d] = self.seen[s]

    def copy_rows(self, other: SlotState, rows: int) -> None:
        """Take rows ``[0, rows)`` of a smaller state (the cache grew); 2-D buffers keep their old width."""
        for name in ("tok", "pos", "count", "max_tokens", "done", "stopped", "stop_ids", "greedy", "temp",
                     "top_k", "top_p", "rep", "seed"):  # fmt: skip
            getattr(self, name)[:rows] = getattr(other, name)[:rows]
        width = other.out_len + 1
        self.out_tok[:rows, :width] = other.out_tok[:rows]
        self.out_lp[:rows, :width] = other.out_lp[:rows]
        if other.seen is not None:
            self.seen = torch.zeros(self.slots, self.vocab, dtype=torch.bool, device=self.device)
            self.seen[:rows] = other.seen[:rows]

    def snapshot(self, rows: int) -> dict[str, torch.Tensor]:
        names = ("tok", "pos", "count", "done", "stopped")
        snap = {n: getattr(self, n)[:rows].clone() for n in names}
        if self.seen is not None:
            snap["seen"] = self.seen[:rows].clone()
        return snap

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        for name, value in snap.items():
            getattr(self, name)[: value.shape[0]].copy_(value)


def choose(state: SlotState, logits: torch.Tensor, rows, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token and its log-prob for ``rows`` (a slice or index tensor of slots) from ``logits [r, V]``."""
    scores = logits.float()
    greedy = state.greedy[rows]
    if mode == "greedy":
        tok = torch.argmax(scores, dim=-1)
        lp = scores.gather(1, tok.unsqueeze(1)).squeeze(1) - torch.logsumexp(scores, dim=-1)
        return tok, lp
    if mode == "full" and state.seen is not None:
        rep = state.rep[rows].unsqueeze(1)
        penalised = torch.where(scores > 0, scores / rep, scores * rep)
        scores = torch.where(state.seen[rows], penalised, scores)
    argmax = torch.argmax(scores, dim=-1)
    scores = scores / state.temp[rows].unsqueeze(1)
    u = uniforms(state.seed[rows], state.count[rows]).to(torch.float32).unsqueeze(1)
    if mode == "sample":
        logz = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = torch.exp(scores - logz)
        cum = torch.cumsum(probs, dim=-1)
        drawn = torch.searchsorted(cum, u * cum[:, -1:], right=True).squeeze(1).clamp_(max=scores.shape[1] - 1)
        tok = torch.where(greedy, argmax, drawn)
        lp = scores.gather(1, tok.unsqueeze(1)).squeeze(1) - logz.squeeze(1)
        return tok, lp
    # full: sort once, filter in sorted order, sample there, map back.
    vals, order = torch.sort(scores, dim=-1, descending=True)
    kth = vals.gather(1, (state.top_k[rows] - 1).unsqueeze(1))
    vals = vals.masked_fill(vals < kth, float("-inf"))
    probs = torch.softmax(vals, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the more likely tokens
    drop = before >= state.top_p[rows].unsqueeze(1)
    drop[:, 0] = False
    vals = vals.masked_fill(drop, float("-inf"))
    logz = torch.logsumexp(vals, dim=-1, keepdim=True)
    cum = torch.cumsum(torch.exp(vals - logz), dim=-1)
    rank = torch.searchsorted(cum, u * cum[:, -1:], right=True).clamp_(max=vals.shape[1] - 1)
    drawn = order.gather(1, rank).squeeze(1)
    drawn_lp = vals.gather(1, rank).squeeze(1) - logz.squeeze(1)
    # Greedy rows in a sampled batch: argmax, log-prob at temperature 1 over the unfiltered distribution.
    raw = logits.float()
    if state.seen is not None:
        raw = torch.where(state.seen[rows], torch.where(raw > 0, raw / state.rep[rows].unsqueeze(1),
                                                        raw * state.rep[rows].unsqueeze(1)), raw)  # fmt: skip
    greedy_lp = raw.gather(1, argmax.unsqueeze(1)).squeeze(1) - torch.logsumexp(raw, dim=-1)
    tok = torch.where(greedy, argmax, drawn)
    return tok, torch.where(greedy, greedy_lp, drawn_lp)


def commit(state: SlotState, rows, tok: torch.Tensor, lp: torch.Tensor, advance: bool = True) -> None:
    """Record the chosen tokens of ``rows`` and update counts, stop flags and the next input, in place.
    ``advance``: the token came from a decode step (its input moves one column on); False after a prefill."""
    active = ~state.done[rows]
    cnt = state.count[rows]
    col = cnt.unsqueeze(1)
    out_tok, out_lp = state.out_tok[rows], state.out_lp[rows]
    out_tok.scatter_(1, col, tok.unsqueeze(1))
    out_lp.scatter_(1, col, lp.unsqueeze(1))
    hit = (tok.unsqueeze(1) == state.stop_ids[rows]).any(dim=1) & active
    new_cnt = cnt + active.long()
    done = state.done[rows] | hit | (new_cnt >= state.max_tokens[rows])
    if isinstance(rows, slice):  # views: the writes above already landed; write the rest in place
        state.count[rows] = new_cnt
        state.stopped[rows] |= hit
        state.tok[rows] = torch.where(active, tok, state.tok[rows])
        if advance:
            state.pos[rows] += (active & ~done).long()
        state.done[rows] = done
        if state.seen is not None:
            state.seen[rows].scatter_(1, tok.unsqueeze(1), True)
    else:
        state.out_tok[rows] = out_tok
        state.out_lp[rows] = out_lp
        state.count[rows] = new_cnt
        state.stopped[rows] = state.stopped[rows] | hit
        state.tok[rows] = torch.where(active, tok, state.tok[rows])
        if advance:
            state.pos[rows] = state.pos[rows] + (active & ~done).long()
        state.done[rows] = done
        if state.seen is not None:
            seen = state.seen[rows]
            seen.scatter_(1, tok.unsqueeze(1), True)
            state.seen[rows] = seen
