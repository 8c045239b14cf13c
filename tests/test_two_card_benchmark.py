"""benchmarks/two_card_ppo.py's bookkeeping (the GPU run itself needs 2 GPUs): the job command per card count, the
batch per card, the tokens/s ratio, memory per card and NCCL error lines from a job's records."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder of scripts, not installed
from benchmarks import two_card_ppo as bench  # noqa: E402
from benchmarks.ppo_job import Assets, job_command  # noqa: E402


def test_job_command_sets_the_gpu_count_once() -> None:
    cmd = job_command("b_batch32", Assets(Path("m"), Path("t"), Path("v")), 3, gpus=2)
    assert [a for a in cmd if a.startswith("trainer.n_gpus_per_node=")] == ["trainer.n_gpus_per_node=2"]


def test_job_command_runs_the_steps_asked_for_past_one_epoch() -> None:
    # verl's loop stops at total_epochs or total_training_steps, whichever comes first: the shipped GSM8K split is
    # 41 steps of 32 prompts, so a 65-step run needs more than one epoch (round M stopped at 41)
    cmd = job_command("b_batch32", Assets(Path("m"), Path("t"), Path("v")), 300)
    assert "trainer.total_training_steps=300" in cmd
    epochs = [int(a.split("=")[1]) for a in cmd if a.startswith("trainer.total_epochs=")]
    assert len(epochs) == 1 and epochs[0] >= 300


def test_weak_scaling_doubles_the_prompts_per_step_strong_keeps_them() -> None:
    assert bench.batch_overrides("b_batch32", 2, "weak") == [
        "data.train_batch_size=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    ]
    assert bench.batch_overrides("b_batch32", 2, "strong") == []
    assert bench.batch_overrides("b_batch32", 1, "weak") == []


def _result(tmp_path: Path, cards: int, tokens: float, step_s: float, peaks: dict, log: str = "") -> dict:
    (tmp_path / f"job{cards}.log").write_text(log)
    series = {"per_step": [], "median_after_first": None}
    summary = {k: series for k in ("timing_s/gen", "timing_s/update_weights", "timing_s/update_actor")}
    summary["training/rollout_probs_diff_max"] = series
    summary["perf/total_num_tokens"] = {"per_step": [tokens] * 3}
    summary["timing_s/step"] = {"per_step": [step_s * 2, step_s, step_s], "median_after_first": step_s}
    rollout = [{"kind": "rollout_batch", "pid": 100 + i, "requests": 4} for i in range(cards)]
    return {
        "returncode": 0,
        "steps_completed": 3,
        "overrides": [],
        "summary": summary,
        "rollout_stats": rollout,
        "memory": {"peak_per_gpu_mib": peaks, "samples": [{"per_gpu_mib": peaks}]},
        "log": str(tmp_path / f"job{cards}.log"),
        "startup_s": 1.0,
        "wall_s": 2.0,
    }


def test_ratio_memory_per_card_and_nccl_errors(tmp_path: Path) -> None:
    card = bench.card_memory_mib("t4")
    one = bench.analyse(_result(tmp_path, 1, 10_000, 40.0, {0: 12_000, 1: 3}), "t4", 1)
    two = bench.analyse(_result(tmp_path, 2, 20_000, 42.0, {0: 12_500, 1: 12_400}), "t4", 2)
    assert one["tokens_per_s_median_after_first"] == 250.0 and one["gpus_in_use"] == [0]
    good = bench.compare(one, two)
    assert good["scaling_ratio"] == round((20_000 / 42) / 250, 3) and good["ok"]

    over = bench.analyse(_result(tmp_path, 2, 20_000, 42.0, {0: card + 1, 1: 12_000}), "t4", 2)
    assert over["samples_above_card_per_gpu"] == {"0": 1} and not bench.compare(one, over)["ok"]
    slow = bench.analyse(_result(tmp_path, 2, 20_000, 70.0, {0: 12_000, 1: 12_000}), "t4", 2)
    assert not bench.compare(one, slow)["scaling_target_met"]
    log = "step:1 - ok\n(WorkerDict pid=7) host:123:456 [1] NCCL WARN Cuda failure 'out of memory'\n"
    broken = bench.analyse(_result(tmp_path, 2, 20_000, 42.0, {0: 12_000, 1: 12_000}, log), "t4", 2)
    assert broken["nccl_error_lines"] == 1 and not bench.compare(one, broken)["ok"]


def test_nonfinite_losses_fail_the_comparison(tmp_path: Path) -> None:
    rows = [  # verl's file logger writes nan as null
        '{"step": 1, "data": {"actor/pg_loss": 0.1, "critic/vf_loss": NaN, "actor/grad_norm": Infinity}}',
        '{"step": 2, "data": {"actor/pg_loss": null, "critic/vf_loss": 0.2}}',
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    expected = ["step 1: critic/vf_loss=nan", "step 2: actor/pg_loss=None"]
    assert bench.nonfinite_losses(tmp_path / "metrics.jsonl") == expected
    one = bench.analyse(_result(tmp_path, 1, 10_000, 40.0, {0: 12_000}), "t4", 1)
    two = bench.analyse(_result(tmp_path, 2, 20_000, 42.0, {0: 12_000, 1: 12_000}), "t4", 2)
    assert one["nonfinite_losses"] and not bench.compare(one, two)["ok"]
