"""FSDP engine seams: which device types the FSDP engines register for, and whether to pin host memory."""

from __future__ import annotations


def on_cpu_platform() -> bool:
    """verl's platform in this process is verl-compat's CPU platform."""
    from verl.plugin.platform import get_platform

    return get_platform().device_name == "cpu"


def engine_devices(devices: list[str]) -> list[str]:
    """Device types for `EngineRegistry.register(..., device=...)` of the FSDP engines: upstream's list plus "cpu".

    Evaluated at import, so it must not depend on the platform: a "cpu" key is only ever looked up on the CPU
    platform, so registering it everywhere changes nothing on a GPU host. FSDP2 (fully_shard) runs on a CPU device
    mesh with gloo; the engines' code is device-agnostic once the platform answers "cpu".
    """
    return devices if "cpu" in devices else [*devices, "cpu"]


def pin_memory(default: bool = True) -> bool:
    """`CPUOffloadPolicy(pin_memory=...)`: pinning needs an accelerator runtime; on the CPU platform the
    parameters already live in host memory, so offloading is a no-op move and pinning would fail."""
    return default and not on_cpu_platform()


def grad_scaler_device(default: str = "cuda") -> str:
    """`ShardedGradScaler(device=...)` for fp16 training. Upstream's default "cuda" makes the scaler disable itself
    (no loss scaling, no skipping of overflowing steps) wherever CUDA is not the device; on the CPU platform the
    scaler must run on "cpu" to do its job."""
    return "cpu" if on_cpu_platform() else default
