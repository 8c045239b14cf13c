"""Per-step records of the hf rollout (weight syncs, generation spans, memory) for benchmarks and debugging.

With ``VERL_COMPAT_ROLLOUT_STATS=/path/file.jsonl`` in the environment (Ray workers inherit it) every record is
appended there as one JSON line; otherwise it is logged at DEBUG level.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

STATS_ENV = "VERL_COMPAT_ROLLOUT_STATS"
logger = logging.getLogger("verl_compat.rollout.stats")


def record(kind: str, **fields: Any) -> None:
    row = {"kind": kind, "time": time.time(), "pid": os.getpid(), **fields}
    path = os.environ.get(STATS_ENV)
    if not path:
        logger.debug("%s", row)
        return
    with open(path, "a", encoding="utf-8") as f:  # one short write per line: appends from processes interleave
        f.write(json.dumps(row, default=str) + "\n")


def read(path: str | os.PathLike) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def device_memory(device: Any) -> dict[str, int] | None:
    """This process's allocator view of ``device`` (None on a CPU)."""
    import torch

    if getattr(device, "type", "cpu") != "cuda":
        return None
    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device)}
