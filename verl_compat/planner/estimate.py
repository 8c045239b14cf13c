"""Bytes of every part of a PPO/GRPO step on one GPU, per process and phase.

verl 0.9.1 (v1 trainer, one GPU per rank) puts actor, reference and critic in ONE trainer process (a colocated
worker) and the rollout server in a second process. Within the trainer the phases run one after another, so its
peak is the largest phase: the model of the phase fully on the GPU plus what the other models leave resident
(parameters unless param_offload; AdamW state unless optimizer_offload; the reference always streams from host
memory: verl gives a forward-only engine FSDP's CPU offload). Train mode loads the optimizer state for the
update, so optimizer offload lowers the other phases, not the update itself; where the state comes back only for
the optimizer step (memory.optimizer_load 'at_step'), the update needs the larger of the activations and it.

Activation sizes per token (worst case: every sequence at prompt + response length, remove-padding packing):
- training, per layer: `ModelShape.saved_activation_elems_per_token_layer` elements (8h + 4i + 2kv + 2q; on a
  CPU this matched torch's MemTracker within a few % for a Qwen2 shape, see tests/test_planner_measured.py);
  with gradient checkpointing only each layer's input (h) is kept, plus one layer recomputed during backward;
- log-prob phases: logits in the compute dtype plus fp32 work buffers of the vocabulary width (log-softmax
  rows; the softmax of the entropy verl computes with old log-probs), or one layer's MLP intermediates if larger
  (on CUDA more, as measured: see _forward_acts);
- the update: logits, their gradient and two fp32 work rows of the vocabulary width per token (with
  checkpointing: the larger of that and one recomputed layer).
With the fused head (Choice.fused_head: kernels.fused "torch") the vocabulary-wide tensors are those of one chunk
of tokens (JobSpec.fused_chunk, kernels.fused_chunk), whatever the micro-batch: at 512 tokens more than the logits
of one 512-token sequence, far less than those of several.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_compat.logprobs import BLOCK_BYTES as LOGPROB_BLOCK_BYTES
from verl_compat.planner.job import JobSpec
from verl_compat.planner.shape import ModelShape

GIB = 2**30
ADAM_STATES = 2  # exp_avg and exp_avg_sq, in the master dtype
# Outside the caching allocator: CUDA context, loaded kernels, cuBLAS workspaces, NCCL buffers. Measured on the H200
# (torch 2.11, CUDA 13; benchmarks/results/h200_oom_reports.json: "this process has X in use" minus what PyTorch
# reserved): trainer 1.21 GiB, rollout 0.60 GiB. Older cards load fewer kernel images, so these are the high side.
CONTEXT_TRAINER = int(1.25 * GIB)
CONTEXT_ROLLOUT = int(0.625 * GIB)
FRAGMENTATION = 0.08  # caching-allocator overhead over the live peak, added to each process's share
# Training activations on CUDA over this file's per-token count: 1.13 measured on the H200 (fp32, SDPA, the
# Qwen2.5-0.5B shape, micro-batches 2-16 x 512 tokens: benchmarks/train_microbatch_rate.py); the CPU count matched
# within a few %. The CUDA kernels keep more (SDPA's saved statistics, cuBLAS and autograd work buffers).
CUDA_TRAIN_ACTIVATIONS = 1.15
# The hf rollout on CUDA beyond its weights, KV cache and prefill: decode graphs' memory pools, kernel workspaces
# and the allocator's block rounding. Measured on the H200 under the P40 policy at batch 1: 286 MiB reserved above
# the weights (benchmarks/results/p40_h200_ppo_in_loop.json, rollout_server_torch_reserved_mib).
ROLLOUT_RUNTIME = 320 * 2**20
HEADROOM = 0.05  # of the card, kept free beyond every estimate
# The hf rollout server asleep (free_cache_engine: weights and KV cache freed), beyond its CUDA context: in nvidia-smi
# 748-812 MiB over 12 sleep cycles (benchmarks/results/rollout_memory_cycles_p40_round_k.json) and 750-754 MiB in
# verl's loop (p40_h200_ppo_planned_41steps_round_m.json), of which CONTEXT_ROLLOUT is the context.
ROLLOUT_ASLEEP = 192 * 2**20
SYNC = "update_weights"  # the trainer phase that runs while the rollout server is awake
# Host memory under FSDP2's CPU offload policy beyond its models' bytes (MemoryPlan.host_need). Measured on the H200
# host, T4 Qwen2.5-1.5B PPO with actor and critic under the policy (benchmarks/results/
# t4_h200_ppo_15b_offload_policy_round_q.json, host_used_mib above the pre-job level): the job's processes held
# 4.25 GiB before any model loaded; the peak during the steps was 67.97 GiB, so 63.72 GiB against the plan's 53.76 GiB
# of models, staging and reference weights (18.5% more; not broken down further).
HOST_PROCESSES = int(4.5 * GIB)
HOST_SLACK = 0.20


@dataclass(frozen=True)
class Choice:
    """One candidate plan: everything the planner decides."""

    actor_micro: int
    logprob_micro: int
    ref_micro: int
    critic_micro: int
    critic_fwd_micro: int
    actor_param_offload: bool
    actor_optim_offload: bool
    critic_param_offload: bool
    critic_optim_offload: bool
    actor_gc: bool
    critic_gc: bool
    rollout_batch: int  # sequences per generate call
    fused_head: bool = False  # the actor's log-probs by verl's fused torch head (kernels.fused "torch")


@dataclass
class Phase:
    process: str  # "trainer" | "rollout"
    name: str
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def _fused_head_bytes(
    shape: ModelShape, tokens: int, b: int, train: bool, entropy: bool, chunk: int, on_gpu: bool = False
) -> int:
    """The fused head's transient, in bytes per entry of one chunk's (chunk x vocab) fp32 logits, as measured on a
    CPU in fp32 and fp16 (tests/test_planner_measured.py): forward 12 (the logits, their softmax and its product
    with them; x1.5 on CUDA, the factor measured for the unfused forward), backward 24 (the chunk recomputed: logits,
    softmax, one-hot labels, their difference and its scaled copy; 12 more with the entropy in the loss) plus two
    weight-size gradients: the whole one the backward allocates and each chunk's partial one added to it."""
    if train:
        per_entry = 24 + (12 if entropy else 0)
        weight_grads = 2 * shape.vocab * shape.hidden * b
    else:
        per_entry, weight_grads = 12 * (1.5 if on_gpu else 1), 0
    return int(min(tokens, chunk) * shape.vocab * per_entry) + weight_grads


