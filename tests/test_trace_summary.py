"""benchmarks/trace_summary.py: GPU busy time is the union of its intervals, idle gaps are counted past the
threshold, kernels are classed by name, and blocking runtime calls are summed."""

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import trace_summary  # noqa: E402


def _ev(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


EVENTS = [
    _ev("user_annotation", "actor_update", 0, 1000),
    _ev("kernel", "ampere_sgemm_128x64_nn", 0, 300),
    _ev("kernel", "fmha_cutlassF_f32_aligned", 200, 200),  # overlaps the gemm: 100 us counted once
    _ev("kernel", "vectorized_elementwise_kernel", 420, 10),  # 20 us gap: launch latency, under threshold
    _ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 900, 50),  # 470 us gap: waiting
    _ev("cuda_runtime", "cudaStreamSynchronize", 430, 470),
    _ev("cuda_runtime", "cudaLaunchKernel", 0, 5),
    _ev("cuda_runtime", "cudaStreamWaitEvent", 6, 300),  # a wait between streams, not the host's
    _ev("cpu_op", "aten::mm", 0, 6),
    {"ph": "i", "cat": "kernel", "name": "instant", "ts": 5},  # not a timed event
]


def test_summary_of_a_small_trace(tmp_path):
    path = tmp_path / "actor_update.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": EVENTS}, f)
    s = trace_summary.summarise(trace_summary.load(path))
    assert s["span_ms"] == 1.0
    assert s["gpu_busy_ms"] == 0.5  # 400 + 10 + 50 us, to 0.1 ms
    assert s["gpu_kernels"] == 3
    gaps = s["gpu_idle_gaps"]
    assert gaps["count_over_50us"] == 1 and gaps["longest_ms"] == 0.5
    assert gaps["under_threshold_total_ms"] == 0.0  # 20 us
    assert list(s["gpu_ms_by_class"]) == ["matmul", "attention", "copy / cast", "elementwise / reduction / other"]
    assert s["host_blocking_ms"] == 0.5
    assert s["markers"]["actor_update"] == {"count": 1, "ms": 1.0}
    assert s["cpu_ops"]["aten::mm"]["count"] == 1


def test_busy_time_merges_overlaps_and_reports_gaps():
    busy, gaps = trace_summary._union([(0, 10), (5, 20), (30, 40), (35, 36)])
    assert busy == 30 and gaps == [10]


def test_main_reads_a_folder_and_fails_on_none(tmp_path):
    assert trace_summary.main([str(tmp_path)]) == 1
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": EVENTS}))
    out = tmp_path / "s.json"
    assert trace_summary.main([str(tmp_path), "--out", str(out)]) == 0
    assert "t.json" in json.loads(out.read_text())


def test_blocking_calls_are_summed_under_their_innermost_python_frames():
    events = [
        _ev("python_function", "trainer.py(10): update", 0, 100),
        _ev("python_function", "loss.py(5): metrics", 10, 30),
        _ev("cuda_runtime", "cudaStreamSynchronize", 20, 5),
        _ev("cuda_runtime", "cudaStreamSynchronize", 30, 5),
        _ev("python_function", "optim.py(7): step", 50, 40),
        _ev("cuda_runtime", "cudaEventSynchronize", 60, 20),
        _ev("cuda_runtime", "cudaLaunchKernel", 61, 1),  # not blocking
        _ev("cuda_runtime", "cudaMemcpyAsync", 62, 1),
    ]
    rows = trace_summary.blocking_stacks(events)
    assert rows[0] == {
        "call": "cudaEventSynchronize",
        "frames": ["optim.py(7): step", "trainer.py(10): update"],
        "count": 1,
        "ms": 0.0,
    }
    assert rows[1]["frames"] == ["loss.py(5): metrics", "trainer.py(10): update"] and rows[1]["count"] == 2
    assert len(rows) == 2


def _launch(name, ts, dur, corr):
    return {**_ev("cuda_runtime", name, ts, dur), "args": {"correlation": corr}}


def _kernel(name, ts, dur, corr):
    return {**_ev("kernel", name, ts, dur), "args": {"correlation": corr}}


def test_gpu_work_and_its_idle_stretches_are_charged_to_the_frames_that_launched_them():
    events = [
        _ev("python_function", "trainer.py(10): update", 0, 1000),
        _ev("python_function", "model.py(3): forward", 0, 100),
        _launch("cudaLaunchKernel", 1, 1, 1),
        _launch("cudaLaunchKernel", 3, 1, 2),
        _ev("python_function", "loss.py(5): metrics", 200, 700),
        _launch("cudaLaunchKernel", 600, 1, 3),  # after 500 us of Python: the GPU waited for this launch
        _launch("cudaLaunchKernel", 850, 1, 4),  # 30 us after the previous kernel ends: launch latency
        _kernel("gemm", 10, 50, 1),
        _kernel("gemm", 60, 40, 2),
        _kernel("reduce", 610, 10, 3),
        _kernel("mul", 650, 5, 4),
        _kernel("orphan", 700, 5, 99),  # no launch in the trace: not charged anywhere
    ]
    rows = trace_summary.launch_stacks(events)
    assert rows[0] == {
        "frames": ["loss.py(5): metrics", "trainer.py(10): update"],
        "gpu_events": 2,
        "idle_stretches": 1,
        "idle_ms": 0.5,
    }
    assert rows[1] == {
        "frames": ["model.py(3): forward", "trainer.py(10): update"],
        "gpu_events": 2,
        "idle_stretches": 0,
        "idle_ms": 0.0,
    }
    assert len(rows) == 2
    summary = trace_summary.summarise(events)
    assert summary["launch_stacks"] == rows
