"""torch.compile, Triton, fused kernels, flash-attn cross-entropy, Liger."""

from __future__ import annotations

import pytest

from verl_compat.catalog import get_profile
from verl_compat.errors import IncompatibleRequestError
from verl_compat.profile import PackageStatus
from verl_compat.resolvers import kernels
from verl_compat.resolvers.registry import Request

COMPILE_KEY = "actor_rollout_ref.actor.fsdp_config.use_torch_compile"


def compile_(name: str, value: bool = True, requested: bool = False):
    req = Request("kernels.torch_compile", COMPILE_KEY, value, requested, True)
    return kernels.resolve_torch_compile(req, get_profile(name))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("p40", False),
        ("p100", False),
        ("v100", False),
        ("t4", False),
        ("gtx1660", False),
        ("cpu", False),
        ("a100", True),
        ("h100", True),
    ],
)
def test_torch_compile_default(name: str, expected: bool) -> None:
    assert compile_(name).value is expected


def test_explicit_compile_refused_below_sm70_but_allowed_as_opt_in_on_v100_and_cpu() -> None:
    with pytest.raises(IncompatibleRequestError) as e:
        compile_("p40", requested=True)
    assert e.value.key == COMPILE_KEY
    assert "needs Triton, which needs compute capability >= 7.0, device has 6.1" in e.value.reason
    assert f"set {COMPILE_KEY}=false" in e.value.fix
    v100 = compile_("v100", requested=True)
    assert v100.value is True and any("officially" in r for r in v100.reasons)
    assert compile_("cpu", requested=True).value is True


def test_triton_and_flash_ce() -> None:
    for name, expected in [("p40", False), ("t4", False), ("cpu", False), ("a100", True)]:
        req = Request("kernels.triton", "triton", True, False, True)
        assert kernels.resolve_triton(req, get_profile(name)).value is expected
    with_fa = get_profile("v100").with_packages(flash_attn=PackageStatus("flash_attn", True, "2.8.3", False))
    req = Request("kernels.flash_ce", "flash_ce", True, False, True, {"triton": False})
    decision = kernels.resolve_flash_ce(req, with_fa)
    assert decision.value is False
    assert any("Triton kernels are off" in r for c in decision.candidates for r in c.reasons)


def fused(name: str, value: str, key: str = "actor_rollout_ref.model.fused_kernel_options.impl_backend"):
    return kernels.resolve_fused(Request("kernels.fused", key, value, True, "off"), get_profile(name))


def test_fused_triton_backend_refused_on_p40_torch_backend_fine() -> None:
    with pytest.raises(IncompatibleRequestError) as e:
        fused("p40", "triton")
    assert e.value.key.endswith("impl_backend")
    assert "impl_backend=torch" in e.value.fix and "use_fused_kernels=false" in e.value.fix
    assert fused("p40", "torch").value == "torch"
    assert fused("cpu", "torch").value == "torch"


def test_fused_torch_head_is_the_default_only_below_sm80_on_gpus_and_only_for_the_lm() -> None:
    def default(name: str, lm_head: bool = True):
        key = "actor_rollout_ref.model.use_fused_kernels"
        request = Request("kernels.fused", key, "off", False, "off", facts={"lm_head": lm_head})
        return kernels.resolve_fused(request, get_profile(name))

    for name in ("p40", "v100", "t4"):
        assert default(name).value == "torch" and default(name).defaulted
        assert default(name, lm_head=False).value == "off"  # the critic's value head
    assert default("cpu").value == "off"
    assert any("host memory" in r for c in default("cpu").candidates for r in c.reasons)
    a100 = default("a100")
    assert a100.value == "off" and a100.identity  # upstream's
    # a user's "off" below sm_80 is kept
    kept = kernels.resolve_fused(Request("kernels.fused", "k", "off", True, "off"), get_profile("p40"))
    assert kept.value == "off" and not kept.defaulted


def test_the_fused_heads_chunk_is_smaller_only_below_sm80_on_gpus() -> None:
    def chunk(name: str):
        upstream = kernels.UPSTREAM_FUSED_CHUNK
        request = Request("kernels.fused_chunk", kernels.FUSED_CHUNK_KEY, upstream, False, upstream)
        return kernels.resolve_fused_chunk(request, get_profile(name))

    assert {name: chunk(name).value for name in ("p40", "v100", "t4", "cpu", "a100")} == {
        "p40": 128,
        "v100": 128,
        "t4": 128,
        "cpu": 512,
        "a100": 512,
    }
    assert chunk("a100").identity


def test_liger_refused_on_p40_and_cpu() -> None:
    for name in ("p40", "cpu"):
        with pytest.raises(IncompatibleRequestError) as e:
            kernels.resolve_liger(
                Request("kernels.liger", "actor_rollout_ref.model.use_liger", True, True, False), get_profile(name)
            )
        assert e.value.key == "actor_rollout_ref.model.use_liger"
        assert "use_liger=false" in e.value.fix
    liger = get_profile("t4").with_packages(liger_kernel=PackageStatus("liger_kernel", True, "0.6", True))
    ok = kernels.resolve_liger(Request("kernels.liger", "actor_rollout_ref.model.use_liger", True, True, False), liger)
    assert ok.value is True  # Triton on sm_75 is unofficial: kept as a warning because it was asked for
