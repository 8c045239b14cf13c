"""Dtype resolvers: training compute dtype (FSDP mixed precision), master weights, rollout dtype, load dtype.

Policy (DESIGN.md): sm_80+ bf16 (upstream); sm_60/70/75 with fast fp16 -> fp16 compute + fp32 master weights +
loss scaling (verl wires ShardedGradScaler when param_dtype is fp16); sm_61 and GTX 16xx -> fp32; CPU -> fp32.
The rollout dtype follows the training compute dtype on pre-Ampere devices (no train/infer mismatch).
"""

from __future__ import annotations

from typing import Any

from verl_compat import capabilities
from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.checks import cc_text
from verl_compat.resolvers.registry import Context, Option, Reason, Registry, Request, choose, hard, soft

# Canonical short names (verl's PrecisionType strings) and the long names vLLM / the rollout config use.
SHORT_TO_LONG = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
LONG_TO_SHORT = {v: k for k, v in SHORT_TO_LONG.items()}
_ALIASES = {
    "bf16": ("bfloat16", "torch.bfloat16"),
    "fp16": ("float16", "half", "16", "torch.float16"),
    "fp32": ("float32", "float", "32", "torch.float32"),
}


def canonical(value: object) -> str | None:
    """'bfloat16' / 'bf16' / torch.bfloat16 -> 'bf16'; unknown -> None."""
    if value is None:
        return None
    text = str(value).strip().lower()
    for short, aliases in _ALIASES.items():
        if text == short or text in aliases:
            return short
    return None


def torch_dtype(value: object) -> Any:
    """'float16' / 'fp16' / torch.float16 -> torch.float16 (torch imported here only: resolvers stay pure)."""
    import torch

    short = canonical(value)
    if short is None:
        raise ValueError(f"{value!r} is not a dtype verl-compat knows; use one of {', '.join(SHORT_TO_LONG)}")
    return getattr(torch, SHORT_TO_LONG[short])


def _bf16_reasons(ctx: Context) -> list[Reason]:
    p = ctx.profile
    if p.is_cpu:
        return [
            soft("cpu_bf16_slow", "bf16 on CPU is emulated unless the CPU has AVX512-BF16/AMX; fp32 is the CPU default")
        ]
    if p.compute_capability is not None and not p.native_bf16:
        need = capabilities.cc_text(capabilities.NATIVE_BF16_CC)
        return [
            hard(
                "no_native_bf16",
                f"needs native bf16 (compute capability >= {need}), device has {cc_text(p)}",
                cc_text(p),
                f">= {need}",
            )
        ]
    return []


def _fp16_reasons(ctx: Context, *, training: bool) -> list[Reason]:
    p = ctx.profile
    if p.is_cpu:
        if training:
            return [
                hard(
                    "cpu_fp16",
                    "fp16 training needs a CUDA GPU: verl's fp16 path (ShardedGradScaler, CUDA autocast) "
                    "assumes one, and CPUs have no fast fp16 math",
                )
            ]
        return [soft("cpu_fp16_slow", "CPUs have no fast fp16 math")]
    if p.compute_capability is not None and not p.fast_fp16:
        if p.sm == 61:
            return [soft("slow_fp16", "fp16 runs at 1/64 of the fp32 rate on sm_61")]
        return [
            soft("slow_fp16", f"no tensor cores or packed fp16 on {p.name} (sm_{p.sm}): fp16 is not faster than fp32")
        ]
    return []


TRAIN_OPTIONS: tuple[Option, ...] = (
    Option("bf16", _bf16_reasons, "native bf16 tensor cores (upstream verl's default)", 10, aliases=_ALIASES["bf16"]),
    Option(
        "fp16",
        lambda ctx: _fp16_reasons(ctx, training=True),
        "fp16 compute (tensor cores / packed fp16) with fp32 master weights and a loss scaler",
        20,
        aliases=_ALIASES["fp16"],
    ),
    Option(
        "fp32",
        why="fp32 everywhere: bf16 is not native here and fp16 is not fast",
        priority=30,
        aliases=_ALIASES["fp32"],
    ),
)