def _train_acts(shape: ModelShape, tokens: int, b: int, gc: bool, lm_head: bool, entropy: bool, fused=0) -> int:
    """`fused`: the fused head's chunk in tokens (0: unfused logits)."""
    per_layer = shape.saved_activation_elems_per_token_layer() * b
    if lm_head and fused:  # per token only the hidden state and the fp32 log-prob/entropy (and their gradients)
        head_tokens, head_fixed = 2 * shape.hidden * b + 16, _fused_head_bytes(shape, tokens, b, True, entropy, fused)
    else:
        head_tokens = shape.vocab * (2 * b + 8 + (8 if entropy else 0)) if lm_head else 2 * shape.hidden * b
        head_fixed = 0
    if gc:  # layer inputs, then either the layer being recomputed or the head's backward, not both at once
        return tokens * shape.layers * shape.hidden * b + max(tokens * max(per_layer, head_tokens), head_fixed)
    return tokens * (shape.layers * per_layer + head_tokens) + head_fixed


def _forward_acts(shape: ModelShape, tokens: int, b: int, lm_head: bool, entropy: bool, on_gpu: bool, fused=0):
    body = shape.forward_transient_elems_per_token() * b
    if lm_head and fused:
        fixed = _fused_head_bytes(shape, tokens, b, False, True, fused, on_gpu)
        return tokens * (2 * shape.hidden * b + 8) + max(tokens * body, fixed)
    head = 0
    if lm_head:
        # Bytes per vocabulary entry and token. On CUDA: the logits (plus an fp32 copy under 16-bit compute), two
        # fp32 log-softmax work tensors, and for the entropy its softmax, their product and logsumexp's exponentials.
        # Measured on the H200: a no-grad forward + log-softmax in fp32 kept 12 bytes (1.49x the CPU count;
        # benchmarks/train_microbatch_rate.py); under the T4 policy (fp16) verl's old_log_prob with entropy needed
        # >= 22 (h200_oom_reports.json: 1.55 GiB asked at 9.42 GiB allocated, 2,738 tokens).
        if on_gpu:
            per_entry = b + (4 if b < 4 else 0) + 8 + (12 if entropy else 0)
        else:
            per_entry = b + 4 + (4 if entropy else 0)
        head = shape.vocab * per_entry
    return tokens * (2 * shape.hidden * b + max(body, head))


