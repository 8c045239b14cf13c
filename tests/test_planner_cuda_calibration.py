"""The planner's CUDA estimate covers what the H200 measured (benchmarks/results): the model's own activations per
micro-batch (train_microbatch_rate_h200_fp32.json), the T4-policy log-prob OOM and the non-allocator memory per
process that the OOM reports showed (h200_oom_reports.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from planner_shapes import QWEN25

from verl_compat.planner import estimate as E
from verl_compat.planner.job import JobSpec
from verl_compat.planner.shape import ModelShape

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
MIB = 2**20


def _job(train_bytes: int, on_gpu: bool = True) -> JobSpec:
    return JobSpec(
        actor=ModelShape.from_config(QWEN25["0.5B"]),
        critic=None,
        need_ref=True,
        card_bytes=24 * 2**30,
        device="p40",
        prompt_len=256,
        response_len=256,
        train_batch=32,
        n=1,
        mini_batch=32,
        critic_mini_batch=32,
        train_bytes=train_bytes,
        on_gpu=on_gpu,
    )


def _choice(micro: int) -> E.Choice:
    return E.Choice(micro, micro, micro, micro, micro, False, False, False, False, False, False, 32)


RATE = json.loads((RESULTS / "train_microbatch_rate_h200_fp32.json").read_text())


@pytest.mark.parametrize(
    "row", [r for r in RATE["rows"] if r["micro"] >= 2], ids=lambda r: f"{r['train']}-{r['micro']}"
)
def test_estimate_covers_the_models_measured_activations(row):
    """Forward rows: logits + log-softmax of the script (no entropy), so the reference phase's estimate."""
    job = _job(4)
    assert RATE["seq"] == job.seq_len
    phase = "update_actor" if row["train"] else "ref"
    estimated = E.phase_activations(job, phase, row["micro"], _choice(row["micro"]))
    measured = row["peak_above_weights_mib"] * MIB
    assert estimated >= measured, (phase, row["micro"], estimated / MIB, measured / MIB)
    assert estimated <= 1.5 * measured  # still an estimate, not a blanket margin


def test_estimate_covers_the_t4_log_prob_oom():
    """Under fp16 compute, old_log_prob at 8 x 512 asked 1.55 GiB at 9.42 GiB allocated with 2,738 real tokens:
    per token at least (9.42 + 1.55 - weights 1.84 - unit copies 0.51) GiB / 2,738; the estimate's worst case
    (every sequence at full length) must hold that per token."""
    reports = json.loads((RESULTS / "h200_oom_reports.json").read_text())["reports"]
    t4 = next(r for r in reports if r["run"].startswith("t4 planned"))
    assert "entropy_from_logits" in t4["last_frames"][-1]
    assert "Tried to allocate 1.55 GiB" in t4["error"] and "9.42 GiB is allocated" in t4["error"]
    job = _job(2)
    estimated_per_token = E.phase_activations(job, "old_log_prob", 8, _choice(8)) / (8 * job.seq_len)
    measured_per_token = (9.42 + 1.55 - 1.84 - 0.51) * 2**30 / 2738
    assert estimated_per_token >= measured_per_token


def test_contexts_are_the_measured_non_allocator_memory():
    # OOM reports on the H200: trainer "has 16.78 GiB in use" with 15.30 allocated + 0.27 reserved-unused; rollout
    # "has 2.55 GiB" with 1.84 + 0.11
    assert E.CONTEXT_TRAINER >= (16.78 - 15.30 - 0.27) * 2**30
    assert E.CONTEXT_ROLLOUT >= (2.55 - 1.84 - 0.11) * 2**30


def test_cpu_estimate_is_uncalibrated():
    cpu, gpu = _job(4, on_gpu=False), _job(4)
    assert E.phase_activations(cpu, "old_log_prob", 8, _choice(8)) < E.phase_activations(
        gpu, "old_log_prob", 8, _choice(8)
    )


def test_estimate_covers_the_p40_critic_update_oom_and_what_stayed_resident():
    """The planned P40 critic update OOMed in AdamW's foreach sqrt at 16.41 GiB allocated (+58 MiB asked), with
    the actor's weights and optimizer resident, its critic optimizer loaded and activations already freed. The
    estimate of that moment (the phase without activations, plus the step's sqrt(exp_avg_sq)) must cover it, and
    what the trainer held after a whole step (its memory snapshot) must be counted between phases. Both ran with
    FSDP1's stale views (before verl_compat.fsdp_views), so the reference's fp32 copy stayed on the GPU."""
    reports = json.loads((RESULTS / "h200_oom_reports.json").read_text())["reports"]
    oom = next(r for r in reports if r["run"].startswith("p40 planned @4e574de"))
    assert "_foreach_sqrt" in oom["last_frames"][-1] and "16.41 GiB is allocated" in oom["error"]
    job = dataclasses.replace(_job(4), critic=ModelShape.from_config(QWEN25["0.5B"]), stale_views=FLAT_VIEWS)
    that_plan = E.Choice(4, 4, 4, 16, 32, False, False, False, True, True, True, 32)
    phase = next(p for p in E.trainer_phases(job, that_plan) if p.name == "update_critic")
    at_step = phase.total - phase.parts["activations"] - phase.parts.get(E.STEP_EXTRA, 0)
    at_step += E.optimizer_step_bytes(job, "update_critic")
    assert at_step >= (16.41 * 2**30 + 58 * MIB)

    snapshot = json.loads((RESULTS / "p40_h200_resident_after_step.json").read_text())
    between = next(p for p in E.trainer_phases(job, that_plan) if p.name == "update_weights")
    counted = between.total - between.parts["weight sync staging bucket"]  # the bucket is freed after the sync
    assert counted >= snapshot["allocated"]


