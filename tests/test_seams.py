"""The functions verl's patches call: worker-safe, keep what can run, replace only what cannot; identity on sm_80+."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from verl_compat import seams
from verl_compat.catalog import get_profile
from verl_compat.errors import IncompatibleRequestError
from verl_compat.logprobs import logprobs_blocked
from verl_compat.profile import DeviceProfile, PackageStatus

FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
FP16 = {"param_dtype": "fp16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch):
    """device('p40') makes every seam see that profile (instead of detect())."""

    def use(profile: str | DeviceProfile) -> DeviceProfile:
        p = get_profile(profile) if isinstance(profile, str) else profile
        monkeypatch.setattr(seams, "_profile", lambda: p)
        return p

    return use


class HFConfig:
    def __init__(self, attn: str | None) -> None:
        self._attn_implementation = attn


@dataclass(frozen=True)  # verl's BaseConfig refuses plain setattr too
class ModelConfig:
    hf_config: Any
    use_liger: bool = False
    use_fused_kernels: bool = False
    fused_kernel_options: dict = field(default_factory=dict)
    use_remove_padding: bool = True
    override_config: dict = field(default_factory=dict)


def test_attn_impl(device) -> None:
    device("p40")
    assert seams.attn_impl("flash_attention_2") == "sdpa_varlen"
    assert seams.attn_impl("flash_attention_2", HFConfig("eager")) == "eager"  # the user's critic override
    assert seams.attn_impl("flash_attention_2", HFConfig("flash_attention_2")) == "sdpa_varlen"
    device("a100")
    assert seams.attn_impl("flash_attention_2", HFConfig("sdpa")) == "flash_attention_2"  # upstream hard-codes it


def test_fsdp_mixed_precision(device) -> None:
    device("p40")
    assert seams.fsdp_mixed_precision(None) == FP32
    device("v100")
    assert seams.fsdp_mixed_precision(None) == FP16
    given = {"param_dtype": "fp32", "reduce_dtype": "fp32"}
    assert seams.fsdp_mixed_precision(given) is given  # validated, not replaced
    assert seams.fsdp_mixed_precision(OmegaConf.create({"reduce_dtype": "fp32"}))["param_dtype"] == "fp16"
    with pytest.raises(IncompatibleRequestError, match="device has 7.0"):
        seams.fsdp_mixed_precision({"param_dtype": "bf16"})
    device("a100")
    assert seams.fsdp_mixed_precision(None) is None


@pytest.mark.parametrize(
    ("name", "compile_ok", "triton"),
    [
        ("p40", False, False),
        ("p100", False, False),
        ("v100", True, False),  # Inductor can compile for sm_70; the driver turns it off by default
        ("t4", True, False),
        ("cpu", True, False),
        ("a100", True, True),
        ("h100", True, True),
    ],
)
def test_compile_and_triton(device, name: str, compile_ok: bool, triton: bool) -> None:
    device(name)
    assert seams.torch_compile_ok() is compile_ok
    assert seams.use_triton() is triton
    # the calls patches/0011 makes: upstream's value, gated where Triton cannot run
    assert seams.torch_compile(True) is compile_ok and seams.torch_compile(False) is False
    assert seams.flash_ce(True) is triton and seams.flash_ce(False) is False


def test_rollout_dtype_and_eager(device) -> None:
    device("p40")
    assert seams.rollout_dtype("bfloat16") == "float32"
    device("v100")
    assert seams.rollout_dtype("bfloat16") == "float16"
    assert seams.rollout_dtype("float32") == "float32"  # runs here: kept
    assert seams.rollout_enforce_eager(False) is True
    device("t4")
    assert seams.rollout_enforce_eager(False) is False
    device("a100")
    assert seams.rollout_dtype("bfloat16") == "bfloat16"
    assert seams.rollout_enforce_eager(False) is False


def test_resolve_model_config(device) -> None:
    device("p40")
    mc = ModelConfig(
        HFConfig("flash_attention_2"),
        use_liger=True,
        use_fused_kernels=True,
        fused_kernel_options={"impl_backend": "triton"},
    )
    out = seams.resolve_model_config(mc)
    assert out is mc
    assert mc.hf_config._attn_implementation == "sdpa_varlen"
    assert mc.use_liger is False and mc.use_fused_kernels is False
    assert mc.use_remove_padding is True  # the driver decides it; it runs everywhere

    torch_backend = ModelConfig(
        HFConfig("sdpa"), use_fused_kernels=True, fused_kernel_options={"impl_backend": "torch"}
    )
    seams.resolve_model_config(torch_backend)
    assert torch_backend.use_fused_kernels is True

    device("a100")
    untouched = ModelConfig(HFConfig("flash_attention_2"), use_liger=True)
    seams.resolve_model_config(untouched)
    assert untouched.hf_config._attn_implementation == "flash_attention_2" and untouched.use_liger is True


def test_hf_rollout_dtype_and_attn(device) -> None:
    device("p40")
    rc = OmegaConf.create({"dtype": "float32"})
    assert seams.hf_rollout_dtype_and_attn(rc, ModelConfig(HFConfig("sdpa"))) == (torch.float32, "sdpa")
    assert seams.hf_rollout_dtype_and_attn({"dtype": "bfloat16"}, ModelConfig(HFConfig(None))) == (
        torch.float32,
        "sdpa_varlen",  # the trainer's default; unpacked rows (the rollout's) run plain SDPA through it
    )
    device(get_profile("a100").with_packages(flash_attn=PackageStatus("flash_attn", installed=False)))
    assert seams.hf_rollout_dtype_and_attn(rc.copy(), ModelConfig(HFConfig("flash_attention_2")))[1] == "sdpa"
    device(get_profile("a100").with_packages(flash_attn=PackageStatus("flash_attn", True, "2.8.3", True)))
    bf16 = OmegaConf.create({"dtype": "bfloat16"})
    assert seams.hf_rollout_dtype_and_attn(bf16, ModelConfig(HFConfig("flash_attention_2"))) == (
        torch.bfloat16,
        "flash_attention_2",
    )


def _hydra_run(overrides: list[str]):
    """Compose verl's ppo_trainer as a Hydra app would and publish HydraConfig (what main_ppo sees)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from verl_compat.user_keys import verl_config_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


