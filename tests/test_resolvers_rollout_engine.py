"""Rollout engine, tensor parallel, enforce_eager, checkpoint engine; memory and placement report-only ones."""

from __future__ import annotations

import pytest

from verl_compat.catalog import get_profile
from verl_compat.errors import IncompatibleRequestError
from verl_compat.profile import DeviceProfile, PackageStatus
from verl_compat.resolvers import memory, placement, rollout_engine
from verl_compat.resolvers.registry import Request

NAME = "actor_rollout_ref.rollout.name"


def usable(name: str, *pkgs: str) -> DeviceProfile:
    return get_profile(name).with_packages(**{p: PackageStatus(p, True, "1.0", True) for p in pkgs})


def engine(profile: DeviceProfile, value: str | None = None, requested: bool = False):
    return rollout_engine.resolve_engine(Request("rollout.engine", NAME, value, requested, None), profile)


@pytest.mark.parametrize(
    ("name", "pkgs", "expected"),
    [
        ("p40", ("vllm", "sglang"), "hf"),  # cc too old whatever is installed
        ("p100", ("vllm",), "hf"),
        ("v100", (), "hf"),
        ("v100", ("vllm",), "vllm"),  # a vLLM build that has sm_70
        ("t4", ("vllm",), "vllm"),
        ("t4", (), "hf"),
        ("cpu", ("vllm",), "hf"),
        ("a100", ("vllm",), "vllm"),
        ("a100", (), "hf"),
    ],
)
def test_engine_when_unset(name: str, pkgs: tuple[str, ...], expected: str) -> None:
    for unset in (None, "???", "auto"):
        decision = engine(usable(name, *pkgs), unset, requested=unset == "auto")
        assert decision.value == expected and decision.defaulted


def test_named_engine_on_ampere_is_kept() -> None:
    assert engine(usable("a100", "vllm"), "vllm", True).value == "vllm"
    assert engine(usable("h100", "sglang"), "sglang", True).value == "sglang"


@pytest.mark.parametrize(
    ("name", "value", "needle", "alternative"),
    [
        ("p40", "vllm", "vLLM needs compute capability >= 7.0, device has 6.1", "hf"),
        ("cpu", "vllm", "vLLM needs an NVIDIA GPU with compute capability >= 7.0, device is a CPU", "hf"),
        ("v100", "sglang", "SGLang needs compute capability >= 7.5, device has 7.0", "vllm"),  # vLLM is usable here
    ],
)
def test_impossible_engines_raise(name: str, value: str, needle: str, alternative: str) -> None:
    with pytest.raises(IncompatibleRequestError) as e:
        engine(usable(name, "vllm", "sglang"), value, True)
    assert e.value.key == NAME and needle in e.value.reason
    assert f"{NAME}={alternative}" in e.value.fix


def test_tensor_parallel_for_hf() -> None:
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    p40 = get_profile("p40")
    assert (
        rollout_engine.resolve_tensor_parallel(
            Request("rollout.tensor_parallel", key, 2, False, 2, {"engine": "hf"}), p40
        ).value
        == 1
    )
    assert (
        rollout_engine.resolve_tensor_parallel(
            Request("rollout.tensor_parallel", key, 2, False, 2, {"engine": "vllm"}), p40
        ).value
        == 2
    )
    with pytest.raises(IncompatibleRequestError, match="no tensor parallelism") as e:
        rollout_engine.resolve_tensor_parallel(
            Request("rollout.tensor_parallel", key, 2, True, 2, {"engine": "hf"}), p40
        )
    assert f"set {key}=1" in e.value.fix


def eager(name: str, engine_name: str, value: bool = False, requested: bool = False):
    req = Request(
        "rollout.enforce_eager",
        "actor_rollout_ref.rollout.enforce_eager",
        value,
        requested,
        False,
        {"engine": engine_name},
    )
    return rollout_engine.resolve_enforce_eager(req, get_profile(name))


def test_enforce_eager() -> None:
    assert eager("v100", "vllm").value is True  # Triton/cudagraph path below 7.5
    assert eager("t4", "vllm").value is False
    assert eager("p40", "hf").value is False  # hf may capture CUDA graphs without Triton
    assert eager("cpu", "hf").value is True
    assert eager("a100", "vllm").value is False
    with pytest.raises(IncompatibleRequestError, match="device has 7.0"):
        eager("v100", "vllm", False, True)


def test_delta_checkpoint_engine_refused_pre_ampere() -> None:
    key = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    for name in ("v100", "t4", "p40"):
        with pytest.raises(IncompatibleRequestError) as e:
            rollout_engine.resolve_checkpoint_engine(
                Request("rollout.checkpoint_engine", key, "delta_sharded", True, "naive"), get_profile(name)
            )
        assert e.value.key == key and "compute capability >= 8.0" in e.value.reason and "=naive" in e.value.fix
    ok = rollout_engine.resolve_checkpoint_engine(
        Request("rollout.checkpoint_engine", key, "delta_sharded", True, "naive"), get_profile("a100")
    )
    assert ok.value == "delta_sharded"


def test_memory_decisions_keep_values_with_a_reason() -> None:
    req = Request(
        "memory.gpu_memory_utilization",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        0.5,
        False,
        0.5,
        {"engine": "hf"},
    )
    decision = memory.resolve_gpu_memory_utilization(req, get_profile("p40"))
    assert decision.value == 0.5 and "does not read" in decision.reasons[0]


def test_cpu_placement() -> None:
    cpu = get_profile("cpu")
    assert (
        placement.resolve_device(Request("platform.device", "trainer.device", "cuda", False, "cuda"), cpu).value
        == "cpu"
    )
    assert (
        placement.resolve_strategy(Request("platform.strategy", "critic.strategy", "fsdp", False, "fsdp"), cpu).value
        == "fsdp2"
    )
    with pytest.raises(IncompatibleRequestError, match="FSDP1"):
        placement.resolve_strategy(Request("platform.strategy", "critic.strategy", "fsdp", True, "fsdp"), cpu)
    p40 = get_profile("p40")
    assert (
        placement.resolve_device(Request("platform.device", "trainer.device", "cuda", False, "cuda"), p40).value
        == "cuda"
    )
