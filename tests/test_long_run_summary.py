"""benchmarks/long_run_summary.py: a long run's step times, verl's allocator peaks and the nvidia-smi samples of
the same steps, span by span."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.long_run_summary import load_run, spans  # noqa: E402


def _record(tmp_path: Path) -> Path:
    # 4 steps of 2 s after a 10 s start; the card fills up in step 3 only
    steps = [3.0, 2.0, 2.0, 2.0]
    seen = {1: 13.0, 2: 15.0, 3: 17.0, 4: 19.0}
    samples = [
        {"t": 100.0 + t, "total_mib": 9000 if 15 < t <= 17 else 5000, "per_pid_mib": {"11": 4000, "12": 1000}}
        for t in range(0, 20)
    ]
    raw = {
        "summary": {
            "timing_s/step": {"per_step": steps},
            "perf/total_num_tokens": {"per_step": [100.0] * 4},
            "actor/perf/max_memory_reserved_gb": {"per_step": [1.0, 1.0, 1.5, 1.5]},
        },
        "memory": {"samples": samples},
        "t0": 100.0,
        "step_seen_s": {str(k): v for k, v in seen.items()},
    }
    path = tmp_path / "h2h.json"
    path.write_text(json.dumps({"sides": {"planned": {"raw": raw}}}))
    return path


def test_spans_join_the_memory_samples_to_the_steps_that_ran_during_them(tmp_path):
    rows = spans(load_run(_record(tmp_path)), span=2)
    assert [r["steps"] for r in rows] == ["1-2", "3-4"]
    assert rows[0]["step_s_max"] == 3.0 and rows[0]["tokens_per_s"] == 40.0
    assert rows[0]["card_peak_mib"] == 5000 and rows[1]["card_peak_mib"] == 9000
    assert rows[1]["actor_reserved_gib"] == 1.5 and rows[0]["critic_reserved_gib"] is None
    assert rows[1]["process_peaks_mib"] == {"11": 4000, "12": 1000}


def test_a_bare_metrics_file_gives_verls_own_figures_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": s, "data": {"timing_s/step": 2.0 + s, "perf/total_num_tokens": 10.0}} for s in (2, 1, 3)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"note": 1}\n')
    (row,) = spans(load_run(path), span=5)
    assert row["steps"] == "1-3" and row["step_s_median"] == 4.0 and "card_peak_mib" not in row
