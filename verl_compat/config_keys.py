"""The verl config keys verl-compat resolves, per role: one table for the driver's policy and the worker seams."""

from __future__ import annotations

ACTOR, REF, CRITIC = "actor", "ref", "critic"
# role -> (fsdp engine config, role config)
FSDP_ROLES: dict[str, tuple[str, str]] = {
    ACTOR: ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.actor"),
    REF: ("actor_rollout_ref.ref.fsdp_config", "actor_rollout_ref.ref"),
    CRITIC: ("critic.fsdp", "critic"),
}
# role -> HF model config
MODEL_ROLES: dict[str, str] = {ACTOR: "actor_rollout_ref.model", CRITIC: "critic.model"}
ROLLOUT = "actor_rollout_ref.rollout"

ROLLOUT_DTYPE = f"{ROLLOUT}.dtype"
ROLLOUT_ENFORCE_EAGER = f"{ROLLOUT}.enforce_eager"
ACTOR_ATTENTION = f"{MODEL_ROLES[ACTOR]}.override_config.attn_implementation"
CRITIC_ATTENTION = f"{MODEL_ROLES[CRITIC]}.override_config.attn_implementation"


def decision_suffix(role: str) -> str:
    """Decision-name suffix of a role: the actor's decisions carry the plain category name ('dtype.train')."""
    return "" if role == ACTOR else f".{role}"


def fused_keys(role: str) -> tuple[str, str]:
    """(use_fused_kernels, fused_kernel_options.impl_backend) of a role's model: the one kernels.fused decision."""
    model = MODEL_ROLES[role]
    return f"{model}.use_fused_kernels", f"{model}.fused_kernel_options.impl_backend"


def trainer_gpus(config) -> int:
    """GPUs (FSDP ranks) of the trainer pool: trainer.n_gpus_per_node x trainer.nnodes (1 each where unset)."""
    from omegaconf import OmegaConf

    def get(key: str, default: int) -> int:
        value = OmegaConf.select(config, key, default=None)
        return default if value is None else int(value)

    return get("trainer.n_gpus_per_node", 1) * get("trainer.nnodes", 1)


def offload_policy_keys(role: str) -> tuple[str, str]:
    """(strategy, offload_policy): the two keys that put `role` under FSDP2's CPU offload policy."""
    fsdp, role_cfg = FSDP_ROLES[role]
    return f"{role_cfg}.strategy", f"{fsdp}.offload_policy"


def offload_owner_keys(role: str) -> tuple[str, ...]:
    """The keys a user sets to decide where `role`'s model lives: with any of them set, the memory plan does not
    turn FSDP2's CPU offload policy on for it (the actor's strategy is the reference's too, by interpolation)."""
    fsdp, _ = FSDP_ROLES[role]
    own = (*offload_policy_keys(role), f"{fsdp}.param_offload", f"{fsdp}.optimizer_offload")
    return (*own, *offload_policy_keys(REF)) if role == ACTOR else own


def cpu_offload_policy(config, role: str, writes=None) -> bool:
    """Does verl train `role` with FSDP2's CPU offload policy (weights, grads and AdamW state on the host, the step
    there)? verl's engine honours `offload_policy` only under strategy fsdp2, and then ignores param/optimizer
    offload for that model. `writes`: {key: value} resolved but not yet written into `config`."""
    from omegaconf import OmegaConf

    def get(key: str):
        return writes[key] if writes and key in writes else OmegaConf.select(config, key, default=None)

    strategy_key, policy_key = offload_policy_keys(role)
    return str(get(strategy_key) or "fsdp") == "fsdp2" and bool(get(policy_key))


def fsdp_keys(suffix: str) -> str:
    """A key of every role's FSDP engine config, for seams that run in an engine that does not know its role:
    'actor_rollout_ref.actor.fsdp_config.X | actor_rollout_ref.ref.fsdp_config.X | critic.fsdp.X'."""
    return " | ".join(f"{fsdp}.{suffix}" for fsdp, _ in FSDP_ROLES.values())


def model_keys(suffix: str) -> str:
    """A key of every role's model config ('actor_rollout_ref.model.X | critic.model.X')."""
    return " | ".join(f"{model}.{suffix}" for model in MODEL_ROLES.values())
