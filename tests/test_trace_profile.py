"""The tracer's torch profile of one actor update (benchmarks/startup_trace, VERL_COMPAT_TORCH_PROFILE): only the
second training pass of the LM-head engine is profiled, and the file lists the ops that ran in it."""

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


def test_the_second_actor_update_is_profiled(tmp_path):
    tracer, out = _tracer(), tmp_path / "profile.json"
    tracer._PROFILE = str(out)
    x = torch.randn(16, 16)
    tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None, True), {})  # a forward-only pass: not counted
    tracer._call(NAME, _pass, (FSDPEngineWithValueHead(), x, None), {})  # the critic's: not counted
    tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None), {"forward_only": False})
    assert not out.exists()
    assert tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None), {}) == _pass(None, x, None)
    profile = json.loads(out.read_text())
    assert profile["wall_s"] > 0 and any("matmul" in op["name"] or "mm" in op["name"] for op in profile["ops"])
    tracer._call(NAME, _pass, (FSDPEngineWithLMHead(), x, None), {})  # only once
    assert json.loads(out.read_text()) == profile
