"""The resolver core: priority order, registry idempotence, plugin options."""

from __future__ import annotations

from verl_compat.catalog import get_profile
from verl_compat.resolvers import attention
from verl_compat.resolvers.registry import Option, Registry, Request, choose, hard, soft

KEY = "actor_rollout_ref.model.override_config.attn_implementation"


def test_registration_is_idempotent() -> None:
    reg = Registry()
    opt = Option("my_attn", priority=5, source="plug")
    assert reg.register("attention", opt) is True
    assert reg.register("attention", opt) is False
    assert [o.value for o in reg.options("attention")] == ["my_attn"]
    reg.unregister_source("plug")
    assert reg.options("attention") == []


def test_plugin_option_wins_by_priority_on_pre_ampere_but_never_on_ampere() -> None:
    reg = Registry()
    reg.register("attention", Option("xformers_varlen", why="xformers BlockDiagonal", priority=14, source="plug"))
    req = Request("attention", KEY, "flash_attention_2", False, "flash_attention_2")
    assert attention.resolve_attention(req, get_profile("v100"), reg).value == "xformers_varlen"
    assert attention.resolve_attention(req, get_profile("a100"), reg).value == "flash_attention_2"


def test_soft_only_options_are_a_last_resort() -> None:
    options = (
        Option("a", lambda ctx: [hard("x", "no")], priority=1),
        Option("b", lambda ctx: [soft("y", "meh")], priority=2),
    )
    decision = choose(Request("cat", "k", "a", False, "a"), get_profile("p40"), options, registry=Registry())
    assert decision.value == "b"
    assert any(r.startswith("warning: meh") for r in decision.reasons)


def test_explain_lists_every_candidate() -> None:
    req = Request("attention", KEY, "flash_attention_2", False, "flash_attention_2")
    text = attention.resolve_attention(req, get_profile("p40")).explain()
    assert "attention = 'sdpa_varlen' (default" in text
    assert "- 'flash_attention_2': cc_too_old: flash-attn 2 needs compute capability >= 8.0, device has 6.1" in text
    assert "+ 'sdpa_varlen'" in text and "+ 'sdpa'" in text
    assert "upstream verl would use 'flash_attention_2'" in text
