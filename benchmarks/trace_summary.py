"""Where a profiled phase's time goes: a summary of torch-profiler chrome traces (verl's `global_profiler.tool=torch`).

Per trace: the wall span, the GPU's busy time (union of kernel, memcpy and memset intervals) and its idle gaps
(how many, how long, the longest), kernel time by class (matmul, attention, optimizer, copy, elementwise /
reduction) and the top kernels by name, the CUDA runtime calls that block the host (synchronize, blocking copies)
and verl's `record_function` markers; with stacks recorded, the Python frames under those blocking calls and the
frames that launch the GPU's work and end its idle stretches. The traces themselves are large (tens of MB a
phase); this keeps what a reader needs to tell "the GPU is slow" from "the GPU waits for Python".

    python benchmarks/trace_summary.py /tmp/prof --out benchmarks/results/trace_summary.json
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# substrings of kernel names, first match wins; lower-cased
CLASSES = (
    ("attention", ("fmha", "attention", "flash", "efficient_attention")),
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "ampere_", "volta_", "turing_", "cublas", "splitk")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("softmax / log-softmax", ("softmax",)),
    ("copy / cast", ("copy", "cast", "memcpy", "memset", "fill")),
)


def blocks_host(name: str) -> bool:
    """A runtime call that waits for the GPU: any *Synchronize, and the synchronous cudaMemcpy. Not
    cudaStreamWaitEvent (a wait between streams, on the GPU) nor cudaMemcpyAsync."""
    return "synchronize" in name.lower() or name == "cudaMemcpy"


GAP_US = 50.0  # an idle stretch shorter than this is launch latency, not waiting


def kernel_class(name: str) -> str:
    low = name.lower()
    for label, keys in CLASSES:
        if any(k in low for k in keys):
            return label
    return "elementwise / reduction / other"


def _union(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """Busy time of the merged intervals, and the gaps between them."""
    busy, gaps, end = 0.0, [], None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                gaps.append(s - end)
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy, gaps


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f).get("traceEvents", [])


def _frames_at(
    timed: list[dict[str, Any]], chosen: Callable[[dict[str, Any]], bool], frames: int
) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """Each chosen runtime call with the innermost `frames` Python frames open at it (the profiler's
    `python_function` events, recorded with `contents=[cuda,stack]`), innermost first.

    One sweep per thread over the events by start time, keeping the stack of open Python frames (they nest)."""
    per_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in timed:
        if e.get("cat") == "python_function" or (e.get("cat") == "cuda_runtime" and chosen(e)):
            per_tid[e.get("tid")].append(e)
    out = []
    for evs in per_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))  # a parent before the child that starts with it
        stack: list[dict[str, Any]] = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"]:
                stack.pop()
            if e.get("cat") == "python_function":
                stack.append(e)
            else:
                out.append((e, tuple(f["name"][:150] for f in stack[-frames:][::-1])))
    return out


def blocking_stacks(timed: list[dict[str, Any]], frames: int = 4, top: int = 10) -> list[dict[str, Any]]:
    """Which Python code makes the host wait: each blocking CUDA runtime call under its innermost Python frames,
    summed by those frames."""
    totals: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0, 0.0])
    for e, where in _frames_at(timed, lambda e: blocks_host(e["name"]), frames):
        key = (e["name"], *where)
        totals[key][0] += 1
        totals[key][1] += e["dur"]
    return [
        {"call": k[0], "frames": list(k[1:]), "count": c, "ms": round(t * 1e-3, 1)}
        for k, (c, t) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    ]


def launch_stacks(timed: list[dict[str, Any]], frames: int = 4, top: int = 15) -> list[dict[str, Any]]:
    """Which Python code feeds the GPU, and which leaves it waiting: each GPU event is joined to the runtime call
    that launched it (the profiler's `correlation` id) and counted under that call's innermost Python frames;
    an idle stretch of at least GAP_US before a GPU event is charged to the frames that launched it, the code
    the GPU waited for. Sorted by that idle time."""
    gpu = sorted((e for e in timed if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    idle_before: dict[Any, float] = {}
    end = None
    for e in gpu:
        if end is not None and e["ts"] - end >= GAP_US:
            idle_before[e.get("args", {}).get("correlation")] = e["ts"] - end
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    launched: dict[Any, int] = defaultdict(int)
    for e in gpu:
        launched[e.get("args", {}).get("correlation")] += 1
    ids = set(launched) - {None}
    totals: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for call, where in _frames_at(timed, lambda e: e.get("args", {}).get("correlation") in ids, frames):
        cid = call["args"]["correlation"]
        row = totals[where]
        row[0] += launched[cid]
        row[1] += cid in idle_before
        row[2] += idle_before.get(cid, 0.0)
    return [
        {"frames": list(k), "gpu_events": n, "idle_stretches": g, "idle_ms": round(t * 1e-3, 1)}
        for k, (n, g, t) in sorted(totals.items(), key=lambda kv: (-kv[1][2], -kv[1][0]))[:top]
    ]


def summarise(events: list[dict[str, Any]], top: int = 25) -> dict[str, Any]:
    timed = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if not timed:
        return {"events": 0}
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + e["dur"] for e in timed)
    gpu = [e for e in timed if e.get("cat") in GPU_CATS]
    busy, gaps = _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    waits = [g for g in gaps if g >= GAP_US]
    by_class: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in gpu:
        by_class[kernel_class(e["name"])] += e["dur"]
        row = by_name[e["name"][:160]]
        row[0] += 1
        row[1] += e["dur"]
    runtime: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in timed:
        if e.get("cat") == "cuda_runtime":
            row = runtime[e["name"]]
            row[0] += 1
            row[1] += e["dur"]
    marks: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in timed:
        table = {"user_annotation": marks, "cpu_op": ops}.get(e.get("cat"))
        if table is not None:
            row = table[e["name"][:120]]
            row[0] += 1
            row[1] += e["dur"]
    ms = 1e-3
    return {
        "events": len(timed),
        "span_ms": round((end - start) * ms, 1),
        "gpu_busy_ms": round(busy * ms, 1),
        "gpu_busy_share": round(busy / (end - start), 3),
        "gpu_kernels": sum(1 for e in gpu if e.get("cat") == "kernel"),
        "gpu_idle_gaps": {
            f"count_over_{GAP_US:g}us": len(waits),
            "total_ms": round(sum(waits) * ms, 1),
            "longest_ms": round(max(waits, default=0.0) * ms, 1),
            "under_threshold_total_ms": round(sum(g for g in gaps if g < GAP_US) * ms, 1),
        },
        "gpu_ms_by_class": {k: round(v * ms, 1) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "top_kernels": [
            {"name": n, "count": c, "ms": round(t * ms, 1)}
            for n, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
        ],
        "cuda_runtime": {
            n: {"count": c, "ms": round(t * ms, 1)}
            for n, (c, t) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:12]
        },
        "host_blocking_ms": round(sum(t for n, (c, t) in runtime.items() if blocks_host(n)) * ms, 1),
        # inclusive times: a parent op's time holds its children's
        "cpu_ops": {
            n: {"count": c, "ms": round(t * ms, 1)} for n, (c, t) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:20]
        },
        "blocking_stacks": blocking_stacks(timed),
        "launch_stacks": launch_stacks(timed),
        "markers": {
            n: {"count": c, "ms": round(t * ms, 1)}
            for n, (c, t) in sorted(marks.items(), key=lambda kv: -kv[1][1])[:20]
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="trace files or folders holding them")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    files = []
    for p in args.paths:
        files += sorted(q for q in p.rglob("*.json*") if q.is_file()) if p.is_dir() else [p]
    report = {f.name: summarise(load(f)) for f in files}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if report else 1


if __name__ == "__main__":
    raise SystemExit(main())
