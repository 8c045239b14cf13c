"""Sampling parameters in vLLM semantics, as verl's agent loop sends them, and the per-row sampler.

verl builds a dict like ``{"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
"logprobs": True, "max_tokens": 256}`` (``experimental/agent_loop/agent_loop.py:590-605``). vLLM reads
``temperature == 0`` as greedy, ``top_k <= 0`` as "off" and ``logprobs`` as "return the log-prob of each
sampled token". This module turns such a dict into a :class:`SamplingSpec` and samples a whole batch of rows,
each with its own spec, in one pass per decode step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger("verl_compat.rollout.sampling")

# vLLM treats temperatures below this as greedy (vllm/sampling_params.py _SAMPLING_EPS).
SAMPLING_EPS = 1e-5

# Keys that change nothing for token-in/token-out generation here (detokenisation, output shaping) or that
# verl/vLLM add internally. They are accepted silently; any other unknown key is logged once.
_IGNORED_KEYS = frozenset(
    {
        "n",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "output_kind",
        "extra_args",
        "prompt_logprobs",
        "logprobs_mode",
        "min_p",  # only 0.0 is meaningful to verl; non-zero values are rejected below
        "presence_penalty",
        "frequency_penalty",
    }
)
_warned_keys: set[str] = set()


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling parameters, already normalised (vLLM semantics)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.0
    logprobs: bool = False
    ignore_eos: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @classmethod
    def from_vllm(cls, params: Mapping[str, Any], *, default_max_tokens: int = 16) -> SamplingSpec:
        """Build a spec from a vLLM-style dict. ``max_tokens`` (or sglang's ``max_new_tokens``) wins over
        ``default_max_tokens``. Values that would silently change the distribution are rejected."""
        known = {f for f in cls.__dataclass_fields__} | {"max_new_tokens"}
        for key in params:
            if key not in known and key not in _IGNORED_KEYS and key not in _warned_keys:
                _warned_keys.add(key)
                logger.warning("hf rollout ignores the sampling parameter %r (not supported)", key)
        for key in ("presence_penalty", "frequency_penalty", "min_p"):
            if float(params.get(key) or 0.0) != 0.0:
                raise ValueError(
                    f"sampling parameter {key}={params[key]!r} is not supported by the hf rollout engine; "
                    f"remove it or use rollout.name=vllm on a device that runs vLLM"
                )
        if "stop" in params and params["stop"]:
            raise ValueError(
                "sampling parameter 'stop' (stop strings) is not supported by the hf rollout engine, which works "
                "on token ids only; use stop_token_ids instead"
            )

        if params.get("max_tokens") is not None:
            max_tokens = int(params["max_tokens"])
        elif params.get("max_new_tokens") is not None:
            max_tokens = int(params["max_new_tokens"])
        else:
            max_tokens = int(default_max_tokens)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")

        temperature = float(_get(params, "temperature", 1.0))
        top_p = float(_get(params, "top_p", 1.0))
        top_k = int(_get(params, "top_k", 0))
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        rep = float(_get(params, "repetition_penalty", 1.0))
        if rep <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {rep}")
        # vLLM: logprobs=None -> no log-probs; an int k >= 0 -> the sampled token's log-prob (plus top-k,
        # which verl never reads). verl sends a bool (calculate_log_probs) or 0/None after its own mapping.
        raw_lp = params.get("logprobs")
        logprobs = raw_lp is not None and raw_lp is not False
        seed = params.get("seed")
        return cls(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=max(top_k, 0),
            repetition_penalty=rep,
            logprobs=logprobs,
            ignore_eos=bool(params.get("ignore_eos", False)),
            seed=None if seed is None else int(seed),
            stop_token_ids=tuple(int(t) for t in (params.get("stop_token_ids") or ())),
        )


def _get(params: Mapping[str, Any], key: str, default: Any) -> Any:
    """``params[key]``, with ``None`` meaning "not set" (verl passes None for unset config values)."""
    value = params.get(key)
    return default if value is None else value


def resolve_max_tokens(
    params: Mapping[str, Any],
    prompt_len: int,
    *,
    prompt_length: int,
    response_length: int,
    max_model_len: int | None,
) -> int:
    """The vLLM server's rule (``vllm_async_server.py`` generate): an explicit ``max_tokens`` /
    ``max_new_tokens`` wins, else ``min(response_length, prompt_length + response_length - len(prompt))``;
    then clamp to ``[1, max_model_len - len(prompt)]``."""
    max_possible = (max_model_len - prompt_len) if max_model_len is not None else None
    if max_possible is not None and max_possible < 1:
        raise ValueError(
            f"Prompt length ({prompt_len}) leaves no room to generate within the model's maximum context "
            f"length ({max_model_len}); need at least 1 token of headroom."
        )
    if params.get("max_tokens") is not None:
        max_tokens = int(params["max_tokens"])
    elif params.get("max_new_tokens") is not None:
        max_tokens = int(params["max_new_tokens"])
    else:
        max_tokens = min(response_length, prompt_length + response_length - prompt_len)
    if max_possible is not None:
        max_tokens = min(max_tokens, max_possible)
    return max(1, max_tokens)


class BatchSampler:
    """Chooses the next token of every row, each with its own :class:`SamplingSpec`.

    Used as the last (and only) logits processor of a greedy ``model.generate``: it samples the token itself,
    records it and its log-prob, and returns scores that are ``-inf`` everywhere but at that token, so
    generate's argmax picks exactly it. Doing the sampling here (instead of generate's ``do_sample``) gives
    per-row temperature / top-k / top-p / seed in one batch and the log-prob of the processed distribution
    (vLLM's ``processed_logprobs``) without keeping every step's full score matrix.
    """

    def __init__(self, specs: list[SamplingSpec], prompt_mask: torch.Tensor, device: torch.device):
        self.specs = specs
        self.device = device
        self.prompt_width = prompt_mask.shape[1]
        # Tokens the repetition penalty looks at: real prompt tokens (not left padding) and every generated
        # token, as in vLLM. Padding positions are sent to an extra dummy column that is dropped.
        self._prompt_valid = prompt_mask.to(device=device, dtype=torch.bool)
        self.tokens: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []

        b = len(specs)
        self._any_sampled = any(not s.greedy for s in specs)
        self._greedy = torch.tensor([s.greedy for s in specs], device=device)
        temps = [1.0 if s.greedy else s.temperature for s in specs]  # vLLM uses 1.0 for greedy rows' log-probs
        self._temps = torch.tensor(temps, device=device, dtype=torch.float32).unsqueeze(1)
        self._rep = torch.tensor([s.repetition_penalty for s in specs], device=device, dtype=torch.float32)
        self._any_rep = any(s.repetition_penalty != 1.0 for s in specs)
        self._top_k = [0 if s.greedy else s.top_k for s in specs]
        self._top_p = torch.tensor([1.0 if s.greedy else s.top_p for s in specs], device=device).unsqueeze(1)
        self._any_top_p = any(not s.greedy and s.top_p < 1.0 for s in specs)
        self._generators: list[torch.Generator | None] = []
        for s in specs:
            if s.seed is None or s.greedy:
                self._generators.append(None)
            else:
                g = torch.Generator(device=device)
                g.manual_seed(s.seed)
                self._generators.append(g)
        assert len(self._generators) == b

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.float()
        if self._any_rep:
            scores = self._apply_repetition_penalty(input_ids, scores)
        scores = scores / self._temps
        scores = self._apply_top_k(scores)
        if self._any_top_p:
            scores = self._apply_top_p(scores)
        logprobs_all = torch.log_softmax(scores, dim=-1)

        chosen = torch.argmax(scores, dim=-1)
        if self._any_sampled:
            sampled = self._sample(logprobs_all)
            chosen = torch.where(self._greedy, chosen, sampled)
        self.tokens.append(chosen)
        self.logprobs.append(logprobs_all.gather(1, chosen.unsqueeze(1)).squeeze(1))

        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, chosen.unsqueeze(1), 0.0)
        return forced

    def _apply_repetition_penalty(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[1]
        valid = torch.ones_like(input_ids, dtype=torch.bool)
        valid[:, : self.prompt_width] = self._prompt_valid
        ids = torch.where(valid, input_ids, torch.full_like(input_ids, vocab))
        seen = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
        seen.scatter_(1, ids, True)
        seen = seen[:, :vocab]
        rep = self._rep.unsqueeze(1)
        penalised = torch.where(scores > 0, scores / rep, scores * rep)
        return torch.where(seen, penalised, scores)

    def _apply_top_k(self, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[1]
        ks = [k if 0 < k < vocab else vocab for k in self._top_k]
        if all(k == vocab for k in ks):
            return scores
        k_max = max(ks)
        top_vals = torch.topk(scores, k_max, dim=-1).values
        k_idx = torch.tensor([k - 1 for k in ks], device=scores.device).unsqueeze(1)
        kth = top_vals.gather(1, k_idx)
        return scores.masked_fill(scores < kth, float("-inf"))

    def _apply_top_p(self, scores: torch.Tensor) -> torch.Tensor:
        # Same construction as vLLM's / HF's top-p: drop the tail whose cumulative mass (ascending) is
        # <= 1 - top_p, always keeping the most likely token.
        sorted_scores, sorted_idx = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - self._top_p)
        remove_sorted[:, -1] = False
        remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
        return scores.masked_fill(remove, float("-inf"))

    def _sample(self, logprobs: torch.Tensor) -> torch.Tensor:
        # Exponential race (argmax p / E, E ~ Exp(1)) is an exact categorical sample, and it lets seeded rows
        # draw their noise from their own generator while unseeded rows share the global RNG.
        probs = logprobs.exp()
        noise = torch.empty_like(probs)
        unseeded = [i for i, g in enumerate(self._generators) if g is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1], device=probs.device).exponential_()
        for i, g in enumerate(self._generators):
            if g is not None:
                noise[i].exponential_(generator=g)
        return torch.argmax(probs / noise, dim=-1)
