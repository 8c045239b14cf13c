"""Both settings of the PPO job (benchmarks/ppo_job.py) inside verl's loop on a simulated P40, in one run.

    VERL_COMPAT_DEVICE=p40 python benchmarks/ppo_in_loop.py --steps 4 --out benchmarks/results/x.json

Reports per setting, against research/gpu-baseline-2026-12-01.md (same job, before this change):
- ``timing_s/update_weights`` (target <= 0.2 s; was 8-10 s) and how the sync went (transport, buckets, bytes);
- ``timing_s/gen`` per step next to the engine's own time for that step's batch (first request in, last result
  out, measured in the rollout server): gen within 10% of it, and no 2 s quantum left in gen - engine;
- the rollout's weights on the card: bytes the server holds on the device after each sync (one copy = the model's
  size), and the server process's memory from nvidia-smi while it generates and while it sleeps;
- memory summed over all processes (nvidia-smi, the whole card), tokens/s, start-up time before step 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.ppo_job import SETTINGS, build_assets, print_rows, run_setting  # noqa: E402

UPDATE_WEIGHTS_TARGET_S = 0.2
GEN_VS_ENGINE_TOLERANCE = 0.10
P40_MEMORY_GIB = 22.4
# research/gpu-baseline-2026-12-01.md (project at 1a2368b): the same job before this change.
BASELINE = {
    "a_seed_recipe": {"update_weights_s": [8.3, 9.8], "gen_s": [6.6, 8.8], "tokens_per_s": [15.8, 19.3],
                      "peak_memory_gib": [14.1, 15.8], "startup_s": [136, 174], "step_s": [16.7, 20.5]},
    "b_batch32": {"update_weights_s": [10.1], "gen_s": [17.8], "tokens_per_s": [293], "peak_memory_gib": [23.2],
                  "startup_s": [178], "step_s": [37.0]},
}  # fmt: skip


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    summary = result["summary"]
    stats = result["rollout_stats"]
    gen = summary["timing_s/gen"]["per_step"]
    update = summary["timing_s/update_weights"]["per_step"]
    batches = [r for r in stats if r["kind"] == "rollout_batch"]
    spans = [r["engine_span_s"] for r in batches]
    sleeps = [r for r in stats if r["kind"] == "rollout_sleep"][1:]  # the first is the one at start-up
    polls = [r["interval_s"] for r in stats if r["kind"] == "replay_poll"]
    syncs = [r for r in stats if r["kind"] == "trainer_weights_sent"]
    received = [r for r in stats if r["kind"] == "rollout_weights_received"]
    server_pids = {r["pid"] for r in stats if r["kind"].startswith("rollout_")}
    trainer_pids = {r["pid"] for r in syncs}

    per_step = []
    for i, g in enumerate(gen):
        span = spans[i] if i < len(spans) else None
        per_step.append(
            {
                "step": i + 1,
                "gen_s": round(g, 3),
                "engine_span_s": round(span, 3) if span is not None else None,
                "gen_over_engine": round(g / span, 3) if span else None,
                "gen_minus_engine_s": round(g - span, 3) if span is not None else None,
                # from the engine's last result to the end of sampling (the trainer putting the rollout to sleep)
                "end_of_sampling_lag_s": round(sleeps[i]["called_time"] - batches[i]["last_result_time"], 3)
                if i < len(sleeps) and i < len(batches) and "last_result_time" in batches[i]
                else None,
                "update_weights_s": round(update[i], 3) if i < len(update) else None,
            }
        )
    later = per_step[1:] if len(per_step) > 1 else per_step
    ratios = [s["gen_over_engine"] for s in later if s["gen_over_engine"] is not None]

    samples = result["memory"]["samples"]
    per_pid = [{int(pid): mib for pid, mib in s["per_pid_mib"].items()} for s in samples]
    per_pid_peak: dict[int, int] = {}
    for sample in per_pid:
        for pid, mib in sample.items():
            per_pid_peak[pid] = max(per_pid_peak.get(pid, 0), mib)
    server_mem = [sample[p] for sample in per_pid for p in server_pids if p in sample]
    weight_bytes = [r["weight_bytes_on_device"] for r in received]
    peak_total = result["memory"]["peak_total_mib"]
    return {
        "setting": result["setting"],
        "returncode": result["returncode"],
        "steps_completed": result["steps_completed"],
        "per_step": per_step,
        "update_weights_s_median_after_first": _median([s["update_weights_s"] for s in later if s["update_weights_s"]]),
        "update_weights_target_met": bool(update) and max(update[1:] or update) <= UPDATE_WEIGHTS_TARGET_S,
        # the transport alone (trainer side: stage + server copies), inside update_weights, which also holds
        # waking the rollout and, with parameter offload, moving the actor between host and card
        "sync_transport_s_median_after_first": _median([r["seconds"] for r in syncs[1:]]),
        "sync": [
            {k: r.get(k) for k in ("transport", "tensors", "bytes", "buckets", "direct", "bucket_bytes", "seconds")}
            for r in syncs
        ],
        "gen_s_median_after_first": summary["timing_s/gen"]["median_after_first"],
        "gen_over_engine_max_after_first": max(ratios) if ratios else None,
        "gen_within_10pct_of_engine": bool(ratios) and max(ratios) <= 1 + GEN_VS_ENGINE_TOLERANCE,
        "replay_poll_s_max": max(polls) if polls else None,
        "replay_polls": len(polls),
        "rollout_weight_bytes_on_device_after_sync": sorted(set(weight_bytes)),
        "rollout_server_pids": sorted(server_pids),
        "trainer_pids": sorted(trainer_pids),
        "rollout_server_mib_min_max": [min(server_mem), max(server_mem)] if server_mem else None,
        # the server's own allocator view after each sync and sleep (when nvidia-smi's pids are not this namespace's)
        "rollout_server_torch_reserved_mib": [
            round(r["memory"]["reserved"] / 2**20) for r in stats if r["pid"] in server_pids and r.get("memory")
        ],
        "per_process_peak_mib": {str(p): m for p, m in sorted(per_pid_peak.items())},
        "process_names": result["memory"]["process_names"],
        "peak_memory_all_processes_gib": round(peak_total / 1024, 2) if peak_total else None,
        "samples_above_p40": sum(1 for s in samples if s["total_mib"] / 1024 > P40_MEMORY_GIB),
        "samples": len(samples),
        "tokens_per_step_median": summary["perf/total_num_tokens"]["median_after_first"],
        "tokens_per_s_median_after_first": summary["perf/throughput"]["median_after_first"],
        "step_s_median_after_first": summary["timing_s/step"]["median_after_first"],
        "startup_s": result["startup_s"],
        "rollout_probs_diff_max": summary["training/rollout_probs_diff_max"]["per_step"],
        "baseline_2026_12_01": BASELINE.get(result["setting"]),
        "memory_errors": result["memory"]["errors"],
    }


def print_table(reports: list[dict[str, Any]]) -> None:
    rows = [
        ("update_weights s (median 2+)", "update_weights_s_median_after_first"),
        ("update_weights <= 0.2 s", "update_weights_target_met"),
        ("  of which transport s", "sync_transport_s_median_after_first"),
        ("gen s (median 2+)", "gen_s_median_after_first"),
        ("gen / engine span (max 2+)", "gen_over_engine_max_after_first"),
        ("gen within 10% of engine", "gen_within_10pct_of_engine"),
        ("replay poll wait s (max)", "replay_poll_s_max"),
        ("rollout weights on card (B)", "rollout_weight_bytes_on_device_after_sync"),
        ("server MiB min/max", "rollout_server_mib_min_max"),
        ("peak all processes GiB", "peak_memory_all_processes_gib"),
        ("samples above 22.4 GiB", "samples_above_p40"),
        ("tokens/s (median 2+)", "tokens_per_s_median_after_first"),
        ("step s (median 2+)", "step_s_median_after_first"),
        ("start-up s", "startup_s"),
    ]
    print_rows([r["setting"] for r in reports], reports, rows, 26)
    for r in reports:
        print(r["setting"], "per step:", json.dumps(r["per_step"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="PPO job, both settings, in verl's loop on a simulated card")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=sorted(SETTINGS))
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--assets", type=Path, default=Path("/tmp/ppo-job-assets"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/ppo-in-loop"))
    ap.add_argument("--timeout", type=float, default=None, help="seconds per setting")
    ap.add_argument("--out", type=Path, default=Path("ppo_in_loop.json"))
    ap.add_argument("--raw", type=Path, default=None, help="also write the full results (memory samples, logs)")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: Hydra overrides for every setting")
    args = ap.parse_args(argv)
    if not os.environ.get("VERL_COMPAT_DEVICE"):
        print("note: VERL_COMPAT_DEVICE is not set; measuring the real device", file=sys.stderr)
    assets = build_assets(args.assets, args.shape)
    extra = [a for a in args.extra if a != "--"]
    results, reports = [], []
    for setting in args.settings:
        result = run_setting(setting, assets, args.steps, args.work / setting, extra, timeout_s=args.timeout)
        results.append(result)
        reports.append(analyse(result))
        if result["returncode"] != 0:
            print(Path(result["log"]).read_text()[-6000:], file=sys.stderr)
    out = {
        "device_profile": os.environ.get("VERL_COMPAT_DEVICE", "(real)"),
        "steps": args.steps,
        "shape": args.shape,
        "command": "python benchmarks/ppo_in_loop.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": reports,
    }
    args.out.write_text(json.dumps(out, indent=1, default=str))
    if args.raw:
        args.raw.write_text(json.dumps(results, default=str))
    print_table(reports)
    return max(r["returncode"] for r in results)


if __name__ == "__main__":
    sys.exit(main())
