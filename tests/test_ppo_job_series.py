"""benchmarks/ppo_job.py's per-step series from verl's jsonl metrics: a skipped fp16 step's grad norm is inf,
which verl's file logger (orjson) writes as null; the series keeps the step and the median skips it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder of scripts, not installed
from benchmarks.ppo_job import _series, median_after_first  # noqa: E402


def test_a_non_finite_metric_from_verls_file_logger_is_kept_as_nan_and_left_out_of_the_median():
    logged = [{"actor/grad_norm": v, "timing_s/step": 2.0} for v in (1.5, math.inf, 0.5, 0.7)]
    rows = [json.loads(orjson.dumps({"step": i + 1, "data": d})) for i, d in enumerate(logged)]
    assert rows[1]["data"]["actor/grad_norm"] is None  # what verl's FileLogger writes for inf
    series = _series(rows, "actor/grad_norm")
    assert len(series) == 4 and math.isnan(series[1]) and series[2:] == [0.5, 0.7]
    assert median_after_first(series) == 0.6  # steps 2+, finite ones
    assert median_after_first(_series(rows, "timing_s/step")) == 2.0
    assert _series(rows, "critic/grad_norm") == [] and median_after_first([]) is None


def test_a_failed_job_keeps_its_log_tail_and_the_per_role_memory_series(tmp_path, monkeypatch):
    """A run on a lent GPU machine that fails leaves its reason in the result (the machine goes back with the
    log); the memory series read verl's role-prefixed names (the trainer renames the engine's perf/ metrics)."""
    import benchmarks.ppo_job as ppo_job

    def fake_job(setting, assets, steps, extra, gpus):
        # one logged step as verl's FileLogger writes it, then a crash
        row = {"step": 1, "data": {"timing_s/step": 3.0, "actor/perf/max_memory_allocated_gb": 1.25}}
        code = (
            f"import json, os; open(os.environ['VERL_FILE_LOGGER_PATH'], 'w').write(json.dumps({row!r}) + '\\n'); "
            "print('line one'); print('CUDA error: out of memory'); raise SystemExit(3)"
        )
        return [sys.executable, "-c", code]

    monkeypatch.setattr(ppo_job, "job_command", fake_job)
    result = ppo_job.run_setting("a_seed_recipe", None, 1, tmp_path / "job")
    assert result["returncode"] == 3 and result["steps_completed"] == 1
    assert result["log_tail"][-1] == "CUDA error: out of memory"
    assert result["summary"]["actor/perf/max_memory_allocated_gb"]["per_step"] == [1.25]


def test_sigterm_stops_the_job_as_its_timeout_does_and_the_results_are_still_returned(tmp_path, monkeypatch):
    """A device round's `timeout` sends SIGTERM: the job is killed and what it logged is kept (it was lost)."""
    import os
    import signal
    import threading

    import benchmarks.ppo_job as ppo_job

    def slow_job(setting, assets, steps, extra, gpus):
        row = {"step": 1, "data": {"timing_s/step": 2.0}}
        code = (
            "import json, os, time; "
            f"open(os.environ['VERL_FILE_LOGGER_PATH'], 'w').write(json.dumps({row!r}) + '\\n'); "
            "print('step 1 done', flush=True); time.sleep(60)"
        )
        return [sys.executable, "-c", code]

    monkeypatch.setattr(ppo_job, "job_command", slow_job)
    monkeypatch.setattr(ppo_job, "STOP", threading.Event())
    previous = signal.getsignal(signal.SIGTERM)
    try:
        ppo_job.stop_on_sigterm()
        threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        result = ppo_job.run_setting("a_seed_recipe", None, 1, tmp_path / "job")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result["stopped_by_signal"] and result["returncode"] != 0 and result["wall_s"] < 30
    assert result["steps_completed"] == 1 and result["log_tail"] == ["step 1 done"]


def test_the_planned_floor_needs_only_the_planned_side_and_the_ratio_both():
    from benchmarks.p40_ppo_head_to_head import planned_figures, step_flops

    planned = {"tokens_per_step": 10_000.0, "step_s": 6.0, "tokens_per_s": 10_000 / 6.0}
    alone = planned_figures({"planned": planned}, 500_000_000, 50.0)
    floor = step_flops(500_000_000, 10_000.0, 32 * 256) / 50e12
    assert alone == {"planned_vs_floor": {"floor_s": floor, "step_s": 6.0, "ratio": 6.0 / floor}}
    seed = {"tokens_per_s": 100.0}
    both = planned_figures({"planned": planned, "a_seed_recipe": seed}, 500_000_000, 50.0)
    assert both["tokens_per_s_ratio"] == planned["tokens_per_s"] / 100.0
    assert planned_figures({"planned": {**planned, "step_s": None}}, 1, 1.0) == {}


def test_a_running_job_leaves_its_progress_behind_before_it_ends(tmp_path, monkeypatch):
    """A run longer than the machine that holds it: the record so far (steps, memory samples) is on disk while the
    job still runs, marked unfinished (returncode None), and the final record replaces it."""
    import threading

    import benchmarks.ppo_job as ppo_job

    def slow_job(setting, assets, steps, extra, gpus):
        row = {"step": 1, "data": {"timing_s/step": 2.0}}
        code = (
            "import json, os, time; "
            f"open(os.environ['VERL_FILE_LOGGER_PATH'], 'w').write(json.dumps({row!r}) + '\\n'); time.sleep(60)"
        )
        return [sys.executable, "-c", code]

    monkeypatch.setattr(ppo_job, "job_command", slow_job)
    monkeypatch.setattr(ppo_job, "STOP", threading.Event())
    monkeypatch.setattr(ppo_job, "PROGRESS_S", 0.5)
    progress, seen = tmp_path / "progress.json", {}

    def look_then_stop():
        seen.update(json.loads(progress.read_text()))
        ppo_job.STOP.set()

    threading.Timer(4.0, look_then_stop).start()
    result = ppo_job.run_setting("a_seed_recipe", None, 1, tmp_path / "job", progress=progress)
    assert seen["returncode"] is None and seen["steps_completed"] == 1 and 1 in map(int, seen["step_seen_s"])
    assert "samples" in seen["memory"] and seen["t0"] == result["t0"]
    final = json.loads(progress.read_text())
    assert final["returncode"] == result["returncode"] is not None and final["stopped_by_signal"]
