"""AdamW's step on the host, three torch implementations in one run: the per-parameter loop (torch's default for
host tensors), foreach, and the fused host kernel (what `memory.optimizer_step` picks under FSDP2's CPU offload
policy). Qwen2.5-1.5B-sized matrices, fp32, seconds per step and the ratio to the loop; the values of the three
after the same steps are compared too.

    python benchmarks/host_adamw.py --params 2e8 --out benchmarks/results/host_adamw_cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

IMPLS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
SHAPES = [(1536, 1536)] * 4 + [(8960, 1536)] * 3  # one Qwen2.5-1.5B layer's attention and MLP matrices


def run(params: float, steps: int) -> dict:
    per_layer = sum(a * b for a, b in SHAPES)
    layers = max(1, int(params) // per_layer)
    out: dict = {"params": layers * per_layer, "threads": torch.get_num_threads(), "seconds_per_step": {}}
    finals = {}
    for name, flags in IMPLS.items():
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(s, generator=gen, requires_grad=True) for _ in range(layers) for s in SHAPES]
        for w in weights:
            w.grad = torch.randn(w.shape, generator=gen)
        opt = torch.optim.AdamW(weights, lr=1e-3, **flags)
        opt.step()  # state allocated outside the timing
        t = time.perf_counter()
        for _ in range(steps):
            opt.step()
        out["seconds_per_step"][name] = (time.perf_counter() - t) / steps
        finals[name] = weights[0].detach().clone()
        del opt, weights
    loop = out["seconds_per_step"]["loop"]
    out["vs_loop"] = {k: v / loop for k, v in out["seconds_per_step"].items()}
    out["max_abs_diff_vs_loop"] = {k: float((v - finals["loop"]).abs().max()) for k, v in finals.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=2e8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    result = run(args.params, args.steps)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
