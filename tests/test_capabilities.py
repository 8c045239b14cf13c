"""The capability table: one record per backend/kernel/package, turned into reasons by one function."""

from __future__ import annotations

import pytest

from verl_compat import capabilities
from verl_compat.capabilities import REQUIREMENTS, Requirement
from verl_compat.catalog import get_profile
from verl_compat.packages import PACKAGE_NAMES
from verl_compat.profile import PackageStatus
from verl_compat.resolvers.checks import requires


def test_every_probed_package_has_a_requirement() -> None:
    assert set(PACKAGE_NAMES) <= set(REQUIREMENTS)
    with pytest.raises(KeyError, match="known: flash_attn"):
        capabilities.requirement("flash_attn_4")


@pytest.mark.parametrize(
    ("name", "card", "code", "actual", "required"),
    [
        ("flash_attn", "t4", "cc_too_old", "7.5", ">= 8.0"),
        ("flash_attn_3", "a100", "cc_too_old", "8.0", ">= 9.0"),
        ("vllm", "p40", "cc_too_old", "6.1", ">= 7.0"),
        ("sglang", "v100", "cc_too_old", "7.0", ">= 7.5"),
        ("delta_sharded", "t4", "cc_too_old", "7.5", ">= 8.0"),
        ("xformers", "cpu", "needs_gpu", "cpu", ">= 5.0"),
    ],
)
def test_requirement_reasons_carry_actual_and_required(name, card, code, actual, required) -> None:
    (reason,) = requires(get_profile(card), name)
    assert (reason.code, reason.actual, reason.required, reason.hard) == (code, actual, required, True)
    assert reason.to_dict()["message"] in str(reason)


def test_package_after_capability() -> None:
    v100 = get_profile("v100").with_packages(xformers=PackageStatus("xformers", installed=False))
    (reason,) = requires(v100, "xformers", "attn_implementation=xformers")
    assert reason.code == "not_installed" and "attn_implementation=xformers" in reason
    assert requires(get_profile("v100"), "xformers")[0].code == "not_probed"  # catalog profile: unknown


def test_shared_memory_requirement(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's "Required: 98304, Hardware limit: 65536" on a T4, as data."""
    monkeypatch.setitem(REQUIREMENTS, "big_kernel", Requirement("big_kernel", "a 96 KiB kernel", shared_memory=98304))
    (reason,) = requires(get_profile("t4"), "big_kernel")
    assert (reason.code, reason.actual, reason.required) == ("shared_memory", 65536, 98304)
    assert "needs 96 KiB of shared memory per block, device has 64 KiB" in reason
    assert requires(get_profile("v100"), "big_kernel") == [] and requires(get_profile("a100"), "big_kernel") == []


def test_catalog_traits_follow_the_table() -> None:
    for name in ("p40", "p100", "v100", "t4", "a100", "h100"):
        p = get_profile(name)
        assert p.native_bf16 == capabilities.at_least(p.compute_capability, capabilities.NATIVE_BF16_CC)
        assert p.triton_capable == capabilities.at_least(p.compute_capability, capabilities.TRITON_CC)
        assert p.shared_memory_per_block_optin == capabilities.SMEM_OPTIN_BY_CC[p.compute_capability]
        assert p.is_ampere_or_newer == capabilities.at_least(p.compute_capability, capabilities.IDENTITY_CC)
