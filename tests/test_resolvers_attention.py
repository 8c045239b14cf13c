"""Attention and remove-padding resolvers."""

from __future__ import annotations

import pytest

from verl_compat.catalog import get_profile
from verl_compat.errors import IncompatibleRequestError
from verl_compat.profile import PackageStatus
from verl_compat.resolvers import attention
from verl_compat.resolvers.registry import Request

KEY = "actor_rollout_ref.model.override_config.attn_implementation"


def attn(profile, value: str = "flash_attention_2", requested: bool = False):
    profile = get_profile(profile) if isinstance(profile, str) else profile
    return attention.resolve_attention(Request("attention", KEY, value, requested, "flash_attention_2"), profile)


@pytest.mark.parametrize("name", ["p40", "p100", "v100", "t4", "gtx1660", "cpu"])
def test_pre_ampere_and_cpu_default_to_packed_sdpa_varlen(name: str) -> None:
    decision = attn(name)
    assert decision.value == "sdpa_varlen"
    varlen = next(c for c in decision.candidates if c.value == "sdpa_varlen")
    assert varlen.accepted
    fa2 = next(c for c in decision.candidates if c.value == "flash_attention_2")
    assert not fa2.accepted


def test_fa2_rejection_reason_is_xformers_style() -> None:
    fa2 = next(c for c in attn("t4").candidates if c.value == "flash_attention_2")
    assert fa2.reasons == ("cc_too_old: flash-attn 2 needs compute capability >= 8.0, device has 7.5",)


@pytest.mark.parametrize("name", ["a100", "h100"])
def test_ampere_keeps_upstream_fa2(name: str) -> None:
    assert attn(name).value == "flash_attention_2"


def test_explicit_fa2_on_t4_raises_with_key_device_and_fix() -> None:
    with pytest.raises(IncompatibleRequestError) as e:
        attn("t4", requested=True)
    msg = str(e.value)
    assert KEY in msg and "t4 (sm_75" in msg and "device has 7.5" in msg and f"set {KEY}=sdpa" in msg


def test_explicit_fa2_without_flash_attn_installed_fails_even_on_ampere() -> None:
    # the only exception to sm_80+ identity: upstream would die importing flash_attn later, in a Ray worker
    a100 = get_profile("a100").with_packages(flash_attn=PackageStatus("flash_attn", installed=False))
    with pytest.raises(IncompatibleRequestError) as e:
        attn(a100, requested=True)
    assert "'flash_attn' package, which is not installed" in e.value.reason
    assert "a100" in e.value.device and f"{KEY}=sdpa" in e.value.fix
    # defaulted: a default that cannot run falls back on every device (issue 7): sdpa, with the reason
    decision = attn(a100)
    assert decision.value == "sdpa" and decision.defaulted and not decision.identity
    assert decision.reasons[0].startswith("sm_80+: upstream verl's value cannot run here: not_installed")
    fa2 = next(c for c in decision.candidates if c.value == "flash_attention_2")
    assert not fa2.accepted and [r.code for r in fa2.reasons] == ["not_installed"]
    assert (fa2.reasons[0].actual, fa2.reasons[0].required) == ("absent", "flash_attn")


def test_unusable_but_installed_flash_attn_on_ampere_is_only_a_note() -> None:
    a100 = get_profile("a100").with_packages(
        flash_attn=PackageStatus("flash_attn", installed=True, version="2.8.3", usable=False, reason="ABI mismatch")
    )
    decision = attn(a100, requested=True)
    assert decision.value == "flash_attention_2"
    assert any("ABI mismatch" in r for r in decision.reasons)


def test_explicit_eager_is_kept_and_unknown_values_pass_through() -> None:
    assert attn("p40", "eager", requested=True).value == "eager"
    decision = attn("p40", "flex_attention", requested=True)
    assert decision.value == "flex_attention" and "passed through" in decision.reasons[0]


def rmpad(profile: str, value: bool = True, requested: bool = False, **facts):
    facts.setdefault("attention", "sdpa")
    req = Request(
        "attention.remove_padding", "actor_rollout_ref.model.use_remove_padding", value, requested, True, facts
    )
    return attention.resolve_remove_padding(req, get_profile(profile))


def test_remove_padding_off_by_default_with_sdpa_and_the_reason_says_why() -> None:
    decision = rmpad("p40")
    assert decision.value is False
    assert any("N x N" in r for r in decision.reasons)


def test_remove_padding_kept_when_requested_or_needed() -> None:
    assert rmpad("p40", True, requested=True).value is True
    assert rmpad("v100", ulysses_sp=2).value is True  # sequence parallelism needs it: soft cost accepted
    assert rmpad("a100", attention="flash_attention_2").value is True


@pytest.mark.parametrize("name", ["p40", "v100", "t4", "cpu"])
def test_remove_padding_on_by_default_with_the_varlen_attention(name: str) -> None:
    decision = rmpad(name, attention="sdpa_varlen")
    assert decision.value is True and decision.defaulted
