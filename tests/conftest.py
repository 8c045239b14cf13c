"""Every test starts on the real device: no VERL_COMPAT_DEVICE leaked from the shell, no cached profile."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_compat.detect import ENV_VAR, reset_cache


@pytest.fixture(autouse=True)
def _real_device(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    reset_cache()
    yield
    reset_cache()


@pytest.fixture(scope="module")
def single_rank() -> Iterator[None]:
    """The environment a Ray worker of a one-GPU pool gets: rank 0 of 1 (verl's Worker reads it)."""
    import torch
    from engine_harness import free_port

    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }.items():
            mp.setenv(key, value)
        yield
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.fixture
def one_rank(tmp_path) -> Iterator[None]:
    """A gloo process group of world size 1 in this process (FSDP1 on the CPU), unless one exists already."""
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A two-CPU local Ray cluster for one test module; its workers import this checkout."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    repo_root = str(Path(__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH")) if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "RAY_AUTH_MODE": "disabled"}},
    )
    yield
    ray.shutdown()
