"""Ray resource pools on a host without GPUs: CPU-only bundles, and a loud check instead of a silent hang."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verl_compat.cpu.engine import on_cpu_platform


def ray_use_accelerator() -> bool:
    """`RayResourcePool(use_gpu=...)`: False on the CPU platform, so bundles ask Ray for CPUs only."""
    return not on_cpu_platform()


def check_ray_resources(manager: Any) -> None:
    """`ResourcePoolManager.create_resource_pool`'s check once its pools exist: upstream's GPU count check
    (`manager._check_resource_available()`) on a GPU platform, logical CPUs on the CPU platform."""
    if ray_use_accelerator():
        manager._check_resource_available()
        return
    check_ray_cpu_resources(manager.resource_pool_spec, manager.max_colocate_count)


def check_ray_cpu_resources(
    resource_pool_spec: Mapping[str, Sequence[int]],
    max_colocate_count: int,
    available_cpus: float | None = None,
) -> None:
    """Replace upstream's GPU count check on the CPU platform: every worker process gets a bundle of
    `max_colocate_count` logical CPUs; a placement group that cannot be satisfied waits forever, so raise now.

    `available_cpus` defaults to Ray's currently free logical CPUs (the TaskRunner and TransferQueue actors
    already hold theirs when the pools are created).
    """
    needed = sum(count for counts in resource_pool_spec.values() for count in counts) * max_colocate_count
    total = None
    if available_cpus is None:
        import ray

        available_cpus = float(ray.available_resources().get("CPU", 0))
        total = float(ray.cluster_resources().get("CPU", 0))
    if available_cpus < needed:
        from verl_compat.errors import IncompatibleRequestError

        held = f" of Ray's {total:g}" if total is not None else ""
        raise IncompatibleRequestError(
            key="ray_kwargs.ray_init.num_cpus",
            value=total,
            device="the CPU platform",
            reason=(
                f"the worker pools {dict(resource_pool_spec)} need {needed} logical CPUs "
                f"({max_colocate_count} per worker process) but only {available_cpus:g}{held} are free (TransferQueue "
                "and other actors hold the rest); Ray's placement group would wait for them forever"
            ),
            fix=(
                "leave ray_kwargs.ray_init.num_cpus unset so verl-compat sizes it (verl_compat.cpu.size_for_host), "
                f"raise it by at least {needed - available_cpus:g}, or lower trainer.n_gpus_per_node"
            ),
        )
