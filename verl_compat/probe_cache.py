"""Slow package probes kept on disk, keyed by the files they depend on, so a job probes once per install.

Why: the xformers check (`packages._xformers_cpp_ops`) loads xformers' C++ ops beside torch in a fresh
interpreter, 10-13 s on the H100 machine's host. Every process of a verl job detects its device (the driver, the
TaskRunner, the trainer worker, the rollout server), so on sm_75 and newer with xformers installed each one paid
it, one after another on the start-up's critical path (`benchmarks/results/t4_h100_ppo_head_to_head.json`,
`raw.startup_trace`: `resolve_config`, `_init_tokenizer`, `TrainingWorker.__init__` and `HFServer.configure`
10-13 s each under `t4`, 2 s or less under `p40`, where the probe does not run).

The key names what the answer depends on (interpreter, versions, the binaries' size and mtime, the library path);
a changed install misses the cache and probes again, and a failed answer names its file, so a fix made elsewhere
(a driver) is checked again by deleting it. It lives in verl-compat's home (``verl_compat.paths``), under
``probes/``; where that cannot be written the probe simply runs every time.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_compat import paths

logger = logging.getLogger("verl_compat.probe_cache")


def path(name: str) -> Path:
    """The file that keeps probe `name`'s answer."""
    return paths.home() / "probes" / f"{name}.json"


def file_stamps(files: list[Path]) -> list[list[Any]]:
    """[path, size, mtime_ns] per existing file: a reinstalled binary changes at least one of them."""
    out = []
    for p in sorted(files):
        try:
            st = p.stat()
        except OSError:
            continue
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def cached(name: str, key: dict[str, Any], probe: Callable[[], tuple[list[str], bool]]) -> list[str]:
    """`probe()`'s reasons for `key`, from the cache when it holds this key; `probe` returns (reasons, keep) and
    a result it marks not to keep (a timeout, a failure to start the check) is not written."""
    file = path(name)
    try:
        held = json.loads(file.read_text())
        if held.get("key") == key:
            return [str(r) for r in held["reasons"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    reasons, keep = probe()
    if keep:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{name}-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "reasons": reasons}, f)
            os.replace(tmp, file)  # atomic: processes probing at once never read half a file
        except OSError:
            logger.debug("could not write the probe cache %s", file, exc_info=True)
    return reasons
