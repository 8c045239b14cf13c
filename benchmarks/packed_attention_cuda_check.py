"""Packed (varlen) attention on a CUDA GPU: `sdpa_varlen`'s aten path against a float64 per-sequence reference,
forward and backward, and a tiny Qwen2 packed vs padded (logits and gradients). Plain python, no pytest.

    python benchmarks/packed_attention_cuda_check.py [--out benchmarks/results/packed_attention_cuda.json]

Exit status 1 when any error exceeds its bound (fp32 2e-5, fp16 2e-2 relative). On an H200 it also reports the
forward time and peak memory of packed vs padded attention for the varlen-attention.md case.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch
import torch.nn.functional as F

from verl_compat.packed import VARLEN, register
from verl_compat.packed.attention import _cuda_varlen_usable, sdpa_varlen_attention

LENS = [300, 512, 77, 1024, 5, 451]
HEADS, KV_HEADS, DIM = 14, 2, 64
BOUND = {torch.float32: 2e-5, torch.float16: 2e-2, torch.bfloat16: 5e-2}


class _Module(torch.nn.Module):
    is_causal = True
    num_key_value_groups = HEADS // KV_HEADS


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def kernel_check(dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    n = sum(LENS)
    q = torch.randn(1, HEADS, n, DIM, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(1, KV_HEADS, n, DIM, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(1, KV_HEADS, n, DIM, device="cuda", dtype=dtype, requires_grad=True)
    pos = torch.cat([torch.arange(L) for L in LENS])[None].cuda()
    out, _ = sdpa_varlen_attention(_Module(), q, k, v, None, position_ids=pos)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = [out, q.grad, k.grad, v.grad]
    # float64 reference: causal attention per sequence, K/V expanded to the query heads
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kx, vx = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k64, v64))
    outs, start = [], 0
    for L in LENS:
        sl = slice(start, start + L)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            outs.append(F.scaled_dot_product_attention(q64[:, :, sl], kx[:, :, sl], vx[:, :, sl], is_causal=True))
        start += L
    ref = torch.cat(outs, dim=2).transpose(1, 2)
    ref.backward(grad.double())
    names = ["out", "dq", "dk", "dv"]
    errors = {name: _rel(g, r) for name, g, r in zip(names, got, [ref, q64.grad, k64.grad, v64.grad], strict=True)}
    return {"dtype": str(dtype), "errors": errors, "ok": all(e <= BOUND[dtype] for e in errors.values())}


def model_check(dtype: torch.dtype) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    # one config object each: _from_config writes attn_implementation into the config it is given, so a shared
    # one would make the packed model run plain sdpa too
    packed_model = Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=VARLEN, dtype=dtype).cuda()
    padded_model = Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa", dtype=dtype).cuda()
    assert packed_model.config._attn_implementation == VARLEN, packed_model.config._attn_implementation
    padded_model.load_state_dict(packed_model.state_dict())
    lens = [37, 200, 5, 121]
    seqs = [torch.randint(3, 1000, (L,)) for L in lens]
    ids = torch.zeros(len(lens), max(lens), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    ids, mask = ids.cuda(), mask.cuda()
    padded_logits = padded_model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    ref = torch.cat([padded_logits.logits[i, :L] for i, L in enumerate(lens)]).float()
    packed = torch.cat(seqs)[None].cuda()
    pos = torch.cat([torch.arange(L) for L in lens])[None].cuda()
    got = packed_model(input_ids=packed, position_ids=pos).logits[0].float()
    target = packed[0].roll(-1)
    F.cross_entropy(got, target).backward()
    F.cross_entropy(ref, target).backward()
    grad_err = max(
        _rel(a.grad, b.grad)
        for a, b in zip(packed_model.parameters(), padded_model.parameters(), strict=True)
        if b.grad is not None and b.grad.norm() > 0
    )
    errors = {"logits": _rel(got, ref), "grads (max over params)": grad_err}
    return {"dtype": str(dtype), "errors": errors, "ok": all(e <= 10 * BOUND[dtype] for e in errors.values())}


def speed(dtype: torch.dtype) -> dict:
    """Forward ms and peak MiB: packed varlen vs padded SDPA (memory-efficient) for the LENS case."""
    n, L = sum(LENS), max(LENS)
    q = torch.randn(1, HEADS, n, DIM, device="cuda", dtype=dtype)
    kv = torch.randn(1, KV_HEADS, n, DIM, device="cuda", dtype=dtype)
    pos = torch.cat([torch.arange(x) for x in LENS])[None].cuda()
    qp = torch.randn(len(LENS), HEADS, L, DIM, device="cuda", dtype=dtype)
    kp = torch.randn(len(LENS), HEADS, L, DIM, device="cuda", dtype=dtype)
    mask = torch.zeros(len(LENS), 1, L, L, dtype=torch.bool, device="cuda")
    for i, x in enumerate(LENS):
        mask[i, :, :x, :x] = torch.ones(x, x, dtype=torch.bool, device="cuda").tril()

    def run(fn):
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / 20 * 1e3, torch.cuda.max_memory_allocated() / 2**20

    packed_ms, packed_mib = run(lambda: sdpa_varlen_attention(_Module(), q, kv, kv, None, position_ids=pos))
    padded_ms, padded_mib = run(lambda: F.scaled_dot_product_attention(qp, kp, kp, attn_mask=mask))
    return {
        "packed_ms": packed_ms,
        "padded_ms": padded_ms,
        "speedup": padded_ms / packed_ms,
        "packed_peak_mib": packed_mib,
        "padded_peak_mib": padded_mib,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    register()
    probe = torch.zeros(1, 1, 1, 1, device="cuda")
    cc = torch.cuda.get_device_capability()
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if cc >= (8, 0) else [])
    report = {
        "device": torch.cuda.get_device_name(),
        "capability": cc,
        "torch": torch.__version__,
        "aten_varlen": _cuda_varlen_usable(probe),
        "kernel": [],
        "model": [],
        "speed": {},
    }
    for dt in dtypes:
        report["kernel"].append(kernel_check(dt))
        report["model"].append(model_check(dt))
        report["speed"][str(dt)] = speed(dt)
    for section in ("kernel", "model"):
        for row in report[section]:
            errs = ", ".join(f"{k} {v:.2e}" for k, v in row["errors"].items())
            print(f"{section:6} {row['dtype']:15} {'ok ' if row['ok'] else 'BAD'} {errs}")
    for dt, s in report["speed"].items():
        print(
            f"speed  {dt:15} packed {s['packed_ms']:.3f} ms / {s['packed_peak_mib']:.0f} MiB, padded "
            f"{s['padded_ms']:.3f} ms / {s['padded_peak_mib']:.0f} MiB ({s['speedup']:.1f}x)"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=str)
    ok = report["aten_varlen"] and all(r["ok"] for s in ("kernel", "model") for r in report[s])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