def phase_activations(job: JobSpec, phase: str, micro: int, c: Choice) -> int:
    """Activation bytes of one trainer phase at `micro` sequences per micro-batch."""
    tokens, a, crit = micro * job.seq_len, job.actor, job.critic
    fused = job.fused_chunk if c.fused_head else 0
    train_margin = CUDA_TRAIN_ACTIVATIONS if job.on_gpu else 1.0
    # the log-prob block's transient (CPU keeps upstream's rows; the fused head computes its own log-probs)
    block = LOGPROB_BLOCK_BYTES if job.on_gpu and not fused else 0
    if phase == "old_log_prob":
        return _forward_acts(a, tokens, job.train_bytes, True, True, job.on_gpu, fused) + block
    if phase == "ref":
        return _forward_acts(a, tokens, job.train_bytes, True, False, job.on_gpu, fused) + block
    if phase == "values":
        return _forward_acts(crit, tokens, job.critic_train_bytes, False, False, job.on_gpu)
    if phase == "update_critic":
        return int(train_margin * _train_acts(crit, tokens, job.critic_train_bytes, c.critic_gc, False, False))
    if phase == "update_actor":
        acts = _train_acts(a, tokens, job.train_bytes, c.actor_gc, True, job.actor_entropy, fused)
        return int(train_margin * acts) + block
    return 0


def _resident(params: int, job: JobSpec, param_offload: bool, optim_offload: bool) -> dict[str, int]:
    return {
        "weights": 0 if param_offload else params * job.master_bytes,
        "optimizer": 0 if optim_offload else params * job.master_bytes * ADAM_STATES,
    }


def _cast_copies(shape: ModelShape, compute_bytes: int, master_bytes: int) -> int:
    """FSDP2 mixed precision: the unit being computed (and the next, prefetched) in the compute dtype."""
    return 0 if compute_bytes == master_bytes else 2 * shape.largest_unit_params * compute_bytes


def _streamed(shape: ModelShape, compute_bytes: int, master_bytes: int, train: bool) -> dict[str, int]:
    """A model under FSDP2's CPU offload policy, in one of its passes: the unit being computed and the next one
    (prefetched) come in from the host in the master dtype and are cast to the compute dtype; in a backward each
    of those units' gradients too, before they go back to the host. Nothing stays between passes."""
    unit = 2 * shape.largest_unit_params
    parts = {
        "units streamed from host": unit * (master_bytes + (compute_bytes if compute_bytes != master_bytes else 0))
    }
    if train:
        parts["unit gradients on their way to the host"] = unit * master_bytes
    return parts


def sync_staging_bytes(job: JobSpec) -> int:
    """The hf engine's weight sync stages tensors in one bucket, on the card or (an actor under FSDP2's CPU
    offload policy) in host shared memory, capped at the rollout's model size (Qwen2.5-0.5B fp32 fills 1.98 GB of
    the default 2048 MB); vLLM/SGLang servers bring their own transfer, not planned here (0)."""
    return min(job.sync_bucket_bytes, job.actor.lm_params * job.rollout_bytes) if job.engine == "hf" else 0


