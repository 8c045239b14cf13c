"""Fit the Ray / TransferQueue actor layout of a verl run to this host's CPU count (cpu-feasibility blocker 2).

Ray reserves logical CPUs for placement groups and waits forever for a group it cannot place, so an oversized
layout is a silent hang, not an error. Upstream's defaults need 1 TransferQueue controller + 8 storage units
(1 CPU each, `transfer_queue/storage/simple_storage.py`) + `max_colocate_count` (3) CPUs per worker process
(`single_controller/ray/base.py`) + one free CPU to place the default actors (TaskRunner, agent-loop and
reward-loop workers need 1 CPU to be scheduled, 0 to run). On 2 cores that never fits.

Policy (requested vs defaulted, as for every verl-compat decision):
- storage units left at the default shrink to what the host's CPUs leave over (at least 1);
- `ray_kwargs.ray_init.num_cpus` left unset becomes the layout's need when the host has fewer CPUs (logical CPUs
  are Ray's bookkeeping, not pinning: the processes share the cores);
- a value the user set that cannot fit raises `IncompatibleRequestError` naming the key, the count and the fix.
On a host with enough cores nothing changes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from verl_compat.errors import IncompatibleRequestError

log = logging.getLogger("verl_compat.cpu")

NUM_CPUS_KEY = "ray_kwargs.ray_init.num_cpus"
STORAGE_UNITS_KEY = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
UPSTREAM_STORAGE_UNITS = 8  # verl/trainer/config/transfer_queue/transfer_queue.yaml
MAX_COLOCATE_COUNT = 3  # ResourcePoolManager default: CPUs per worker-process bundle
TQ_CONTROLLER_CPUS = 1  # transfer_queue/controller.py: @ray.remote(num_cpus=1)
SCHEDULING_HEADROOM_CPUS = 1  # default actors need one free CPU to be placed


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any
    why: str


@dataclass(frozen=True)
class HostSizing:
    """What `size_for_host` found and changed (also logged, one INFO line per change)."""

    host_cpus: int
    capacity: int  # logical CPUs Ray will have
    demand: dict[str, int]  # what needs logical CPUs, by item
    changes: tuple[Change, ...] = field(default=())

    @property
    def needed(self) -> int:
        return sum(self.demand.values())


def ray_default_cpus() -> int:
    """Logical CPUs `ray.init()` registers when num_cpus is unset (Ray honours cgroup CPU quotas)."""
    try:
        from ray._private.utils import get_num_cpus  # private but stable since Ray 1.x; same number Ray uses

        return int(get_num_cpus())
    except (ImportError, AttributeError):
        from verl_compat.detect import host

        return host().cpu_count or 1


def _select(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    value = OmegaConf.select(config, key, default=default)
    return default if value is None else value


def _requested(requested: Any) -> Any:
    from verl_compat.user_keys import RequestedKeys

    if requested is None or isinstance(requested, RequestedKeys):
        return requested
    return RequestedKeys(list(requested) if isinstance(requested, Iterable) else [])


def _is_requested(key: str, value: Any, requested: Any, upstream: Any) -> bool:
    """Without a record of what the user typed, a value that differs from upstream's default counts as set."""
    if requested is None:
        return value != upstream
    return bool(requested.known) and key in requested


def worker_processes(config: Any) -> int:
    """Worker processes in the resource pools (one bundle each): the trainer pool plus separate reward/teacher pools."""
    from verl_compat.config_keys import trainer_gpus

    n = trainer_gpus(config)
    if _select(config, "reward.reward_model.enable", False) and _select(
        config, "reward.reward_model.enable_resource_pool", False
    ):
        n += int(_select(config, "reward.reward_model.n_gpus_per_node", 0)) * int(
            _select(config, "reward.reward_model.nnodes", 0)
        )
    if _select(config, "distillation.enabled", False) and _select(config, "distillation.nnodes", 0):
        n += int(_select(config, "distillation.n_gpus_per_node", 0)) * int(_select(config, "distillation.nnodes", 0))
    return n


