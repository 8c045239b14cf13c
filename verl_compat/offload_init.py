"""FSDP1's CPU offload of a forward-only model (verl's reference), initialised while the job starts.

verl wraps the reference in FSDP1 with ``CPUOffload(offload_params=True)``. FSDP1 finishes a wrap lazily, at the
module's first forward: it pins a copy of each unit's flat parameter (for asynchronous host-to-device copies) and
allocates a pinned zero gradient of the same size (for a backward's device-to-host copy), which a forward-only model
never uses. For Qwen2.5-0.5B in fp32 that is two 1.98 GB pinned host allocations inside step 1's reference pass
(benchmarks/fsdp_offload_first_pass.py times them), and the unused one stays pinned for the whole run.

Where ``memory.offload_init`` says 'at_build' (below sm_80 on a GPU: the plan streams the reference from host
memory there), the lazy initialisation runs in a background thread right after the wrap, the module's first
forward waits for it, and the unused pinned gradient buffers are given back to the host.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

logger = logging.getLogger("verl_compat.offload_init")


def offloaded_root(module: Any) -> bool:
    """An FSDP1 root module, not yet initialised, with at least one CPU-offloaded unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not isinstance(module, FSDP) or getattr(module, "_is_root", None) is not None:
        return False
    return any(handle._offload_params for handle in handles(module))


def handles(module: Any) -> list[Any]:
    """The FSDP1 flat-parameter handles of ``module``'s units (before the lazy init too)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in FSDP.fsdp_modules(module) if m._handle is not None]


def release_gradient_buffers(module: Any) -> int:
    """Give back the pinned host gradient of every offloaded unit of a forward-only module; returns its bytes.

    Pinned storage cannot be resized in place, and FSDP1 allocates the buffer again before each forward when it is
    None, so each is replaced by unpinned zeros of the same size whose pages the system commits only when written:
    a model that runs no backward never writes them, and a backward would still find its zero buffer."""
    freed = 0
    for handle in handles(module):
        grad = getattr(handle.flat_param, "_cpu_grad", None)
        if grad is None or grad.untyped_storage().nbytes() == 0:
            continue
        freed += grad.untyped_storage().nbytes()
        handle.flat_param._cpu_grad = _zeros_committed_when_written(grad)
    if freed and torch.cuda.is_available():  # the pinned blocks go back to torch's host cache first
        empty_host_cache()
    return freed


def _zeros_committed_when_written(like: torch.Tensor) -> torch.Tensor:
    """Host zeros shaped as ``like`` from calloc (numpy's zeros): large blocks are fresh zero pages, not filled."""
    import numpy as np

    raw = torch.from_numpy(np.zeros(like.numel() * like.element_size(), dtype=np.uint8))
    return raw.view(like.dtype).view(like.shape)


def empty_host_cache() -> None:
    """Give torch's cached pinned host blocks back to the system (the function's name differs between releases)."""
    for name in ("_accelerator_emptyHostCache", "_host_emptyCache"):
        if hasattr(torch._C, name):
            getattr(torch._C, name)()
            return


def start(module: Any) -> threading.Thread | None:
    """Initialise ``module`` (an FSDP1 root of a forward-only model) in a background thread; its first forward
    joins the thread and re-raises what the thread raised. None where there is nothing to do."""
    if not offloaded_root(module):
        return None
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    failure: list[BaseException] = []

    def work() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)  # the current device is per thread
            _lazy_init(module, module)
            freed = release_gradient_buffers(module)
            logger.info("FSDP1 CPU offload initialised at build; %.2f GB of unused pinned gradient freed", freed / 1e9)
        except BaseException as exc:  # re-raised by the first forward, where FSDP's own init would raise it
            failure.append(exc)

    thread = threading.Thread(target=work, name="verl-compat-offload-init", daemon=True)

    def join(*_: Any) -> None:
        thread.join()
        hook.remove()
        if failure:
            raise failure[0]

    hook = module.register_forward_pre_hook(join, prepend=True)
    thread.start()
    return thread
