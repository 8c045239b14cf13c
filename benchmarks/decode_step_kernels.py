"""Where a graphed decode step of the hf rollout engine goes, by CUDA kernel, for variants of the step in one run.

Qwen2.5-0.5B shape with random weights built on the GPU, prompts 128, the engine's own CUDA graph per batch size
(``VERL_COMPAT_DEVICE`` picks the simulated card and so the dtype: p40 fp32, v100 fp16). Per variant: ms per graph
replay (one decode step, sampling included) and the profiler's kernels per step with their device time.

- ``separate``: one GEMM per projection (q, k, v, gate, up), as before the fused layout.
- ``fused``: the engine's fast decoder as it is (q|k|v and gate|up as one GEMM each: rollout/fused_weights.py).
- ``fused_sdpa``: ``fused`` with torch's SDPA (memory-efficient kernel under the simulation) for the attention
  instead of baddbmm + softmax + bmm over the grouped query heads.
- ``fused_split_pv``: ``fused`` with the probabilities x values bmm split along the cache width into chunks
  (more, shorter GEMMs and one sum): at batch 1 that bmm is one GEMM of K = width over 2 (kv-head) batches,
  too few tiles to fill the GPU.

``python benchmarks/decode_step_kernels.py --out benchmarks/results/decode_step_kernels_h200.json`` (GPU only).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

BATCHES = {"p40": (1, 32, 64), "v100": (1, 64)}
VARIANTS = ("separate", "fused", "fused_sdpa", "fused_split_pv")


def _chunks(width: int) -> int:
    """The smallest divisor of the cache width giving chunks of at most 96 columns (width is prime: 1)."""
    return next((c for c in range(2, width) if width % c == 0 and width // c <= 96), 1)


def _variant(name: str, model):
    """The fast decoder with another attention (measured alternatives, not used by the engine)."""
    from verl_compat.rollout.fast_decode import FastDecoder, attention_probs

    class Sdpa(FastDecoder):
        def attend(self, q, keys, values, mask, mask3, scale):
            b, kv, _, d = keys.shape
            q = q.reshape(b, kv, q.shape[1] // kv, d)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)

    class SplitPV(FastDecoder):
        def attend(self, q, keys, values, mask, mask3, scale):
            b, kv, width, d = keys.shape
            group, c = q.shape[1] // kv, _chunks(width)
            probs = attention_probs(q, keys, mask3, scale)
            pc = probs.view(b * kv, group, c, width // c).transpose(1, 2).reshape(b * kv * c, group, width // c)
            return torch.bmm(pc, values.reshape(b * kv * c, width // c, d)).view(b * kv, c, group, d).sum(1)

    return {"fused_sdpa": Sdpa, "fused_split_pv": SplitPV}[name](model)


def replay_ms(graph, n: int = 200) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / n


def kernel_table(graph, n: int = 20) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
    agg: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:90]][0] += 1
            agg[e.name[:90]][1] += getattr(e, "device_time", 0)
    rows = sorted(((v[1] / n, v[0] / n, k) for k, v in agg.items()), reverse=True)
    return {
        "kernels_per_step": sum(r[1] for r in rows),
        "kernel_us_per_step": sum(r[0] for r in rows),
        "top": [[round(us, 1), cnt, name] for us, cnt, name in rows[:25]],
    }


def one_profile(profile: str) -> dict:
    os.environ["VERL_COMPAT_DEVICE"] = profile
    from rollout_decode import PROFILE_DTYPES, engine_run, qwen_05b_config
    from transformers import GenerationConfig, Qwen2ForCausalLM

    from verl_compat import simulate
    from verl_compat.detect import detect
    from verl_compat.rollout.engine import HFGenerationEngine

    simulate.prepare_device(detect())
    dtype = PROFILE_DTYPES[profile]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM._from_config(qwen_05b_config(), dtype=dtype, attn_implementation="sdpa")
    model.eval()
    model.generation_config = GenerationConfig(pad_token_id=0, eos_token_id=None)
    out: dict = {"dtype": str(dtype), "batches": {}}
    g = torch.Generator().manual_seed(1)
    for batch in BATCHES[profile]:
        prompts = torch.randint(0, 151000, (batch, 128), generator=g).tolist()
        engine = HFGenerationEngine(model, device="cuda", enforce_eager=False, max_batch_size=max(BATCHES[profile]))
        engine_run(engine, prompts, lambda i, n: {"temperature": 0, "max_tokens": n, "ignore_eos": True})(16)
        runner = engine.scheduler.runner
        b, mode = next(k for k in runner._graphs if k[0] == batch)
        fast, fused_views = runner.fast, list(runner.fast._fused)
        rec: dict = {}
        for name in VARIANTS:
            fast._fused = [(None, None)] * len(fused_views) if name == "separate" else fused_views
            runner.fast = _variant(name, model) if name.startswith("fused_") else fast
            runner.drop_graphs()
            runner.step(b, mode)  # captures this variant's graph (its warm-up steps are undone)
            graph = runner._graphs[(b, mode)]
            rec[name] = {"replay_ms": replay_ms(graph), "kernels": kernel_table(graph)}
        fast._fused, runner.fast = fused_views, fast
        rec["fused_vs_separate"] = rec["fused"]["replay_ms"] / rec["separate"]["replay_ms"]
        for name in VARIANTS[2:]:
            rec[f"{name}_vs_fused"] = rec[name]["replay_ms"] / rec["fused"]["replay_ms"]
        out["batches"][str(batch)] = rec
        engine.scheduler.release()
        del engine
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/decode_step_kernels_h200.json")
    ap.add_argument("--profiles", default="p40,v100")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.one:
        print("RESULT " + json.dumps(one_profile(args.one)))
        return
    results = {"meta": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}}
    for profile in args.profiles.split(","):  # one child per profile: the simulation caps the whole process
        proc = subprocess.run([sys.executable, __file__, "--one", profile], capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), "")
        results[profile] = json.loads(line[7:]) if line else {"error": proc.stderr[-2000:]}
        for batch, rec in results[profile].get("batches", {}).items():
            ms = {k: round(rec[k]["replay_ms"], 3) for k in VARIANTS}
            print(f"{profile} batch {batch}: ms per step {ms}, fused/separate {rec['fused_vs_separate']:.3f}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
