"""Values valid nowhere are refused at start-up with the valid values and the closest one; every spelling the
key's reader accepts passes (verl_compat.value_checks)."""

from __future__ import annotations

import copy

import huggingface_hub
import pytest
from omegaconf import OmegaConf
from startup_harness import assert_refused, parquet_file, run_main, tiny_model_dir

from verl_compat.detect import reset_cache
from verl_compat.errors import InvalidSettingError
from verl_compat.policy import compose_ppo_config
from verl_compat.quickstart import reward
from verl_compat.value_checks import check_values, checked_keys

MP = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
MODEL = "actor_rollout_ref.model"
ROLLOUT = "actor_rollout_ref.rollout"


@pytest.fixture(scope="module")
def base():
    return compose_ppo_config([f"{ROLLOUT}.name=vllm"])


def _with(base, key: str, value):
    config = copy.deepcopy(base)
    OmegaConf.update(config, key, value, merge=False, force_add=True)
    return config


def test_verl_defaults_pass(base):
    check_values(base, "cpu")
    assert len(list(checked_keys())) >= 30  # dtypes, attention, switches, engine, for every role


@pytest.mark.parametrize(
    "key, value",
    [
        (f"{MP}.param_dtype", "bf16"),
        (f"{MP}.param_dtype", "bfloat16"),
        (f"{MP}.param_dtype", 16),
        (f"{MP}.reduce_dtype", "float32"),
        ("critic.fsdp.model_dtype", "32"),
        (f"{ROLLOUT}.dtype", "BFloat16"),  # vLLM and SGLang lower-case it
        (f"{ROLLOUT}.dtype", "half"),
        (f"{ROLLOUT}.dtype", "auto"),
        (f"{MODEL}.override_config.torch_dtype", "float16"),
        (f"{MODEL}.override_config.dtype", "auto"),
        (f"{MODEL}.override_config.attn_implementation", "flex_attention"),
        (f"{MODEL}.override_config.attn_implementation", "paged|sdpa"),
        (f"{MODEL}.override_config.attn_implementation", "kernels-community/flash-attn3"),
        (f"{MODEL}.use_liger", False),
        (f"{MODEL}.fused_kernel_options.impl_backend", "triton"),
        (f"{ROLLOUT}.name", "hf"),
        (f"{ROLLOUT}.name", "sglang"),
    ],
)
def test_every_accepted_spelling_passes(base, key, value):
    check_values(_with(base, key, value), "cpu")


@pytest.mark.parametrize(
    "key, value, closest",
    [
        (f"{MP}.param_dtype", "BF16", "bf16"),  # verl's PrecisionType matches exactly: BF16 would raise in a worker
        (f"{MP}.param_dtype", "torch.bfloat16", "bf16"),
        (f"{MP}.buffer_dtype", "half", "fp16"),
        (f"{MP}.param_dtype", "bfloat", "bfloat16"),
        ("actor_rollout_ref.ref.fsdp_config.model_dtype", "float", "fp32"),
        (f"{ROLLOUT}.dtype", "bf16", "bfloat16"),  # vLLM knows no "bf16"
        (f"{ROLLOUT}.dtype", "bfloat", "bfloat16"),
        (f"{MODEL}.override_config.torch_dtype", "torch.float16", "float16"),
        ("critic.model.override_config.dtype", "bf16", "bfloat16"),
        (f"{MODEL}.override_config.attn_implementation", "flash_attn_2", "flash_attention_2"),
        (f"{MODEL}.override_config.attn_implementation", "SDPA", "sdpa"),
        ("critic.model.override_config.attn_implementation", "xformer", None),
        ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", "ture", "true"),
        ("actor_rollout_ref.actor.use_torch_compile", "False", "false"),
        (f"{MODEL}.use_remove_padding", "no", "false"),
        (f"{ROLLOUT}.enforce_eager", 1, "true"),
        (f"{MODEL}.fused_kernel_options.impl_backend", "Triton", "triton"),
        (f"{ROLLOUT}.name", "vLLM", "vllm"),
        (f"{ROLLOUT}.name", "transformers", "hf"),  # the name of the library behind verl-compat's hf engine
    ],
)
def test_value_valid_nowhere_is_refused_with_the_closest(base, key, value, closest):
    with pytest.raises(InvalidSettingError) as e:
        check_values(_with(base, key, value), "p40 (sm_61, 22.4 GiB, simulated)")
    err = e.value
    assert err.key == key and err.value == value and err.device.startswith("p40")
    assert "accepts" in err.reason and "is none of these" in err.reason
    if closest is not None:
        assert err.fix.startswith(f"set {key}={closest} ("), err.fix
    else:
        assert err.fix.startswith(f"set {key} to one of the values above") or f"set {key}=" in err.fix


