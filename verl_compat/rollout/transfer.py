"""Weight sync from a trainer worker to its hf rollout server on the same host: no host round trip, nothing
pickled through Ray's object store.

The trainer packs tensors into one staging bucket and the server copies them out into its model:
- ``cuda_ipc`` (the tensors are on a GPU that supports IPC): the bucket is device memory whose CUDA IPC handle the
  server opens once per sync, so the data never leaves the card; a tensor larger than the bucket is shared through
  its own handle, without staging.
- ``shared_memory`` (CPU, or a device without IPC): the bucket is a POSIX shared-memory segment.
Per bucket only metadata (names, shapes, dtypes, offsets) travels, as the argument of one Ray actor call (inlined
in the task, not put in the object store), and that call returns only after the server's copies completed, so a
bucket is never overwritten while it is read and a refused weight name raises in the trainer's call.

verl's ``vllm_rollout/bucketed_weight_transfer.py`` does the same over ZMQ; we use its IPC/shm helpers
(``rebuild_ipc``, ``create_shared_memory``, ``rebuild_shared_memory``) but not its sender/receiver pair: (1) the
package that holds it raises on import without vLLM, so it is loaded from its file; (2) a refusal on the receiving
side (unknown weight name, shape mismatch) closes the receiver's socket while the sender waits in a blocking
``recv`` on the trainer's event loop, a hang instead of our error; (3) its shared-memory path refuses any tensor
above the bucket (Qwen2.5-0.5B's fp32 embedding is 545 MB, the bucket often 512 MB).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("verl_compat.rollout.transfer")
CUDA_IPC = "cuda_ipc"
SHARED_MEMORY = "shared_memory"
_VERL_MODULE = "verl_compat.rollout._verl_bucketed_weight_transfer"
_CREATED_HERE: set[str] = set()  # shared-memory names this process created (and its resource tracker owns)
SEGMENT_PREFIX = "verl_compat_w_"
SHM_DIR = Path("/dev/shm")
_swept = False


def verl_transfer_helpers():
    """verl's bucketed_weight_transfer module, loaded from its file: its package ``vllm_rollout/__init__`` raises
    without vLLM (hook-points D7), the module itself needs only torch, zmq and verl.utils.device."""
    if _VERL_MODULE in sys.modules:
        return sys.modules[_VERL_MODULE]
    import verl.workers.rollout as rollout_pkg

    path = Path(rollout_pkg.__file__).parent / "vllm_rollout" / "bucketed_weight_transfer.py"
    spec = importlib.util.spec_from_file_location(_VERL_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_VERL_MODULE] = module
    spec.loader.exec_module(module)
    return module


def choose_transport(tensor: torch.Tensor) -> str:
    """CUDA IPC for a tensor on a GPU whose platform supports it, else shared memory."""
    if tensor.device.type == "cuda":
        from verl.utils.device import is_support_ipc

        if is_support_ipc():
            return CUDA_IPC
    return SHARED_MEMORY


@dataclass
class SyncReport:
    """What one sync moved and how (the trainer logs it; tests assert on ``transport``)."""

    transport: str
    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    direct: int = 0  # tensors larger than the bucket, shared without staging (cuda_ipc) or in their own segment
    bucket_bytes: int = 0
    seconds: float = 0.0
    received: Any = None  # what the receiver's finish() returned
    sender_allocated_before: int | None = None  # CUDA bytes the trainer held when the sync began
    sender_allocated_after: int | None = None  # ... and still holds once the buckets are freed

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


class _Segment:
    """One staging area the server can open: device memory with an IPC handle, or a shared-memory segment."""

    def __init__(self, transport: str, nbytes: int, device: torch.device | None, tensor: torch.Tensor | None = None):
        from torch.multiprocessing.reductions import reduce_tensor

        self.key = uuid.uuid4().hex
        self.shm = None
        if transport == CUDA_IPC:
            self.buffer = tensor if tensor is not None else torch.empty(nbytes, dtype=torch.uint8, device=device)
            self.descriptor = {"key": self.key, "kind": CUDA_IPC, "handle": reduce_tensor(self.buffer)}
        else:
            sweep_once()
            _check_shm_space(nbytes)
            self.shm = verl_transfer_helpers().create_shared_memory(nbytes, segment_name(os.getpid(), self.key))
            _CREATED_HERE.add(self.shm.name)
            self.buffer = torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=nbytes)
            self.descriptor = {"key": self.key, "kind": SHARED_MEMORY, "name": self.shm.name, "size": nbytes}

    def close(self) -> None:
        self.buffer = None
        if self.shm is not None:
            self.shm.close()
            self.shm.unlink()
            _CREATED_HERE.discard(self.shm.name)
            self.shm = None


def _stage(buffer: torch.Tensor, offset: int, tensor: torch.Tensor) -> None:
    # no view of a shared-memory buffer may outlive the call: the segment cannot close while one exists
    nbytes = tensor.numel() * tensor.element_size()
    buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor, non_blocking=True)


# A segment lives for one sync and its creator unlinks it; a creator killed mid-sync together with its resource
# tracker (SIGKILL to the process group) leaves it in /dev/shm, which is RAM, until reboot. Names carry the
# creator's pid namespace and pid, so a later sync can remove those whose creator is gone: only within the same
# pid namespace, where a pid that does not exist is a dead creator (a live one elsewhere would not be visible).
def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def segment_name(pid: int, key: str) -> str:
    return f"{SEGMENT_PREFIX}{_pid_namespace()}_{pid}_{key}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_stale_segments(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink this pid namespace's weight-sync segments whose creator no longer runs; returns their names."""
    if not shm_dir.is_dir():
        return []
    mine = f"{SEGMENT_PREFIX}{_pid_namespace()}_"
    removed, freed = [], 0
    for entry in shm_dir.iterdir():
        pid = entry.name[len(mine) :].split("_", 1)[0] if entry.name.startswith(mine) else ""
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            size = entry.stat().st_size
            entry.unlink()
        except FileNotFoundError:  # another process swept it first
            continue
        removed.append(entry.name)
        freed += size
    if removed:
        log.warning(
            "removed %d weight-sync segment(s) of processes that no longer run from %s (%d MiB)",
            len(removed),
            shm_dir,
            freed >> 20,
        )
    return removed