def trainer_phases(job: JobSpec, c: Choice) -> list[Phase]:
    a, m = job.actor, job.master_bytes
    pa = a.lm_params // job.world  # FSDP shards weights, grads and optimizer state over the ranks
    phases: list[Phase] = []
    crit = job.critic
    pc = crit.value_params // job.world if crit else 0
    host_a, host_c = job.host_offload

    def others(skip: str) -> dict[str, int]:
        out = {}
        if skip != "actor":
            offload = (c.actor_param_offload or host_a, c.actor_optim_offload or host_a)
            for k, v in _resident(pa, job, *offload).items():
                out[f"actor {k} (resident)"] = v
        if crit and skip != "critic":
            offload = (c.critic_param_offload or host_c, c.critic_optim_offload or host_c)
            for k, v in _resident(pc, job, *offload).items():
                out[f"critic {k} (resident)"] = v
        return out

    def own(role: str, shape: ModelShape, params: int, compute: int, train: bool) -> dict[str, int]:
        """The model of the phase: on the card whole (and its optimizer for an update), or streamed from host."""
        if (host_a, host_c)[role == "critic"]:
            return {f"{role} {k}": v for k, v in _streamed(shape, compute, m, train).items()}
        parts = {f"{role} weights": params * m, f"{role} fp16/32 unit copies": _cast_copies(shape, compute, m)}
        if train:
            parts[f"{role} grads"] = params * m
            if not state_at_step_bytes(job, f"update_{role}", c):  # else only the step holds it (below)
                parts[f"{role} optimizer"] = params * m * ADAM_STATES
        return parts

    p = Phase("trainer", "old_log_prob", own("actor", a, pa, job.train_bytes, False))
    if not (c.actor_optim_offload or host_a):
        p.parts["actor optimizer (resident)"] = pa * m * ADAM_STATES
    p.parts["activations"] = phase_activations(job, "old_log_prob", c.logprob_micro, c)
    p.parts |= others("actor")
    phases.append(p)

    if job.need_ref:
        p = Phase("trainer", "ref", {"reference units streamed from host": 2 * a.largest_unit_params * job.train_bytes})
        p.parts["activations"] = phase_activations(job, "ref", c.ref_micro, c)
        p.parts |= others("")
        phases.append(p)

    if crit:
        p = Phase("trainer", "values", own("critic", crit, pc, job.critic_train_bytes, False))
        if not (c.critic_optim_offload or host_c):
            p.parts["critic optimizer (resident)"] = pc * m * ADAM_STATES
        p.parts["activations"] = phase_activations(job, "values", c.critic_fwd_micro, c)
        p.parts |= others("critic")
        phases.append(p)
        p = Phase("trainer", "update_critic", own("critic", crit, pc, job.critic_train_bytes, True))
        p.parts["activations"] = phase_activations(job, "update_critic", c.critic_micro, c)
        p.parts |= others("critic")
        phases.append(p)

    p = Phase("trainer", "update_actor", own("actor", a, pa, job.train_bytes, True))
    p.parts["activations"] = phase_activations(job, "update_actor", c.actor_micro, c)
    p.parts |= others("actor")
    phases.append(p)

    # host-offloaded weights are gathered on the host and staged in shared memory: nothing of the sync on the card
    p = Phase("trainer", SYNC)
    if not host_a:
        p.parts |= {"actor weights": pa * m, "largest tensor gathered": a.embedding_params * m}
        if job.engine == "hf":
            p.parts["weight sync staging bucket"] = sync_staging_bytes(job)
    if not (c.actor_optim_offload or host_a):
        p.parts["actor optimizer (resident)"] = pa * m * ADAM_STATES
    p.parts |= others("actor")
    phases.append(p)
    held = _kept_by_stale_views(job, c)
    for ph in phases:
        if held:
            ph.parts["GPU copies of offloaded models kept by FSDP1 views"] = held
        label = _state_label(ph.name) if state_at_step_bytes(job, ph.name, c) else STEP_EXTRA
        ph.parts[label] = max(0, step_bytes(job, ph.name, c) - ph.parts.get("activations", 0))
        ph.parts = {k: v for k, v in ph.parts.items() if v}
    return phases


STEP_EXTRA = "optimizer step's sqrt(exp_avg_sq) beyond the activations"
STATE_AT_STEP = "optimizer, brought for the step, beyond the activations"  # after the role: "actor optimizer, ..."


def _state_label(phase: str) -> str:
    return f"{phase.removeprefix('update_')} {STATE_AT_STEP}"


def step_bytes(job: JobSpec, phase: str, c: Choice) -> int:
    """What an update holds for its optimizer step once the activations are freed: the step's temporaries, and the
    offloaded state where it comes back only for the step."""
    return optimizer_step_bytes(job, phase) + state_at_step_bytes(job, phase, c)


