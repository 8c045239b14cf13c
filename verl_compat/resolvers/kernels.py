"""Kernel resolvers: torch.compile of the entropy, Triton kernels, verl's fused kernels, flash-attn's Triton
cross-entropy, the torch log-prob fallback, RMSNorm, Liger.

Inductor (torch.compile on CUDA) generates Triton, which compiles for cc >= 7.0 and is officially supported from
8.0 (Volta hits "mma -> mma layout conversion is only supported on Ampere"). So: off below 7.0 whatever the user
says, off by default on sm_70/75 (opt-in allowed), off by default on CPU (Inductor's CPU backend needs a C++
compiler and only speeds up one entropy function), on as configured on sm_80+.
"""

from __future__ import annotations

from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.checks import needs_package, package_known_unusable, triton_reasons
from verl_compat.resolvers.registry import Context, Option, Reason, Registry, Request, choose, hard, soft


def _compile_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [
            soft(
                "cpu_inductor",
                "Inductor on CPU needs a C++ compiler and OpenMP and only speeds up the entropy; off by default on CPU",
            )
        ]
    return triton_reasons(ctx.profile, "torch.compile")


COMPILE_OPTIONS: tuple[Option, ...] = (
    Option(True, _compile_reasons, "torch.compile of the entropy (upstream verl's default)", 10),
    Option(False, why="eager entropy: plain torch, same result", priority=20),
)


