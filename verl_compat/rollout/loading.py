"""Build the rollout's causal LM with an explicit dtype and attention implementation."""

from __future__ import annotations

import logging
import os

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel

logger = logging.getLogger("verl_compat.rollout.loading")

_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def torch_dtype(value: str | torch.dtype) -> torch.dtype:
    """Map a config dtype string (``rollout.dtype``: "bfloat16", "float16", "float32", ...) to a torch dtype."""
    if isinstance(value, torch.dtype):
        return value
    key = str(value).lower().removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise ValueError(
            f"actor_rollout_ref.rollout.dtype={value!r} is not a dtype the hf rollout engine knows; "
            f"use one of {sorted(_DTYPE_NAMES)}"
        )
    return _DTYPE_NAMES[key]


def load_causal_lm(
    source: str | os.PathLike | PretrainedConfig,
    *,
    dtype: torch.dtype,
    attn_implementation: str,
    device: torch.device | str = "cpu",
    dummy: bool = False,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load (path) or build (config, or ``dummy=True``: random weights, to be overwritten by the first weight
    sync, like vLLM's ``load_format=dummy``) a causal LM in eval mode on ``device``."""
    device = torch.device(device)
    if isinstance(source, PretrainedConfig) or dummy:
        config = source
        if not isinstance(config, PretrainedConfig):
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        # Building on the target device skips a host copy; random init is cheap next to a checkpoint read.
        with device:
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
            )
    else:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
        )
        model.to(device)
    model.eval()
    logger.info(
        "hf rollout model %s: dtype=%s attn=%s device=%s%s",
        type(model).__name__,
        dtype,
        attn_implementation,
        device,
        " (dummy weights)" if dummy else "",
    )
    return model


def neutral_generation_config(pad_token_id: int | None) -> GenerationConfig:
    """A GenerationConfig with no sampling defaults. ``generate`` fills unset values from
    ``model.generation_config`` (e.g. Qwen ships repetition_penalty=1.05, top_k=20), which would silently change
    what verl asked for; the engine installs this one on its model so only explicit requests apply."""
    return GenerationConfig(pad_token_id=pad_token_id, eos_token_id=None, bos_token_id=None)


def eos_token_ids(*sources: object) -> tuple[int, ...]:
    """Union of ``eos_token_id`` over generation configs, tokenizers and model configs (int or list each)."""
    ids: list[int] = []
    for src in sources:
        value = getattr(src, "eos_token_id", None) if src is not None else None
        if value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return tuple(ids)
