"""HF's RMSNorm against torch's fused ``F.rms_norm`` in a training pass, in one run: kernels launched, time and
peak memory, forward + backward, alone and inside one Qwen2 decoder layer.

Why: the simulated cards' trainer passes are host-bound on the H200 (about 9,000 kernel launches per actor
micro-batch, ``benchmarks/results/p40_h200_engine_profile_planned_round_h.json``), and HF's ``Qwen2RMSNorm`` runs
pow, mean, add, rsqrt, mul, mul where ``F.rms_norm`` is one fused kernel on CUDA (two layers' worth per decoder
layer, again in the recompute of gradient checkpointing). This measures what swapping it would save before any
seam is written. Values: the two agree within the dtype's tolerance (checked here).

    VERL_COMPAT_DEVICE=p40 python benchmarks/rms_norm_kernels.py --out benchmarks/results/rms_norm_kernels_h200.json

On a CPU (``--device cpu``) it checks the values only; its timings say nothing about a GPU and it counts no
kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


class FusedRMSNorm(torch.nn.Module):
    """``Qwen2RMSNorm``'s math through ``F.rms_norm``."""

    def __init__(self, norm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn, device, repeat: int = 20) -> dict:
    """ms per call of ``fn`` (forward + backward), the kernels one call launches (profiler) and peak memory."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    _sync(device)
    ms = 1000 * (time.perf_counter() - t0) / repeat
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    if device.type != "cuda":  # a CPU profile's op tree says nothing about GPU launches
        return {"ms": ms, "kernels": None, "peak_MiB": None}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(device)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"ms": ms, "kernels": len(events), "peak_MiB": peak}


def run(device: torch.device, dtype: torch.dtype, tokens: int) -> dict:
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm, Qwen2RotaryEmbedding

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ppo_job import QWEN25_05B

    config = Qwen2Config(**QWEN25_05B)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hidden = config.hidden_size
    x = torch.randn(1, tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    norm = Qwen2RMSNorm(hidden, eps=config.rms_norm_eps).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    fused = FusedRMSNorm(norm)
    out: dict = {"dtype": str(dtype), "tokens": tokens}
    ref, got = norm(x), fused(x)
    out["max_abs_diff"] = (ref - got).abs().max().item()
    g = torch.randn_like(ref)
    (ref_grad,) = torch.autograd.grad(ref, x, g)
    (got_grad,) = torch.autograd.grad(got, x, g)
    out["grad_max_abs_diff"] = (ref_grad - got_grad).abs().max().item()

    def step(module):
        return lambda: module(x).backward(g)

    out["norm"] = {"hf": measure(step(norm), device), "fused": measure(step(fused), device)}

    layer = Qwen2DecoderLayer(config, 0).to(device=device, dtype=dtype)
    rope = Qwen2RotaryEmbedding(config).to(device)
    pos = torch.arange(tokens, device=device).unsqueeze(0)
    emb = rope(x, pos)

    def layer_pass():
        y = layer(x, position_embeddings=emb, position_ids=pos)
        (y[0] if isinstance(y, tuple) else y).sum().backward()

    hf_norms = (layer.input_layernorm, layer.post_attention_layernorm)
    out["layer"] = {"hf": measure(layer_pass, device)}
    layer.input_layernorm, layer.post_attention_layernorm = (FusedRMSNorm(n) for n in hf_norms)
    out["layer"]["fused"] = measure(layer_pass, device)
    layer.input_layernorm, layer.post_attention_layernorm = hf_norms
    for part in ("norm", "layer"):
        rec = out[part]
        rec["fused_vs_hf_ms"] = rec["fused"]["ms"] / rec["hf"]["ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/rms_norm_kernels_h200.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        from verl_compat import simulate
        from verl_compat.detect import detect

        simulate.prepare_device(detect())
    results = {"meta": {"torch": torch.__version__, "device": str(device)}}
    for dtype in (torch.float32, torch.float16) if device.type == "cuda" else (torch.float32,):
        rec = run(device, dtype, args.tokens)
        results[str(dtype)] = rec
        print(
            f"{dtype}: norm {rec['norm']['hf']} -> {rec['norm']['fused']}; layer {rec['layer']['hf']} -> "
            f"{rec['layer']['fused']}; value diff {rec['max_abs_diff']:.2e}, grad diff {rec['grad_max_abs_diff']:.2e}"
        )
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
