"""`HostFacts`: the machine this process runs on (cores, memory, whether it has a real accelerator).

Kept apart from the `DeviceProfile`, which is the card decided for and may be simulated: under
`VERL_COMPAT_DEVICE=p40` on a CPU-only machine the resolvers decide as for a P40 while every tensor still lives
on the host. `verl_compat.detect.host()` builds this once per process; nothing here touches a CUDA context
(torch.cuda.is_available() only), so it is safe inside `import verl`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("verl_compat.machine")

SMI_TIMEOUT_S = 10
# Where verl's own PlatformCUDA looks for nvidia-smi when it is not on PATH (platform_cuda.py).
SMI_FALLBACK_PATHS = ("/usr/bin/nvidia-smi", "/usr/local/bin/nvidia-smi", "/usr/local/cuda/bin/nvidia-smi")


@dataclass(frozen=True)
class HostFacts:
    cpu_count: int | None  # CPUs this process may run on (affinity), None if unreadable
    memory_bytes: int | None  # physical memory of the machine
    accelerator: bool  # a real GPU/NPU: torch sees one, or nvidia-smi works (a CPU-only Ray actor on a GPU node)
    accelerator_via: str | None  # "torch", "npu", "nvidia-smi" or None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_host() -> HostFacts:
    """Read the machine's facts; never raises (unreadable fields are None)."""
    via = None
    if _torch_sees_accelerator():
        via = "torch"
    elif _npu_available():
        via = "npu"
    elif _nvidia_smi_works():
        via = "nvidia-smi"
    return HostFacts(
        cpu_count=_cpu_count(), memory_bytes=_memory_bytes(), accelerator=via is not None, accelerator_via=via
    )


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _torch_sees_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()


def _npu_available() -> bool:
    import torch

    npu = getattr(torch, "npu", None)  # present only once torch_npu is imported
    return bool(npu is not None and npu.is_available())


def nvidia_smi_path() -> str | None:
    return shutil.which("nvidia-smi") or next((p for p in SMI_FALLBACK_PATHS if os.access(p, os.X_OK)), None)


def _nvidia_smi_works() -> bool:
    path = nvidia_smi_path()
    if path is None:
        return False
    try:
        done = subprocess.run([path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("verl-compat: nvidia-smi present but did not run (%s); treating the host as GPU-less", exc)
        return False
    return done.returncode == 0
