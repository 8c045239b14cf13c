"""Where verl-compat keeps its own files: ``VERL_COMPAT_HOME``, else ``~/.cache/verl-compat`` (the quickstart's
converted model and data, the probe cache)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "VERL_COMPAT_HOME"


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "verl-compat").expanduser()
