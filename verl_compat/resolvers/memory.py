"""Memory resolvers. The plan (micro-batches, offload, gradient checkpointing, the rollout's batch / KV budget)
comes from `verl_compat.planner` (`resolve_plan`); the single-key resolvers below only report.
"""

from __future__ import annotations

from verl_compat.decision import Decision
from verl_compat.planner.resolve import export_shares, is_auto  # noqa: F401  (used by the policy)
from verl_compat.planner.resolve import plan_decisions as resolve_plan  # noqa: F401
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import Context, Option, Reason, Registry, Request, choose, hard, passthrough, soft


def _gib(profile: DeviceProfile) -> str:
    return f"{profile.total_memory_bytes / 2**30:.1f} GiB" if profile.total_memory_bytes else "unknown memory"


def resolve_gpu_memory_utilization(request: Request, profile: DeviceProfile) -> Decision:
    """rollout.gpu_memory_utilization; fact: engine."""
    engine = request.facts.get("engine")
    if engine == "hf":
        why = "the hf engine allocates its KV cache per request and does not read this value"
    elif profile.is_cpu:
        why = "no GPU memory to reserve on a CPU"
    else:
        why = f"{engine} reserves this fraction of {_gib(profile)} for weights + KV cache (upstream value kept)"
    return passthrough(request, profile, [why])


# AdamW's implementation (torch.optim): upstream passes none, so torch picks foreach on CUDA, which computes
# sqrt(exp_avg_sq) for every parameter at once: one model-size fp32 temporary at each step (the planned P40
# critic update OOMed there: benchmarks/results/h200_oom_reports.json). The fused CUDA kernel (an ATen kernel, not
# Triton) updates in place with no such temporary; the per-parameter loop (foreach=False, torch's reference
# implementation) needs one parameter's worth (the embedding) and some thousand small kernels per step.
def _torch_adam_reasons(ctx: Context) -> list[Reason]:
    reasons: list[Reason] = []
    if ctx.profile.is_cpu:
        reasons.append(soft("cpu_no_card", "on a CPU the step's temporaries are host memory; torch's default kept"))
    if ctx.fact("optimizer") not in ("AdamW", "Adam") or ctx.fact("optimizer_impl") != "torch.optim":
        reasons.append(hard("not_torch_adam", "only torch.optim's Adam/AdamW take these implementation flags"))
    return reasons


def _fused_reasons(ctx: Context) -> list[Reason]:
    reasons = _torch_adam_reasons(ctx)
    if ctx.fact("offload_policy") and not host_fused_adamw():
        reasons.append(
            hard("offload_policy", "FSDP2's offload_policy steps on the host; this torch has no host kernel")
        )
    # fp16 loss scaling steps it too: verl's scaler comes from verl_compat.loss_scaling, whose overflow flags the
    # fused kernel accepts (torch's own ShardedGradScaler's fail there)
    return reasons


def host_fused_adamw() -> bool:
    """Does this torch have AdamW's fused kernel for host tensors? Under FSDP2's CPU offload policy the step runs
    on the host, where torch's default is the per-parameter loop: the fused kernel is one vectorised, threaded pass
    (0.19x the loop's time on 2 cores for 152 M parameters, same values: benchmarks/host_adamw.py)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return "cpu" in _get_fused_kernels_supported_devices()
    except ImportError:
        return False


OPTIMIZER_STEP_OPTIONS = (
    Option(
        "fused",
        _fused_reasons,
        "AdamW's fused kernel (CUDA's, or the host's under FSDP2's CPU offload policy): in place, one pass",
        priority=10,
    ),
    Option("loop", _torch_adam_reasons, "AdamW one parameter at a time: temporaries of one parameter", priority=15),
    Option("default", why="torch's default AdamW implementation (foreach on CUDA; upstream verl)", priority=20),
)
# What each choice writes into optim.override_optimizer_config (verl passes it to the optimizer's constructor).
OPTIMIZER_OVERRIDES = {"fused": {"fused": True}, "loop": {"foreach": False}}


def resolve_optimizer_step(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """The AdamW implementation for one trained role; facts: optimizer, optimizer_impl, offload_policy."""
    return choose(request, profile, OPTIMIZER_STEP_OPTIONS, registry=registry)


# FSDP1 on one GPU (NO_SHARD) in full precision: a model moved to the host (the reference's CPUOffload after each
# forward, verl's param offload) keeps its GPU copy through stale views (verl_compat.fsdp_views). No config key.
MOVED_VIEWS_KEY = "FSDP1's views of a model moved to the host (no config key)"
MOVED_VIEWS_OPTIONS = (
    Option(
        "release",
        why="re-point them at the host tensor, so the model's GPU copy is freed (verl_compat.fsdp_views)",
        priority=10,
    ),
    Option("keep", why="upstream: they keep the old GPU tensor until the next forward", priority=20),
)


def resolve_moved_views(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """What happens to FSDP1's stale views after a move to the host; upstream: 'keep'."""
    return choose(request, profile, MOVED_VIEWS_OPTIONS, registry=registry)


# FSDP1 finishes a CPU-offloaded wrap at the first forward: a pinned copy of each flat parameter and a pinned
# gradient for a backward; for verl's reference (forward only) that is step 1's reference pass, and the gradient is
# never used (verl_compat.offload_init). No config key.
OFFLOAD_INIT_KEY = "when FSDP1 sets up a forward-only model's CPU offload (no config key)"


def _at_build_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [hard("cpu_no_card", "on a CPU nothing is pinned or streamed")]
    return []


OFFLOAD_INIT_OPTIONS = (
    Option(
        "at_build",
        _at_build_reasons,
        "in a background thread after the wrap, joined by the first forward; the unused pinned gradient freed "
        "(verl_compat.offload_init)",
        priority=10,
    ),
    Option("first_forward", why="upstream: FSDP1's lazy init in the first forward, the gradient kept", priority=20),
)


def resolve_offload_init(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """When a forward-only FSDP1 model's CPU offload is set up; upstream: 'first_forward'."""
    return choose(request, profile, OFFLOAD_INIT_OPTIONS, registry=registry)


# verl's optimizer offload brings AdamW's state back when an engine enters train mode (engine/base.py), so it sits
# on the card through every micro-batch's forward and backward, though only optimizer.step() reads it, after the
# activations are freed (verl_compat.optimizer_state). No config key: a defaulted request with upstream's value.
OPTIMIZER_LOAD_KEY = "when verl's optimizer_offload brings AdamW's state back (no config key)"


def _at_step_reasons(ctx: Context) -> list[Reason]:
    reasons: list[Reason] = []
    if ctx.profile.is_cpu:
        reasons.append(hard("cpu_no_card", "on a CPU the state never leaves host memory"))
    if ctx.fact("engine_step") is False:
        reasons.append(
            hard(
                "engine_step", "this engine's optimizer_step does not bring the state (only verl's FSDP engine's does)"
            )
        )
    return reasons


OPTIMIZER_LOAD_OPTIONS = (
    Option(
        "at_step",
        _at_step_reasons,
        "for optimizer.step(), after the update's last backward: the state and the micro-batches' activations are "
        "never on the card together",
        priority=10,
    ),
    Option("at_entry", why="upstream: when the engine enters train mode, for the whole update", priority=20),
)


def resolve_optimizer_load(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """When an offloaded optimizer state comes back to the card; fact: engine_step (does the engine's
    optimizer_step carry the seam); upstream: 'at_entry'."""
    return choose(request, profile, OPTIMIZER_LOAD_OPTIONS, registry=registry)
