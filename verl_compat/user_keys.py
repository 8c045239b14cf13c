"""What the user set explicitly: Hydra command-line overrides and every config file of the user's.

A key the user typed counts as requested even when its value equals upstream's default
(`actor_rollout_ref.rollout.dtype=bfloat16` typed on a P40 is refused; left alone it becomes float32). The
user's files are all of them: the primary config and everything its defaults list, a `+group=option` or a
`# @package` header pulls in, however deep (verl_compat.config_sources); only verl's packaged configs are defaults.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("verl_compat.user_keys")

# Top-level keys of a user's config file that are not verl settings.
_NOT_SETTINGS = frozenset({"defaults", "hydra"})


class RequestedKeys:
    """A set of dotted config keys the user set. `key in requested` is true for the key itself and for any
    parent of a key the user set (setting `...mixed_precision.param_dtype` requests `...mixed_precision`)."""

    def __init__(
        self, keys: Iterable[str] = (), *, known: bool = True, origins: Mapping[str, str] | None = None
    ) -> None:
        self.keys: frozenset[str] = frozenset(k for k in keys if k)
        self.known = known  # False when the source of requests could not be read (everything counts as default)
        self.origins: Mapping[str, str] = dict(origins or {})  # key -> the file (or the command line) that set it

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        prefix = key + "."
        return key in self.keys or any(k.startswith(prefix) for k in self.keys)

    def any(self, keys: Iterable[str]) -> str | None:
        """The first of `keys` the user set, or None."""
        return next((k for k in keys if k in self), None)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.keys))

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"RequestedKeys({sorted(self.keys)!r}, known={self.known})"


def _flatten(value: Any, prefix: str) -> Iterator[str]:
    """Dotted keys of every leaf under `value` (a non-empty mapping is not a leaf; an empty one is)."""
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix


def keys_from_overrides(overrides: Iterable[str]) -> set[str]:
    """Keys set by Hydra overrides: `a.b=1`, `+a.b=1`, `++a.b=1`, `~a.b`, `a.b={c: 1}` (-> a.b and a.b.c)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [o for o in overrides if o and o.strip()]
    keys: set[str] = set()
    if not overrides:
        return keys
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if override.package:  # `group@pkg=opt` writes under pkg
            key = f"{override.package}.{key}" if key else override.package
        if key:
            keys.add(key)
        if key and not override.is_delete():
            keys.update(_flatten(override.value(), key))
    return keys


def keys_from_config_file(path: str | os.PathLike[str]) -> set[str]:
    """Dotted keys a user's own Hydra config file sets (its `defaults` list and `hydra:` block excluded)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if not isinstance(raw, dict):
        return set()
    return {k for name, v in raw.items() if name not in _NOT_SETTINGS for k in _flatten(v, str(name))}


def verl_config_dir() -> Path:
    """verl's own trainer config folder (installed wheel or the materialised editable tree).

    Located through the import system without importing verl (which costs seconds: torch, ray, ...); this is
    the folder `verl.__file__` would give.
    """
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise ImportError("verl is not installed: cannot locate verl/trainer/config")
    return Path(spec.origin).resolve().parent / "trainer" / "config"


def _is_verl_own(path: Path) -> bool:
    try:
        return path.resolve().parent == verl_config_dir()
    except ImportError:  # verl not importable: a user file cannot be verl's own then
        return False


def requested_keys(overrides: Iterable[str] = (), config_file: str | os.PathLike[str] | None = None) -> RequestedKeys:
    """The plain form (tests, doctor): overrides as typed on the command line, plus the user's config file and
    every file it pulls in. `config_file` is skipped when it is verl's own trainer config (ppo_trainer.yaml)."""
    overrides = list(overrides)
    if config_file is None or _is_verl_own(Path(config_file)):
        return RequestedKeys(keys_from_overrides(overrides))
    origins = keys_from_user_config(config_file, overrides)
    return RequestedKeys(origins, origins=origins)


def doctor_searchpath(config_file: str | os.PathLike[str]) -> str:
    """`hydra.searchpath=[...]` for composing a user's file outside main_ppo: its own entries, then verl's configs."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False)
    own = (raw.get("hydra") or {}).get("searchpath") or [] if isinstance(raw, dict) else []
    entries = [*own, f"file://{verl_config_dir()}"]
    return "hydra.searchpath=[" + ",".join(f"'{e}'" for e in entries) + "]"


def keys_from_user_config(config_file: str | os.PathLike[str], overrides: Iterable[str] = ()) -> dict[str, str]:
    """{key: origin} for `config_file` composed with `overrides`, as `main_ppo --config-path/--config-name` would."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from verl_compat.config_sources import user_config_keys

    path = Path(config_file).resolve()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            loader = GlobalHydra.instance().config_loader()
            return user_config_keys(loader, path.stem, [*overrides, doctor_searchpath(path)])
    finally:
        GlobalHydra.instance().clear()


def primary_config_file_from_hydra(hydra_cfg: Any) -> Path | None:
    """The primary config file of a Hydra run: config_name inside the `main` config source, if it is a file."""
    name = hydra_cfg.job.config_name
    if not name:
        return None
    for source in hydra_cfg.runtime.config_sources:
        if source.provider != "main" or source.schema != "file":
            continue
        base = Path(source.path)
        for candidate in (base / name, base / f"{name}.yaml"):
            if candidate.is_file():
                return candidate
    return None


def requested_keys_from_hydra() -> RequestedKeys:
    """Requests of the running Hydra app: its command line and every user config file it composed.

    Outside Hydra: an empty set with known=False (logged once). Should Hydra's defaults-list internals change
    shape, the primary file and the command line still count (with a warning saying what is not read).
    """
    from hydra.core.hydra_config import HydraConfig

    from verl_compat.config_sources import running_app_keys

    if not HydraConfig.initialized():
        log.info("verl-compat: no Hydra run in this process; every setting is treated as defaulted")
        return RequestedKeys(known=False)
    hydra_cfg = HydraConfig.get()
    try:
        origins = running_app_keys()
    except (AttributeError, TypeError, ImportError) as e:  # hydra._internal API moved: degrade, loudly
        log.warning("verl-compat: cannot read Hydra's defaults list (%s); only the primary config file counts", e)
        origins = None
    if origins is not None:
        return RequestedKeys(origins, origins=origins)
    overrides = list(hydra_cfg.overrides.task)
    keys = keys_from_overrides(overrides)
    primary = primary_config_file_from_hydra(hydra_cfg)
    if primary is not None and not _is_verl_own(primary):
        keys |= keys_from_config_file(primary)
    return RequestedKeys(keys)
