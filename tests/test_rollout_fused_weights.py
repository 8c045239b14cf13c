"""The fast decoder's fused projections: one storage per layer's q|k|v and gate|up, the modules' own parameters as
views, kept through weight sync and restored after anything that gives the parameters fresh storage."""

from __future__ import annotations

import asyncio
import copy

import torch
from test_rollout_engine import PROMPTS, tiny_llama, tiny_qwen_tied
from torch import nn

from verl_compat.rollout.engine import HFGenerationEngine
from verl_compat.rollout.fast_decode import FastDecoder
from verl_compat.rollout.fused_weights import Projections, fused
from verl_compat.rollout.weights import ParameterStorage, WeightLoader


def _qkv(model, i=0):
    a = model.model.layers[i].self_attn
    return [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]


def test_decoder_lays_out_projections_as_views_without_changing_the_model():
    model = tiny_qwen_tied()
    before = copy.deepcopy(model.state_dict())
    params_before = [id(p) for p in model.parameters()]
    assert fused(_qkv(model)) is None  # each projection has its own storage as built
    dec = FastDecoder.for_model(model)
    assert [id(p) for p in model.parameters()] == params_before  # the same Parameter objects, new .data
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)
    for qkv_w, gate_up_w in dec._fused:
        assert qkv_w is not None and qkv_w[1] is not None  # Qwen2: q/k/v biases fused too
        assert gate_up_w is not None and gate_up_w[1] is None  # no MLP bias
    weight, bias = dec._fused[0][0]
    a = model.model.layers[0].self_attn
    torch.testing.assert_close(weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
    torch.testing.assert_close(bias, torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
    assert not dec.prepare()  # already laid out: nothing moves, no graph goes stale


def test_weight_sync_writes_through_the_fused_views():
    model = tiny_qwen_tied()
    dec = FastDecoder.for_model(model)
    new = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    WeightLoader(model).load(new.items())
    assert not dec.prepare()
    weight, bias = dec._fused[1][0]
    a = model.model.layers[1].self_attn
    prefix = "model.layers.1.self_attn."
    want = torch.cat([new[prefix + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj")])
    torch.testing.assert_close(weight, want, rtol=0, atol=0)
    torch.testing.assert_close(bias, torch.cat([new[prefix + n + ".bias"] for n in ("q_proj", "k_proj", "v_proj")]))
    assert a.q_proj.weight.data_ptr() == weight.data_ptr()


def test_a_discarding_sleep_reallocates_the_groups_adjacently():
    model = tiny_llama()
    dec = FastDecoder.for_model(model)
    storage = ParameterStorage(model)
    storage.release()
    assert not dec.prepare() and all(f == (None, None) for f in dec._fused)  # released: nothing to fuse
    storage.allocate("cpu")
    values = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    WeightLoader(model).load(values.items())
    assert fused(_qkv(model)) is not None  # allocated as one buffer: no copy at the next decode
    assert not dec.prepare() and all(q is not None and g is not None for q, g in dec._fused)
    torch.testing.assert_close(
        dec._fused[0][0][0], torch.cat([values[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    )


def test_fresh_storage_falls_back_then_is_laid_out_again_with_its_values():
    model = tiny_llama()
    dec = FastDecoder.for_model(model)
    with torch.no_grad():
        for p in model.parameters():  # what a move between devices does: every parameter its own storage
            p.data = p.data.clone()
    values = copy.deepcopy(model.state_dict())
    assert fused(_qkv(model)) is None  # the decoder would run one GEMM per projection
    assert dec.prepare()  # moved: a runner drops its graphs (check_weights compares the addresses)
    assert all(q is not None and g is not None for q, g in dec._fused)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, values[name], rtol=0, atol=0)


def test_the_engine_lays_out_the_model_at_load():
    model = tiny_qwen_tied()
    assert fused(_qkv(model)) is None
    HFGenerationEngine(model, device="cpu", max_batch_size=2)
    assert all(fused(_qkv(model, i)) is not None for i in range(len(model.model.layers)))


def _generate(model) -> list:
    sampled = {"temperature": 0.8, "max_tokens": 12, "logprobs": True, "ignore_eos": True}
    engine = HFGenerationEngine(model, device="cpu", max_batch_size=4)

    async def go():
        return await asyncio.gather(
            *[engine.generate(p, {**sampled, "seed": i}, f"r{i}") for i, p in enumerate(PROMPTS)]
        )

    return asyncio.run(go())


def test_fused_and_separate_projections_decode_the_same_tokens(monkeypatch):
    """The fused GEMMs against one GEMM per projection, through the engine, sampled with log-probs."""
    fused_runs = {build.__name__: _generate(build()) for build in (tiny_llama, tiny_qwen_tied)}
    laid_out = FastDecoder.prepare

    def separate(self):  # the layout is made, but the decoder is given no fused view: one GEMM per projection
        moved = laid_out(self)
        self._fused = [(None, None)] * len(self._fused)
        return moved

    monkeypatch.setattr(FastDecoder, "prepare", separate)
    for build in (tiny_llama, tiny_qwen_tied):
        a, b = fused_runs[build.__name__], _generate(build())
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(torch.tensor(x.log_probs), torch.tensor(y.log_probs), atol=1e-5, rtol=0)


def test_a_mixed_set_of_biases_is_not_fused():
    linears = [nn.Linear(4, 4, bias=True), nn.Linear(4, 2, bias=False)]
    proj = Projections(linears)
    assert not proj.pack() and proj.fused() is None
    assert linears[0].weight.untyped_storage().data_ptr() != linears[1].weight.untyped_storage().data_ptr()


def test_the_decode_step_benchmarks_variants_decode_what_the_engine_does():
    """benchmarks/decode_step_kernels.py times other attentions on a GPU; on a CPU they give the engine's tokens."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import decode_step_kernels

    base = _generate(tiny_qwen_tied())
    for name in ("fused_sdpa", "fused_split_pv"):
        model = tiny_qwen_tied()
        built = decode_step_kernels._variant(name, model)
        original = FastDecoder.for_model
        try:
            FastDecoder.for_model = classmethod(lambda cls, m, built=built: built)
            got = _generate(model)
        finally:
            FastDecoder.for_model = original
        assert [r.token_ids for r in got] == [r.token_ids for r in base]
        for x, y in zip(got, base, strict=True):
            torch.testing.assert_close(torch.tensor(x.log_probs), torch.tensor(y.log_probs), atol=1e-5, rtol=0)


def test_a_group_of_mixed_dtypes_is_allocated_per_parameter():
    model = tiny_llama()
    attn = model.model.layers[0].self_attn
    attn.k_proj.to(torch.float64)
    storage = ParameterStorage(model)
    storage.release()
    storage.allocate("cpu")
    assert attn.k_proj.weight.dtype == torch.float64 and attn.q_proj.weight.dtype == torch.float32
    assert fused(_qkv(model)) is None and fused(_qkv(model, 1)) is not None
    assert not storage.released and sorted(storage.unloaded) == sorted(n for n, _ in model.named_parameters())


def test_projections_that_are_not_plain_linears_run_one_gemm_each():
    class Projection(nn.Module):  # has the weight and bias the decoder reads, but is no nn.Linear
        def __init__(self, linear):
            super().__init__()
            self.weight, self.bias = linear.weight, linear.bias

        def forward(self, x):
            return nn.functional.linear(x, self.weight, self.bias)

    model = tiny_qwen_tied()
    expected = _generate(tiny_qwen_tied())
    for layer in model.model.layers:
        layer.self_attn.q_proj = Projection(layer.self_attn.q_proj)
    dec = FastDecoder.for_model(model)
    assert dec is not None and all(f == (None, None) for f in dec._fused)
    got = _generate(model)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
