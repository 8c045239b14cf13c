"""Where each trainer phase's time goes outside the model: a PPO job's trace (benchmarks/startup_trace, written by
`p40_ppo_head_to_head.py --trace` / `ppo_job.py --trace` into the job's folder as startup_trace.jsonl; those
jobs keep this summary in their result as `raw.phase_parts`), per phase
(old_log_prob, ref, values, update_critic, update_actor), median over the steps after the first, in ms:

- worker: the trainer worker's whole call (`TrainingWorker.infer_batch` / `train_batch`);
- model: `forward_step` (the micro-batch's move, the forward and the loss; the GPU is waited for where verl
  reads a value back);
- backward: the rest of `forward_backward_batch` after its micro-batches' forward steps and its own preparation;
- optimizer: `optimizer_step` (gradient clip, bringing offloaded AdamW state, the step);
- host work, none of it the model's: `tq_get` / `tq_put` (the batch fetched from and results written to
  TransferQueue), `micro_batches` (`prepare_micro_batches`: sequence balancing and the split), `to_device`
  (`TensorDict.to` or, below sm_80, `verl_compat.batch_moves.to_device`: the micro-batch to the GPU and the
  outputs back; a move inside another is counted once), `postprocess` (outputs reassembled, metrics).

Without VERL_COMPAT_TRACE_SYNC=1 the host spans end when the host moves on, so `model` and `backward` hold the
GPU's time only where verl waits for it; the host parts are host time either way.

    python benchmarks/phase_parts.py /tmp/h2h-p40-qwen2.5-0.5b-b_planned/startup_trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

# engine pass (the tracer's label of forward_backward_batch) -> verl's phase name (timing_s/...)
PHASE_OF_PASS = {
    "actor.forward": "old_log_prob",
    "ref.forward": "ref",
    "critic.forward": "values",
    "critic.train": "update_critic",
    "actor.train": "update_actor",
}
# verl's v1 PPO step calls the trainer in this order (trainer_base.py); used for traces without pass labels
PPO_ORDER = ("old_log_prob", "ref", "values", "update_critic", "update_actor")
WORKER_CALLS = ("TrainingWorker.infer_batch", "TrainingWorker.train_batch")
INSIDE = {
    "model": ("FSDPEngineWithLMHead.forward_step",),
    "optimizer": ("FSDPEngine.optimizer_step",),
    "micro_batches": ("prepare_micro_batches",),
    "to_device": ("TensorDict.to", "batch_moves.to_device"),
    "postprocess": ("postprocess_batch_func", "TrainingWorker._postprocess_output"),
}
HOST_PARTS = ("tq_get", "tq_put", "micro_batches", "to_device", "postprocess")


def _ms(rows: list[dict[str, Any]]) -> float:
    return sum(r["t1"] - r["t0"] for r in rows) * 1e3


def _ends(r: dict[str, Any], names: tuple[str, ...]) -> bool:
    return r["name"].endswith(names)


def _outermost(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records not inside another of `rows` (a move that calls another move is one move)."""
    return [r for r in rows if not any(o is not r and o["t0"] <= r["t0"] and r["t1"] <= o["t1"] for o in rows)]


def calls(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per trainer-worker call, in time order: its phase and its parts in ms."""
    workers = sorted((r for r in trace if _ends(r, WORKER_CALLS)), key=lambda r: r["t0"])
    out = []
    for i, w in enumerate(workers):
        same = [r for r in trace if r["pid"] == w["pid"] and r is not w]
        inside = [r for r in same if r["t0"] >= w["t0"] and r["t1"] <= w["t1"]]
        prev_end = max((p["t1"] for p in workers[:i] if p["pid"] == w["pid"]), default=0.0)
        next_start = min((n["t0"] for n in workers[i + 1 :] if n["pid"] == w["pid"]), default=float("inf"))
        fbb = [r for r in inside if _ends(r, ("FSDPEngine.forward_backward_batch",))]
        parts = {k: _ms(_outermost([r for r in inside if _ends(r, names)])) for k, names in INSIDE.items()}
        # TransferQueue's fetch comes right before the worker's call (or inside it), its write right after
        parts["tq_get"] = _ms([r for r in same if _ends(r, ("_meta_to_realdata",)) and prev_end <= r["t0"] < w["t1"]])
        parts["tq_put"] = _ms(
            [r for r in same if _ends(r, ("_update_meta_with_output",)) and w["t0"] <= r["t0"] < next_start]
        )
        fbb_inner = [r for r in inside if any(r["t0"] >= f["t0"] and r["t1"] <= f["t1"] for f in fbb)]
        runs_itself = INSIDE["model"] + INSIDE["micro_batches"] + INSIDE["to_device"]
        own = _ms(_outermost([r for r in fbb_inner if _ends(r, runs_itself)]))  # verl's move is inside forward_step
        parts["backward"] = max(0.0, _ms(fbb) - own) if w["name"].endswith("train_batch") else 0.0
        parts["worker"] = _ms([w])
        label = next((f.get("pass") for f in fbb if f.get("pass")), None)
        out.append({"phase": PHASE_OF_PASS.get(label), "train": w["name"].endswith("train_batch"), "parts": parts})
    if out and all(c["phase"] is None for c in out) and len(out) % len(PPO_ORDER) == 0:
        for i, c in enumerate(out):  # an unlabelled trace: verl's order, checked against each call's kind
            phase = PPO_ORDER[i % len(PPO_ORDER)]
            c["phase"] = phase if c["train"] == phase.startswith("update_") else None
    return out


def summary(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase: medians of each part over its calls after the first, and the host parts' sum."""
    by_phase: dict[str, list[dict[str, float]]] = {}
    for c in calls(trace):
        by_phase.setdefault(c["phase"] or "unknown", []).append(c["parts"])
    result: dict[str, Any] = {}
    for phase, rows in by_phase.items():
        steady = rows[1:] or rows
        med = {k: round(statistics.median(r[k] for r in steady), 1) for k in steady[0]}
        med["host_parts"] = round(sum(med[k] for k in HOST_PARTS), 1)
        result[phase] = {"calls": len(rows), "median_ms": med}
    result["step_host_parts_ms"] = round(sum(v["median_ms"]["host_parts"] for v in result.values()), 1)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    trace = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    result = summary(trace)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    cols = ("worker", "model", "backward", "optimizer", *HOST_PARTS, "host_parts")
    print(f"{'phase':14}" + "".join(f"{c:>14}" for c in cols))
    for phase, v in result.items():
        if isinstance(v, dict):
            print(f"{phase:14}" + "".join(f"{v['median_ms'][c]:>14.1f}" for c in cols))
    print(f"host parts in a step: {result['step_host_parts_ms']} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