def cpu_demand(config: Any, storage_units: int) -> dict[str, int]:
    """Logical CPUs the run's actors hold, by item."""
    demand: dict[str, int] = {}
    if _select(config, "trainer.use_v1", True):  # only the v1 trainer starts TransferQueue
        demand["TransferQueue controller"] = TQ_CONTROLLER_CPUS
        if _select(config, "transfer_queue.backend.storage_backend", "SimpleStorage") == "SimpleStorage":
            demand["TransferQueue storage units"] = storage_units
    demand["worker pools"] = worker_processes(config) * MAX_COLOCATE_COUNT
    if _select(config, "reward.reward_manager.name", "naive") == "remote":
        # each reward-loop worker's RemoteRewardManager starts reward.num_workers RewardComputeWorker(num_cpus=1)
        workers = int(_select(config, "reward.num_workers", 1))
        demand["remote reward workers"] = workers * workers
    demand["scheduling headroom"] = SCHEDULING_HEADROOM_CPUS
    return demand


def size_for_host(config: Any, requested: Any = None, host_cpus: int | None = None) -> HostSizing:
    """Rewrite `config` in place so the run's Ray layout fits this host; raise where a user setting cannot fit.

    `requested`: the keys the user set (`verl_compat.user_keys.RequestedKeys`, or any iterable of dotted keys);
    None means "unknown": values equal to upstream's defaults count as defaulted. Call it on the driver before
    `ray.init` (verl's `run_ppo`), e.g. from `verl_compat.seams.resolve_config`.
    """
    requested = _requested(requested)
    host = host_cpus if host_cpus is not None else ray_default_cpus()
    changes: list[Change] = []

    num_cpus = _select(config, NUM_CPUS_KEY)
    num_cpus_set = num_cpus is not None and _is_requested(NUM_CPUS_KEY, num_cpus, requested, None)
    joins_cluster = _select(config, "ray_kwargs.ray_init.address") is not None or bool(os.environ.get("RAY_ADDRESS"))
    capacity = int(num_cpus) if num_cpus is not None else host

    storage = int(_select(config, STORAGE_UNITS_KEY, UPSTREAM_STORAGE_UNITS))
    storage_set = _is_requested(STORAGE_UNITS_KEY, storage, requested, UPSTREAM_STORAGE_UNITS)
    demand = cpu_demand(config, storage)
    tq_storage = "TransferQueue storage units" in demand

    if tq_storage and not storage_set and sum(demand.values()) > capacity:
        others = sum(demand.values()) - storage
        fitted = max(1, min(storage, capacity - others))
        if fitted != storage:
            changes.append(Change(STORAGE_UNITS_KEY, storage, fitted, f"{capacity} logical CPUs for Ray"))
            storage = fitted
            demand = cpu_demand(config, storage)

    needed = sum(demand.values())
    if needed > capacity and not joins_cluster:
        if num_cpus_set:
            raise _too_small(num_cpus, host, demand, storage_set)
        changes.append(
            Change(NUM_CPUS_KEY, num_cpus, needed, f"the run's actors hold {needed} logical CPUs, host has {host}")
        )
        capacity = needed

    for change in changes:
        _apply(config, change)
        log.info("verl-compat: %s = %r (was %r): %s", change.key, change.new, change.old, change.why)
    return HostSizing(host_cpus=host, capacity=capacity, demand=demand, changes=tuple(changes))


def _apply(config: Any, change: Change) -> None:
    from omegaconf import OmegaConf, open_dict

    with open_dict(config):
        OmegaConf.update(config, change.key, change.new, merge=False)


def _too_small(num_cpus: Any, host: int, demand: dict[str, int], storage_set: bool) -> IncompatibleRequestError:
    needed = sum(demand.values())
    breakdown = ", ".join(f"{name} {n}" for name, n in demand.items())
    fix = f"set {NUM_CPUS_KEY}={needed} (logical CPUs may exceed the host's cores) or leave it unset"
    if storage_set:
        fix += f", or lower {STORAGE_UNITS_KEY}"
    return IncompatibleRequestError(
        key=NUM_CPUS_KEY,
        value=num_cpus,
        device=f"this host ({host} CPUs)",
        reason=f"the run's Ray actors hold {needed} logical CPUs ({breakdown}); Ray would wait for them forever",
        fix=fix,
    )
