"""Attention resolver: transformers `attn_implementation` strings, and verl's remove-padding switch.

flash_attention_2 (upstream default) needs sm_80+ and a usable flash-attn; otherwise torch SDPA, which on
CUDA dispatches to the memory-efficient kernel (the xformers cutlass kernel family: fp16 and fp32, sm_50+),
and on CPU to its flash/math kernels. `eager` is the last resort.
"""

from __future__ import annotations

from verl_compat.decision import Decision
from verl_compat.packed.attention import VARLEN
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.checks import requires
from verl_compat.resolvers.registry import Context, Option, Reason, Registry, Request, choose, hard, soft

FLASH_IMPLEMENTATIONS = frozenset({"flash_attention_2", "flash_attention_3"})


def _fa2_reasons(ctx: Context) -> list[Reason]:
    return requires(ctx.profile, "flash_attn", "flash_attention_2")


def _fa3_reasons(ctx: Context) -> list[Reason]:
    return requires(ctx.profile, "flash_attn_3", "flash_attention_3")


def _varlen_reasons(ctx: Context) -> list[Reason]:
    # Checked against the padded path on CPU inside verl's FSDP engine (tests/test_packed_attention.py), on the
    # H200 per kernel and whole model in fp32/fp16 (benchmarks/packed_attention_cuda_check.py) and in verl's PPO
    # loop under the P40 policy (benchmarks/p40_ppo_head_to_head.py, planned side). On sm_80+ flash-attn is upstream's
    # packed path; without it the default stays upstream's padded fallback (SDPA), and asked for it is kept.
    if ctx.profile.is_cpu or ctx.profile.compute_capability < (8, 0):
        return []
    return [
        soft(
            "upstream_packs_with_flash_attn",
            f"on sm_80+ upstream packs sequences with flash-attn; {VARLEN} is used there only when asked for",
        )
    ]


ATTENTION_OPTIONS: tuple[Option, ...] = (
    Option("flash_attention_2", _fa2_reasons, "FlashAttention-2 (upstream verl's default)", 10),
    Option("flash_attention_3", _fa3_reasons, "FlashAttention-3", 11),
    Option(
        VARLEN,
        _varlen_reasons,
        why="torch SDPA, and packed sequences (remove padding) through torch's varlen memory-efficient kernel "
        "(per-sequence SDPA on a CPU): verl_compat/packed",
        priority=15,
    ),
    Option(
        "sdpa",
        why="torch SDPA: memory-efficient kernel on CUDA sm_50+ (fp16 and fp32), flash/math kernels on CPU; "
        "no extra package",
        priority=20,
    ),
    Option("eager", why="plain matmul + softmax: slowest, always works", priority=30),
)


def resolve_attention(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """override_config.attn_implementation for the actor/ref/rollout model config or the critic."""
    return choose(request, profile, ATTENTION_OPTIONS, registry=registry)


# Remove padding -----------------------------------------------------------------------------------------------
# verl packs a micro-batch into one row (attention_mask=None, packed position_ids). Flash-attn handles that with
# varlen kernels. With sdpa/eager, transformers >= 5 detects the packing from position_ids and builds a dense
# N x N block-diagonal mask, N = tokens in the micro-batch: correct, but O(N^2) memory. At N = 16384 (verl's
# default ppo_max_token_len_per_gpu) that is 256 MiB as bool or 1 GiB as an fp32 additive mask, per layer call.
# The padded path (transformer_impl.py:1274-1312) is complete and costs O(L^2) per sequence instead.


def _rmpad_on_reasons(ctx: Context) -> list[Reason]:
    attn = ctx.fact("attention")
    if attn in FLASH_IMPLEMENTATIONS or attn == VARLEN:
        return []
    return [
        soft(
            "dense_packed_mask",
            f"with attn_implementation={attn} the packed micro-batch gets a dense N x N block-diagonal mask "
            "(N = tokens per micro-batch; N=16384 costs 256 MiB as bool, 1 GiB as fp32, per layer call); "
            "the padded path needs no varlen kernel",
        )
    ]


def _rmpad_off_reasons(ctx: Context) -> list[Reason]:
    reasons = []
    if (ctx.fact("ulysses_sp") or 1) > 1:
        reasons.append(
            hard(
                "needs_rmpad",
                "Ulysses sequence parallelism (ulysses_sequence_parallel_size > 1) requires use_remove_padding=true",
            )
        )
    if ctx.fact("pad_to_length"):
        reasons.append(hard("needs_rmpad", "fsdp_config.pad_to_length=true requires use_remove_padding=true"))
    return reasons


REMOVE_PADDING_OPTIONS: tuple[Option, ...] = (
    Option(
        True, _rmpad_on_reasons, "packed micro-batches with a varlen attention kernel (upstream verl's default)", 10
    ),
    Option(False, _rmpad_off_reasons, "padded micro-batches: no packed N x N mask, no varlen kernel needed", 20),
)


def resolve_remove_padding(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """model.use_remove_padding; facts: attention (the resolved implementation), ulysses_sp, pad_to_length."""
    return choose(request, profile, REMOVE_PADDING_OPTIONS, registry=registry)
