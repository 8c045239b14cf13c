"""dtype resolvers over every catalog profile: values, reason codes, requested vs defaulted."""

from __future__ import annotations

import logging

import pytest

from verl_compat.catalog import get_profile
from verl_compat.errors import IncompatibleRequestError
from verl_compat.resolvers import dtype
from verl_compat.resolvers.registry import Request

TRAIN_KEY = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"


def train(profile: str, value: str = "bf16", requested: bool = False):
    return dtype.resolve_train(Request("dtype.train", TRAIN_KEY, value, requested, "bf16"), get_profile(profile))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("p40", "fp32"),
        ("p100", "fp16"),
        ("v100", "fp16"),
        ("t4", "fp16"),
        ("gtx1660", "fp32"),
        ("cpu", "fp32"),
        ("a100", "bf16"),
        ("h100", "bf16"),
    ],
)
def test_default_train_dtype_per_device(name: str, expected: str) -> None:
    decision = train(name)
    assert decision.value == expected
    assert decision.defaulted
    assert dtype.default_train_dtype(get_profile(name)) == expected


def test_p40_rejections_show_actual_vs_required() -> None:
    decision = train("p40")
    rejected = {c.value: c.reasons for c in decision.candidates if not c.accepted}
    assert "no_native_bf16: needs native bf16 (compute capability >= 8.0), device has 6.1" in rejected["bf16"]
    assert any("1/64" in r for r in rejected["fp16"])
    assert "explain" and "fp32" in decision.explain()


def test_gtx1660_fp16_is_soft_so_an_explicit_request_is_kept() -> None:
    decision = train("gtx1660", "fp16", requested=True)
    assert decision.value == "fp16" and not decision.defaulted
    assert any(r.startswith("warning:") for r in decision.reasons)


def test_explicit_bf16_on_v100_raises() -> None:
    with pytest.raises(IncompatibleRequestError) as e:
        train("v100", "bf16", requested=True)
    assert e.value.key == TRAIN_KEY
    assert "v100" in e.value.device and "device has 7.0" in e.value.reason
    assert "fp16" in e.value.fix


def test_fp16_on_cpu_is_refused_but_bf16_is_allowed_when_asked() -> None:
    with pytest.raises(IncompatibleRequestError, match="fp16 training needs a CUDA GPU"):
        train("cpu", "fp16", requested=True)
    assert train("cpu", "bf16", requested=True).value == "bf16"


def test_ampere_keeps_whatever_the_config_holds() -> None:
    assert train("a100", "fp16", requested=True).value == "fp16"
    assert train("h100", "bf16").reasons[0].startswith("sm_80+")


def test_defaulted_fallback_logs_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="verl_compat.resolvers.dtype"):
        train("p40")
    lines = [r for r in caplog.records if r.name == "verl_compat.resolvers.dtype"]
    assert len(lines) == 1
    assert "bf16 -> fp32" in lines[0].getMessage() and "p40" in lines[0].getMessage()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("p40", "float32"),
        ("v100", "float16"),
        ("t4", "float16"),
        ("gtx1660", "float32"),
        ("cpu", "float32"),
        ("a100", "bfloat16"),
    ],
)
def test_rollout_dtype_follows_training_dtype(name: str, expected: str) -> None:
    profile = get_profile(name)
    facts = {"train_dtype": dtype.default_train_dtype(profile)}
    req = Request("dtype.rollout", "actor_rollout_ref.rollout.dtype", "bfloat16", False, "bfloat16", facts)
    assert dtype.resolve_rollout(req, profile).value == expected


def test_rollout_bf16_typed_on_p40_is_refused_even_though_it_is_the_default() -> None:
    req = Request(
        "dtype.rollout", "actor_rollout_ref.rollout.dtype", "bfloat16", True, "bfloat16", {"train_dtype": "fp32"}
    )
    with pytest.raises(IncompatibleRequestError, match="float32"):
        dtype.resolve_rollout(req, get_profile("p40"))


def test_master_weights_fp32_and_fp16_master_refused() -> None:
    req = Request("dtype.master", "actor_rollout_ref.actor.fsdp_config.model_dtype", "fp32", False, "fp32")
    assert dtype.resolve_master(req, get_profile("v100")).value == "fp32"
    bad = Request("dtype.master", "actor_rollout_ref.actor.fsdp_config.model_dtype", "fp16", True, "fp32")
    with pytest.raises(IncompatibleRequestError, match="Attempting to unscale FP16 gradients"):
        dtype.resolve_master(bad, get_profile("v100"))
    ref = Request(
        "dtype.master", "actor_rollout_ref.ref.fsdp_config.model_dtype", "fp16", True, "fp32", {"forward_only": True}
    )
    assert dtype.resolve_master(ref, get_profile("v100")).value == "fp16"  # no gradients on the frozen ref


def test_canonical_names() -> None:
    assert dtype.canonical("bfloat16") == dtype.canonical("bf16") == "bf16"
    assert dtype.canonical("torch.float16") == "fp16"
    assert dtype.canonical("float") == "fp32"
    assert dtype.canonical("int8") is None