def beyond_activations(phase: Phase) -> int:
    """The part of a phase that step_bytes adds beyond its activations (either label)."""
    return phase.parts.get(STEP_EXTRA, 0) + phase.parts.get(_state_label(phase.name), 0)


def state_at_step_bytes(job: JobSpec, phase: str, c: Choice) -> int:
    """An update's offloaded AdamW state where it comes back only for optimizer.step() (memory.optimizer_load
    'at_step', verl_compat.optimizer_state): on the card after the activations are freed, so the phase needs
    max(activations, this + the step's temporaries) instead of their sum. 0 where it comes at train-mode entry, or
    where the update steps more than once (mini-batches, epochs): it stays on the card from the first step on."""
    if not (job.on_gpu and job.optimizer_at_step) or phase not in ("update_actor", "update_critic"):
        return 0
    critic = phase == "update_critic"
    if job.optimizer_steps(critic) > 1:
        return 0
    shape = job.critic if critic else job.actor
    offloaded = c.critic_optim_offload if critic else c.actor_optim_offload
    if shape is None or not offloaded or job.host_offload[critic]:
        return 0
    params = shape.value_params if critic else shape.lm_params
    return params // job.world * job.master_bytes * ADAM_STATES


def optimizer_step_bytes(job: JobSpec, phase: str) -> int:
    """torch's multi-tensor AdamW (foreach, its default on CUDA) computes sqrt(exp_avg_sq) for every parameter at
    once: one more model-size tensor at the step, when the activations are already freed, so an update phase
    needs max(activations, this). The planned P40 critic update OOMed there (benchmarks/results/
    h200_oom_reports.json, its last report). With the fused kernel (memory.optimizer_step) there is none; with the
    per-parameter loop, one parameter's worth."""
    if not job.on_gpu or phase not in ("update_actor", "update_critic"):
        return 0
    shape = job.actor if phase == "update_actor" else job.critic
    if shape is None or job.host_offload[phase == "update_critic"]:  # FSDP2's CPU offload steps on the host
        return 0
    step = job.adam_step[0 if phase == "update_actor" else 1]
    if step == "fused":  # the fused kernel updates in place
        return 0
    if step == "loop":  # one parameter at a time: the largest one, the embedding
        return shape.embedding_params // job.world * job.master_bytes
    params = shape.lm_params if phase == "update_actor" else shape.value_params
    return params // job.world * job.master_bytes


def _kept_by_stale_views(job: JobSpec, c: Choice) -> int:
    """Model-size copies a one-GPU trainer keeps after moving an offloaded model to the host, where FSDP1's stale
    views of the old GPU tensor survive (JobSpec.stale_views: upstream's behaviour, which verl_compat.fsdp_views
    changes below sm_80): the reference after each forward (FSDP1's CPUOffload), actor and critic after verl's
    param offload. Measured on the H200 under fp32 (benchmarks/results/p40_h200_resident_*_round_e.json): the
    planned P40 trainer held the reference's copy (allocated at FSDP's pre_unshard), the seed recipe's (all
    offloaded) the actor's and critic's (at verl's load_fsdp_model_to_gpu) and the reference's."""
    if not job.on_gpu or job.world != 1:
        return 0
    offloaded = {"ref": job.need_ref, "actor": c.actor_param_offload}
    offloaded["critic"] = job.critic is not None and c.critic_param_offload
    copies = sum(1 for role, off in offloaded.items() if off and role in job.stale_views)
    return copies * job.actor.lm_params * job.master_bytes


def rollout_phases(job: JobSpec, c: Choice) -> list[Phase]:
    """The rollout server during generation, and asleep where it frees its weights and KV cache between
    generations (JobSpec.rollout_sleeps)."""
    a, rb = job.actor, job.rollout_bytes
    rows = min(c.rollout_batch, job.rows)
    kv = rows * job.seq_len * a.kv_bytes_per_token(rb)
    prefill = rows * job.prompt_len * (a.forward_transient_elems_per_token() + 2 * a.hidden) * rb
    sampling = rows * a.vocab * 4 * 4  # fp32 logits of the last position: processors, softmax, log-probs
    parts = {
        "rollout weights copy": a.lm_params * rb,
        "KV cache": kv + kv // max(1, a.layers),  # DynamicCache grows by concatenation: one layer twice
        "prefill / sampling work": max(prefill, sampling),
        "decode graphs and workspaces": ROLLOUT_RUNTIME if job.on_gpu else 0,
    }
    parts = {k: v for k, v in parts.items() if v}
    phases = [Phase("rollout", "generate", parts)]
    if job.rollout_sleeps:
        phases.append(Phase("rollout", "asleep", {"asleep server beyond its CUDA context": ROLLOUT_ASLEEP}))
    return phases