def sweep_once() -> None:
    global _swept
    if not _swept:
        _swept = True
        sweep_stale_segments()


def _check_shm_space(nbytes: int) -> None:
    free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else None
    if free is not None and free < nbytes:
        raise RuntimeError(
            f"hf rollout weight sync needs a {nbytes >> 20} MiB shared-memory bucket but /dev/shm has only "
            f"{free >> 20} MiB free; lower actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes "
            "or give the container a larger /dev/shm (docker --shm-size)"
        )


class BucketSender:
    """Trainer side: fills buckets from a ``(name, tensor)`` stream and hands each to ``deliver(meta)``."""

    def __init__(self, bucket_bytes: int, max_total_numel: int | None = None):
        self.bucket_bytes = int(bucket_bytes)
        self.max_total_numel = max_total_numel  # the receiver's model size: no bucket larger than the whole model

    async def send(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        deliver: Callable[[dict], Awaitable[Any]],
        finish: Callable[[], Awaitable[Any]] | None = None,
    ) -> SyncReport:
        """Send every tensor; ``finish()`` (the receiver closing its segments) is awaited before the buckets are
        freed, so CUDA IPC blocks are released at once instead of waiting in torch's IPC limbo. Its result is
        ``report.received``."""
        start = time.perf_counter()
        report: SyncReport | None = None
        bucket: _Segment | None = None
        opened: set[str] = set()
        entries: list[tuple] = []
        offset = 0

        async def flush(segment: _Segment, items: list[tuple], last: bool = False) -> None:
            if segment.descriptor["kind"] == CUDA_IPC:
                torch.cuda.synchronize(segment.buffer.device)  # the server reads what the copies wrote
            descriptor = None if segment.key in opened else segment.descriptor
            opened.add(segment.key)
            await deliver({"segment": descriptor, "key": segment.key, "tensors": items, "last": last})
            report.buckets += 1

        try:
            for name, tensor in weights:
                full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # a DTensor that slipped by
                full = full.detach()
                if report is None:
                    report = SyncReport(transport=choose_transport(full))
                    report.bucket_bytes = self._bucket_size(full)
                    if report.transport == CUDA_IPC:  # the first gathered tensor included
                        report.sender_allocated_before = torch.cuda.memory_allocated()
                nbytes = full.numel() * full.element_size()
                report.tensors += 1
                report.bytes += nbytes
                entry_offset = _align(offset, max(full.element_size(), 1))
                if entries and entry_offset + nbytes > report.bucket_bytes:
                    await flush(bucket, entries)
                    entries, entry_offset = [], 0
                if nbytes > report.bucket_bytes:
                    await self._send_direct(name, full, report, deliver)
                    offset = 0
                    continue
                if bucket is None:
                    device = full.device if report.transport == CUDA_IPC else None
                    bucket = _Segment(report.transport, report.bucket_bytes, device)
                _stage(bucket.buffer, entry_offset, full)
                entries.append((name, tuple(full.shape), full.dtype, entry_offset))
                offset = entry_offset + nbytes
            if report is None:
                return SyncReport(transport="none", seconds=time.perf_counter() - start)
            if entries:
                await flush(bucket, entries, last=True)
            if finish is not None:
                report.received = await finish()
        finally:
            if bucket is not None:
                bucket.close()
            if report is not None and report.transport == CUDA_IPC:
                torch.cuda.ipc_collect()  # the server dropped its mappings; free our blocks now, not later
                report.sender_allocated_after = torch.cuda.memory_allocated()
        report.seconds = time.perf_counter() - start
        return report

    def _bucket_size(self, first: torch.Tensor) -> int:
        size = self.bucket_bytes
        if self.max_total_numel:
            # a bucket above the whole model's size only costs memory
            size = min(size, _align(self.max_total_numel * first.element_size() + (1 << 20), 1 << 20))
        return size

    async def _send_direct(self, name: str, tensor: torch.Tensor, report: SyncReport, deliver) -> None:
        """A tensor above the bucket: its own IPC handle (no copy) or its own shared-memory segment."""
        nbytes = tensor.numel() * tensor.element_size()
        if report.transport == CUDA_IPC:
            segment = _Segment(CUDA_IPC, nbytes, None, tensor=tensor.contiguous().view(-1).view(torch.uint8))
            torch.cuda.synchronize(tensor.device)
        else:
            segment = _Segment(SHARED_MEMORY, nbytes, None)
            _stage(segment.buffer, 0, tensor)
        try:
            meta = {
                "segment": segment.descriptor,
                "key": segment.key,
                "tensors": [(name, tuple(tensor.shape), tensor.dtype, 0)],
                "last": False,
                "transient": True,
            }
            await deliver(meta)
        finally:
            segment.close()
        report.buckets += 1
        report.direct += 1