def resolve_torch_compile(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """fsdp_config.use_torch_compile (actor, ref, critic)."""
    return choose(request, profile, COMPILE_OPTIONS, registry=registry)


def _triton_reasons(ctx: Context) -> list[Reason]:
    return triton_reasons(ctx.profile, "verl's Triton kernels")


TRITON_OPTIONS: tuple[Option, ...] = (
    Option(True, _triton_reasons, "Triton kernels allowed (upstream verl)", 10),
    Option(False, why="no Triton kernels: verl's torch fallbacks are used", priority=20),
)


def resolve_triton(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """Whether verl may run its own Triton kernels (the flash-attn cross-entropy guard)."""
    return choose(request, profile, TRITON_OPTIONS, registry=registry)


def _flash_ce_reasons(ctx: Context) -> list[Reason]:
    reasons: list[Reason] = []
    if not ctx.profile.package("flash_attn").installed:
        reasons.append(hard("flash_attn_absent", "flash_attn is not installed (verl uses the torch log-softmax path)"))
    if not ctx.fact("triton", True):
        reasons.append(hard("triton_off", "Triton kernels are off on this device"))
    return reasons


FLASH_CE_OPTIONS: tuple[Option, ...] = (
    Option(
        True,
        _flash_ce_reasons,
        "flash-attn's Triton cross-entropy for log-probs (upstream verl when flash_attn imports)",
        10,
    ),
    Option(False, why="torch log_softmax + gather: exact, no Triton", priority=20),
)


def resolve_flash_ce(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """Whether verl's logprobs_from_logits uses flash-attn's Triton cross-entropy; fact: triton (bool)."""
    return choose(request, profile, FLASH_CE_OPTIONS, registry=registry)


# verl's torch log-prob path (where the flash-attn cross-entropy is not used): upstream loops over tokens.
def _blocked_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [soft("cpu_row_in_cache", "on a CPU the per-token loop works in cache: no faster per block")]
    return []


LOGPROBS_OPTIONS: tuple[Option, ...] = (
    Option(
        "blocked",
        _blocked_reasons,
        why="torch log-softmax per block of tokens: one kernel per block, bounded memory (verl_compat.logprobs)",
        priority=10,
    ),
    Option("rowwise", why="one logsumexp kernel per token (upstream verl's logprobs_from_logits_v2)", priority=20),
)


LOGPROBS_KEY = "verl's torch log-prob fallback (torch_functional.logprobs_from_logits_v2)"


def resolve_logprobs(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """Which torch log-prob implementation verl's logprobs_from_logits falls back to; upstream: 'rowwise'."""
    return choose(request, profile, LOGPROBS_OPTIONS, registry=registry)


# The fused head's chunk (FusedLinearForPPO chunk_size; no config key: verl's call sites pass none). Its work
# tensors are (chunk x vocabulary), 24 bytes per entry at once in the backward (measured: planner/estimate.py):
# 1.7 GiB at 512 tokens of a 151,936-entry vocabulary, 0.4 GiB at 128, while the chunk's GEMM (128 x hidden x
# vocabulary, 17 GFLOP for Qwen2.5-0.5B) still fills an old card.
FUSED_CHUNK_KEY = "verl's fused head chunk (FusedLinearForPPO chunk_size, no config key)"
UPSTREAM_FUSED_CHUNK = 512


def _small_chunk_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [soft("cpu_host_memory", "on a CPU the chunk's work tensors live in host memory: upstream's chunk")]
    return []


FUSED_CHUNK_OPTIONS: tuple[Option, ...] = (
    Option(128, _small_chunk_reasons, "128 tokens per chunk: a quarter of the work tensors a 15-24 GB card holds", 10),
    Option(UPSTREAM_FUSED_CHUNK, why="512 tokens per chunk (upstream verl's FusedLinearForPPO default)", priority=20),
)


def resolve_fused_chunk(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """Tokens per chunk of verl's fused head (FusedLinearForPPO); upstream: 512."""
    return choose(request, profile, FUSED_CHUNK_OPTIONS, registry=registry)


# RMSNorm (no config key): torch's fused F.rms_norm instead of the model's eager ops (verl_compat.norms). Below sm_80
# on GPUs the trainer's passes are many small kernels (measured 0.97x fp32 / 0.81x fp16 per Qwen2 decoder layer,
# forward + backward); the CPU has no fused backward, and sm_80+ keeps upstream's model code.
RMS_NORM_KEY = "the model's RMSNorm (no config key; verl_compat.norms)"
UPSTREAM_RMS_NORM = "model"


def _fused_norm_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [soft("cpu_no_fused_backward", "torch has no fused RMSNorm backward on a CPU: the model's own ops")]
    return []


RMS_NORM_OPTIONS: tuple[Option, ...] = (
    Option("torch", _fused_norm_reasons, "torch's fused F.rms_norm: one kernel each way instead of six", 10),
    Option(UPSTREAM_RMS_NORM, why="the model's own RMSNorm forward (upstream verl)", priority=20),
)


def resolve_rms_norm(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """Which RMSNorm the FSDP engine's models run: 'torch' (F.rms_norm) or 'model'; upstream: 'model'."""
    return choose(request, profile, RMS_NORM_OPTIONS, registry=registry)


# How the FSDP engine moves each micro-batch to the device (no config key; verl_compat.batch_moves): TensorDict.to
# rebuilds every per-sample non-tensor field element by element, 23-31 ms of host time per 32-row micro-batch on
# a 2-core CPU against 0.26-0.57 ms here (benchmarks/batch_moves.py), in every pass of every step. Below sm_80
# and on CPUs the tensors move and the non-tensor fields are kept as they are; sm_80+ keeps upstream's
# TensorDict.to.
BATCH_MOVES_KEY = "how a micro-batch moves to the device (no config key; verl_compat.batch_moves)"
UPSTREAM_BATCH_MOVES = "tensordict"

BATCH_MOVES_OPTIONS: tuple[Option, ...] = (
    Option("tensors", why="its tensors moved, its per-sample non-tensor fields kept, not rebuilt", priority=10),
    Option(UPSTREAM_BATCH_MOVES, why="TensorDict.to: every element rebuilt (upstream verl)", priority=20),
)


def resolve_batch_moves(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """How the engine moves a micro-batch: 'tensors' (verl_compat.batch_moves) or 'tensordict'; upstream's is
    'tensordict'."""
    return choose(request, profile, BATCH_MOVES_OPTIONS, registry=registry)


def _liger_reasons(ctx: Context) -> list[Reason]:
    return triton_reasons(ctx.profile, "Liger") + needs_package(ctx.profile, "liger_kernel", "use_liger")


LIGER_OPTIONS: tuple[Option, ...] = (
    Option(False, why="no Liger kernels (upstream verl's default)", priority=10),
    Option(True, _liger_reasons, "Liger Triton kernels", 20),
)


def resolve_liger(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """model.use_liger."""
    return choose(request, profile, LIGER_OPTIONS, registry=registry)


# Fused kernels: value "off" or the impl_backend. "torch" is pure torch and runs anywhere; "triton" and "liger"
# are Triton kernels (utils/kernel/kernels.py, linear_cross_entropy.py). Below sm_80 on a GPU the default is
# "torch": verl's FusedLinearForPPO computes log-probs and entropy from the hidden states a chunk of tokens at a
# time (kernels.fused_chunk), so the (tokens x vocabulary) logits of a micro-batch are never held (at 2,048 tokens
# of a 151,936-entry vocabulary those are 1.2 GiB in fp32, about 5 GiB with their softmax, gradient and work rows).
# That memory is what bounded the planner's micro-batches on a 16-24 GB card; the price is one more vocabulary
# projection in the backward. The memory plan takes it or leaves it (planner/resolve.py).
def _fused_torch_reasons(ctx: Context) -> list[Reason]:
    if not ctx.fact("lm_head", True):
        return [soft("no_lm_head", "this model has a value head, no vocabulary projection to fuse")]
    if ctx.profile.is_cpu:
        return [soft("cpu_logits_in_ram", "on a CPU a micro-batch's logits live in host memory: upstream's path")]
    return []


def _fused_triton_reasons(ctx: Context) -> list[Reason]:
    return triton_reasons(ctx.profile, "the fused-kernel triton backend")


def _fused_liger_reasons(ctx: Context) -> list[Reason]:
    return _fused_triton_reasons(ctx) + package_known_unusable(ctx.profile, "liger_kernel", "liger backend")


FUSED_OPTIONS: tuple[Option, ...] = (
    Option(
        "torch",
        _fused_torch_reasons,
        "fused linear + log-prob in pure torch (verl's FusedLinearForPPO): no whole micro-batch of logits",
        10,
    ),
    Option("off", why="fused kernels off (upstream verl's default)", priority=20),
    Option("triton", _fused_triton_reasons, "fused linear + log-prob Triton kernels", 30),
    Option("liger", _fused_liger_reasons, "fused linear + log-prob Liger kernels", 40),
)


def resolve_fused(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """model.use_fused_kernels + fused_kernel_options.impl_backend, as one value: 'off' or the backend; fact:
    lm_head (False for the critic's value model)."""
    return choose(request, profile, FUSED_OPTIONS, fix=_fused_fix, registry=registry)


def _fused_fix(request: Request, profile: DeviceProfile, alternative: object) -> str:
    model = request.key.rsplit(".", 2)[0] if request.key.endswith("impl_backend") else request.key.rsplit(".", 1)[0]
    return (
        f"set {model}.fused_kernel_options.impl_backend=torch (pure torch, runs anywhere) "
        f"or {model}.use_fused_kernels=false"
    )
