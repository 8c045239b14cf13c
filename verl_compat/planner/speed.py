"""A rough step-time model, used only to rank plans that fit (never to decide whether one fits).

Per card: fp32 and fp16 matmul rate, memory bandwidth, host link (published datasheet figures; the ranking
needs ratios, not exact times). Terms: generation = number of generate calls x response length x (a fixed
per-step cost per layer + weight reads + batch FLOPs); training = FLOPs / rate with the efficiency measured per
tokens in a micro-batch (x 4/3 with gradient checkpointing); offload = bytes moved over the host link per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl_compat.planner.estimate import ADAM_STATES, Choice
from verl_compat.planner.job import JobSpec


@dataclass(frozen=True)
class Rates:
    fp32_tflops: float
    fp16_tflops: float
    mem_gbs: float
    host_gbs: float


RATES = {
    "p40": Rates(11.8, 0.18, 347, 12),
    "p100": Rates(9.3, 18.7, 732, 12),
    "v100": Rates(15.7, 125, 900, 12),
    "v100-32gb": Rates(14.0, 112, 900, 12),
    "t4": Rates(8.1, 65, 320, 12),
    "rtx2080ti": Rates(13.4, 54, 616, 12),
    "gtx1660": Rates(5.0, 10, 192, 12),
    "gtx1660ti": Rates(5.4, 11, 288, 12),
    "a100": Rates(19.5, 312, 1555, 24),
    "h100": Rates(67, 989, 3350, 50),
    "cpu": Rates(0.2, 0.1, 20, 1000),
}
GENERIC = Rates(10, 20, 400, 12)
HOST_MEMORY_GBS = 20  # a desktop's host memory bandwidth, for AdamW stepped on the host (FSDP2's CPU offload)
# One decode step's cost per layer beyond its weight reads and FLOPs (Python, launches, small kernels), measured on
# the H200 at batch 1, fp32, Qwen2.5-0.5B shape (benchmarks/results/rollout_decode_h200_round_k.json: step minus
# both floors, over 24 layers; tests/test_planner_cuda_calibration.py): transformers' generate, which stands for
# every engine but the hf one on a GPU, and the hf engine's CUDA-graph decode step, the default on every CUDA card.
GENERATE_STEP_S_PER_LAYER = 0.71e-3
GRAPH_DECODE_STEP_S_PER_LAYER = 0.07e-3
# The model's own rate per tokens in a micro-batch, relative to its best: the Qwen2.5-0.5B shape in fp32 on the
# H200, training (forward + backward) and forward-only (benchmarks/results/train_microbatch_rate_h200_fp32.json;
# tests/test_planner_cuda_calibration.py checks these against it). A card with fewer SMs saturates earlier; for
# ranking, the shape of the curve is what matters: one 512-token sequence per micro-batch trains at a third of
# the rate of four.
TRAIN_EFFICIENCY = ((512, 0.354), (1024, 0.727), (2048, 0.910), (4096, 0.968), (8192, 1.0))
FORWARD_EFFICIENCY = ((512, 0.420), (1024, 0.731), (2048, 0.898), (4096, 0.995), (8192, 1.0))


# verl's loop adds host time per micro-batch and layer beyond the model's own (FSDP1's hooks, eager launches, the
# syncs of its metrics), the same on any card: measured on an H100 under the T4 policy, the same job planned at
# 2,048 and at 8,192 tokens per critic micro-batch (fp16, where the GPU's share is small; benchmarks/results/
# t4_h100_ppo_head_to_head_75b6848.json against t4_h100_ppo_planned_cc6932e.json, tests/test_planner_cuda_calibration
# .py derives them): the values pass took 44 ms more per micro-batch, the critic's update 107 ms (with gradient
# checkpointing its recompute adds one forward's). Without it the ranking preferred 2,048-token micro-batches
# over checkpointed 4,096/8,192-token ones, which ran 1.22x slower there.
MICRO_BATCH_HOST_S_PER_LAYER = {"forward": 1.84e-3, "train": 4.44e-3}


def rates_for(device_name: str) -> Rates:
    return RATES.get(device_name, GENERIC)


def _rate(r: Rates, dtype_bytes: int) -> float:
    return (r.fp16_tflops if dtype_bytes == 2 else r.fp32_tflops) * 1e12


def efficiency(micro_tokens: int, train: bool) -> float:
    """The measured curve, interpolated in log2(tokens); proportional below its first point, 1 past its last."""
    curve = TRAIN_EFFICIENCY if train else FORWARD_EFFICIENCY
    t = max(1, micro_tokens)
    if t <= curve[0][0]:
        return curve[0][1] * t / curve[0][0]
    for (t0, e0), (t1, e1) in zip(curve, curve[1:], strict=False):
        if t <= t1:
            return e0 + (e1 - e0) * (math.log2(t) - math.log2(t0)) / (math.log2(t1) - math.log2(t0))
    return curve[-1][1]


def _compute_s(flops_per_token: float, tokens: int, micro_tokens: int, rate: float, train: bool = False) -> float:
    return flops_per_token * tokens / (rate * efficiency(micro_tokens, train))


def step_seconds(job: JobSpec, c: Choice, device_name: str) -> dict[str, float]:
    r = rates_for(device_name)
    a, seq, rows = job.actor, job.seq_len, job.rows
    tokens = rows * seq
    out: dict[str, float] = {}
    calls = -(-rows // max(1, min(c.rollout_batch, rows)))
    batch = min(c.rollout_batch, rows)
    fixed = GRAPH_DECODE_STEP_S_PER_LAYER if job.engine == "hf" and job.on_gpu else GENERATE_STEP_S_PER_LAYER
    per_token = (
        fixed * a.layers
        + a.lm_params * job.rollout_bytes / (r.mem_gbs * 1e9)
        + 2 * a.lm_params * batch / _rate(r, job.rollout_bytes)
    )
    out["gen"] = calls * job.response_len * per_token
    fwd = 2.0 * a.lm_params
    out["old_log_prob"] = _compute_s(fwd, tokens, c.logprob_micro * seq, _rate(r, job.train_bytes))
    if job.need_ref:
        out["ref"] = _compute_s(fwd, tokens, c.ref_micro * seq, _rate(r, job.train_bytes))
    gc = 4 / 3
    # the fused head recomputes the vocabulary projection in its backward
    head = 2.0 * a.vocab * a.hidden if c.fused_head else 0.0
    out["update_actor"] = _compute_s(
        6.0 * a.lm_params * (gc if c.actor_gc else 1) + head,
        tokens,
        c.actor_micro * seq,
        _rate(r, job.train_bytes),
        True,
    )
    moved = 0.0
    if job.need_ref:  # FSDP1's CPU offload of the reference streams its weights in for every micro-batch
        moved += -(-rows // max(1, c.ref_micro)) * a.lm_params * job.master_bytes / job.world
    pa = a.lm_params * job.master_bytes / job.world
    if c.actor_param_offload:
        moved += 2 * 3 * 2 * pa  # weights + grads buffers in and out, three actor phases
    if c.actor_optim_offload:
        moved += 2 * ADAM_STATES * pa
    if job.critic:
        pc = job.critic.value_params * job.master_bytes / job.world
        cfwd = 2.0 * job.critic.value_params
        out["values"] = _compute_s(cfwd, tokens, c.critic_fwd_micro * seq, _rate(r, job.critic_train_bytes))
        out["update_critic"] = _compute_s(
            3 * cfwd * (gc if c.critic_gc else 1), tokens, c.critic_micro * seq, _rate(r, job.critic_train_bytes), True
        )
        if c.critic_param_offload:
            moved += 2 * 2 * 2 * pc
        if c.critic_optim_offload:
            moved += 2 * ADAM_STATES * pc
    # FSDP2's CPU offload policy: every pass streams the model's units in (master dtype), every backward sends its
    # gradients out, and AdamW steps on the host (reads weights, grads and both states, writes three of them)
    host_a, host_c = job.host_offload
    streamed = []  # (bytes of the model, passes over it, backwards)
    if host_a:
        updates = -(-rows // max(1, c.actor_micro))
        streamed.append((pa, -(-rows // max(1, c.logprob_micro)) + updates * (2 + int(c.actor_gc)), updates))
    if host_c and job.critic:
        updates = -(-rows // max(1, c.critic_micro))
        streamed.append((pc, -(-rows // max(1, c.critic_fwd_micro)) + updates * (2 + int(c.critic_gc)), updates))
    for size, passes, backwards in streamed:
        moved += (passes + backwards) * size
        out["host optimizer"] = out.get("host optimizer", 0.0) + 7 * size / (HOST_MEMORY_GBS * 1e9)
    out["offload"] = moved / (r.host_gbs * 1e9)
    if job.on_gpu:
        _add_host_per_micro_batch(out, job, c)
    return out


def _add_host_per_micro_batch(out: dict[str, float], job: JobSpec, c: Choice) -> None:
    fwd, train = MICRO_BATCH_HOST_S_PER_LAYER["forward"], MICRO_BATCH_HOST_S_PER_LAYER["train"]

    def cost(phase: str, micro_rows: int, layers: int, per_layer: float) -> None:
        if phase in out:
            out[phase] += -(-job.rows // max(1, micro_rows)) * layers * per_layer

    a = job.actor.layers
    cost("old_log_prob", c.logprob_micro, a, fwd)
    cost("ref", c.ref_micro, a, fwd)
    cost("update_actor", c.actor_micro, a, train + (fwd if c.actor_gc else 0))
    if job.critic:
        cost("values", c.critic_fwd_micro, job.critic.layers, fwd)
        cost("update_critic", c.critic_micro, job.critic.layers, train + (fwd if c.critic_gc else 0))
