"""Is there an accelerator on this host? The machine's facts (`verl_compat.detect.host()`), never the simulated
profile.

verl's platform must match the process's real device: under `VERL_COMPAT_DEVICE=p40` on a CPU-only machine the
resolvers decide as for a P40 (dtype, attention, rollout engine), but every tensor still lives on the CPU, so the
CPU platform is selected. Only `VERL_COMPAT_DEVICE=cpu` forces the CPU platform on a machine that has a GPU.
"""

from __future__ import annotations


def forced_cpu() -> bool:
    """`VERL_COMPAT_DEVICE=cpu`: run on the CPU platform even where a GPU exists."""
    from verl_compat.detect import requested_profile_name

    return (requested_profile_name() or "").lower() == "cpu"


def cpu_platform_wanted() -> bool:
    """True where verl must use the CPU platform: forced, or no accelerator on this host."""
    return forced_cpu() or not host_has_accelerator()


def host_has_accelerator() -> bool:
    """CUDA/ROCm visible to torch, an Ascend torch_npu, or a working nvidia-smi (a CPU-only Ray actor on a GPU
    node sees no device through torch but is still on a GPU host: the GPU platform must stay selected there)."""
    from verl_compat.detect import host

    return host().accelerator


def reset_cache() -> None:
    """Forget the host facts (tests)."""
    from verl_compat.detect import reset_cache as reset

    reset()