FLAT_VIEWS = frozenset({"actor", "ref", "critic"})


def test_the_copy_fsdp1_views_kept_is_the_references_and_is_counted():
    """Round D's snapshot (the P40 plan of then: actor and critic resident, the reference offloaded by FSDP1's
    CPUOffload, flat-parameter views): besides the two resident models' flat parameters, one whole fp32 model
    allocated at FSDP's pre_unshard (the move to the GPU for the reference's forward) was still live. The
    estimate with those views counts it; without them (verl_compat.fsdp_views) it is not there to count."""
    snapshot = json.loads((RESULTS / "p40_h200_resident_after_step_round_d.json").read_text())
    shape = ModelShape.from_config(QWEN25["0.5B"])
    moved_in = sum(g["bytes"] for g in snapshot["groups"] if "pre_unshard" in g["stack"])
    assert moved_in == pytest.approx(shape.lm_params * 4, rel=0.02)
    job = dataclasses.replace(_job(4), critic=shape, stale_views=FLAT_VIEWS)
    that_plan = E.Choice(2, 4, 8, 32, 32, False, True, False, True, True, True, 32)
    between = next(p for p in E.trainer_phases(job, that_plan) if p.name == "update_weights")
    counted = between.total - between.parts["weight sync staging bucket"]
    assert counted >= snapshot["allocated"]
    fixed = next(p for p in E.trainer_phases(dataclasses.replace(job, stale_views=frozenset()), that_plan))
    assert not any("FSDP1 views" in k for k in fixed.parts)


def test_the_seam_freed_the_copies_the_stale_views_kept():
    """Round E (flat-parameter views, and use_orig_params=true, which did not help): the planned side still held
    the reference's copy (pre_unshard), the seed recipe's side the actor's and critic's (verl's
    load_fsdp_model_to_gpu) too. Round F, with verl_compat.fsdp_views: none of them."""
    shape = ModelShape.from_config(QWEN25["0.5B"])

    def moved_in(name: str) -> int:
        groups = json.loads((RESULTS / name).read_text())["groups"]
        return sum(g["bytes"] for g in groups if "pre_unshard" in g["stack"] or "load_fsdp_model_to_gpu" in g["stack"])

    assert moved_in("p40_h200_resident_planned_round_e.json") == pytest.approx(shape.lm_params * 4, rel=0.02)
    assert moved_in("p40_h200_resident_seed_round_e.json") == pytest.approx(3 * shape.lm_params * 4, rel=0.05)
    assert moved_in("p40_h200_resident_planned_round_f.json") == 0


def test_the_ranking_uses_the_measured_micro_batch_efficiency():
    from verl_compat.planner import speed

    for train, curve in ((True, speed.TRAIN_EFFICIENCY), (False, speed.FORWARD_EFFICIENCY)):
        rows = {r["micro"] * RATE["seq"]: r["tflops"] for r in RATE["rows"] if r["train"] is train}
        best = max(rows.values())
        for tokens, eff in curve:
            assert eff == pytest.approx(rows[tokens] / best, abs=0.005), (train, tokens)
        assert speed.efficiency(768, train) == pytest.approx((curve[0][1] + curve[1][1]) / 2, abs=0.1)
        assert speed.efficiency(256, train) == pytest.approx(curve[0][1] / 2)


def test_the_decode_step_costs_are_the_measured_ones():
    """speed.py's fixed per-layer cost of a decode step: the measured step minus its weight-read and compute floors,
    batch 1, fp32, for plain generate and for the hf engine's graphs (rollout_decode_h200_round_k.json)."""
    from verl_compat.planner import speed

    run = json.loads((RESULTS / "rollout_decode_h200_round_k.json").read_text())["results"]["p40"]
    row, layers = run["rows"]["1"], ModelShape.from_config(QWEN25["0.5B"]).layers
    floors = run["weight_floor_ms"] + row["compute_floor_ms"]
    for measured, constant in (
        (row["generate_ms"], speed.GENERATE_STEP_S_PER_LAYER),
        (row["engine_graphs_ms"], speed.GRAPH_DECODE_STEP_S_PER_LAYER),
    ):
        assert constant * 1e3 == pytest.approx((measured - floors) / layers, rel=0.05)


