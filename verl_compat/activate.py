"""Run once in every process that imports verl (seam: patches/0001 in verl/__init__.py).

Must import only lightweight modules: verl is half-initialised when this runs.
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
    log.debug("verl-compat active")


activate()
