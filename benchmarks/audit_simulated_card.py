"""Audit a simulated card's policy on a real GPU: which dtypes every op used, which CUDA kernels ran, whether
Triton or torch.compile ran, and the peak memory, for verl's actor update, reference log-prob, critic update and
the hf rollout engine's generation: the same steps as tests/test_engine_step.py, on CUDA.

    VERL_COMPAT_DEVICE=p40 python benchmarks/audit_simulated_card.py --model PATH --out audit.json
    ... --out host_optim.json -- actor_rollout_ref.actor.fsdp_config.offload_policy=true   # more verl overrides

Prints a table and writes JSON, with whether the update changed every weight and where the optimizer state
lives (FSDP2's CPU offload policy keeps it, and the step, on the host). Exit status 1 when the profile's policy
did not hold (e.g. a bf16 or fp16 op or kernel under p40, a Triton kernel, a torch.compile call).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

# cuBLAS/CUTLASS/flash kernel names that carry a half-precision type: h884/h1688/h16816 = fp16 tensor-core GEMMs
HALF_KERNEL = re.compile(r"bf16|bfloat16|BFloat16|fp16|f16|half|Half|__half|h884|h1688|h16816|hgemm", re.I)
TRITON_KERNEL = re.compile(r"^triton_|triton", re.I)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF model folder (a tiny one or SmolLM2)")
    ap.add_argument("--out", default="audit.json")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("extra", nargs="*", help="after --: more verl overrides for the job's config")
    args = ap.parse_args()
    profile_name = os.environ.get("VERL_COMPAT_DEVICE", "")
    for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    from engine_harness import (
        ALLOWED_HALF,
        actor_update_input,
        compose_ppo_config,
        free_port,
        overrides,
        padded,
        padded_batch,
        params_snapshot,
        to_engine_input,
    )

    os.environ.setdefault("MASTER_PORT", str(free_port()))
    from dtype_audit import DtypeAudit
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl_compat import simulate
    from verl_compat.detect import detect
    from verl_compat.rollout.engine import HFGenerationEngine
    from verl_compat.rollout.loading import torch_dtype

    prof_dev = detect()
    model = Path(args.model)
    config = compose_ppo_config(overrides(model) + list(args.extra))
    audit = DtypeAudit()

    class AuditedEngine(HFGenerationEngine):
        def _decode_run(self, deliver):  # runs in a worker thread: enter the audit there
            with audit:
                return super()._decode_run(deliver)

    # verl's fused head patches the model CLASS's forward (one model config per worker process); here the rollout
    # engine loads the same class in the same process, so it gets transformers' forward back before it does
    from transformers import AutoConfig, AutoModelForCausalLM

    model_class = AutoModelForCausalLM._model_mapping[type(AutoConfig.from_pretrained(model))]  # noqa: SLF001
    transformers_forward = model_class.forward

    torch.cuda.reset_peak_memory_stats()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
        ref = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="ref")
        actor.init_model()
        ref.init_model()
        vocab = actor.actor.engine.module.config.vocab_size if hasattr(actor.actor.engine.module, "config") else 90
        fields = {k: v for k, v in padded_batch(vocab_size=min(vocab, 1000)).items()}
        before = params_snapshot(actor.actor.engine.module)  # on the host: no GPU memory in the peak
        with audit:
            old_td = to_engine_input(fields, calculate_entropy=True, compute_loss=False)
            old = padded(actor.compute_log_prob(old_td), "log_probs", old_td).float()
            ref_td = to_engine_input(fields, calculate_entropy=False, compute_loss=False)
            refl = padded(ref.compute_ref_log_prob(ref_td), "log_probs", ref_td).float()
            upd = actor_update_input(fields, old, refl)
            actor.update_actor(upd)
        train_peak = torch.cuda.max_memory_allocated()
        after = params_snapshot(actor.actor.engine.module)
        optimizer = actor.actor.engine.optimizer
        state_devices = sorted(
            {t.device.type for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t) and t.dim()}
        )
        model_class.forward = transformers_forward
        rcfg = config.actor_rollout_ref.rollout
        attn = config.actor_rollout_ref.model.override_config.get("attn_implementation", "flash_attention_2")
        engine = AuditedEngine(str(model), dtype=torch_dtype(rcfg.dtype), attn_implementation=attn, device="cuda")

        async def gen():
            prompts = [[3 + (7 * i + j) % 50 for j in range(16 + i)] for i in range(args.prompts)]
            params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": args.new_tokens, "logprobs": True}
            return await asyncio.gather(*(engine.generate(p, params, f"r{i}") for i, p in enumerate(prompts)))

        results = asyncio.run(gen())
        torch.cuda.synchronize()
    kernels: dict[str, int] = {}
    for e in prof.key_averages():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            kernels[e.key] = kernels.get(e.key, 0) + e.count
    half_kernels = sorted(k for k in kernels if HALF_KERNEL.search(k))
    triton_kernels = sorted(k for k in kernels if TRITON_KERNEL.search(k))
    allowed = ALLOWED_HALF.get(profile_name, set())
    half_ops = {
        str(d): sorted(ops)
        for d, ops in audit.ops_by_dtype.items()
        if d.is_floating_point and d in {torch.bfloat16, torch.float16} and d not in allowed
    }
    report = {
        "profile": prof_dev.describe(),
        "gpu": torch.cuda.get_device_name(0),
        "resolved": {
            "actor_mixed_precision": str(config.actor_rollout_ref.actor.fsdp_config.get("mixed_precision")),
            "attn_implementation": attn,
            "rollout_name": rcfg.name,
            "rollout_dtype": rcfg.dtype,
            "use_torch_compile": config.actor_rollout_ref.actor.fsdp_config.use_torch_compile,
        },
        "ops_audited": audit.op_count,
        "dtypes_seen": sorted(str(d) for d in audit.dtypes),
        "disallowed_half_ops": half_ops,
        "cuda_kernels": len(kernels),
        "half_kernels": half_kernels[:50],
        "triton_kernels": triton_kernels[:50],
        "dynamo_frames": int(sum(counters["stats"].values())) if "stats" in counters else 0,
        "flash_attn_imported": "flash_attn" in sys.modules,
        "memory_capped_to_profile": bool(simulate._capped),
        "sdpa_flash_cudnn_enabled": [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled()],
        "extra_overrides": list(args.extra),
        "weights_changed": f"{sum(not torch.equal(before[n], after[n]) for n in before)} of {len(before)}",
        "optimizer_state_devices": state_devices,
        "generated_tokens": sum(len(r.token_ids) for r in results),
        "train_peak_gib": round(train_peak / 2**30, 3),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
    }
    ok = not half_ops and not triton_kernels and not report["flash_attn_imported"]
    if not allowed:
        ok = ok and not half_kernels
    report["policy_held"] = ok
    Path(args.out).write_text(json.dumps(report, indent=1))
    for k, v in report.items():
        print(f"{k:24} {v}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