def _master_fp16_reasons(ctx: Context) -> list[Reason]:
    if ctx.fact("forward_only", False):  # a frozen reference model has no gradients to unscale
        return _fp16_reasons(ctx, training=False)
    return [
        hard(
            "fp16_master",
            "fp16 master weights cannot be trained with loss scaling (torch's GradScaler raises "
            "'Attempting to unscale FP16 gradients'); keep model_dtype=fp32",
        )
    ]


MASTER_OPTIONS: tuple[Option, ...] = (
    Option("fp32", why="fp32 master weights (upstream verl's model_dtype)", priority=10, aliases=_ALIASES["fp32"]),
    Option("bf16", _bf16_reasons, "", 20, aliases=_ALIASES["bf16"]),
    Option("fp16", _master_fp16_reasons, "", 30, aliases=_ALIASES["fp16"]),
)


# FSDP reduce_dtype / buffer_dtype: verl-compat keeps both fp32 on every pre-Ampere card (gradients reduced in
# fp16 overflow; the loss scaler unscales fp32 grads), so fp32 comes first and a refusal's fix names fp32.
REDUCE_OPTIONS: tuple[Option, ...] = (
    Option(
        "fp32", why="fp32 gradient reduction and buffers (verl-compat's policy)", priority=10, aliases=_ALIASES["fp32"]
    ),
    Option("bf16", _bf16_reasons, "", 20, aliases=_ALIASES["bf16"]),
    Option("fp16", lambda ctx: _fp16_reasons(ctx, training=True), "", 30, aliases=_ALIASES["fp16"]),
)


def _follows_train(value: str):
    def check(ctx: Context) -> list[Reason]:
        train = ctx.fact("train_dtype")
        if train is not None and train != value:
            return [
                soft(
                    "differs_from_train",
                    f"the rollout dtype should follow the training compute dtype ({train}) "
                    "so rollout and training log-probs agree",
                )
            ]
        return []

    return check


ROLLOUT_OPTIONS: tuple[Option, ...] = (
    Option(
        "bfloat16",
        lambda ctx: _bf16_reasons(ctx) + _follows_train("bf16")(ctx),
        "upstream verl's rollout dtype",
        10,
        aliases=("bf16", "torch.bfloat16"),
    ),
    Option(
        "float16",
        lambda ctx: _fp16_reasons(ctx, training=False) + _follows_train("fp16")(ctx),
        "follows the fp16 training compute dtype",
        20,
        aliases=("fp16", "half", "torch.float16"),
    ),
    Option(
        "float32",
        _follows_train("fp32"),
        "follows the fp32 training compute dtype",
        30,
        aliases=("fp32", "float", "torch.float32"),
    ),
)


def resolve_train(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """FSDP mixed-precision param (compute) dtype: 'bf16' | 'fp16' | 'fp32'."""
    return choose(request, profile, TRAIN_OPTIONS, registry=registry)


def resolve_reduce(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """FSDP mixed_precision.reduce_dtype / buffer_dtype."""
    return choose(request, profile, REDUCE_OPTIONS, registry=registry)


def resolve_master(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """FSDP model_dtype: the dtype the sharded (master) parameters are kept in."""
    return choose(request, profile, MASTER_OPTIONS, registry=registry)


def resolve_rollout(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """actor_rollout_ref.rollout.dtype in the rollout config's spelling ('bfloat16' | 'float16' | 'float32')."""
    return choose(request, profile, ROLLOUT_OPTIONS, registry=registry)


def default_train_dtype(profile: DeviceProfile, registry: Registry | None = None) -> str:
    """The training compute dtype this device gets when the user sets nothing."""
    req = Request("dtype.train", "mixed_precision.param_dtype", "bf16", requested=False, upstream="bf16")
    return resolve_train(req, profile, registry).value
