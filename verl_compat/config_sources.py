"""Which values of a composed Hydra config came from the user, and from where.

"Requested" is everything the user wrote: the command line in every Hydra form (`a.b=1`, `+a.b=1`, `++a.b=1`,
`~a.b`, `a.b={c: 1}`) and every config file the user's config pulls in, however deep: its `defaults:` list, a
group selected on the command line (`+experiment=p40`), `# @package _global_` or `@pkg` placement. Only verl's
own packaged configs (and Hydra's) are defaults.

Hydra's defaults list says which file was merged at which package, and its config repository says which search
path each file came from, so this module asks Hydra rather than re-reading YAML: the same tree Hydra composed.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

log = logging.getLogger("verl_compat.config_sources")

COMMAND_LINE = "the command line"
_VERL_PACKAGE = "verl.trainer.config"


def _flatten(value: Any, prefix: str) -> Iterator[str]:
    """Dotted keys of every leaf under `value` (a non-empty mapping is not a leaf; an empty one is)."""
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix


@cache
def _verl_config_dirs() -> frozenset[Path]:
    """verl's packaged config folder, however it is reached (pkg://verl.trainer.config or a file:// path)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        return frozenset()
    return frozenset({(Path(spec.origin).resolve().parent / "trainer" / "config")})


def _source_dir(source_path: str) -> Path | None:
    """The folder behind a Hydra search-path entry (`file://...` or `pkg://a.b`); None for other schemes."""
    if source_path.startswith("file://"):
        return Path(source_path.removeprefix("file://")).resolve()
    if source_path.startswith("pkg://"):
        name = source_path.removeprefix("pkg://").strip("/").replace("/", ".")
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return None


def is_default_source(provider: str, source_path: str) -> bool:
    """Configs that are defaults, not the user's: verl's packaged configs and Hydra's own."""
    if provider == "hydra" or source_path.startswith("pkg://hydra."):
        return True
    folder = _source_dir(source_path)
    return folder is not None and folder in _verl_config_dirs()


def command_line_keys(overrides: Iterable[str], is_group: Any = None) -> dict[str, str]:
    """Keys the command line sets. A config-group selection (`+experiment=p40`, `actor@x=dp_actor`) sets no key
    itself: the selected file's keys come from the defaults list (`user_config_keys`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [o for o in overrides if o and o.strip()]
    keys: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(lines) if lines else []:
        if override.is_hydra_override():
            continue
        if is_group is not None and not override.is_delete() and is_group(override.key_or_group):
            continue
        key = override.key_or_group
        if override.package:  # `key@pkg=value` writes under pkg
            key = f"{override.package}.{key}" if key else override.package
        if not key:
            continue
        keys[key] = COMMAND_LINE
        if not override.is_delete():
            keys.update(dict.fromkeys(_flatten(override.value(), key), COMMAND_LINE))
    return keys


def user_config_keys(loader: Any, config_name: str | None, overrides: Iterable[str]) -> dict[str, str]:
    """{dotted key: where the user set it} for a composition of `config_name` with `overrides` by `loader`
    (Hydra's ConfigLoader of the running app, or of an `initialize_config_dir` block)."""
    from hydra._internal.defaults_list import create_defaults_list

    overrides = list(overrides)
    parsed, repo = loader._parse_overrides_and_create_caching_repo(config_name, overrides)
    defaults = create_defaults_list(
        repo=repo, config_name=config_name, overrides_list=parsed, prepend_hydra=False, skip_missing=True
    )
    keys: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for default in defaults.defaults:
        if default.config_path is None or (default.config_path, default.package or "") in seen:
            continue
        seen.add((default.config_path, default.package or ""))
        loaded = repo.load_config(config_path=default.config_path)
        if loaded is None or is_default_source(loaded.provider, loaded.path):
            continue
        from omegaconf import OmegaConf

        content = OmegaConf.to_container(loaded.config, resolve=False)
        if not isinstance(content, dict):
            continue
        package = default.package or ""
        if not package:
            content.pop("hydra", None)  # Hydra's own settings (searchpath, run dir) are not verl settings
        content.pop("defaults", None)
        origin = _file_of(loaded.path, default.config_path)
        for key in _flatten(content, package):
            keys.setdefault(key, origin)
    keys.update(command_line_keys(overrides, repo.group_exists))  # the command line is applied last
    return keys


def _file_of(source_path: str, config_path: str) -> str:
    folder = _source_dir(source_path)
    name = config_path if config_path.endswith((".yaml", ".yml")) else f"{config_path}.yaml"
    return str(folder / name) if folder is not None else f"{source_path}/{name}"


def running_app_keys() -> dict[str, str] | None:
    """The running Hydra app's user keys (None outside a Hydra app)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or not GlobalHydra.instance().is_initialized():
        return None
    hydra_cfg = HydraConfig.get()
    # of Hydra's own overrides only the search path changes which files compose (run dirs, logging do not)
    searchpath = [o for o in hydra_cfg.overrides.hydra if o.lstrip("+").startswith("hydra.searchpath=")]
    overrides = [*searchpath, *hydra_cfg.overrides.task]
    return user_config_keys(GlobalHydra.instance().config_loader(), hydra_cfg.job.config_name, overrides)