# Typed the way users type them, through main_ppo ---------------------------------------------------------------
@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    return {"model": tiny_model_dir(root), "data": parquet_file(root / "d.parquet")}


@pytest.fixture
def job(assets, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def run(*overrides: str, device: str | None = None, **where):
        if device is not None:
            monkeypatch.setenv("VERL_COMPAT_DEVICE", device)
        reset_cache()
        paths = [f"{MODEL}.path={assets['model']}", f"data.train_files={assets['data']}"]
        paths += [f"data.val_files={assets['data']}", f"reward.custom_reward_function.path={reward.__file__}"]
        paths.append(f"trainer.default_local_dir={tmp_path / 'ckpt'}")
        return run_main(monkeypatch, capsys, tmp_path, [*paths, *overrides], **where)

    return run


def test_misspelt_engine_on_the_command_line(job):
    result = job(f"{ROLLOUT}.name=vlm")
    assert_refused(result, f"{ROLLOUT}.name='vlm'", "cpu", "accepts vllm, sglang", f"Fix: set {ROLLOUT}.name=vllm")


def test_engine_in_another_case_is_checked_against_the_device(job):
    """vLLM is vllm to the policy: on this CPU it is refused for what it is, with the engine that runs here."""
    result = job(f"{ROLLOUT}.name=vLLM")
    assert_refused(result, f"{ROLLOUT}.name='vLLM'", "cpu", "vLLM needs an NVIDIA GPU", f"Fix: set {ROLLOUT}.name=hf")


def test_dict_valued_override_config_with_a_typo(job):
    result = job(f"++{MODEL}.override_config={{attn_implementation: sdpa, torch_dtype: bf16}}")
    key = f"{MODEL}.override_config.torch_dtype"
    assert_refused(result, f"{key}='bf16'", "accepts auto, bfloat16", f"Fix: set {key}=bfloat16")


def test_switch_typo_with_plus_plus(job):
    key = "actor_rollout_ref.actor.fsdp_config.use_torch_compile"
    assert_refused(job(f"++{key}=ture"), f"{key}='ture'", "accepts true, false", f"Fix: set {key}=true")


def test_upper_case_dtype_on_a_p40_is_refused_as_bf16(job):
    """The device policy reads every spelling: BF16 on a P40 is refused for being bf16, with the P40's fix."""
    result = job(f"+{MP}.param_dtype=BF16", device="p40")
    fix = f"Fix: set {MP}.param_dtype=fp32"
    assert_refused(result, f"{MP}.param_dtype='BF16'", "p40 (sm_61", "needs native bf16", fix)


def test_dtype_through_override_config_is_checked_for_the_device(job):
    """A dtype given through override_config (transformers' torch_dtype) is a request like any other."""
    key = f"{MODEL}.override_config.torch_dtype"
    result = job(f"+{key}=bfloat16", device="p40")
    assert_refused(result, f"{key}='bfloat16'", "p40 (sm_61", "needs native bf16", f"Fix: set {key}=float32")


def test_critic_dtype_in_a_dict_valued_override_config(job):
    key = "critic.model.override_config.dtype"
    result = job("+critic.model.override_config={dtype: torch.bfloat16}", device="t4")
    assert_refused(result, f"{key}='torch.bfloat16'", "t4 (sm_75", "needs native bf16", f"Fix: set {key}=float16")
