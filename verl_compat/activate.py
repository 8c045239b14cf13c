"""Run once in every process that imports verl (seam: patches/0001 in verl/__init__.py).

Must import only lightweight modules: verl is half-initialised when this runs (only `verl/__init__.py`'s first
lines have run). It registers verl-compat's CPU platform before verl first detects its platform; the platform is
selected only where the host has no accelerator or VERL_COMPAT_DEVICE=cpu (verl_compat.cpu.host). Failures
propagate: a silently missing platform would bring back verl's "fall back to nvidia" on CPU hosts.
"""

from __future__ import annotations

import logging

log = logging.getLogger("verl_compat")
_done = False


def activate() -> None:
    global _done
    if _done:
        return
    _done = True
    import verl_compat.cpu

    verl_compat.cpu.register_platform()
    log.debug("verl-compat active")


activate()
