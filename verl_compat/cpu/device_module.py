"""The `torch.<device>` module verl gets from the CPU platform (`get_torch_device()`).

verl calls CUDA's memory and RNG API on whatever `device_module` the platform returns (for example
`engine_workers.py` logs `max_memory_allocated()` after every step); `torch.cpu` has none of it. This module
answers the same calls for the host: memory figures are the process's resident set (what a CPU run actually
uses) and the machine's RAM, seeding goes to torch's CPU generator, and the rest is a no-op. Anything else is
looked up on `torch.cpu` (Stream, Event, current_stream, ...).

`is_available()` answers "is there an accelerator to manage?": False. verl uses it to skip GPU-only work
(peak-memory resets, `set_per_process_memory_fraction`, CUDA RNG state in checkpoints).
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import psutil
import torch

DEVICE_NAME = "CPU"  # verl's flops table and performance.py call torch.cpu "CPU" too


def is_available() -> bool:
    return False


def device_count() -> int:
    return 1  # one "device": the host


def current_device() -> str:
    return "cpu"  # verl uses the id as a device (`.to(get_device_id())`): it must be a device string here


def set_device(device: Any = None) -> None:
    """Nothing to select: every rank uses the host."""


def get_device_name(device: Any = None) -> str:
    return DEVICE_NAME


def synchronize(device: Any = None) -> None:
    """CPU ops are synchronous."""


def empty_cache() -> None:
    """The CPU allocator has no cache to release."""


def ipc_collect() -> None:
    """No CUDA IPC handles on the CPU."""


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    torch.set_rng_state(state)


def memory_allocated(device: Any = None) -> int:
    return psutil.Process().memory_info().rss


def memory_reserved(device: Any = None) -> int:
    return memory_allocated(device)


def max_memory_allocated(device: Any = None) -> int:
    """Peak resident set of this process (the kernel updates ru_maxrss lazily: never report less than now)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes
    return max(peak, memory_allocated(device))


def max_memory_reserved(device: Any = None) -> int:
    return max_memory_allocated(device)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of host RAM, like `torch.cuda.mem_get_info`."""
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def reset_peak_memory_stats(device: Any = None) -> None:
    """The process's peak RSS cannot be reset."""


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Nothing accumulated."""


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """No device memory pool to cap."""


def __getattr__(name: str) -> Any:
    # Stream, Event, current_stream, stream, StreamContext, amp, ...: torch.cpu has CPU versions of these.
    try:
        return getattr(torch.cpu, name)
    except AttributeError:
        raise AttributeError(f"the CPU device module (verl_compat.cpu.device_module) has no {name!r}") from None
