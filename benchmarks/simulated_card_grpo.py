"""The default GRPO job on a simulated card (e.g. a P40 on a bigger GPU): per-step time, reward, peak memory.

    VERL_COMPAT_DEVICE=p40 python benchmarks/simulated_card_grpo.py --steps 20 --out run.json -- [quickstart args]

Runs `verl-compat quickstart` (verl's own trainer), polls the GPU's used memory with nvidia-smi while it runs
(every process on the card: the FSDP worker and the rollout server), points Triton's cache at an empty folder
and counts what lands there (a compiled Triton kernel always does), and summarises verl's per-step metrics.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def poll_gpu_memory(stop: threading.Event, samples: list[int]) -> None:
    while not stop.is_set():
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            samples.append(sum(int(x) for x in out.split()) * 2**20)
        except FileNotFoundError:
            print("nvidia-smi not found: no GPU memory samples", file=sys.stderr)
            return
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:  # keep polling; report what failed
            print(f"nvidia-smi poll failed: {e}", file=sys.stderr)
        stop.wait(1.0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="run.json")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="after --: arguments for verl-compat quickstart")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="simcard-"))
    metrics = work / "metrics.jsonl"
    triton_cache = work / "triton-cache"
    triton_cache.mkdir()
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics), TRITON_CACHE_DIR=str(triton_cache))
    env.setdefault("RAY_AUTH_MODE", "disabled")
    rest = [a for a in args.rest if a != "--"]
    cmd = [sys.executable, "-m", "verl_compat.cli", "quickstart", "--steps", str(args.steps), "--out", str(work)]
    cmd += rest + ["trainer.logger=[console,file]"]
    stop, samples = threading.Event(), []
    poller = threading.Thread(target=poll_gpu_memory, args=(stop, samples), daemon=True)
    poller.start()
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    stop.set()
    poller.join(timeout=5)
    (work / "stdout.log").write_text(proc.stdout)
    (work / "stderr.log").write_text(proc.stderr)
    rows = []
    if metrics.is_file():
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "step" in r and "data" in r]

    def series(key: str) -> list[float]:
        return [float(r["data"][key]) for r in steps if key in r["data"]]

    step_times = series("timing_s/step")
    report = {
        "device_profile": os.environ.get("VERL_COMPAT_DEVICE", "(real)"),
        "returncode": proc.returncode,
        "steps_completed": len(steps),
        "wall_s": round(wall, 1),
        "step_time_s_median": round(statistics.median(step_times), 2) if step_times else None,
        "step_time_s_after_first": round(statistics.mean(step_times[1:]), 2) if len(step_times) > 1 else None,
        "reward_mean_by_step": [round(x, 3) for x in series("critic/score/mean")],
        "gpu_memory_peak_gib_all_processes": round(max(samples) / 2**30, 2) if samples else None,
        "actor_max_memory_allocated_gib": max(series("actor/perf/max_memory_allocated_gb"), default=None),
        "actor_max_memory_reserved_gib": max(series("actor/perf/max_memory_reserved_gb"), default=None),
        "rollout_actor_probs_diff_max": max(series("training/rollout_probs_diff_max"), default=None),
        "triton_cache_files": sum(1 for p in triton_cache.rglob("*") if p.is_file()),
        "logs": str(work),
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    for k, v in report.items():
        print(f"{k:36} {v}")
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
