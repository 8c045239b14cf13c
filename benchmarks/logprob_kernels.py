"""verl's torch log-prob fallback, upstream's per-token loop vs verl-compat's blocks, in one run: milliseconds
forward and forward+backward, peak memory above the logits, and the ratio, for packed micro-batches of Qwen2.5's
151,936-entry vocabulary (the shape of a planned PPO step's log-prob and update phases without flash-attn).

    python benchmarks/logprob_kernels.py --tokens 1024 2816 --dtype float32 float16 --out logprob_kernels.json

Runs on CUDA (the GPU the script finds) or, slowly, on CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

VOCAB = 151936


def measure(fn, tokens: int, dtype_name: str, device: str, backward: bool, reps: int) -> dict:
    import torch

    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(tokens, VOCAB, device=device, dtype=dtype, generator=g).requires_grad_(backward)
    labels = torch.randint(0, VOCAB, (tokens,), device=device, generator=g)
    cuda = device == "cuda"

    def once():
        out = fn(logits, labels)
        if backward:
            (grad,) = torch.autograd.grad(out.float().sum(), logits)
            return out.detach(), grad
        return out.detach(), None

    result = once()  # warm-up, and the values compared below
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    t = time.perf_counter()
    for _ in range(reps):
        once()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / reps * 1e3
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
    return {"ms": round(ms, 2), "peak_above_logits_MiB": None if peak is None else round(peak, 1)}, result


def main(argv: list[str] | None = None) -> int:
    import torch

    from verl.utils.torch_functional import logprobs_from_logits_v2
    from verl_compat.logprobs import logprobs_blocked

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2816])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float16"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("logprob_kernels.json"))
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for dtype_name in args.dtype:
        for tokens in args.tokens:
            for backward in (False, True):
                row = {"dtype": dtype_name, "tokens": tokens, "backward": backward}
                (row["rowwise"], a), (row["blocked"], b) = (
                    measure(fn, tokens, dtype_name, device, backward, args.reps)
                    for fn in (logprobs_from_logits_v2, logprobs_blocked)
                )
                row["speedup"] = round(row["rowwise"]["ms"] / row["blocked"]["ms"], 1)
                row["max_abs_diff"] = (a[0].double() - b[0].double()).abs().max().item()
                if backward:
                    row["grad_max_abs_diff"] = (a[1].double() - b[1].double()).abs().max().item()
                rows.append(row)
                print(json.dumps(row), flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    report = {"meta": {"device": name, "torch": torch.__version__, "vocab": VOCAB}, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
