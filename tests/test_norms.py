"""kernels.rms_norm: the model's plain RMSNorm modules through torch's fused F.rms_norm (verl_compat.norms).

Same values as the model's own forward and backward (fp32, a tiny Llama and a tiny Qwen2); a norm with other math
(Gemma's 1 + weight) keeps its forward; the decision per device; the FSDP engine's model build applies it
(tests/test_engine_step.py asserts that through verl's own workers).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl_compat import norms
from verl_compat.catalog import get_profile
from verl_compat.resolvers import kernels
from verl_compat.resolvers.registry import Request

SMALL = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip


def _pass(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits = model(input_ids=ids).logits
    (logits.float().square().mean()).backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "build", [lambda: LlamaForCausalLM(LlamaConfig(**SMALL)), lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL))]
)
def test_fused_norms_give_the_models_values_and_gradients(build) -> None:
    torch.manual_seed(0)
    model = build().float()
    for m in model.modules():  # non-trivial norm weights, so a wrong weight would show
        if type(m).__name__.endswith("RMSNorm"):
            torch.nn.init.normal_(m.weight, 1.0, 0.2)
    fused = copy.deepcopy(model)
    assert norms.fuse_rms_norms(fused) == 2 * SMALL["num_hidden_layers"] + 1
    assert norms.fuse_rms_norms(fused) == 0  # already fused: nothing twice
    assert norms.fused_count(model) == 0
    ids = torch.randint(0, SMALL["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    want_logits, want_grads = _pass(model, ids)
    got_logits, got_grads = _pass(fused, ids)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-6)
    assert want_grads.keys() == got_grads.keys()
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert fused.state_dict().keys() == model.state_dict().keys()
    # a fused model saves, loads and copies as a whole, and stays fused
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    for again in (torch.load(buffer, weights_only=False), copy.deepcopy(fused)):
        assert norms.fused_count(again) == norms.fused_count(fused)
        assert all(m.forward.norm is m for m in again.modules() if norms.is_fused(m))  # its own weight
        torch.testing.assert_close(again(input_ids=ids).logits, got_logits, rtol=1e-5, atol=1e-6)


class OnePlusWeightRMSNorm(torch.nn.Module):
    """Gemma's variant: scales by (1 + weight), so it is not F.rms_norm with its weight."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * (1.0 + self.weight)


def test_a_norm_with_other_math_keeps_its_forward() -> None:
    model = torch.nn.Sequential(OnePlusWeightRMSNorm(16), torch.nn.LayerNorm(16))
    assert norms.fuse_rms_norms(model) == 0
    try:
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    except ImportError:  # pragma: no cover - transformers without Gemma
        return
    assert norms.fuse_rms_norms(torch.nn.Sequential(GemmaRMSNorm(16))) == 0


def test_a_weight_in_another_dtype_goes_through_the_models_forward() -> None:
    model = Qwen2ForCausalLM(Qwen2Config(**SMALL)).float()
    norm = model.model.norm
    norms.fuse_rms_norms(model)
    x = torch.randn(2, SMALL["hidden_size"], dtype=torch.float16)
    out = norm(x)
    assert out.dtype == torch.float32  # HF's promotion of a fp32 weight times a fp16 input, kept


def test_fused_rms_norm_below_sm80_on_gpus_only() -> None:
    def decide(name: str):
        up = kernels.UPSTREAM_RMS_NORM
        return kernels.resolve_rms_norm(
            Request("kernels.rms_norm", kernels.RMS_NORM_KEY, up, False, up), get_profile(name)
        )

    assert {n: decide(n).value for n in ("p40", "p100", "v100", "t4", "cpu", "a100")} == {
        "p40": "torch", "p100": "torch", "v100": "torch", "t4": "torch", "cpu": "model", "a100": "model",
    }  # fmt: skip
    assert decide("a100").identity
    assert any("CPU" in r for c in decide("cpu").candidates for r in c.reasons)
