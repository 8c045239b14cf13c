"""What the model code itself reaches on this GPU, outside verl: forward+backward and forward-only log-probs of the
Qwen2.5-0.5B shape (random weights) per micro-batch size, in the train dtype, against the dense matmul rate.

It separates the two halves of a planned PPO step's distance from its compute floor: the model's own efficiency at
a micro-batch size (this script) and what verl's loop adds around it (p40_ppo_head_to_head.py's phases). It also
gives the measured peak memory per micro-batch that the planner's activation estimate is checked against.

    python benchmarks/train_microbatch_rate.py --dtype float32 --micro 1 2 4 8 16 --out rate.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo_job  # noqa: E402
from p40_ppo_head_to_head import matmul_tflops  # noqa: E402


def log_probs(logits, labels):
    import torch

    return torch.gather(logits.log_softmax(-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def measure(model, micro: int, seq: int, train: bool, reps: int) -> dict:
    import torch

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (micro, seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()

    def once():
        if train:
            out = model(input_ids=ids).logits.float()
            loss = log_probs(out[:, :-1], ids[:, 1:]).mean()
            loss.backward()
            model.zero_grad(set_to_none=False)
        else:
            with torch.no_grad():
                log_probs(model(input_ids=ids).logits.float()[:, :-1], ids[:, 1:])

    once()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        once()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t) / reps
    params = sum(p.numel() for p in model.parameters())
    flops = (6 if train else 2) * params * micro * seq
    return {
        "micro": micro,
        "train": train,
        "tokens_per_s": round(micro * seq / seconds),
        "tflops": round(flops / seconds / 1e12, 2),
        "peak_above_weights_mib": round((torch.cuda.max_memory_allocated() - base) / 2**20),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--seq", type=int, default=2 * ppo_job.PROMPT_TOKENS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    rate = matmul_tflops(args.dtype)
    torch.manual_seed(0)
    with torch.device("cuda"):
        config = Qwen2Config(**ppo_job.SHAPES["qwen2.5-0.5b"], attn_implementation=args.attn)
        model = Qwen2ForCausalLM(config).to(getattr(torch, args.dtype))
    rows = []
    for train in (False, True):
        for micro in args.micro:
            try:
                row = measure(model, micro, args.seq, train, args.reps)
            except torch.OutOfMemoryError:
                row = {"micro": micro, "train": train, "oom": True}
            row["of_matmul_rate"] = round(row["tflops"] / rate, 3) if "tflops" in row else None
            rows.append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    report = {"dtype": args.dtype, "attn": args.attn, "seq": args.seq, "matmul_tflops": round(rate, 2), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(f"matmul rate {rate:.1f} TFLOP/s ({args.dtype}, TF32 off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
