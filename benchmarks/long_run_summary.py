"""A long run of the PPO job, span by span: does the step time drift, does memory creep?

Reads one run's record: `p40_ppo_head_to_head.py`'s --out (its planned side) or --progress file, `ppo_job.py`'s
--out, or a bare `metrics.jsonl` of verl's file logger (then only verl's own per-step figures, no nvidia-smi).
For each span of --span steps it prints the median and slowest step, tokens/s, the trainer's allocator peaks that
verl logs per update (actor and critic: max allocated and reserved, GiB), and from the nvidia-smi samples taken
during those steps the peak over the card (all processes summed) and each process's peak (MiB).

    python benchmarks/long_run_summary.py RUN.json [--side planned] [--span 25] [--out summary.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ALLOCATOR_KEYS = {
    "actor_alloc_gib": "actor/perf/max_memory_allocated_gb",
    "actor_reserved_gib": "actor/perf/max_memory_reserved_gb",
    "critic_alloc_gib": "critic/perf/max_memory_allocated_gb",
    "critic_reserved_gib": "critic/perf/max_memory_reserved_gb",
}


def load_run(path: Path, side: str = "planned") -> dict[str, Any]:
    """{'steps': [verl's per-step data dicts, in order], 'samples': [...], 't0': float|None, 'step_seen_s': {...}}."""
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = sorted((r for r in rows if "step" in r and "data" in r), key=lambda r: r["step"])
        return {"steps": [r["data"] for r in rows], "samples": [], "t0": None, "step_seen_s": {}}
    doc = json.loads(path.read_text())
    if "sides" in doc:
        doc = doc["sides"][side]["raw"]
    summary = doc["summary"]
    n = len(summary["timing_s/step"]["per_step"])
    steps = [{k: v["per_step"][i] for k, v in summary.items() if i < len(v["per_step"])} for i in range(n)]
    seen = {int(k): v for k, v in (doc.get("step_seen_s") or {}).items()}
    return {"steps": steps, "samples": doc["memory"]["samples"], "t0": doc.get("t0"), "step_seen_s": seen}


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def spans(run: dict[str, Any], span: int) -> list[dict[str, Any]]:
    steps, out = run["steps"], []
    for a in range(0, len(steps), span):
        chunk = steps[a : a + span]
        times = _finite([s.get("timing_s/step") for s in chunk])
        tokens = _finite([s.get("perf/total_num_tokens") for s in chunk])
        row: dict[str, Any] = {
            "steps": f"{a + 1}-{a + len(chunk)}",
            "step_s_median": round(statistics.median(times), 3) if times else None,
            "step_s_max": round(max(times), 3) if times else None,
            "tokens_per_s": round(sum(tokens) / sum(times), 1) if times and len(tokens) == len(times) else None,
        }
        for name, key in ALLOCATOR_KEYS.items():
            vals = _finite([s.get(key) for s in chunk])
            row[name] = round(max(vals), 3) if vals else None
        row.update(_smi_in(run, a + 1, a + len(chunk)))
        out.append(row)
    return out


def _smi_in(run: dict[str, Any], first: int, last: int) -> dict[str, Any]:
    """nvidia-smi's peaks while steps first..last ran: from the previous step's metrics to this span's last."""
    seen, t0 = run["step_seen_s"], run["t0"]
    if not run["samples"] or t0 is None or last not in seen:
        return {}
    start = seen.get(first - 1, seen[first] - (run["steps"][first - 1].get("timing_s/step") or 0))
    inside = [s for s in run["samples"] if start < s["t"] - t0 <= seen[last]]
    if not inside:
        return {}
    per_pid: dict[str, int] = {}
    for s in inside:
        for pid, mib in s["per_pid_mib"].items():
            per_pid[str(pid)] = max(per_pid.get(str(pid), 0), mib)
    return {"card_peak_mib": max(s["total_mib"] for s in inside), "process_peaks_mib": per_pid}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--side", default="planned")
    ap.add_argument("--span", type=int, default=25)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    run = load_run(args.run, args.side)
    rows = spans(run, args.span)
    cols = ["steps", "step_s_median", "step_s_max", "tokens_per_s", *ALLOCATOR_KEYS, "card_peak_mib"]
    print("  ".join(f"{c:>18}" for c in cols))
    for r in rows:
        print("  ".join(f"{str(r.get(c, '-')):>18}" for c in cols) + f"  {r.get('process_peaks_mib', '')}")
    if args.out:
        args.out.write_text(json.dumps({"source": str(args.run), "span": args.span, "spans": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
