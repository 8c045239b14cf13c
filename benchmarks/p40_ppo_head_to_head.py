"""The seeds' PPO job on a simulated P40 (or T4): the seed recipe's settings vs verl-compat's own plan, one run.

Both sides run `benchmarks/ppo_job.py`'s job (PPO + GAE critic + KL-in-reward reference, Qwen2.5-0.5B shape with
random weights, GSM8K prompts, 256 + 256 tokens):
- `a_seed_recipe`: ppo_job's setting (batch/mini/micro 1, eager attention, parameter + optimizer offload);
- `planned`: the same job with the batch of the seeds' job (32 prompts, mini-batch 32) and NOTHING else: every
  memory value (micro-batches, offload, gradient checkpointing, rollout batch) and the attention are left to
  verl-compat's planner and resolvers; no hand tuning.

Reported per side: tokens/s (verl's perf/total_num_tokens over timing_s/step, medians of steps 2+), the per-phase
breakdown, start-up before step 1, the peak of nvidia-smi's card total (every process, sampled each second) and
the plan's own estimate. Then: the tokens/s ratio (target >= 20x), and the planned step against its compute floor
(the model's FLOPs for the step over the matmul rate measured here on the same GPU, in the train dtype; target
within 2x), and memory <= the simulated card throughout.

    VERL_COMPAT_DEVICE=p40 python benchmarks/p40_ppo_head_to_head.py --steps 5 \
        --out benchmarks/results/p40_h200_ppo_head_to_head.json
    # one side per device call (each ~5 min), merged into the same --out:
    ... --settings a_seed_recipe ; ... --settings planned
    # a run longer than one device call, its steps and memory samples so far in FILE every 30 s
    # (benchmarks/long_run_summary.py reports them by span of steps):
    ... --settings planned --steps 300 --timeout-s 1800 --progress FILE
    # another model shape: a 1.5B PPO job fits a 24 GB (or 16 GB) card only under FSDP2's CPU offload policy,
    # which the plan turns on itself; the planned side's own verl overrides, if any, go after `--`:
    ... --settings planned --shape qwen2.5-1.5b
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo_job  # noqa: E402  (benchmarks/ppo_job.py: assets, settings, runner, nvidia-smi sampler)

PLANNED = "planned"
ppo_job.SETTINGS.setdefault(  # the seeds' batch; the rest is verl-compat's
    PLANNED, ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32"]
)
TRAIN_DTYPE = {"p40": "float32", "p100": "float16", "v100": "float16", "t4": "float16"}


def matmul_tflops(dtype_name: str, n: int = 8192, reps: int = 20) -> float:
    """Dense GEMM rate on this GPU in `dtype_name` (TF32 off: a P40 has none, so fp32 means fp32)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    rate = 2 * n**3 * reps / (time.perf_counter() - t) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return rate


def step_flops(params: int, tokens: float, response_tokens: float) -> float:
    """Model FLOPs of one PPO step: actor update (6P per token), old log-prob, reference and values (2P each),
    critic update (6P), and generation (2P per generated token)."""
    return params * (tokens * (6 + 2 + 2 + 2 + 6) + 2 * response_tokens)


def planned_figures(sides: dict[str, Any], params: int, tflops: float) -> dict[str, Any]:
    """The planned step against its compute floor, and (with the seed side) the tokens/s ratio."""
    out: dict[str, Any] = {}
    p = sides[PLANNED]
    if p["tokens_per_step"] and p["step_s"]:
        floor = step_flops(params, p["tokens_per_step"], 32 * ppo_job.RESPONSE_TOKENS) / (tflops * 1e12)
        out["planned_vs_floor"] = {"floor_s": floor, "step_s": p["step_s"], "ratio": p["step_s"] / floor}
    a = sides.get("a_seed_recipe")
    if a and a["tokens_per_s"] and p["tokens_per_s"]:
        out["tokens_per_s_ratio"] = p["tokens_per_s"] / a["tokens_per_s"]
    return out


def _median(result: dict[str, Any], key: str) -> float | None:
    return result["summary"].get(key, {}).get("median_after_first")


def side_report(result: dict[str, Any]) -> dict[str, Any]:
    step, tokens = _median(result, "timing_s/step"), _median(result, "perf/total_num_tokens")
    phases = {
        k.split("/", 1)[1]: v["median_after_first"]
        for k, v in result["summary"].items()
        if k.startswith("timing_s/") and v["median_after_first"] is not None
    }
    return {
        "returncode": result["returncode"],
        "steps_completed": result["steps_completed"],
        "tokens_per_step": tokens,
        "step_s": step,
        "tokens_per_s": (tokens / step) if step and tokens else None,
        "phases_s": phases,
        "startup_s": result["startup_s"],
        # step 1 carries what starts lazily (first-call costs, any process not yet up): the start-up figure
        # above stops where step 1 begins, so a user's wait for the first step is this one
        "first_step_s": (result["summary"]["timing_s/step"]["per_step"] or [None])[0],
        "to_first_step_end_s": result["step_seen_s"].get(1),
        "peak_card_mib": result["memory"]["peak_total_mib"],
        "host_peak_above_base_mib": result["memory"].get("host_peak_above_base_mib"),
        "oom": "OutOfMemoryError" in Path(result["log"]).read_text(errors="replace") if result["log"] else None,
    }