@dataclass
class BucketReceiver:
    """Server side: opens the segments a sender names and yields ``(name, tensor view)`` pairs per bucket."""

    device: torch.device
    _segments: dict[str, tuple[torch.Tensor, Any]] = field(default_factory=dict)
    transports: set[str] = field(default_factory=set)
    _lingering: list[Any] = field(default_factory=list)  # segments a live view (e.g. a traceback's) kept open

    def tensors(self, meta: dict) -> list[tuple[str, torch.Tensor]]:
        descriptor = meta.get("segment")
        if descriptor is not None:
            self._segments[meta["key"]] = self._open(descriptor)
            self.transports.add(descriptor["kind"])
        buffer = self._segments[meta["key"]][0]
        pairs = []
        for name, shape, dtype, offset in meta["tensors"]:
            nbytes = dtype.itemsize * int(torch.Size(shape).numel())
            pairs.append((name, buffer[offset : offset + nbytes].view(dtype).view(shape)))
        return pairs

    def _open(self, descriptor: dict) -> tuple[torch.Tensor, Any]:
        helpers = verl_transfer_helpers()
        if descriptor["kind"] == CUDA_IPC:
            index = self.device.index if self.device.type == "cuda" else None
            return helpers.rebuild_ipc(descriptor["handle"], index), None
        buffer, shm = helpers.rebuild_shared_memory(descriptor["name"], descriptor["size"], dtype=torch.uint8)
        if shm.name not in _CREATED_HERE:
            _untrack(shm)
        return buffer, shm

    def done_with(self, key: str) -> None:
        """Drop one segment (the sender frees it when the call returns)."""
        buffer, shm = self._segments.pop(key, (None, None))
        del buffer
        if shm is not None:
            self._close_or_linger(shm)

    def _close_or_linger(self, shm: Any) -> None:
        try:
            shm.close()
        except BufferError:  # a view is still referenced (e.g. by an error's traceback): retry later
            self._lingering.append(shm)

    def close(self) -> None:
        for key in list(self._segments):
            self.done_with(key)
        lingering, self._lingering = self._lingering, []
        for shm in lingering:
            self._close_or_linger(shm)
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()


def _untrack(shm: Any) -> None:
    """Python < 3.13 registers an attached segment with this process's resource tracker, which would unlink the
    sender's segment (and warn) when this process exits; the sender owns and unlinks it."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 - the name the tracker holds
    except (ImportError, AttributeError, KeyError):
        pass
