"""Why the reference's first forward of a PPO job takes seconds: FSDP1's CPUOffload, as verl wraps the reference.

verl wraps a forward-only model (the reference) in FSDP1 with ``CPUOffload(offload_params=True)``. FSDP1's lazy
init, at the first forward, pins each unit's flat parameter (a pinned copy) and allocates a pinned zero gradient
of the same size for the backward; a reference never runs one. In the planned P40 job (Qwen2.5-0.5B in fp32) the
first reference pass took 4.0-4.5 s and every later one 0.46 s. This times, on one GPU, the same wrapping of the
same shape (random weights): the first and second forward as torch does it; the first forward when the flat
parameters were pinned beforehand; after verl-compat's background initialisation (verl_compat.offload_init,
joined before the forward here); and the two host allocations alone (pinned copy, pinned zeros) at the model's size.

    python benchmarks/fsdp_offload_first_pass.py --out benchmarks/results/fsdp_offload_first_pass_h100.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from verl_compat import offload_init

SHAPE = dict(  # Qwen2.5-0.5B (benchmarks/ppo_job.py's QWEN25_05B)
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
)  # fmt: skip


def build_wrapped() -> torch.nn.Module:
    from torch.distributed.fsdp import CPUOffload, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, attn_implementation="sdpa")).to(torch.float32)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Qwen2DecoderLayer})
    return FSDP(  # verl's reference: transformer_impl.py's FSDP1 branch, forward_only
        model, auto_wrap_policy=policy, device_id=torch.cuda.current_device(),
        sharding_strategy=ShardingStrategy.NO_SHARD, sync_module_states=True,
        cpu_offload=CPUOffload(offload_params=True),
    )  # fmt: skip


def flat_params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [handle.flat_param for handle in offload_init.handles(module)]


def timed_forward(module: torch.nn.Module, ids: torch.Tensor) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad():
        module(input_ids=ids).logits.sum().item()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def host_allocations(numel: int) -> dict[str, float]:
    """The two allocations of the lazy init at this size, alone."""
    src = torch.empty(numel, dtype=torch.float32)
    src.fill_(1.0)
    t = time.perf_counter()
    pinned = src.pin_memory()
    copy_s = time.perf_counter() - t
    t = time.perf_counter()
    grad = torch.zeros_like(src).pin_memory()
    zeros_s = time.perf_counter() - t
    del src, pinned, grad
    offload_init.empty_host_cache()
    return {"pinned_copy_s": copy_s, "pinned_zeros_s": zeros_s}


def _pinned_bytes() -> int | None:
    stats = torch.cuda.memory.host_memory_stats()
    return stats.get("allocated_bytes.current", stats.get("active_bytes.current"))


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return round(kib / 1024, 1)


def variant(name: str, ids: torch.Tensor, before: str) -> dict[str, Any]:
    rss_at_start, pinned_at_start = _rss_mib(), _pinned_bytes() or 0
    module = build_wrapped()
    params = flat_params(module)
    out: dict[str, Any] = {"variant": name, "units": len(params), "bytes": sum(p.numel() * 4 for p in params)}
    t = time.perf_counter()
    if before == "prepin":
        for p in params:
            p.data = p.data.pin_memory()
    elif before == "verl_compat":  # the seam's own code: background init, then the wait a job has before the pass
        offload_init.start(module).join()
    out["before_forward_s"] = time.perf_counter() - t
    out["first_forward_s"] = timed_forward(module, ids)
    out["second_forward_s"] = timed_forward(module, ids)
    out["third_forward_s"] = timed_forward(module, ids)
    grads = [p._cpu_grad for p in params if getattr(p, "_cpu_grad", None) is not None]
    out["cpu_grad_pinned_bytes"] = sum(g.untyped_storage().nbytes() for g in grads if g.is_pinned())
    out["cpu_grad_unpinned_bytes"] = sum(g.untyped_storage().nbytes() for g in grads if not g.is_pinned())
    out["pinned_host_bytes"] = _pinned_bytes()  # torch's pinned host allocator, cached blocks included
    out["process_rss_mib"] = _rss_mib()  # what the host holds for this process: an unwritten buffer holds none
    # this variant's own share (the model's host copy, its pinned buffers): variants run in turn in one process
    out["pinned_host_bytes_added"] = (out["pinned_host_bytes"] or 0) - pinned_at_start
    out["process_rss_mib_added"] = round(out["process_rss_mib"] - rss_at_start, 1)
    del module, params, grads
    gc.collect()  # FSDP's modules hold reference cycles: freed here, not at the next variant's build
    torch.cuda.empty_cache()
    offload_init.empty_host_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--out", type=Path, default=Path("fsdp_offload_first_pass.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fsdp_offload_first_pass: needs a CUDA GPU (FSDP1's CPUOffload pins host memory for one)")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    torch.backends.cuda.matmul.allow_tf32 = False
    ids = torch.randint(0, SHAPE["vocab_size"], (args.rows, args.seq), device="cuda")
    runs = []
    for name, before in (
        ("as torch does (upstream)", ""),
        ("verl-compat: memory.offload_init=at_build (joined here)", "verl_compat"),
        ("flat parameters pinned beforehand", "prepin"),
    ):
        runs.append(variant(name, ids, before))
        print(json.dumps(runs[-1]), flush=True)  # each as it ends: a run cut short still says what it measured
    numel = runs[0]["bytes"] // 4
    result = {
        "what": __doc__.split("\n\n")[0],
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "input": [args.rows, args.seq],
        "runs": runs,
        "host_allocations_at_model_size": host_allocations(numel),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
