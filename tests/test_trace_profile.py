"""The tracer's torch profiles (benchmarks/startup_trace, VERL_COMPAT_TORCH_PROFILE): the second call of each
engine pass (actor update and log-prob, reference, critic update and values) is profiled, and the file lists the
ops that ran in each, keyed by pass."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

TRACER = Path(__file__).resolve().parent.parent / "benchmarks" / "startup_trace" / "sitecustomize.py"
NAME = "verl.workers.engine.fsdp.transformer_impl.FSDPEngine.forward_backward_batch"


def _tracer():
    spec = importlib.util.spec_from_file_location("trace_under_test", TRACER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FSDPEngineWithLMHead:  # the name is what the tracer looks at
    pass


class FSDPEngineWithValueHead:
    pass


def _pass(engine, data, loss_function, forward_only=False):
    return torch.linalg.matrix_power(data, 3).sum()


class _RefConfig:
    forward_only = True


class RefEngine(FSDPEngineWithLMHead):
    engine_config = _RefConfig()


def test_the_second_call_of_each_pass_is_profiled(tmp_path):
    tracer, out = _tracer(), tmp_path / "profile.json"
    tracer._PROFILE = str(out)
    x = torch.randn(16, 16)
    tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None, True), {})  # actor log-prob, first call
    tracer._call(NAME, _pass, (RefEngine(), x, None, True), {})  # reference, first call
    tracer._call(NAME, _pass, (FSDPEngineWithValueHead(), x, None), {})  # critic update, first call
    tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None), {"forward_only": False})  # actor update, first
    tracer._call("some.other.function", _pass, (FSDPEngineWithLMHead(), x, None), {})  # not an engine pass
    assert not out.exists()
    assert tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None), {}) == _pass(None, x, None)
    passes = json.loads(out.read_text())["passes"]
    assert list(passes) == ["actor.train"]
    assert passes["actor.train"]["wall_s"] > 0
    assert any("matmul" in op["name"] or "mm" in op["name"] for op in passes["actor.train"]["ops"])
    tracer._call(NAME, _pass, (RefEngine(), x, None), {"forward_only": True})
    tracer._call(NAME, _pass, (FSDPEngineWithValueHead(), x, None), {})
    passes = json.loads(out.read_text())["passes"]
    assert sorted(passes) == ["actor.train", "critic.train", "ref.forward"]
    first = passes["actor.train"]
    tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None), {})  # a third update: not profiled again
    assert json.loads(out.read_text())["passes"]["actor.train"] == first
