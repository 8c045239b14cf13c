"""Running a simulated card on a bigger real GPU (`VERL_COMPAT_DEVICE=p40` on an H200): cap the process's memory
and keep SDPA off the attention kernels the simulated card does not have (flash and cuDNN need sm_80+; the
memory-efficient and math kernels run from sm_50), so the simulation runs the kernels the real card would.

The card is one card for all its processes: each process's cap is its planned share, lowered while the other
processes on the GPU hold more than the card leaves it (`card_guard`), so the trainer and the rollout server
together never hold more than the simulated card, whichever of them allocates last runs out, as on the real card.

Only when the profile is simulated and a real CUDA device is in use; a real card's profile never changes anything.
Called only through `verl_compat.seams.device_in_use()`, where this process is about to use the device (the FSDP
engine build, the hf rollout server), never at import: touching torch.cuda before Ray or a server sets
CUDA_VISIBLE_DEVICES would freeze the wrong device list.
"""

from __future__ import annotations

import logging
import threading

from verl_compat.profile import DeviceProfile

log = logging.getLogger("verl_compat.simulate")
_capped: set[int] = set()
GUARD_PERIOD_S = 0.02  # how often the card guard re-reads the GPU's memory (a cudaMemGetInfo call)


def guarded_fraction(device: int, card_bytes: int, share: int) -> float:
    """This process's allocator cap as a fraction of the real GPU: its share, and no more than the simulated card
    less what is in use on the GPU beside this process's allocator (the other processes, every CUDA context)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    beside = (total - free) - torch.cuda.memory_reserved(device)
    return max(0.0, min(share, card_bytes - beside)) / total


def card_guard(device: int, card_bytes: int, share: int, stop: threading.Event | None = None) -> threading.Thread:
    """A daemon thread that keeps this process's cap at `guarded_fraction` every GUARD_PERIOD_S. A cap below
    what the allocator already holds frees nothing: its next allocation beyond its cached blocks fails, as on the
    real card."""
    import torch

    stop = stop or threading.Event()

    def run() -> None:
        last = None
        while not stop.wait(GUARD_PERIOD_S):
            fraction = guarded_fraction(device, card_bytes, share)
            if fraction != last:
                torch.cuda.set_per_process_memory_fraction(fraction, device)
                last = fraction

    thread = threading.Thread(target=run, name=f"verl-compat-card-guard-{device}", daemon=True)
    thread.start()
    return thread


def prepare_device(profile: DeviceProfile, process: str | None = None) -> float | None:
    """Limit this process's CUDA caching allocator to the simulated card's memory, or to the share of it the
    memory plan gives `process` ("trainer" | "rollout"), so all processes together stay within the card, and its
    SDPA kernels to the card's; returns the fraction set (None when nothing was done: a real card, no CUDA, or
    already done)."""
    if not profile.simulated or profile.device_type != "cuda" or not profile.total_memory_bytes:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.cuda.current_device()
    if device in _capped:
        return None
    from verl_compat.detect import real_device
    from verl_compat.planner.resolve import planned_share

    real = real_device().total_memory_bytes or torch.cuda.get_device_properties(device).total_memory
    share = planned_share(process) if process else None
    allowed = min(profile.total_memory_bytes, share or profile.total_memory_bytes)
    fraction = min(1.0, allowed / real)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    _capped.add(device)
    card_guard(device, profile.total_memory_bytes, allowed)
    if profile.sm is not None and profile.sm < 80:
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    log.warning(  # a warning, so every Ray worker's log shows that its memory is capped
        "simulating %s: this process (%s) may allocate %.1f GiB of the %.1f GiB on cuda:%d, less while the "
        "GPU's other processes hold more than the simulated card leaves",
        profile.describe(),
        f"{process}, planned share" if share else "no plan",
        allowed / 2**30,
        real / 2**30,
        device,
    )
    return fraction
