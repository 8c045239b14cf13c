"""The verl config keys the planner reads and fills (verl 0.9.1's ppo_trainer config)."""

from __future__ import annotations

AUTO = "auto"  # a value the user hands to the planner explicitly (the only way to plan on sm_80+)

ACTOR_MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
LOGPROB_MICRO = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
REF_MICRO = "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
CRITIC_MICRO = "critic.ppo_micro_batch_size_per_gpu"
CRITIC_FWD_MICRO = "critic.forward_micro_batch_size_per_gpu"
ACTOR_PARAM_OFFLOAD = "actor_rollout_ref.actor.fsdp_config.param_offload"
ACTOR_OPTIM_OFFLOAD = "actor_rollout_ref.actor.fsdp_config.optimizer_offload"
CRITIC_PARAM_OFFLOAD = "critic.fsdp.param_offload"
CRITIC_OPTIM_OFFLOAD = "critic.fsdp.optimizer_offload"
ACTOR_GC = "actor_rollout_ref.model.enable_gradient_checkpointing"
CRITIC_GC = "critic.model.enable_gradient_checkpointing"
ROLLOUT_BATCH = "actor_rollout_ref.rollout.engine_kwargs.hf.max_batch_size"
ROLLOUT_TOKENS = "actor_rollout_ref.rollout.engine_kwargs.hf.max_batch_tokens"
GPU_UTIL = "actor_rollout_ref.rollout.gpu_memory_utilization"
SYNC_BUCKET_MB = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"  # read, not planned

# verl's token budgets per micro-batch (use_dynamic_bsz): planned in place of the row counts above for the actor's
# passes when the user set none of them (MemoryPlan.writes).
ACTOR_DYNAMIC = "actor_rollout_ref.actor.use_dynamic_bsz"
LOGPROB_DYNAMIC = "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"
REF_DYNAMIC = "actor_rollout_ref.ref.log_prob_use_dynamic_bsz"
ACTOR_TOKENS = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
LOGPROB_TOKENS = "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
REF_TOKENS = "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"
TOKEN_KEYS = (ACTOR_DYNAMIC, LOGPROB_DYNAMIC, REF_DYNAMIC, ACTOR_TOKENS, LOGPROB_TOKENS, REF_TOKENS)
# verl's v1 trainer (trainer.use_v1, the default) sizes both critic passes by this one token budget
# (v1/trainer_base.py copies it into critic.fsdp's max_token_len_per_gpu and infer_max_token_len_per_gpu; the
# critic's row keys are read only by the v0 trainer). CriticConfig's default, absent from the yaml: 32768.
CRITIC_TOKENS = "critic.ppo_infer_max_token_len_per_gpu"
CRITIC_TOKENS_DEFAULT = 32768
TOKEN_BUDGET_OF = {ACTOR_TOKENS: ACTOR_MICRO, LOGPROB_TOKENS: LOGPROB_MICRO, REF_TOKENS: REF_MICRO}

MICRO_KEYS = (ACTOR_MICRO, LOGPROB_MICRO, REF_MICRO, CRITIC_MICRO, CRITIC_FWD_MICRO)
OFFLOAD_KEYS = (ACTOR_PARAM_OFFLOAD, ACTOR_OPTIM_OFFLOAD, CRITIC_PARAM_OFFLOAD, CRITIC_OPTIM_OFFLOAD)
GC_KEYS = (ACTOR_GC, CRITIC_GC)
ROLLOUT_KEYS = (ROLLOUT_BATCH, ROLLOUT_TOKENS, GPU_UTIL)
PLANNED_KEYS = (*MICRO_KEYS, *OFFLOAD_KEYS, *GC_KEYS, *ROLLOUT_KEYS)

# What a key is, in the words of an error message.
LABELS = {
    ACTOR_MICRO: "actor micro-batch",
    LOGPROB_MICRO: "old log-prob micro-batch",
    REF_MICRO: "reference micro-batch",
    CRITIC_MICRO: "critic micro-batch",
    CRITIC_FWD_MICRO: "critic forward micro-batch",
    CRITIC_TOKENS: "critic token budget, read by verl's v1 trainer",
    ACTOR_PARAM_OFFLOAD: "actor parameter offload",
    ACTOR_OPTIM_OFFLOAD: "actor optimizer offload",
    CRITIC_PARAM_OFFLOAD: "critic parameter offload",
    CRITIC_OPTIM_OFFLOAD: "critic optimizer offload",
    ACTOR_GC: "actor gradient checkpointing",
    CRITIC_GC: "critic gradient checkpointing",
    ROLLOUT_BATCH: "rollout batch (sequences)",
    ROLLOUT_TOKENS: "rollout KV budget (tokens)",
    GPU_UTIL: "rollout memory fraction",
}
