"""Plugins through the `verl_compat.plugins` entry-point group, with a fake entry point."""

from __future__ import annotations

import importlib.metadata

import pytest

from verl_compat import plugins
from verl_compat.resolvers.registry import Option, Registry

CALLS: list[str] = []


def good_plugin(registry: Registry) -> None:
    CALLS.append("good")
    registry.register("attention", Option("my_attn", priority=15, source="good"))


def broken_plugin(registry: Registry) -> None:
    raise RuntimeError("boom: needs xformers 0.0.99")


@pytest.fixture(autouse=True)
def fake_entry_points(monkeypatch: pytest.MonkeyPatch):
    eps = [
        importlib.metadata.EntryPoint("good", f"{__name__}:good_plugin", plugins.GROUP),
        importlib.metadata.EntryPoint("broken", f"{__name__}:broken_plugin", plugins.GROUP),
    ]

    def entry_points(**kw):
        assert kw == {"group": plugins.GROUP}
        return eps

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    plugins.reset_for_tests()
    CALLS.clear()
    yield
    plugins.reset_for_tests()


def test_unset_allowlist_loads_all_and_records_errors(caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()
    statuses = {s.name: s for s in plugins.load_plugins(reg)}
    assert statuses["good"].loaded and not statuses["good"].error
    assert not statuses["broken"].loaded
    assert statuses["broken"].error == "RuntimeError: boom: needs xformers 0.0.99"
    assert "Traceback" in statuses["broken"].detail
    assert [o.value for o in reg.options("attention")] == ["my_attn"]
    assert any("broken" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert {s.name for s in plugins.plugin_status()} == {"good", "broken"}


def test_loading_twice_is_a_no_op() -> None:
    reg = Registry()
    plugins.load_plugins(reg)
    plugins.load_plugins(reg)
    assert CALLS == ["good"]
    plugins.load_plugins(reg, force=True)  # even forced, the registry keeps one copy
    assert len(reg.options("attention")) == 1


def test_allowlist_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugins.ENV_VAR, "good,missing")
    statuses = {s.name: s for s in plugins.load_plugins(Registry())}
    assert set(statuses) == {"good", "missing"}
    assert "not installed" in statuses["missing"].error
    plugins.reset_for_tests()
    monkeypatch.setenv(plugins.ENV_VAR, "none")
    assert plugins.load_plugins(Registry()) == []
    assert plugins.allowlist() == set()
