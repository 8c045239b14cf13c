"""Is there an accelerator on this host? The real hardware only, never the simulated profile.

verl's platform must match the process's real device: under `VERL_COMPAT_DEVICE=p40` on a CPU-only machine the
resolvers decide as for a P40 (dtype, attention, rollout engine), but every tensor still lives on the CPU, so the
CPU platform is selected. Only `VERL_COMPAT_DEVICE=cpu` forces the CPU platform on a machine that has a GPU.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess

log = logging.getLogger("verl_compat.cpu")

DEVICE_ENV = "VERL_COMPAT_DEVICE"  # same variable verl_compat.detect reads
_SMI_TIMEOUT_S = 10
# Where verl's own PlatformCUDA looks for nvidia-smi when it is not on PATH (platform_cuda.py).
_SMI_FALLBACK_PATHS = ("/usr/bin/nvidia-smi", "/usr/local/bin/nvidia-smi", "/usr/local/cuda/bin/nvidia-smi")


def forced_cpu() -> bool:
    """`VERL_COMPAT_DEVICE=cpu`: run on the CPU platform even where a GPU exists."""
    return os.environ.get(DEVICE_ENV, "").strip().lower() == "cpu"


def cpu_platform_wanted() -> bool:
    """True where verl must use the CPU platform: forced, or no accelerator on this host."""
    return forced_cpu() or not host_has_accelerator()


@functools.cache
def host_has_accelerator() -> bool:
    """CUDA/ROCm visible to torch, an Ascend torch_npu, or a working nvidia-smi (a CPU-only Ray actor on a GPU
    node sees no device through torch but is still on a GPU host: the GPU platform must stay selected there)."""
    return _torch_sees_accelerator() or _nvidia_smi_works()


def _torch_sees_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    npu = getattr(torch, "npu", None)  # present only once torch_npu is imported
    return bool(npu is not None and npu.is_available())


def _nvidia_smi_works() -> bool:
    path = shutil.which("nvidia-smi") or next((p for p in _SMI_FALLBACK_PATHS if os.access(p, os.X_OK)), None)
    if path is None:
        return False
    try:
        done = subprocess.run([path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("verl-compat: nvidia-smi present but did not run (%s); treating the host as GPU-less", exc)
        return False
    return done.returncode == 0


def reset_cache() -> None:
    """Forget the probe (tests)."""
    host_has_accelerator.cache_clear()
