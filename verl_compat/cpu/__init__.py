"""verl on a host without an accelerator: the CPU platform and the seams verl's call sites use.

Seams (one line each in a patch; see patches/series):
- `dist_backend(s)`               utils/distributed.py, backend string of init_process_group
- `ray_use_accelerator()`         single_controller/ray/base.py, RayResourcePool(use_gpu=...)
- `check_ray_resources(manager)`  single_controller/ray/base.py, upstream's GPU count check or, on the CPU
                                  platform, `check_ray_cpu_resources(...)`
- `engine_devices(devices)`       workers/engine/fsdp/transformer_impl.py, EngineRegistry device list
- `pin_memory()`                  workers/engine/fsdp/transformer_impl.py, the ref's CPUOffloadPolicy
Driver side (for the lead's resolve_config): `size_for_host(config, requested)` fits the Ray/TransferQueue layout.
Platform: `register_platform()` (from verl_compat.activate) registers `platform.PlatformCPU`.

Importing this package must stay cheap and must not import verl: it is imported from inside `import verl`.
The submodules below import verl only inside functions.
"""

from __future__ import annotations

from typing import Any

from verl_compat.cpu.distributed import dist_backend
from verl_compat.cpu.engine import engine_devices, grad_scaler_device, on_cpu_platform, pin_memory
from verl_compat.cpu.host import cpu_platform_wanted, forced_cpu, host_has_accelerator
from verl_compat.cpu.ray_pools import check_ray_cpu_resources, check_ray_resources, ray_use_accelerator


def register_platform() -> None:
    """Register the CPU platform in verl's PlatformRegistry (imports verl's platform package)."""
    from verl_compat.cpu.platform import register_platform as impl

    impl()


def size_for_host(config: Any, requested: Any = None, host_cpus: int | None = None) -> Any:
    """See `verl_compat.cpu.sizing.size_for_host` (imported lazily: it needs omegaconf)."""
    from verl_compat.cpu.sizing import size_for_host as impl

    return impl(config, requested, host_cpus)


__all__ = [
    "check_ray_cpu_resources",
    "check_ray_resources",
    "cpu_platform_wanted",
    "dist_backend",
    "engine_devices",
    "grad_scaler_device",
    "forced_cpu",
    "host_has_accelerator",
    "on_cpu_platform",
    "pin_memory",
    "ray_use_accelerator",
    "register_platform",
    "size_for_host",
]
