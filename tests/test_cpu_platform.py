"""verl-compat's CPU platform in verl's registry, the CPU seams, and sizing the Ray layout to the host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import verl_compat.cpu as cpu
from verl_compat import machine
from verl_compat.cpu import host
from verl_compat.errors import IncompatibleRequestError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_host(monkeypatch: pytest.MonkeyPatch):
    """Forget the cached hardware probe before and after a test that fakes the hardware."""
    host.reset_cache()
    yield monkeypatch
    host.reset_cache()


# -- backend string -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cpu:gloo,cpu:gloo", "gloo"),  # the CPU platform: torch rejects the duplicate device type
        ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),  # GPU hosts: upstream's string untouched
        ("cpu:gloo,npu:hccl", "cpu:gloo,npu:hccl"),
        ("gloo", "gloo"),
        ("cpu:gloo,cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),
    ],
)
def test_dist_backend(given: str, expected: str) -> None:
    assert cpu.dist_backend(given) == expected


def test_dist_backend_refuses_conflicting_backends() -> None:
    with pytest.raises(ValueError, match="two backends"):
        cpu.dist_backend("cpu:gloo,cpu:mpi")


def test_backend_string_is_accepted_by_torch(tmp_path: Path) -> None:
    """What verl builds on the CPU platform initialises a real gloo group (world size 1)."""
    import torch.distributed as dist

    from verl.utils.device import get_device_name, get_nccl_backend

    backend = cpu.dist_backend(f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}")
    assert backend == "gloo"
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group(backend=backend, init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


# -- the platform -----------------------------------------------------------------------------------------------
def test_cpu_platform_is_registered_last_and_selected_here() -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry, _detect_platform_name
    from verl.utils import device

    names = PlatformRegistry.registered_names()
    assert names[-1] == "cpu" and {"nvidia", "huawei", "amd"} <= set(names)
    assert not host.host_has_accelerator()  # this test machine has no GPU
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("VERL_PLATFORM", raising=False)
        mp.delenv("VERL_COMPAT_DEVICE", raising=False)
        assert _detect_platform_name() == "cpu"
    assert device.get_device_name() == "cpu"
    assert device.get_device_id() == "cpu"  # used as a device in .to(...) all over verl
    assert device.get_nccl_backend() == "gloo"
    assert device.get_resource_name() == "CPU"
    assert device.get_device_capability() == (None, None)
    assert device.is_support_ipc() is False


def test_gpu_host_keeps_upstream_detection(fresh_host: pytest.MonkeyPatch) -> None:
    """With an accelerator, the CPU platform declines and verl's own nvidia platform wins as before."""
    from verl.plugin.platform.platform_cuda import PlatformCUDA
    from verl.plugin.platform.platform_manager import _detect_platform_name
    from verl_compat.cpu.platform import PlatformCPU

    fresh_host.delenv("VERL_PLATFORM", raising=False)
    fresh_host.delenv("VERL_COMPAT_DEVICE", raising=False)
    fresh_host.setattr(machine, "_torch_sees_accelerator", lambda: True)
    fresh_host.setattr(PlatformCUDA, "is_platform_available", lambda self, use_smi_check=False: True)
    assert PlatformCPU().is_platform_available(use_smi_check=True) is False
    assert _detect_platform_name() == "nvidia"


def test_gpu_host_seen_only_through_nvidia_smi(fresh_host: pytest.MonkeyPatch) -> None:
    """A CPU-only Ray actor on a GPU node: torch sees no device, nvidia-smi does; the CPU platform declines."""
    fresh_host.delenv("VERL_COMPAT_DEVICE", raising=False)
    fresh_host.setattr(machine, "_torch_sees_accelerator", lambda: False)
    fresh_host.setattr(machine, "_nvidia_smi_works", lambda: True)
    assert host.cpu_platform_wanted() is False


def test_simulated_gpu_profile_keeps_cpu_platform(fresh_host: pytest.MonkeyPatch) -> None:
    """VERL_COMPAT_DEVICE=p40 on a CPU host: the resolvers act as for a P40, tensors still live on the CPU."""
    fresh_host.setenv("VERL_COMPAT_DEVICE", "p40")
    assert host.cpu_platform_wanted() is True
    fresh_host.setattr(machine, "_torch_sees_accelerator", lambda: True)
    host.reset_cache()
    assert host.cpu_platform_wanted() is False  # and on a GPU host, the GPU platform, P40 policy


