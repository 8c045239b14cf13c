"""The PPO job (benchmarks/ppo_job.py) on 2 cards vs 1 card, per simulated card, in one run (issue 11).

    python benchmarks/two_card_ppo.py --devices t4 p40 --steps 4 --out benchmarks/results/two_card_ppo_h200x2.json

Needs a host with 2 GPUs (`nvidia-h200-x2`); each job gets ``VERL_COMPAT_DEVICE=<device>``, so every process caps
its allocator to that card (verl_compat.simulate). Per device it runs the setting (default ``b_batch32``) with
``trainer.n_gpus_per_node=1`` and then ``=2`` (FSDP over 2 ranks, NCCL, one hf rollout replica per rank), and
reports:
- tokens/s = ``perf/total_num_tokens / timing_s/step`` (median of steps 2+; verl's ``perf/throughput`` is per GPU)
  and the 2-card / 1-card ratio (target >= 1.8);
- memory per card: peak of nvidia-smi's ``memory.used`` per GPU (every process on that GPU), against the card's;
- NCCL errors: lines of the job's log that report one (verl runs with NCCL_DEBUG=WARN);
- non-finite losses (pg / value / KL penalty): a job that does not train is no result;
- rollout replicas that served requests (one per card expected) and step/gen/update_weights medians.

Scaling: ``weak`` (default) keeps the per-card batch, so 2 cards train ``train_batch_size`` x 2 prompts per step (how
a second card is used for data parallelism); ``strong`` keeps the global batch. A call limited to 10 minutes can
run the jobs in parts: ``--reuse`` keeps each finished job's result in ``--work`` and skips it next time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.ppo_job import SETTINGS, build_assets, median_after_first, print_rows, run_setting  # noqa: E402

SCALING_TARGET = 1.8
GPU_IN_USE_MIB = 512  # a GPU whose peak stays below this ran no job process (an idle H200 shows a few MiB)
NCCL_ERROR = re.compile(
    r"NCCL WARN|NCCL error|nccl(InternalError|SystemError|InvalidUsage|RemoteError|UnhandledCudaError)"
    r"|ProcessGroupNCCL.*(error|timed? ?out|watchdog)|DistBackendError",
    re.IGNORECASE,
)
# a fp16 step the scaler skips may report an inf grad norm; a non-finite loss means the job does not train
LOSS_KEYS = ("actor/pg_loss", "critic/vf_loss", "actor/reward_kl_penalty")
BATCH_KEYS = ("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size")


def card_memory_mib(device: str) -> int:
    from verl_compat.catalog import get_profile

    return int(get_profile(device).total_memory_bytes // 2**20)


def visible_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def batch_overrides(setting: str, cards: int, scaling: str) -> list[str]:
    """Weak scaling: the setting's prompts per step (and mini-batch) times the card count; strong: unchanged."""
    if scaling == "strong" or cards == 1:
        return []
    given = dict(o.split("=", 1) for o in SETTINGS[setting] if o.split("=", 1)[0] in BATCH_KEYS)
    return [f"{key}={int(given[key]) * cards}" for key in BATCH_KEYS]


def nccl_errors(log: Path) -> list[str]:
    if not log.is_file():
        return [f"no log at {log}"]
    return [line.strip()[:300] for line in log.read_text(errors="replace").splitlines() if NCCL_ERROR.search(line)]


def nonfinite_losses(metrics: Path) -> list[str]:
    """``step N: key=value`` for every loss of verl's per-step metrics (metrics.jsonl) that is nan or inf (verl's
    file logger writes those as null)."""
    if not metrics.is_file():
        return []
    bad = []
    for line in metrics.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        for key in LOSS_KEYS:
            data = row.get("data", {})
            value = data.get(key)
            if (key in data and value is None) or (isinstance(value, float) and not math.isfinite(value)):
                bad.append(f"step {row.get('step')}: {key}={value}")
    return bad


