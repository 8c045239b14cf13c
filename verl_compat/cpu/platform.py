"""`PlatformCPU`: verl's platform interface for a host without an accelerator (CPU training with gloo).

Registered in verl's own `PlatformRegistry` under "cpu" by `register_platform()` (called from
`verl_compat.activate`, before verl first detects its platform). verl probes registered platforms in
registration order; "cpu" is registered after nvidia/npu/rocm and answers `is_platform_available` only where
`host.cpu_platform_wanted()` holds, so on a GPU host nothing changes. Importing this module imports verl's
platform package: call it only from code that runs inside `import verl` or later.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl_compat.cpu import device_module as _device_module
from verl_compat.cpu.host import cpu_platform_wanted, forced_cpu

log = logging.getLogger("verl_compat.cpu")

PLATFORM_NAME = "cpu"


class PlatformCPU(PlatformBase):
    """FSDP2 over gloo on the host; Ray schedules workers on logical CPUs."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _device_module

    def is_available(self) -> bool:
        return True  # the host is always there; _create_platform warns when a platform says False

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # verl probes this once per process, after nvidia/npu/rocm said no: say why the CPU platform wins.
        wanted = cpu_platform_wanted()
        if wanted:
            why = "VERL_COMPAT_DEVICE=cpu" if forced_cpu() else "no GPU on this host"
            log.info("verl-compat: verl runs on the CPU platform (%s): gloo, FSDP2, Ray CPU pools", why)
        return wanted

    def current_device(self) -> str:  # type: ignore[override]  # verl's base says int; see device_module
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        """Every rank uses the host."""

    def synchronize(self, device_index: Any = None) -> None:
        """CPU ops are synchronous."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """`expandable_segments:...` is a CUDA caching-allocator setting; the CPU allocator has none."""

    def empty_cache(self) -> None:
        """Nothing cached."""

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None  # constants_ppo.py unpacks this at import

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Worker env plumbing reads and forwards this variable; on a CPU run it only hides GPUs, which is what
        # VERL_COMPAT_DEVICE=cpu on a GPU host wants anyway.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        """No device profiler."""

    def profiler_stop(self) -> None:
        """No device profiler."""

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # A worker's CPUs are reserved by its placement-group bundle ({"CPU": max_colocate_count}); Ray rejects
        # "CPU" as a custom resource, so the base class's {"resources": {"CPU": n}} must not be produced.
        return {}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_platform() -> None:
    """Register PlatformCPU with verl (idempotent). Cheap: no hardware probe here (that runs in verl's detection).

    `VERL_COMPAT_DEVICE=cpu` also sets `VERL_PLATFORM=cpu` unless the user set VERL_PLATFORM: verl's detection
    then picks "cpu" before probing nvidia, and Ray workers started from this process inherit the choice.
    """
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    if forced_cpu():
        chosen = os.environ.setdefault("VERL_PLATFORM", PLATFORM_NAME)
        if chosen.strip().lower() != PLATFORM_NAME:
            log.warning("verl-compat: VERL_COMPAT_DEVICE=cpu but VERL_PLATFORM=%s; verl follows VERL_PLATFORM", chosen)
