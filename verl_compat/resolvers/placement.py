"""Placement resolvers for a CPU-only run: trainer.device and the FSDP strategy.

The CPU platform itself (dist backend, Ray resources, pinned memory) is verl-compat's platform plugin; these
two are plain config keys the driver can set before anything starts.
"""

from __future__ import annotations

from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import Context, Option, Reason, Registry, Request, choose, hard


def _needs_cuda(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [hard("needs_gpu", "trainer.device=cuda needs an NVIDIA GPU, device is a CPU")]
    return []


def _needs_cpu(ctx: Context) -> list[Reason]:
    if not ctx.profile.is_cpu:
        return [hard("not_cpu", f"the device is {ctx.profile.describe()}, not a CPU")]
    return []


DEVICE_OPTIONS: tuple[Option, ...] = (
    Option("cuda", _needs_cuda, "NVIDIA GPU (upstream verl's default)", 10),
    Option("cpu", _needs_cpu, "CPU-only run through verl-compat's CPU platform", 20),
)


def resolve_device(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """trainer.device. Non-CUDA accelerators (npu) are verl's own auto_set_device business: passed through."""
    return choose(request, profile, DEVICE_OPTIONS, registry=registry)


def _fsdp1_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [
            hard(
                "fsdp1_needs_accelerator",
                "FSDP1 (strategy=fsdp) needs an accelerator (device_id, flat-param moves to cuda); device is a CPU",
            )
        ]
    return []


STRATEGY_OPTIONS: tuple[Option, ...] = (
    Option("fsdp", _fsdp1_reasons, "FSDP1 (upstream verl's default)", 10),
    Option("fsdp2", why="FSDP2 (fully_shard): runs on CPU with gloo", priority=20),
)


def resolve_strategy(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """actor_rollout_ref.actor.strategy / critic.strategy."""
    return choose(request, profile, STRATEGY_OPTIONS, registry=registry)


def torch_wheel_hint(profile: DeviceProfile) -> str:
    """Which torch build to install for this card (verl_compat.torch_build knows the wheel matrix)."""
    from verl_compat.torch_build import install_command

    if profile.compute_capability is None:
        return "install a CUDA build of torch with kernels for this GPU (`verl-compat doctor` shows the arch list)"
    command = install_command(profile.torch_version, profile.compute_capability)
    return f"install a torch build with sm_{profile.sm} kernels: {command}"


def resolve_torch_build(profile: DeviceProfile) -> Decision:
    """Does the installed torch have kernels for this card? Raises only on a real (not simulated) GPU: simulated
    profiles run on whatever torch the test machine has. On a real card without kernels nothing runs, upstream
    included, so refusing at start-up changes no run that works (sm_80+ too)."""
    from verl_compat.errors import IncompatibleRequestError

    version = profile.torch_version or "unknown"
    arch = ", ".join(profile.torch_arch_list) or "unknown"
    if profile.is_cpu or profile.torch_covers_device is not False:
        why = "CPU run" if profile.is_cpu else f"torch {version} has kernels for this device (arch list: {arch})"
        if profile.torch_covers_device is None and not profile.is_cpu:
            why = "could not tell whether torch covers this device"
        return Decision("torch", "torch", version, True, profile.describe(), reasons=(why,))
    reason = (
        f"torch {version} (CUDA {profile.torch_cuda_version}) has no kernels for sm_{profile.sm} (arch list: {arch})"
    )
    fix = torch_wheel_hint(profile)
    if profile.simulated:
        return Decision("torch", "torch", version, True, profile.describe(), reasons=(f"note: {reason}; fix: {fix}",))
    raise IncompatibleRequestError("torch", version, profile.describe(), reason, fix)