def analyse(result: dict[str, Any], device: str, cards: int) -> dict[str, Any]:
    summary = result["summary"]
    tokens = summary["perf/total_num_tokens"]["per_step"]
    step_s = summary["timing_s/step"]["per_step"]
    tokens_per_s = [t / s for t, s in zip(tokens, step_s, strict=True) if s]
    card_mib = card_memory_mib(device)
    peaks = {int(k): v for k, v in result["memory"]["peak_per_gpu_mib"].items()}
    used = {gpu: mib for gpu, mib in peaks.items() if mib >= GPU_IN_USE_MIB}
    over = {}
    for sample in result["memory"]["samples"]:
        for gpu, mib in sample.get("per_gpu_mib", {}).items():
            if mib > card_mib:
                over[int(gpu)] = over.get(int(gpu), 0) + 1
    replicas = {r["pid"] for r in result["rollout_stats"] if r["kind"] == "rollout_batch" and r.get("requests")}
    errors = nccl_errors(Path(result["log"]))
    nonfinite = nonfinite_losses(Path(result["log"]).parent / "metrics.jsonl")
    return {
        "device": device,
        "cards": cards,
        "returncode": result["returncode"],
        "steps_completed": result["steps_completed"],
        "overrides": result["overrides"],
        "tokens_per_step_median": median_after_first(tokens),
        "tokens_per_s_median_after_first": median_after_first(tokens_per_s),
        "tokens_per_s_per_step": [round(v, 2) for v in tokens_per_s],
        "step_s_median_after_first": summary["timing_s/step"]["median_after_first"],
        "gen_s_median_after_first": summary["timing_s/gen"]["median_after_first"],
        "update_weights_s_median_after_first": summary["timing_s/update_weights"]["median_after_first"],
        "update_actor_s_median_after_first": summary["timing_s/update_actor"]["median_after_first"],
        "card_memory_mib": card_mib,
        "peak_mib_per_gpu": {str(k): v for k, v in sorted(peaks.items())},
        "gpus_in_use": sorted(used),
        "samples_above_card_per_gpu": {str(k): v for k, v in sorted(over.items())},
        "memory_within_card": bool(used) and max(used.values()) <= card_mib,
        "rollout_replicas_serving": len(replicas),
        "nccl_error_lines": len(errors),
        "nccl_errors_first": errors[:5],
        "nonfinite_losses": nonfinite,
        "startup_s": result["startup_s"],
        "wall_s": result["wall_s"],
        "rollout_probs_diff_max": summary["training/rollout_probs_diff_max"]["per_step"],
        "log": result["log"],
    }


