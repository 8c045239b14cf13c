"""Golden equality: on sm_80+ verl-compat changes nothing, in the config and in every seam."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_compat import seams
from verl_compat.catalog import get_profile
from verl_compat.policy import compose_ppo_config, resolve_job_config
from verl_compat.profile import DeviceProfile, PackageStatus
from verl_compat.user_keys import requested_keys

USABLE = {
    name: PackageStatus(name, installed=True, version="x", usable=True)
    for name in ("flash_attn", "vllm", "sglang", "triton", "liger_kernel")
}

OVERRIDE_SETS = {
    "grpo-vllm": [
        "actor_rollout_ref.rollout.name=vllm",
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=256",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "trainer.n_gpus_per_node=8",
    ],
    "ppo-gae-sglang": [
        "actor_rollout_ref.rollout.name=sglang",
        "critic.optim.lr=1e-5",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    ],
    "explicit-upstream-values": [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=true",
        "+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
    ],
    "explicit-non-defaults": [
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    ],
}


def ampere(name: str, packages: bool = True) -> DeviceProfile:
    profile = get_profile(name)
    return profile.with_packages(**USABLE) if packages else profile


@pytest.mark.parametrize("name", ["a100", "h100"])
@pytest.mark.parametrize("overrides", list(OVERRIDE_SETS.values()), ids=list(OVERRIDE_SETS))
def test_resolved_config_equals_upstream(name: str, overrides: list[str]) -> None:
    upstream = compose_ppo_config(overrides)
    ours = compose_ppo_config(overrides)
    decisions = resolve_job_config(ours, ampere(name), requested_keys(overrides))
    assert OmegaConf.to_container(ours, resolve=False) == OmegaConf.to_container(upstream, resolve=False)
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(upstream)
    assert all(
        d.reasons[0].startswith("sm_80+")
        for k, d in decisions.items()
        if k.split(".")[0] in {"dtype", "attention", "kernels"} and k != "kernels.flash_ce"
    )


def test_identity_does_not_depend_on_what_is_installed() -> None:
    overrides = ["actor_rollout_ref.rollout.name=vllm"]
    upstream = compose_ppo_config(overrides)
    ours = compose_ppo_config(overrides)
    resolve_job_config(ours, ampere("a100", packages=False), requested_keys([]))  # nothing counted as requested
    assert OmegaConf.to_container(ours, resolve=False) == OmegaConf.to_container(upstream, resolve=False)


@pytest.mark.parametrize("name", ["a100", "h100"])
def test_seams_return_upstream_values(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    profile = ampere(name)
    monkeypatch.setattr(seams, "_profile", lambda: profile)

    class HF:
        _attn_implementation = "flash_attention_2"

    class Model:
        hf_config = HF()
        use_liger = True
        use_fused_kernels = True
        fused_kernel_options = {"impl_backend": "triton"}
        use_remove_padding = True

    assert seams.attn_impl("flash_attention_2") == "flash_attention_2"
    assert seams.attn_impl("flash_attention_2", HF()) == "flash_attention_2"
    assert seams.fsdp_mixed_precision(None) is None
    given = {"param_dtype": "bf16"}
    assert seams.fsdp_mixed_precision(given) is given
    assert seams.torch_compile_ok() is True
    assert seams.use_triton() is True
    assert seams.torch_compile(True) is True and seams.torch_compile(False) is False
    assert seams.flash_ce(True) is True and seams.flash_ce(False) is False
    assert seams.rollout_dtype("bfloat16") == "bfloat16"
    assert seams.rollout_enforce_eager(False) is False
    assert seams.rollout_enforce_eager(True) is True
    model = Model()
    assert seams.resolve_model_config(model) is model
    assert (model.hf_config._attn_implementation, model.use_liger, model.use_fused_kernels) == (
        "flash_attention_2",
        True,
        True,
    )