def test_forced_cpu_sets_verl_platform(fresh_host: pytest.MonkeyPatch) -> None:
    fresh_host.setenv("VERL_COMPAT_DEVICE", "cpu")
    fresh_host.delenv("VERL_PLATFORM", raising=False)
    fresh_host.setattr(machine, "_torch_sees_accelerator", lambda: True)  # even with a GPU
    cpu.register_platform()
    assert os.environ["VERL_PLATFORM"] == "cpu"
    assert host.cpu_platform_wanted() is True


def test_forced_cpu_respects_user_verl_platform(fresh_host: pytest.MonkeyPatch, caplog: Any) -> None:
    fresh_host.setenv("VERL_COMPAT_DEVICE", "cpu")
    fresh_host.setenv("VERL_PLATFORM", "nvidia")
    cpu.register_platform()
    assert os.environ["VERL_PLATFORM"] == "nvidia"
    assert "follows VERL_PLATFORM" in caplog.text


def test_device_module_shim() -> None:
    from verl.utils.device import get_torch_device
    from verl_compat.cpu import device_module

    mod = get_torch_device()
    assert mod is device_module
    assert mod.is_available() is False  # no accelerator to manage: verl skips GPU-only memory calls
    assert mod.current_device() == "cpu" and mod.device_count() == 1
    assert mod.get_device_name() == "CPU"
    assert mod.max_memory_allocated() > 0 and mod.max_memory_reserved() >= mod.memory_reserved() > 0
    free, total = mod.mem_get_info()
    assert 0 < free <= total
    for call in (mod.empty_cache, mod.synchronize, mod.ipc_collect, mod.reset_peak_memory_stats):
        call()
    mod.set_device(0)
    mod.manual_seed(3)
    a = torch.rand(2)
    mod.manual_seed_all(3)
    assert torch.equal(a, torch.rand(2))
    assert mod.Stream is torch.cpu.Stream  # the rest comes from torch.cpu
    with pytest.raises(AttributeError, match="no 'cudart'"):
        _ = mod.cudart


def test_engine_workers_memory_metrics_path() -> None:
    """engine_workers.py:219-220 and profiler/performance.py call these on get_torch_device()."""
    from verl.utils.profiler.performance import _get_current_mem_info

    allocated, reserved, used, total = _get_current_mem_info()
    assert float(total) > 0 and float(used) > 0


def test_constants_ppo_imports() -> None:
    """trainer/constants_ppo.py unpacks get_device_capability() at import (E13)."""
    import verl.trainer.constants_ppo  # noqa: F401


# -- the seams ----------------------------------------------------------------------------------------------------
def test_engine_devices_adds_cpu_once() -> None:
    assert cpu.engine_devices(["cuda", "npu"]) == ["cuda", "npu", "cpu"]
    assert cpu.engine_devices(["cpu"]) == ["cpu"]


def test_fsdp_engines_are_found_for_cpu() -> None:
    from verl.workers.engine import EngineRegistry

    lm = EngineRegistry.get_engine_cls("language_model", "fsdp2")
    value = EngineRegistry.get_engine_cls("value_model", "fsdp2")
    assert lm.__name__ == "FSDPEngineWithLMHead" and value.__name__ == "FSDPEngineWithValueHead"


def test_platform_dependent_seams_on_cpu() -> None:
    assert cpu.on_cpu_platform()
    assert cpu.pin_memory() is False
    assert cpu.ray_use_accelerator() is False


def test_ray_cpu_check_raises_instead_of_hanging() -> None:
    cpu.check_ray_cpu_resources({"global_pool": [1]}, 3, available_cpus=3)
    with pytest.raises(IncompatibleRequestError, match="ray_kwargs.ray_init.num_cpus") as err:
        cpu.check_ray_cpu_resources({"global_pool": [2]}, 3, available_cpus=4)
    assert "need 6 logical CPUs" in str(err.value) and "n_gpus_per_node" in str(err.value)


# -- sizing the Ray / TransferQueue layout to the host ------------------------------------------------------------
@pytest.fixture(scope="module")
def ppo_config() -> Any:
    from hydra import compose, initialize_config_dir

    import verl

    config_dir = Path(verl.__file__).resolve().parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("ppo_trainer", overrides=["trainer.n_gpus_per_node=1"])


@pytest.fixture
def config(ppo_config: Any) -> Any:
    return ppo_config.copy()


def _get(config: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key)


def test_defaults_on_two_cores_shrink_storage_and_raise_logical_cpus(config: Any) -> None:
    result = cpu.size_for_host(config, requested=[], host_cpus=2)
    assert _get(config, "transfer_queue.backend.SimpleStorage.num_data_storage_units") == 1
    # TQ controller 1 + storage 1 + one worker x max_colocate_count 3 + scheduling headroom 1 (measured: 6 works)
    assert _get(config, "ray_kwargs.ray_init.num_cpus") == 6
    assert result.needed == 6 and len(result.changes) == 2


