"""The job policy over verl's real ppo_trainer config: writes per device, explicit requests refused at start-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_compat.catalog import get_profile
from verl_compat.errors import IncompatibleRequestError
from verl_compat.policy import compose_ppo_config, default_policy, resolve_job_config
from verl_compat.profile import DeviceProfile, PackageStatus
from verl_compat.user_keys import requested_keys

FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
FP16 = {"param_dtype": "fp16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
FSDP = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")
MODELS = ("actor_rollout_ref.model", "critic.model")


def resolved(profile: DeviceProfile | str, overrides: list[str] | None = None):
    profile = get_profile(profile) if isinstance(profile, str) else profile
    overrides = overrides or []
    config = compose_ppo_config(overrides)
    decisions = resolve_job_config(config, profile, requested_keys(overrides))
    return config, decisions


def sel(config, key: str):
    value = OmegaConf.select(config, key, throw_on_missing=False)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def test_p40_writes_the_fp32_sdpa_hf_policy() -> None:
    config, decisions = resolved("p40")
    for fsdp in FSDP:
        assert sel(config, f"{fsdp}.mixed_precision") == FP32
        assert sel(config, f"{fsdp}.use_torch_compile") is False
        assert sel(config, f"{fsdp}.model_dtype") == "fp32"
    for model in MODELS:
        assert sel(config, f"{model}.override_config.attn_implementation") == "sdpa_varlen"
        assert sel(config, f"{model}.use_remove_padding") is True  # packed through torch's varlen kernel
    assert sel(config, "actor_rollout_ref.actor.use_remove_padding") is True  # interpolated from the model
    assert sel(config, "actor_rollout_ref.rollout.name") == "hf"
    assert sel(config, "actor_rollout_ref.rollout.dtype") == "float32"
    assert sel(config, "actor_rollout_ref.rollout.tensor_model_parallel_size") == 1
    assert sel(config, "trainer.device") == "cuda"
    assert decisions["dtype.train"].value == "fp32" and decisions["dtype.train"].defaulted


def test_v100_fp16_with_fp32_master_and_reduce() -> None:
    config, _ = resolved("v100")
    for fsdp in FSDP:
        assert sel(config, f"{fsdp}.mixed_precision") == FP16
        assert sel(config, f"{fsdp}.model_dtype") == "fp32"
    assert sel(config, "actor_rollout_ref.rollout.dtype") == "float16"


def test_explicit_partial_mixed_precision_is_kept_and_completed() -> None:
    config, decisions = resolved("v100", ["+critic.fsdp.mixed_precision.param_dtype=fp32"])
    assert sel(config, "critic.fsdp.mixed_precision") == FP32
    assert not decisions["dtype.train.critic"].defaulted
    assert sel(config, "actor_rollout_ref.actor.fsdp_config.mixed_precision") == FP16


def test_cpu_run() -> None:
    config, _ = resolved("cpu")
    assert sel(config, "trainer.device") == "cpu"
    assert sel(config, "actor_rollout_ref.actor.strategy") == "fsdp2"
    assert sel(config, "actor_rollout_ref.ref.strategy") == "fsdp2"  # interpolates the actor's
    assert sel(config, "critic.strategy") == "fsdp2"
    assert sel(config, "actor_rollout_ref.rollout.enforce_eager") is True
    assert sel(config, "actor_rollout_ref.actor.fsdp_config.mixed_precision") == FP32


def test_resolved_config_still_builds_verls_dataclasses() -> None:
    from verl.utils.config import omega_conf_to_dataclass

    config, _ = resolved(
        "v100", ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    )
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.fsdp_config.mixed_precision["param_dtype"] == "fp16"
    assert actor.fsdp_config.use_torch_compile is False
    critic_engine = omega_conf_to_dataclass(config.critic.fsdp)
    assert critic_engine.mixed_precision == FP16


def test_explicit_values_are_kept_when_the_device_can_run_them() -> None:
    config, decisions = resolved(
        "v100",
        [
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=true",
            "actor_rollout_ref.model.use_remove_padding=true",
        ],
    )
    assert sel(config, "actor_rollout_ref.actor.fsdp_config.use_torch_compile") is True
    assert sel(config, "actor_rollout_ref.ref.fsdp_config.use_torch_compile") is False
    assert sel(config, "actor_rollout_ref.model.use_remove_padding") is True
    assert not decisions["kernels.torch_compile"].defaulted


# At least 8 distinct impossible explicit requests: each names the key, the device and a fix --------------------
IMPOSSIBLE = [
    (
        "p40",
        ["actor_rollout_ref.rollout.dtype=bfloat16"],
        "actor_rollout_ref.rollout.dtype",
        "device has 6.1",
        "actor_rollout_ref.rollout.dtype=float32",
    ),
    (
        "v100",
        ["+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"],
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        "device has 7.0",
        "param_dtype=fp16",
    ),
    (
        "t4",
        ["+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2"],
        "actor_rollout_ref.model.override_config.attn_implementation",
        "device has 7.5",
        "attn_implementation=sdpa",
    ),
    (
        "p40",
        ["actor_rollout_ref.rollout.name=vllm"],
        "actor_rollout_ref.rollout.name",
        "device has 6.1",
        "rollout.name=hf",
    ),
    (
        "cpu",
        ["actor_rollout_ref.rollout.name=vllm"],
        "actor_rollout_ref.rollout.name",
        "device is a CPU",
        "rollout.name=hf",
    ),
    (
        "v100",
        ["actor_rollout_ref.rollout.name=sglang"],
        "actor_rollout_ref.rollout.name",
        "compute capability >= 7.5",
        "rollout.name=hf",
    ),
    (
        "p40",
        ["actor_rollout_ref.actor.fsdp_config.use_torch_compile=true"],
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
        "Triton",
        "use_torch_compile=false",
    ),
    (
        "p40",
        ["actor_rollout_ref.actor.use_torch_compile=true"],
        "actor_rollout_ref.actor.use_torch_compile",
        "Triton",
        "use_torch_compile=false",
    ),
    (
        "p40",
        [
            "actor_rollout_ref.model.use_fused_kernels=true",
            "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
        ],
        "actor_rollout_ref.model.fused_kernel_options.impl_backend",
        "device has 6.1",
        "impl_backend=torch",
    ),
    (
        "p40",
        ["actor_rollout_ref.model.use_liger=true"],
        "actor_rollout_ref.model.use_liger",
        "device has 6.1",
        "use_liger=false",
    ),
    ("cpu", ["critic.model.use_liger=true"], "critic.model.use_liger", "device is a CPU", "use_liger=false"),
    (
        "cpu",
        ["+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16"],
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        "CUDA GPU",
        "param_dtype=fp32",
    ),
    (
        "p40",
        ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "no tensor parallelism",
        "tensor_model_parallel_size=1",
    ),
    (
        "t4",
        ["actor_rollout_ref.rollout.checkpoint_engine.backend=delta_sharded"],
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "device has 7.5",
        "backend=naive",
    ),
    ("cpu", ["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy", "FSDP1", "strategy=fsdp2"),
    (
        "p100",
        ["actor_rollout_ref.ref.fsdp_config.model_dtype=bf16"],
        "actor_rollout_ref.ref.fsdp_config.model_dtype",
        "device has 6.0",
        "model_dtype=fp32",
    ),
]


@pytest.mark.parametrize(
    ("profile", "overrides", "key", "reason", "fix"),
    IMPOSSIBLE,
    ids=[f"{c[0]}:{c[2].rsplit('.', 1)[-1]}" for c in IMPOSSIBLE],
)
def test_impossible_explicit_requests_fail_at_startup(profile, overrides, key, reason, fix) -> None:
    config = compose_ppo_config(overrides)
    before = OmegaConf.to_container(config)
    with pytest.raises(IncompatibleRequestError) as e:
        resolve_job_config(config, get_profile(profile), requested_keys(overrides))
    err = e.value
    assert err.key == key
    assert profile in err.device
    assert reason in err.reason
    assert fix in err.fix
    text = str(err)
    assert key in text and profile in text and "Fix:" in text
    assert OmegaConf.to_container(config) == before  # nothing written when a request is refused


def test_typing_the_default_counts_as_a_request() -> None:
    _, decisions = resolved("p40")
    assert decisions["dtype.rollout"].value == "float32"  # left alone: resolved
    with pytest.raises(IncompatibleRequestError):
        resolved("p40", ["actor_rollout_ref.rollout.dtype=bfloat16"])  # typed: refused


def test_torch_without_the_device_arch_fails_only_on_a_real_device() -> None:
    base = dataclasses.replace(
        get_profile("p40"),
        torch_version="2.13.0+cu130",
        torch_cuda_version="13.0",
        torch_arch_list=("sm_75", "sm_80", "sm_90"),
        torch_covers_device=False,
    )
    _, decisions = resolved(base)  # simulated: recorded, not raised
    assert "no kernels for sm_61" in decisions["torch"].reasons[0]
    real = dataclasses.replace(base, simulated=False)
    with pytest.raises(IncompatibleRequestError) as e:
        resolved(real)
    assert e.value.key == "torch"
    assert "sm_61" in e.value.reason and "cu126" in e.value.fix
    # a real sm_80+ card without kernels runs nothing, upstream included: refused at start-up too
    a100 = dataclasses.replace(
        get_profile("a100"), simulated=False, torch_version="2.13.0+cpu", torch_covers_device=False
    )
    with pytest.raises(IncompatibleRequestError, match="sm_80"):
        resolved(a100)


def test_default_policy_for_doctor_p40_and_a100() -> None:
    p40 = default_policy(get_profile("p40"), [], None)
    assert [p40[k].value for k in ("dtype.train", "dtype.master", "dtype.rollout")] == ["fp32", "fp32", "float32"]
    assert p40["attention"].value != "flash_attention_2"
    assert p40["kernels.torch_compile"].value is False
    assert p40["rollout.engine"].value != "vllm"
    assert set(p40["attention"].to_dict()) >= {"value", "defaulted", "reasons"}

    a100 = get_profile("a100").with_packages(
        vllm=PackageStatus("vllm", True, "0.24.0", True), flash_attn=PackageStatus("flash_attn", True, "2.8.3", True)
    )
    up = default_policy(a100, [], None)
    assert [up[k].value for k in ("dtype.train", "dtype.master", "dtype.rollout")] == ["bf16", "fp32", "bfloat16"]
    assert up["attention"].value == "flash_attention_2"
    assert up["kernels.torch_compile"].value is True
    assert up["rollout.engine"].value == "vllm"
    assert up["kernels.flash_ce"].value is True


def test_default_policy_with_a_user_config_file(tmp_path: Path) -> None:
    user = tmp_path / "p40_run.yaml"
    user.write_text("defaults:\n  - ppo_trainer\n  - _self_\nactor_rollout_ref:\n  rollout:\n    dtype: bfloat16\n")
    with pytest.raises(IncompatibleRequestError, match="actor_rollout_ref.rollout.dtype"):
        default_policy(get_profile("p40"), [], str(user))
    user.write_text("defaults:\n  - ppo_trainer\n  - _self_\nactor_rollout_ref:\n  rollout:\n    dtype: float16\n")
    decisions = default_policy(get_profile("v100"), [], str(user))
    assert decisions["dtype.rollout"].value == "float16" and not decisions["dtype.rollout"].defaulted
