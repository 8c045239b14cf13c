"""Every test starts on the real device: no VERL_COMPAT_DEVICE leaked from the shell, no cached profile."""

from __future__ import annotations

import pytest

from verl_compat.detect import ENV_VAR, reset_cache


@pytest.fixture(autouse=True)
def _real_device(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    reset_cache()
    yield
    reset_cache()