def test_big_host_changes_nothing(config: Any) -> None:
    config.trainer.n_gpus_per_node = 8
    result = cpu.size_for_host(config, requested=[], host_cpus=64)
    assert result.changes == ()
    assert _get(config, "transfer_queue.backend.SimpleStorage.num_data_storage_units") == 8
    assert _get(config, "ray_kwargs.ray_init.num_cpus") is None


def test_requested_num_cpus_too_small_is_an_error(config: Any) -> None:
    config.ray_kwargs.ray_init.num_cpus = 2
    with pytest.raises(IncompatibleRequestError) as err:
        cpu.size_for_host(config, requested=["ray_kwargs.ray_init.num_cpus"], host_cpus=2)
    msg = str(err.value)
    assert "ray_kwargs.ray_init.num_cpus=2" in msg and "this host (2 CPUs)" in msg and "set ray_kwargs" in msg


def test_requested_num_cpus_that_fits_after_shrinking_storage(config: Any) -> None:
    config.ray_kwargs.ray_init.num_cpus = 6
    result = cpu.size_for_host(config, requested=["ray_kwargs.ray_init.num_cpus"], host_cpus=2)
    assert [c.key for c in result.changes] == ["transfer_queue.backend.SimpleStorage.num_data_storage_units"]
    assert _get(config, "ray_kwargs.ray_init.num_cpus") == 6


def test_requested_storage_units_are_kept_and_cpus_raised(config: Any) -> None:
    key = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
    cpu.size_for_host(config, requested=[key], host_cpus=2)
    assert _get(config, key) == 8
    assert _get(config, "ray_kwargs.ray_init.num_cpus") == 1 + 8 + 3 + 1


def test_both_requested_and_too_small_names_both_keys(config: Any) -> None:
    config.ray_kwargs.ray_init.num_cpus = 4
    requested = ["ray_kwargs.ray_init.num_cpus", "transfer_queue.backend.SimpleStorage.num_data_storage_units"]
    with pytest.raises(IncompatibleRequestError, match="lower transfer_queue.backend.SimpleStorage"):
        cpu.size_for_host(config, requested=requested, host_cpus=2)


def test_without_request_record_non_default_values_count_as_set(config: Any) -> None:
    config.ray_kwargs.ray_init.num_cpus = 3
    with pytest.raises(IncompatibleRequestError):
        cpu.size_for_host(config, requested=None, host_cpus=2)


def test_joining_an_existing_cluster_leaves_num_cpus_alone(config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    result = cpu.size_for_host(config, requested=[], host_cpus=2)
    assert _get(config, "ray_kwargs.ray_init.num_cpus") is None
    assert [c.key for c in result.changes] == ["transfer_queue.backend.SimpleStorage.num_data_storage_units"]


# -- a fresh process ------------------------------------------------------------------------------------------
def test_fresh_process_with_simulated_p40_runs_on_cpu_platform() -> None:
    """`import verl` activates verl-compat before verl detects its platform; the simulated profile only steers
    the resolvers."""
    code = (
        "import verl\n"
        "from verl.utils.device import get_device_name, get_torch_device\n"
        "from verl_compat import detect\n"
        "print(get_device_name(), get_torch_device().__name__, detect().name)\n"
    )
    env = {**os.environ, "VERL_COMPAT_DEVICE": "p40", "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    env.pop("VERL_PLATFORM", None)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=True
    )
    assert out.stdout.split()[-3:] == ["cpu", "verl_compat.cpu.device_module", "p40"], out.stderr[-2000:]


def test_check_ray_resources_keeps_upstreams_check_on_gpu_platforms(monkeypatch: pytest.MonkeyPatch) -> None:
    """patches/0003: the one call replaces upstream's call; on a GPU platform it is upstream's check again."""
    from verl_compat.cpu import ray_pools

    calls: list[Any] = []

    class Manager:
        resource_pool_spec = {"global_pool": [2]}
        max_colocate_count = 3

        def _check_resource_available(self) -> None:
            calls.append("upstream")

    monkeypatch.setattr(ray_pools, "check_ray_cpu_resources", lambda spec, n: calls.append(("cpu", spec, n)))
    monkeypatch.setattr(ray_pools, "ray_use_accelerator", lambda: True)
    cpu.check_ray_resources(Manager())
    monkeypatch.setattr(ray_pools, "ray_use_accelerator", lambda: False)
    cpu.check_ray_resources(Manager())
    assert calls == ["upstream", ("cpu", {"global_pool": [2]}, 3)]
