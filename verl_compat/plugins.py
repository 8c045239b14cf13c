"""Plugins: entry points in the group `verl_compat.plugins`, each a callable that registers resolver options.

    [project.entry-points."verl_compat.plugins"]
    my_attention = "my_pkg.compat:register"      # def register(registry: Registry) -> None

`VERL_COMPAT_PLUGINS` selects which ones load (vLLM's VLLM_PLUGINS pattern):
- unset or empty: every installed plugin loads (installing a plugin is the opt-in);
- "none": none loads;
- "a,b": only the named entry points load (a name that is not installed is recorded as an error).

Loading is idempotent per process (it runs in the driver and in every Ray worker): a plugin loads once, and
`Registry.register` ignores a repeated (source, value). Failures are recorded, never swallowed: `plugin_status()`
returns them for the doctor, and each is logged at WARNING.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
import traceback
from dataclasses import dataclass

from verl_compat.resolvers.registry import REGISTRY, Registry

GROUP = "verl_compat.plugins"
ENV_VAR = "VERL_COMPAT_PLUGINS"

log = logging.getLogger("verl_compat.plugins")


@dataclass(frozen=True)
class PluginStatus:
    name: str
    value: str  # "module:attr" of the entry point ("" when the allowlist names a missing plugin)
    loaded: bool
    error: str = ""  # "ExceptionType: message" when loading or registering failed
    detail: str = ""  # traceback for the doctor's --verbose / bug reports

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "value": self.value, "loaded": self.loaded, "error": self.error}


_lock = threading.Lock()
_status: dict[str, PluginStatus] = {}
_loaded_registries: set[int] = set()


def allowlist() -> set[str] | None:
    """None = load all; empty set = load none; else the names to load."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    if raw.lower() == "none":
        return set()
    return {name.strip() for name in raw.split(",") if name.strip()}


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=GROUP))


def load_plugins(registry: Registry | None = None, *, force: bool = False) -> list[PluginStatus]:
    """Load the allowed plugins into `registry` (the global one by default), once per process and registry."""
    registry = registry or REGISTRY
    with _lock:
        if id(registry) in _loaded_registries and not force:
            return list(_status.values())
        _loaded_registries.add(id(registry))
        allowed = allowlist()
        found = {ep.name: ep for ep in _entry_points()}
        for name, ep in found.items():
            if allowed is not None and name not in allowed:
                continue
            _status[name] = _load_one(ep, registry)
        for name in sorted((allowed or set()) - set(found)):
            _status[name] = PluginStatus(name, "", False, f"not installed: no entry point '{name}' in group {GROUP}")
            log.warning("verl-compat plugin %s: %s", name, _status[name].error)
        return list(_status.values())


def _load_one(ep: importlib.metadata.EntryPoint, registry: Registry) -> PluginStatus:
    try:
        register = ep.load()
        register(registry)
    except Exception as e:  # a broken plugin must not stop training; it is recorded and shown by the doctor
        status = PluginStatus(ep.name, ep.value, False, f"{type(e).__name__}: {e}", traceback.format_exc())
        log.warning("verl-compat plugin %s (%s) failed to load: %s", ep.name, ep.value, status.error)
        return status
    log.info("verl-compat plugin %s (%s) loaded", ep.name, ep.value)
    return PluginStatus(ep.name, ep.value, True)


def plugin_status() -> list[PluginStatus]:
    """What load_plugins did in this process (empty before the first call)."""
    with _lock:
        return list(_status.values())


def reset_for_tests() -> None:
    with _lock:
        _status.clear()
        _loaded_registries.clear()
