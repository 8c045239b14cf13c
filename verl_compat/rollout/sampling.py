"""Sampling parameters in vLLM semantics, as verl's agent loop sends them.

verl builds a dict like ``{"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
"logprobs": True, "max_tokens": 256}`` (``experimental/agent_loop/agent_loop.py:590-605``). vLLM reads
``temperature == 0`` as greedy, ``top_k <= 0`` as "off" and ``logprobs`` as "return the log-prob of each
sampled token". This module turns such a dict into a :class:`SamplingSpec`; the engine samples a whole batch of rows,
each with its own spec, on the device (device_sampling.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
