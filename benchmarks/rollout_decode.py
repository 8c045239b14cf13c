"""Decode speed of the hf rollout engine against plain ``generate`` and transformers' own continuous batching
(``generate_batch``, paged attention), on a real GPU under simulated-card policies, in one run.

    python benchmarks/rollout_decode.py --out benchmarks/results/rollout_decode_h200.json

Runs each profile (default ``p40`` fp32 and ``v100`` fp16, the policies' rollout dtypes) in its own child process
(``VERL_COMPAT_DEVICE`` set there, memory capped to the card by ``verl_compat.simulate``). Model: Qwen2ForCausalLM
in the Qwen2.5-0.5B shape with random weights built on the GPU. Prompts of 128 random tokens, 256 new tokens,
EOS ignored so every row runs the full length, batch 1 and 64.

ms per decode step = (time for 256 new tokens - time for 1 new token) / 255, so prefill and set-up cancel out.
Floors measured here: weight read = weight bytes / device copy bandwidth; compute = 2 * params * batch / matmul
rate in the model dtype. Checks: greedy tokens against plain ``generate`` (exact, and "argmax up to a tie": the
engine's token has the top logit of a recomputed forward within the dtype's tolerance) and sampled log-probs
against a recomputed forward (max abs difference; 1e-4 fp32, 1e-2 fp16). ``engine_graphs_check32``: the engine
reading its stop flags every 32 decode steps instead of 8 (timing only), which says what the host round costs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

PROFILE_DTYPES = {"p40": torch.float32, "v100": torch.float16}  # the policy's rollout dtype per card (DESIGN.md)
LOGPROB_TOL = {torch.float32: 1e-4, torch.float16: 1e-2}
PROMPT, NEW, BATCHES = 128, 256, (1, 64)


def qwen_05b_config():
    from ppo_job import QWEN25_05B  # one Qwen2.5-0.5B shape for every benchmark (this folder is on sys.path)
    from transformers import Qwen2Config

    return Qwen2Config(**QWEN25_05B, bos_token_id=151643, eos_token_id=151645)


def sync_time(fn, repeat: int = 1) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeat


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = sync_time(lambda: dst.copy_(src), repeat=20)
    return 2 * n / t


def matmul_rate(dtype: torch.dtype) -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    a @ b
    t = sync_time(lambda: a @ b, repeat=10)
    return 2 * n**3 / t


def weight_bytes(model) -> tuple[int, int]:
    seen, nbytes, params = set(), 0, 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        nbytes += p.numel() * p.element_size()
        params += p.numel()
    return nbytes, params


def per_step_ms(run, new_tokens: int = NEW) -> tuple[float, float]:
    """(ms per decode step, seconds for the full run), from a run of `new_tokens` and one of 1 token."""
    # Warm at full length: the engine's cache grows to what the timed run needs and its graphs are captured for
    # it (a shorter warm-up left one cache growth and graph capture inside the timed run).
    run(new_tokens)
    full = sync_time(lambda: run(new_tokens))
    one = sync_time(lambda: run(1))
    return 1000 * (full - one) / (new_tokens - 1), full


def engine_run(engine, prompts, params_for):
    async def go(n):
        calls = [engine.generate(p, params_for(i, n), f"r{i}-{n}-{time.monotonic_ns()}") for i, p in enumerate(prompts)]
        return await asyncio.gather(*calls)

    return lambda n: asyncio.run(go(n))


def greedy_checks(ref, prompts, tokens, expected, tol: float) -> dict:
    """Exact equality with generate's tokens, and whether every engine token is the argmax of a recomputed
    forward up to `tol` (a near-tie of random weights in the model dtype may go either way)."""
    exact = sum(int(a == b) for a, b in zip(tokens, expected, strict=True))
    matched = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a)) for a, b in
               zip(tokens, expected, strict=True)]  # fmt: skip
    worst_gap = 0.0
    for i in range(0, len(prompts), 8):
        ids = torch.tensor([p + t for p, t in zip(prompts[i : i + 8], tokens[i : i + 8], strict=True)], device="cuda")
        with torch.no_grad():
            logits = ref(ids).logits[:, PROMPT - 1 : -1].float()
        chosen = logits.gather(2, ids[:, PROMPT:].unsqueeze(2)).squeeze(2)
        gap = (logits.max(dim=2).values - chosen).max().item()
        worst_gap = max(worst_gap, gap)
        del logits
    return {
        "rows_exact": exact,
        "rows": len(tokens),
        "mean_tokens_before_first_difference": sum(matched) / len(matched),
        "max_logit_gap_to_argmax": worst_gap,
        "argmax_up_to_tie": worst_gap <= tol * 10,
    }


def logprob_check(ref, prompts, results) -> float:
    worst = 0.0
    for i in range(0, len(prompts), 8):
        ids = torch.tensor(
            [p + r.token_ids for p, r in zip(prompts[i : i + 8], results[i : i + 8], strict=True)], device="cuda"
        )
        with torch.no_grad():
            lp = torch.log_softmax(ref(ids).logits[:, PROMPT - 1 : -1].float(), dim=-1)
        rec = lp.gather(2, ids[:, PROMPT:].unsqueeze(2)).squeeze(2)
        got = torch.tensor([r.log_probs for r in results[i : i + 8]], device="cuda")
        worst = max(worst, (rec - got).abs().max().item())
        del lp
    return worst


def run_generate_batch(model, prompts, new_tokens: int, graphs: bool):
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gc = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=-1, pad_token_id=0)
    blocks = len(prompts) * ((PROMPT + NEW) // 256 + 2)
    cb = ContinuousBatchingConfig(
        block_size=256, num_blocks=blocks, max_batch_tokens=len(prompts) * PROMPT, use_cuda_graph=graphs
    )
    out = model.generate_batch(
        prompts, generation_config=gc, continuous_batching_config=cb, progress_bar=False, warmup=graphs
    )
    return [out[k].generated_tokens for k in sorted(out, key=lambda k: int(k.split("_")[-1]))]


def kernel_stats(engine, prompts) -> dict:
    """CUDA kernels per decode step and their summed device time (profiler over an eager run of 33 tokens minus
    one of 1 token): with graphs the step costs about this kernel time, so it says what bounds the step."""
    from torch.profiler import ProfilerActivity, profile

    run = engine_run(engine, prompts, lambda i, n: {"temperature": 0, "max_tokens": n, "ignore_eos": True})

    def measure(n):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(n)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return len(kernels), sum(getattr(e, "device_time", 0) for e in kernels)

    (k1, t1), (k2, t2) = measure(1), measure(33)
    return {"kernels_per_step": (k2 - k1) / 32, "kernel_us_per_step": (t2 - t1) / 32}


def engine_variant(
    row: dict, name: str, eager: bool, ref, prompts, expected, tol: float, fast: bool, check_every: int = 8
) -> None:
    from verl_compat.rollout.engine import HFGenerationEngine

    engine = HFGenerationEngine(
        copy.deepcopy(ref),
        device="cuda",
        enforce_eager=eager,
        max_batch_size=max(BATCHES),
        stop_check_interval=check_every,
    )
    engine.scheduler.fast_decode = fast  # False: the model's own HF forward through the slot cache
    greedy = engine_run(engine, prompts, lambda i, n: {"temperature": 0, "max_tokens": n, "ignore_eos": True})
    row[f"{name}_ms"], _ = per_step_ms(greedy)
    if check_every != 8:
        return  # timing only: what the host round every `check_every` steps costs per step
    if eager and fast:
        try:
            row["eager_step_kernels"] = kernel_stats(engine, prompts)
        except Exception as exc:  # noqa: BLE001 - a diagnostic only
            row["eager_step_kernels"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    if eager or not fast:
        return
    results = greedy(NEW)
    row["greedy"] = greedy_checks(ref, prompts, [r.token_ids for r in results], expected, tol)
    sampled = engine_run(
        engine,
        prompts,
        lambda i, n: {
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "logprobs": True,
            "max_tokens": n,
            "ignore_eos": True,
            "seed": i,
        },  # fmt: skip
    )
    row["engine_graphs_sampled_ms"], _ = per_step_ms(sampled)
    row["sampled_logprob_max_abs_diff"] = logprob_check(ref, prompts, sampled(NEW))
    row["sampled_logprob_tol"] = tol
    row["graphs_captured"] = engine.scheduler.runner.captures
    row["kv_cache_MiB"] = engine.scheduler.cache.nbytes / 2**20
    row["decode_path"] = "fast Llama-style step" if engine.scheduler.runner.fast is not None else "HF forward"


def one_profile(profile: str, library: bool = True, eager_variant: bool = True) -> dict:
    os.environ["VERL_COMPAT_DEVICE"] = profile
    from transformers import GenerationConfig, Qwen2ForCausalLM

    from verl_compat import simulate
    from verl_compat.detect import detect

    prof = detect()
    simulate.prepare_device(prof)
    dtype = PROFILE_DTYPES[profile]
    tol = LOGPROB_TOL[dtype]
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = Qwen2ForCausalLM._from_config(qwen_05b_config(), dtype=dtype, attn_implementation="sdpa")
    ref.eval()
    ref.generation_config = GenerationConfig(pad_token_id=0, eos_token_id=None)  # every row runs NEW tokens
    nbytes, params = weight_bytes(ref)
    bw = copy_bandwidth()
    rate = matmul_rate(dtype)
    rec = {
        "profile": prof.describe(),
        "dtype": str(dtype),
        "weight_bytes": nbytes,
        "params": params,
        "copy_bandwidth_GBps": bw / 1e9,
        "matmul_TFLOPS": rate / 1e12,
        "weight_floor_ms": 1000 * nbytes / bw,
        "rows": {},
    }
    g = torch.Generator().manual_seed(1)
    for batch in BATCHES:
        prompts = torch.randint(0, 151000, (batch, PROMPT), generator=g).tolist()
        row: dict = {"compute_floor_ms": 1000 * 2 * params * batch / rate}
        ids = torch.tensor(prompts, device="cuda")
        mask = torch.ones_like(ids)

        def gen(n, ids=ids, mask=mask):
            with torch.no_grad():
                return ref.generate(
                    ids, attention_mask=mask, do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0
                )

        row["generate_ms"], _ = per_step_ms(gen)
        expected = gen(NEW)[:, PROMPT:].tolist()

        variants = (  # (name, eager, fast decoder, decode steps between stop checks)
            ("engine_graphs", False, True, 8),
            ("engine_graphs_hf_forward", False, False, 8),
            ("engine_graphs_check32", False, True, 32),
            ("engine_eager", True, True, 8),
        )
        for name, eager, fast, check_every in variants if eager_variant else variants[:3]:
            try:
                engine_variant(row, name, eager, ref, prompts, expected, tol, fast, check_every)
            except Exception as exc:  # noqa: BLE001 - recorded, the other variants still run
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                import traceback

                traceback.print_exc()
            torch.cuda.empty_cache()

        for name, graphs in (("generate_batch", False), ("generate_batch_graphs", True)) if library else ():
            cb_model = copy.deepcopy(ref)
            try:
                row[f"{name}_ms"], _ = per_step_ms(
                    lambda n, m=cb_model, p=prompts, g=graphs: run_generate_batch(m, p, n, g)
                )
                toks = run_generate_batch(cb_model, prompts, NEW, graphs)
                row[f"{name}_rows_exact"] = sum(int(a == b) for a, b in zip(toks, expected, strict=True))
            except Exception as exc:  # noqa: BLE001 - recorded: the library path is one of the variants compared
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            torch.cuda.empty_cache()
        row["peak_memory_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        for key in [k for k in row if k.endswith("_ms") and k != "compute_floor_ms"]:
            row[key.replace("_ms", "_x_floor")] = row[key] / rec["weight_floor_ms"]
        rec["rows"][str(batch)] = row
    return rec


def table(results: dict) -> str:
    lines = []
    for profile, rec in results.items():
        if "error" in rec:
            lines.append(f"{profile}: ERROR {rec['error']}")
            continue
        lines.append(
            f"{profile} {rec['dtype']}: weight floor {rec['weight_floor_ms']:.3f} ms "
            f"({rec['weight_bytes'] / 1e9:.2f} GB at {rec['copy_bandwidth_GBps']:.0f} GB/s), "
            f"matmul {rec['matmul_TFLOPS']:.1f} TFLOPS"
        )
        lines.append("  batch | variant                 | ms/step | x floor")
        for batch, row in rec["rows"].items():
            lines.append(f"  {batch:>5} | compute floor           | {row['compute_floor_ms']:7.3f} |")
            for key in [k for k in row if k.endswith("_ms") and k != "compute_floor_ms"]:
                v = key[:-3]
                lines.append(f"  {batch:>5} | {v:<23} | {row[key]:7.3f} | {row[v + '_x_floor']:6.1f}")
            for key in [k for k in row if k.endswith("_error")]:
                lines.append(f"  {batch:>5} | {key[:-6]:<23} | error: {row[key][:80]}")
            ks = row.get("eager_step_kernels", {})
            if "kernels_per_step" in ks:
                lines.append(
                    f"  {batch:>5} | kernels per step {ks['kernels_per_step']:.0f}, "
                    f"summed kernel time {ks['kernel_us_per_step'] / 1000:.3f} ms"
                )
            gr = row.get("greedy", {})
            lines.append(
                f"  {batch:>5} | greedy vs generate: {gr.get('rows_exact')}/{gr.get('rows')} rows exact, "
                f"argmax up to tie {gr.get('argmax_up_to_tie')} (gap {gr.get('max_logit_gap_to_argmax', 0):.2e}); "
                f"sampled log-prob diff {row.get('sampled_logprob_max_abs_diff', float('nan')):.2e} "
                f"(tol {row.get('sampled_logprob_tol')})"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/rollout_decode_h200.json")
    ap.add_argument("--profiles", default="p40,v100")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--no-eager", action="store_true", help="leave out the eager engine")
    ap.add_argument(
        "--skip-library", action="store_true", help="leave out transformers' generate_batch (measured separately)"
    )
    args = ap.parse_args()
    if args.one:
        print(
            "RESULT "
            + json.dumps(one_profile(args.one, library=not args.skip_library, eager_variant=not args.no_eager))
        )
        return 0
    results = {}
    for profile in args.profiles.split(","):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                profile,
                *(["--skip-library"] if args.skip_library else []),
                *(["--no-eager"] if args.no_eager else []),
            ],
            capture_output=True,
            text=True,
            env=dict(os.environ),
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        results[profile] = json.loads(line[7:]) if line else {"error": proc.stderr[-2000:]}
        if line is None:
            print(proc.stderr[-4000:], file=sys.stderr)
    import transformers

    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "prompt": PROMPT,
        "new_tokens": NEW,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
