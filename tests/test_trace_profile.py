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


def test_allocator_stats_are_recorded_per_engine_pass_and_summed_by_the_benchmark(tmp_path):
    """VERL_COMPAT_ALLOC_STATS: what the caching allocator did during each pass and optimizer step (a retry frees
    every cached block after a device sync), one line per call, summed per pass by ppo_job.alloc_totals."""
    import sys

    sys.path.insert(0, str(TRACER.parents[2]))
    from benchmarks.ppo_job import alloc_totals

    tracer, out = _tracer(), tmp_path / "alloc.jsonl"
    tracer._ALLOC = str(out)
    counters = {"num_alloc_retries": 0, "num_device_alloc": 0, "reserved_bytes.all.current": 0}

    def stats():
        return dict(counters)

    def update(engine, data, loss_function, forward_only=False):  # an update that had to free and retry twice
        counters["num_alloc_retries"] += 2
        counters["num_device_alloc"] += 5
        counters["reserved_bytes.all.current"] = 3 * 2**30
        return data.sum()

    tracer._STATS = stats
    x = torch.ones(4)
    tracer._call(NAME, update, (FSDPEngineWithValueHead(), x, None), {})  # critic update
    tracer._call(NAME, update, (FSDPEngineWithValueHead(), x, None), {})
    step = "verl.workers.engine.fsdp.transformer_impl.FSDPEngine.optimizer_step"
    tracer._call(step, lambda engine: 1.0, (FSDPEngineWithLMHead(),), {})  # actor step: nothing happened
    tracer._call("some.other.function", update, (FSDPEngineWithLMHead(), x, None), {})  # not recorded
    totals = alloc_totals(out)
    assert set(totals) == {"critic.train", "actor.step"}
    assert totals["critic.train"]["calls"] == 2 and totals["critic.train"]["num_alloc_retries"] == 4
    assert totals["critic.train"]["num_device_alloc"] == 10 and totals["critic.train"]["max_reserved_after_gib"] == 3
    assert totals["actor.step"]["num_alloc_retries"] == 0
    tracer._STATS = lambda: None  # no CUDA in this process: nothing written
    tracer._call(NAME, update, (FSDPEngineWithValueHead(), x, None), {})
    assert alloc_totals(out)["critic.train"]["calls"] == 2