@pytest.fixture
def hydra_cleanup():
    yield
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().cfg = None
    GlobalHydra.instance().clear()


def test_resolve_config_reads_requests_from_hydra(device, hydra_cleanup, tmp_path, monkeypatch) -> None:
    from startup_harness import parquet_file, tiny_model_dir

    monkeypatch.chdir(tmp_path)  # the default checkpoint folder (checkpoints/...) is looked at for resume
    data = parquet_file(tmp_path / "d.parquet")  # the start-up checks need a real model folder and data files
    model = tiny_model_dir(tmp_path)
    paths = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}", f"data.train_files={data}"]
    paths.append(f"data.val_files={data}")
    device("p40")
    cfg = _hydra_run(["algorithm.adv_estimator=grpo", *paths])
    decisions = seams.resolve_config(cfg)
    assert cfg.actor_rollout_ref.rollout.dtype == "float32"
    assert decisions["rollout.engine"].value == "hf"

    cfg = _hydra_run(["actor_rollout_ref.rollout.dtype=bfloat16", *paths])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the exception itself, not the short message and exit code 2
    with pytest.raises(IncompatibleRequestError) as e:
        seams.resolve_config(cfg)
    assert e.value.key == "actor_rollout_ref.rollout.dtype" and "p40" in e.value.device


@pytest.mark.parametrize(
    ("name", "expected"),
    [("p40", "blocked"), ("v100", "blocked"), ("t4", "blocked"), ("cpu", "rowwise"), ("a100", "rowwise")],
)
def test_logprobs_seam_blocks_on_old_gpus_and_keeps_upstream_on_sm80_and_cpu(device, name: str, expected: str) -> None:
    device(name)
    from verl.utils import torch_functional as verl_F

    chosen = seams.logprobs_fallback(verl_F.logprobs_from_logits_v2)
    assert chosen is (verl_F.logprobs_from_logits_v2 if expected == "rowwise" else logprobs_blocked)


def test_verls_entry_point_uses_the_seam(device) -> None:
    # without flash-attn, verl's logprobs_from_logits goes through the seam (a P40 gets the blocks)
    from verl.utils import torch_functional as verl_F

    device("p40")
    logits, labels = torch.randn(9, 300), torch.randint(0, 300, (9,))
    assert torch.equal(verl_F.logprobs_from_logits(logits, labels), logprobs_blocked(logits, labels))