def plan_estimate(assets: ppo_job.Assets, profile: str, extra: list[str] = ()) -> dict[str, Any]:
    """The planner's own view of the planned side (what the driver will decide), for the record."""
    from verl_compat.catalog import get_profile
    from verl_compat.detect import reset_cache
    from verl_compat.policy import default_policy

    reset_cache()
    overrides = [
        *ppo_job.COMMON,
        *ppo_job.SETTINGS[PLANNED],
        f"actor_rollout_ref.model.path={assets.model_dir}",
        f"critic.model.path={assets.model_dir}",
        *extra,
    ]
    decisions = default_policy(get_profile(profile), overrides)
    plan = decisions["memory.plan"]
    return {"value": dict(plan.value or {}), "table": list(plan.reasons)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=f"a_seed_recipe,{PLANNED}")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--assets", type=Path, default=Path("/tmp/ppo-job-assets"))
    ap.add_argument("--out", type=Path, default=Path("p40_ppo_head_to_head.json"))
    ap.add_argument("--timeout-s", type=float, default=560, help="per side")
    ap.add_argument("--trace", action="store_true", help="start-up timeline of every process (startup_trace)")
    ap.add_argument(
        "--progress", type=Path, default=None, help="the running side's result so far, rewritten every 30 s"
    )
    ap.add_argument("--shape", choices=sorted(ppo_job.SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: verl overrides for the planned side only")
    args = ap.parse_args(argv)
    ppo_job.stop_on_sigterm()
    extra = [a for a in args.extra if a != "--"]
    profile = os.environ.get("VERL_COMPAT_DEVICE")
    if profile not in TRAIN_DTYPE:
        print(f"set VERL_COMPAT_DEVICE to one of {sorted(TRAIN_DTYPE)} (the simulated card)", file=sys.stderr)
        return 2
    from verl_compat.catalog import get_profile

    card_mib = get_profile(profile).total_memory_bytes / 2**20
    assets = ppo_job.build_assets(args.assets, args.shape)
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    report.update(profile=profile, card_mib=card_mib, steps=args.steps, shape=args.shape, planned_extra=extra)
    report.setdefault("sides", {})
    report["plan"] = plan_estimate(assets, profile, extra)
    for setting in args.settings.split(","):
        result = ppo_job.run_setting(
            setting,
            assets,
            args.steps,
            Path(f"/tmp/h2h-{profile}-{args.shape}-{setting}"),  # one folder per job: logs of a run survive the next
            extra=extra if setting == PLANNED else (),
            timeout_s=args.timeout_s,
            trace=args.trace,
            progress=args.progress,
        )
        report["sides"][setting] = {**side_report(result), "raw": result}
        args.out.write_text(json.dumps(report, indent=1, default=str))  # kept if a later side is cut short
        if ppo_job.STOP.is_set():
            break
    if "matmul_tflops" not in report:
        report["matmul_tflops"] = matmul_tflops(TRAIN_DTYPE[profile])
    sides = report["sides"]
    if PLANNED in sides:  # the floor needs the planned side only; the ratio needs both
        from transformers import AutoConfig

        from verl_compat.planner.shape import ModelShape

        params = ModelShape.from_config(AutoConfig.from_pretrained(assets.model_dir)).lm_params
        report.update(planned_figures(sides, params, report["matmul_tflops"]))
    report["memory_within_card"] = {s: (v["peak_card_mib"] or 0) <= card_mib for s, v in sides.items()}
    args.out.write_text(json.dumps(report, indent=1, default=str))
    for name, side in sides.items():
        print(
            f"{name:14} rc {side['returncode']} steps {side['steps_completed']} tokens/s {side['tokens_per_s']} "
            f"step {side['step_s']} s startup {side['startup_s']} s step 1 {side['first_step_s']} s "
            f"(ends at {side['to_first_step_end_s']} s) peak {side['peak_card_mib']} MiB "
            f"(card {card_mib:.0f}) host +{side.get('host_peak_above_base_mib')} MiB oom {side['oom']}"
        )
        print(f"{'':14} phases {side['phases_s']}")
    for key in ("tokens_per_s_ratio", "planned_vs_floor", "matmul_tflops", "memory_within_card"):
        print(f"{key}: {report.get(key)}")
    return 0 if all(s["returncode"] == 0 for s in sides.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
