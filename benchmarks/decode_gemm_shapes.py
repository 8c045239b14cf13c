"""The decode step's GEMMs alone, per shape, for ways torch can run them without Triton or a compiler.

At decode a projection is ``x[M, K] @ W[N, K]^T`` with M the batch (1-64 rows): few output tiles, so in fp32 on a
large GPU cuBLAS fills few SMs (benchmarks/results/decode_step_kernels_h200.json: at batch 64 the GEMMs are most
of a replay). Qwen2.5-0.5B's shapes (the engine's fused q|k|v and gate|up, o, down, the head for one position),
random weights on the GPU, each variant timed as a CUDA graph of ``--reps`` calls (no launch gaps, as in the
engine's graphs):

- ``linear``: ``F.linear``, what the engine runs today (cuBLAS).
- ``cublaslt``: the same call with ``torch.backends.cuda.preferred_blas_library("cublaslt")``.
- ``splitk{s}``: K split into ``s`` slices, one strided ``bmm`` over them and a sum: ``s`` times the tiles.

Per shape: microseconds per call, ratio to ``linear``, the weight bytes read per microsecond against the copy
bandwidth measured here, and the largest difference from ``linear``'s output. Then one decode step's GEMMs (24
layers and the head) per variant, and with each shape's fastest variant.

``python benchmarks/decode_gemm_shapes.py --out benchmarks/results/decode_gemm_shapes_h100.json`` (GPU only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from verl_compat.planner.shape import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_job import QWEN25_05B  # noqa: E402  the one Qwen2.5-0.5B shape of every benchmark
from rollout_decode import copy_bandwidth  # noqa: E402  the same floor bandwidth as the engine's benchmark

SPLITS = (2, 4, 8)


def decode_shapes(config: dict) -> tuple[tuple[str, int, int, int], ...]:
    """(name, N, K, calls per decode step) of the engine's GEMMs, from the planner's reading of the config."""
    m = ModelShape.from_config(config)
    return (
        ("qkv", m.heads * m.head_dim + 2 * m.kv_dim, m.hidden, m.layers),
        ("o", m.hidden, m.heads * m.head_dim, m.layers),
        ("gate_up", 2 * m.intermediate, m.hidden, m.layers),
        ("down", m.hidden, m.intermediate, m.layers),
        ("head", m.vocab, m.hidden, 1),
    )


SHAPES = decode_shapes(QWEN25_05B)


def split_k(x: torch.Tensor, w: torch.Tensor, s: int) -> torch.Tensor:
    """``x @ w.T`` as ``s`` partial products over slices of K (strided views, no copies) and their sum."""
    m, k = x.shape
    n = w.shape[0]
    xs = x.view(m, s, k // s).transpose(0, 1)  # [s, M, K/s]
    ws = w.view(n, s, k // s).permute(1, 2, 0)  # [s, K/s, N]
    return torch.bmm(xs, ws).sum(0)


def variants(k: int) -> dict:
    out = {"linear": F.linear, "cublaslt": F.linear}
    for s in SPLITS:
        if k % s == 0:
            out[f"splitk{s}"] = lambda x, w, s=s: split_k(x, w, s)
    return out


def time_us(fn, x, w, reps: int) -> float:
    """Microseconds per call of ``fn`` replayed from a CUDA graph of ``reps`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn(x, w)
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best / reps * 1e6


def one_dtype(dtype: torch.dtype, rows: list[int], reps: int, bandwidth: float) -> dict:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    result: dict = {}
    for m in rows:
        per_shape, step = {}, {}
        for name, n, k, calls in SHAPES:
            w = torch.randn(n, k, device=device, dtype=dtype, generator=gen) * k**-0.5
            x = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
            ref = F.linear(x, w).float()
            row = {}
            for label, fn in variants(k).items():
                torch.backends.cuda.preferred_blas_library("cublaslt" if label == "cublaslt" else "cublas")
                try:
                    us = time_us(fn, x, w, reps)
                    diff = (fn(x, w).float() - ref).abs().max().item()
                finally:
                    torch.backends.cuda.preferred_blas_library("cublas")
                weight_bytes = n * k * w.element_size()
                row[label] = {
                    "us": us,
                    "weight_GBps": weight_bytes / us / 1e3,
                    "of_copy_bandwidth": weight_bytes / us / 1e3 / bandwidth,
                    "max_abs_diff": diff,
                }
                step[label] = step.get(label, 0.0) + us * calls
            base = row["linear"]["us"]
            for label in row:
                row[label]["vs_linear"] = row[label]["us"] / base
            best = min(row, key=lambda label: row[label]["us"])
            step["best_per_shape"] = step.get("best_per_shape", 0.0) + row[best]["us"] * calls
            per_shape[name] = {"N": n, "K": k, "calls_per_step": calls, "best": best, "variants": row}
            del w, x, ref
        # a variant missing for some shape (K not divisible) has no whole-step total
        complete = {label: us for label, us in step.items() if label in ("linear", "cublaslt", "best_per_shape")}
        complete.update(
            {
                label: us
                for label, us in step.items()
                if label.startswith("splitk") and all(label in per_shape[s]["variants"] for s in per_shape)
            }
        )
        result[str(m)] = {
            "shapes": per_shape,
            "step_gemm_ms": {label: us / 1e3 for label, us in complete.items()},
            "step_vs_linear": {label: us / complete["linear"] for label, us in complete.items()},
        }
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="decode_gemm_shapes.json")
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_gemm_shapes.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False  # sm<8.0 has no TF32: fp32 GEMMs as a P40 runs them
    device = torch.device("cuda")
    bandwidth = copy_bandwidth() / 1e9
    rows = [int(r) for r in args.rows.split(",")]
    out = {
        "meta": {
            "gpu": torch.cuda.get_device_name(),
            "sms": torch.cuda.get_device_properties(device).multi_processor_count,
            "torch": torch.__version__,
            "copy_bandwidth_GBps": bandwidth,
            "reps_per_graph": args.reps,
        },
        "results": {d: one_dtype(getattr(torch, d), rows, args.reps, bandwidth) for d in args.dtypes.split(",")},
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{out['meta']['gpu']} ({out['meta']['sms']} SMs), copy {bandwidth:.0f} GB/s")
    for dtype, by_rows in out["results"].items():
        for m, r in by_rows.items():
            best = {name: s["best"] for name, s in r["shapes"].items()}
            ms = "  ".join(f"{label} {v:.3f}" for label, v in r["step_gemm_ms"].items())
            print(f"{dtype:8s} M={m:>3s}  step GEMMs ms: {ms}  best per shape: {best}")


if __name__ == "__main__":
    main()
