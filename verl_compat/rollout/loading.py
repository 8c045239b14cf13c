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
        kwargs = dict(dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code)
        model = _build_random(config, device, kwargs)
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


def _build_random(config: PretrainedConfig, device: torch.device, kwargs: dict) -> PreTrainedModel:
    """Random weights built on ``device`` with each tied parameter allocated once. Built there directly,
    transformers creates ``lm_head`` untied and ties it afterwards, so the device briefly holds a second
    vocab x hidden matrix (545 MB for Qwen2.5-0.5B in fp32): more than a tight memory share allows. So the model is
    built on the meta device, every distinct parameter and buffer is given device memory once, and the model's own
    ``_init_weights`` fills them (it also recomputes RoPE's buffers). Every tensor starts as NaN, so one the init
    leaves unset shows; such a model (or one with integer buffers, which NaN cannot mark) is built the plain way."""

    def plain() -> PreTrainedModel:
        with device:
            return AutoModelForCausalLM.from_config(config, **kwargs)

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    if device.type == "meta":
        return model
    if any(not b.is_floating_point() for b in model.buffers()):
        return plain()
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):  # noqa: SLF001 - re-homing tensors in place
            for name, tensor in list(table.items()):
                if tensor is None:
                    continue
                if id(tensor) not in made:
                    fresh = torch.full_like(tensor, float("nan"), device=device)
                    if isinstance(tensor, torch.nn.Parameter):
                        fresh = torch.nn.Parameter(fresh, requires_grad=tensor.requires_grad)
                    made[id(tensor)] = fresh
                table[name] = made[id(tensor)]
    init = getattr(model, "_init_weights", None)
    with torch.no_grad():
        for module in model.modules() if callable(init) else ():
            init(module)
    # a NaN left anywhere makes the float32 sum NaN; a reduction needs no tensor-sized temporary (an isnan() mask
    # of the embedding alone is 130 MiB, which a tight rollout share does not have)
    untouched = [
        n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.sum(dtype=torch.float32).isnan()
    ]
    if not callable(init) or untouched:
        logger.info("rollout model: %s not set by _init_weights; building on %s directly", untouched[:3], device)
        del model, made
        return plain()
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