@pytest.mark.parametrize(
    "name",
    [
        "t4_h200_ppo_15b_offload_policy_round_q.json",
        "p40_h200_ppo_15b_offload_policy_round_p.json",
        "p40_h200_ppo_15b_planned_policy_round_r.json",
    ],
)
def test_the_host_memory_under_the_offload_policy_covers_the_measured(name):
    """Qwen2.5-1.5B PPO with actor and critic under FSDP2's CPU offload policy: the host memory the plan asks for
    (models, reference weights, staging bucket, slack, processes) covers the measured peak above the pre-job
    level and is not a blanket margin; the processes' part covers what they held before any model loaded."""
    from verl_compat.planner.search import MemoryPlan

    run = json.loads((RESULTS / name).read_text())
    memory = run["sides"]["planned"]["raw"]["memory"]
    measured = memory["host_peak_above_base_mib"] * MIB
    shape = ModelShape.from_config(QWEN25["1.5B"])
    job = dataclasses.replace(
        _job(4), actor=shape, critic=shape, rollout_bytes=2 if name.startswith("t4") else 4, host_offload=(True, True)
    )
    need = MemoryPlan(job, None, None, {}, frozenset()).host_need()
    assert measured <= need <= 1.05 * measured, (need / 2**30, measured / 2**30)
    before_models = [s["host_used_mib"] - memory["host_base_mib"] for s in memory["samples"] if s["total_mib"] < 100]
    assert before_models and max(before_models) * MIB <= E.HOST_PROCESSES


def test_the_host_cost_per_micro_batch_is_the_measured_one():
    """speed.py's host time per micro-batch and layer: the same T4-policy job on one H100, planned at 2,048 tokens
    per critic micro-batch (no checkpointing) and at 8,192 (checkpointed). In fp16 there the GPU's share is small,
    so the values pass's difference per extra micro-batch is the forward's host cost, and the critic update's (less
    the checkpointed side's recompute, one forward per micro-batch) the training one's."""
    from verl_compat.planner import speed

    def side(name: str) -> dict:
        return json.loads((RESULTS / name).read_text())["sides"]["planned"]

    small, large = side("t4_h100_ppo_head_to_head_75b6848.json"), side("t4_h100_ppo_planned_cc6932e.json")
    critic_forward = "transformers.models.qwen2.modeling_qwen2.Qwen2ForTokenClassification.forward"

    def per_pass(s: dict) -> float:  # the critic's model forwards per step, over its two passes
        return s["raw"]["call_totals"][critic_forward]["calls"] / s["steps_completed"] / 2

    n_small, n_large = per_pass(small), per_pass(large)
    assert (n_small, n_large) == (6, 2)
    layers = ModelShape.from_config(QWEN25["0.5B"]).layers
    fwd = (small["phases_s"]["values"] - large["phases_s"]["values"]) / (n_small - n_large)
    train = (small["phases_s"]["update_critic"] - large["phases_s"]["update_critic"] + n_large * fwd) / (
        n_small - n_large
    )
    assert speed.MICRO_BATCH_HOST_S_PER_LAYER["forward"] == pytest.approx(fwd / layers, rel=0.02)
    assert speed.MICRO_BATCH_HOST_S_PER_LAYER["train"] == pytest.approx(train / layers, rel=0.02)


def test_the_ranking_orders_the_measured_t4_plans_as_they_ran():
    """The two T4 plans of that pair (same job, same H100): without the host term the ranking put the one that ran
    1.22x slower (2,048-token micro-batches, no checkpointing) first; with it, the faster one."""
    from verl_compat.catalog import get_profile
    from verl_compat.planner import speed

    shape = ModelShape.from_config(QWEN25["0.5B"])
    job = JobSpec(
        actor=shape, critic=shape, need_ref=True, card_bytes=get_profile("t4").total_memory_bytes, device="t4",
        prompt_len=256, response_len=256, train_batch=32, n=1, mini_batch=32, critic_mini_batch=32,
        train_bytes=2, critic_train_bytes=2, rollout_bytes=2, rollout_sleeps=True,
    )  # fmt: skip
    #                 actor, logprob, ref, critic, critic fwd micro-batch rows; offloads; checkpointing; rollout; head
    slower = E.Choice(4, 32, 32, 4, 4, False, True, False, True, False, False, 32, True)  # 75b6848: 3.54 s a step
    faster = E.Choice(8, 32, 32, 16, 16, False, True, False, True, True, True, 32, True)  # cc6932e: 2.91 s
    for name, s in (
        ("slower", "t4_h100_ppo_head_to_head_75b6848.json"),
        ("faster", "t4_h100_ppo_planned_cc6932e.json"),
    ):
        ran = json.loads((RESULTS / s).read_text())
        assert ran["plan"]["value"]["writes"]["critic.model.enable_gradient_checkpointing"] is (name == "faster")

    def ranked(c: E.Choice) -> float:
        return sum(speed.step_seconds(job, c, "t4").values())

    assert ranked(faster) < ranked(slower)
    without = dataclasses.replace(job, on_gpu=False)  # the host term applies on GPUs only
    assert sum(speed.step_seconds(without, faster, "t4").values()) > sum(
        speed.step_seconds(without, slower, "t4").values()
    )