def compare(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    a, b = one["tokens_per_s_median_after_first"], two["tokens_per_s_median_after_first"]
    ratio = round(b / a, 3) if a and b else None
    return {
        "device": one["device"],
        "tokens_per_s_1_card": a,
        "tokens_per_s_2_cards": b,
        "scaling_ratio": ratio,
        "scaling_target_met": ratio is not None and ratio >= SCALING_TARGET,
        "memory_within_card_2_cards": two["memory_within_card"],
        "gpus_in_use_2_cards": two["gpus_in_use"],
        "replicas_2_cards": two["rollout_replicas_serving"],
        "nccl_error_lines_2_cards": two["nccl_error_lines"],
        "ok": bool(
            one["returncode"] == 0
            and two["returncode"] == 0
            and ratio is not None
            and ratio >= SCALING_TARGET
            and two["memory_within_card"]
            and len(two["gpus_in_use"]) == 2
            and two["nccl_error_lines"] == 0
            and not one["nonfinite_losses"]
            and not two["nonfinite_losses"]
        ),
    }


def run_job(args: argparse.Namespace, assets: Any, device: str, cards: int) -> dict[str, Any]:
    work = args.work / f"{device}-{cards}card"
    saved = work / "result.json"
    extra = batch_overrides(args.setting, cards, args.scaling) + args.extra
    if args.reuse and saved.is_file():
        result = json.loads(saved.read_text())
        if result.get("returncode") == 0 and result.get("steps_completed") == args.steps:
            if result["overrides"] == SETTINGS[args.setting] + extra:
                print(f"{device} x{cards}: reusing {saved}", flush=True)
                return result
    env = dict(os.environ, VERL_COMPAT_DEVICE=device)
    print(f"{device} x{cards}: running {args.setting}, {args.steps} steps, extra {extra}", flush=True)
    result = run_setting(args.setting, assets, args.steps, work, extra, env=env, timeout_s=args.timeout, gpus=cards)
    saved.write_text(json.dumps(result, default=str))
    if result["returncode"] != 0:
        print(Path(result["log"]).read_text(errors="replace")[-6000:], file=sys.stderr)
    return result


def print_table(jobs: list[dict[str, Any]], comparisons: list[dict[str, Any]]) -> None:
    rows = [
        ("returncode", "returncode"),
        ("steps", "steps_completed"),
        ("tokens/step (median 2+)", "tokens_per_step_median"),
        ("tokens/s (median 2+)", "tokens_per_s_median_after_first"),
        ("step s", "step_s_median_after_first"),
        ("gen s", "gen_s_median_after_first"),
        ("update_weights s", "update_weights_s_median_after_first"),
        ("update_actor s", "update_actor_s_median_after_first"),
        ("card MiB", "card_memory_mib"),
        ("peak MiB per GPU", "peak_mib_per_gpu"),
        ("memory within card", "memory_within_card"),
        ("replicas serving", "rollout_replicas_serving"),
        ("NCCL error lines", "nccl_error_lines"),
        ("non-finite losses", "nonfinite_losses"),
        ("start-up s", "startup_s"),
    ]
    print_rows([f"{j['device']} x{j['cards']}" for j in jobs], jobs, rows, 24)
    for c in comparisons:
        print(
            f"{c['device']}: 2 cards / 1 card tokens/s = {c['scaling_ratio']} (target >= {SCALING_TARGET}); "
            f"memory within card {c['memory_within_card_2_cards']}; NCCL error lines {c['nccl_error_lines_2_cards']}; "
            f"ok {c['ok']}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="PPO job on 2 cards vs 1 card per simulated card")
    ap.add_argument("--devices", nargs="+", default=["t4", "p40"], help="VERL_COMPAT_DEVICE profiles")
    ap.add_argument("--cards", nargs="+", type=int, default=[1, 2], help="card counts to run (1 2)")
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="b_batch32")
    ap.add_argument("--scaling", choices=("weak", "strong"), default="weak")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--assets", type=Path, default=Path("/tmp/ppo-job-assets"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/two-card-ppo"))
    ap.add_argument("--timeout", type=float, default=None, help="seconds per job")
    ap.add_argument("--reuse", action="store_true", help="skip jobs whose finished result is in --work")
    ap.add_argument("--out", type=Path, default=Path("two_card_ppo.json"))
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: Hydra overrides for every job")
    args = ap.parse_args(argv)
    args.extra = [a for a in args.extra if a != "--"]
    gpus = visible_gpus()
    if max(args.cards) > gpus:
        print(f"error: --cards {max(args.cards)} needs that many GPUs, nvidia-smi lists {gpus}", file=sys.stderr)
        return 2
    assets = build_assets(args.assets, args.shape)
    jobs, comparisons = [], []
    for device in args.devices:
        per_cards = {}
        for cards in args.cards:
            per_cards[cards] = analyse(run_job(args, assets, device, cards), device, cards)
            jobs.append(per_cards[cards])
        if 1 in per_cards and 2 in per_cards:
            comparisons.append(compare(per_cards[1], per_cards[2]))
    out = {
        "command": "python benchmarks/two_card_ppo.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "setting": args.setting,
        "scaling": args.scaling,
        "steps": args.steps,
        "shape": args.shape,
        "comparisons": comparisons,
        "jobs": jobs,
    }
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print_table(jobs, comparisons)
    failed = any(j["returncode"] != 0 for j in jobs) or not all(c["ok"] for c in comparisons)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