@dataclass
class Estimate:
    """What the card holds at each moment of a step. Where the rollout server sleeps between generations
    (`rollout_sleeps`), the trainer's compute phases share the card with the asleep server only, and the server
    awake (the weight sync, then generation) shares it with the trainer's sync phase, the largest thing the trainer
    holds then (it empties its cache before the sync: measured 12,800 MiB while the server generated, 18,294 MiB
    in its own phases, p40_h200_ppo_planned_round_t.json). Otherwise both peaks are on the card together."""

    trainer: list[Phase]
    rollout: list[Phase]
    card_bytes: int
    on_gpu: bool
    rollout_sleeps: bool = False

    @property
    def trainer_peak(self) -> Phase:
        return max(self.trainer, key=lambda p: p.total)

    @property
    def rollout_peak(self) -> Phase:
        return max(self.rollout, key=lambda p: p.total)

    def share(self, process: str) -> int:
        """The allocator cap this process gets: its peak plus fragmentation."""
        peak = self.trainer_peak if process == "trainer" else self.rollout_peak
        return with_slack(peak)

    @property
    def contexts(self) -> int:
        return (CONTEXT_TRAINER + CONTEXT_ROLLOUT) if self.on_gpu else 0

    @property
    def headroom(self) -> int:
        return int(self.card_bytes * HEADROOM)

    @property
    def asleep(self) -> int:
        """The asleep server's share (0 where it does not sleep)."""
        return next((with_slack(p) for p in self.rollout if p.name == "asleep"), 0)

    @property
    def beside_compute(self) -> int:
        return beside_compute(self.rollout, self.rollout_sleeps)

    def moments(self) -> list[tuple[str, int]]:
        """(what is on the card, its bytes with the allocator slack) at each moment of the step, without the
        contexts and the headroom; one moment (both peaks) where the server does not sleep."""
        if not self.rollout_sleeps:
            return [(f"trainer {self.trainer_peak.name} + rollout {self.rollout_peak.name}", self._both())]
        awake = self.share("rollout")
        compute = [p for p in self.trainer if p.name != SYNC]
        out = [(f"trainer {p.name} + rollout asleep", with_slack(p) + self.asleep) for p in compute]
        out += [(f"trainer {p.name} + rollout awake", with_slack(p) + awake) for p in self.trainer if p.name == SYNC]
        return out

    def _both(self) -> int:
        return self.share("trainer") + self.share("rollout")

    @property
    def peak_moment(self) -> tuple[str, int]:
        return max(self.moments(), key=lambda m: m[1])

    @property
    def total(self) -> int:
        """What the card must hold: the fullest moment, the contexts and the headroom."""
        return self.peak_moment[1] + self.contexts + self.headroom

    @property
    def overflow(self) -> int:
        return self.total - self.card_bytes

    @property
    def fits(self) -> bool:
        return self.overflow <= 0


def beside_compute(rollout: list[Phase], sleeps: bool) -> int:
    """What the rollout server holds (with the allocator slack) beside the trainer's compute phases: its asleep
    share where it sleeps between generations, else its generation peak."""
    name = "asleep" if sleeps else "generate"
    return next(with_slack(p) for p in rollout if p.name == name)


def with_slack(phase: Phase) -> int:
    """A phase's bytes with the allocator's slack: what it holds of the card."""
    return int(phase.total * (1 + FRAGMENTATION))


def estimate(job: JobSpec, c: Choice) -> Estimate:
    return Estimate(trainer_phases(job, c), rollout_phases(job, c), job.card_bytes, job.on_gpu, job.rollout_sleeps)
