"""`JobSpec`: what the planner needs from a verl config (lengths, batches, algorithm, dtypes, engine, card)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_compat.config_keys import ACTOR, CRITIC, cpu_offload_policy, offload_owner_keys, trainer_gpus
from verl_compat.planner import keys as K
from verl_compat.planner.shape import ModelShape

DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "half": 2, "bf16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Setting:
    """One planned key as the config holds it: the user's value (kept), `auto` (planned), or left alone."""

    value: Any
    requested: bool

    @property
    def auto(self) -> bool:
        return isinstance(self.value, str) and self.value.strip().lower() == K.AUTO

    @property
    def fixed(self) -> bool:
        """A value the planner must keep: set by the user and not `auto`."""
        return self.requested and not self.auto


def token_budgets_allowed(packed: bool, token_keys_set: bool, settings: Mapping[str, Setting]) -> bool:
    """Token budgets bound a micro-batch's tokens as its rows x (prompt + response) do, and pack a step's shorter
    sequences into fewer micro-batches; only with packed sequences (padded, a budget would not bound the padded
    tensors) and only where every row count it replaces is the planner's."""
    rows_fixed = any(settings.get(k, Setting(None, False)).fixed for k in K.TOKEN_BUDGET_OF.values())
    return packed and not token_keys_set and not rows_fixed


@dataclass(frozen=True)
class JobSpec:
    actor: ModelShape
    critic: ModelShape | None  # None: no critic (GRPO and other critic-free estimators)
    need_ref: bool
    card_bytes: int
    device: str  # DeviceProfile.describe()
    prompt_len: int
    response_len: int
    train_batch: int  # prompts per step (data.train_batch_size)
    n: int  # samples per prompt
    mini_batch: int  # prompts per actor mini-batch
    critic_mini_batch: int
    world: int = 1  # GPUs (FSDP ranks); one rollout replica per GPU
    train_bytes: int = 4  # compute dtype of the FSDP engines (mixed precision param_dtype)
    critic_train_bytes: int = 4
    master_bytes: int = 4  # FSDP master weights, grads and AdamW state
    rollout_bytes: int = 4
    engine: str = "hf"
    on_gpu: bool = True  # False on a CPU: no CUDA contexts
    # the hf rollout server frees its weights and KV cache on the GPU between generations (rollout.free_cache_engine,
    # verl's default): the trainer's compute phases then share the card with the asleep server only
    rollout_sleeps: bool = False
    actor_entropy: bool = False  # entropy_coeff != 0: the update keeps an entropy graph too
    use_dynamic_bsz: bool = False
    sync_bucket_bytes: int = 2048 << 20  # rollout.checkpoint_engine.update_weights_bucket_megabytes
    adam_step: tuple[str, str] = ("default", "default")  # (actor, critic): memory.optimizer_step's choices
    optimizer_at_step: bool = False  # an offloaded AdamW state comes back only for the step (memory.optimizer_load)
    epochs: tuple[int, int] = (1, 1)  # (actor, critic) ppo_epochs: passes over each update's mini-batches
    # roles ("actor", "ref", "critic") whose GPU copy outlives a move to the host (verl_compat.fsdp_views)
    stale_views: frozenset[str] = frozenset()
    # the actor's fused head (kernels.fused): "off", "on" (the user's), "free" (the device allows verl's torch
    # backend and nobody set it: the plan chooses, since at one sequence per micro-batch it holds more)
    fused_head: str = "off"
    fused_chunk: int = 512  # its tokens per chunk (kernels.fused_chunk)
    # the actor's passes sized by token budgets (verl's use_dynamic_bsz) instead of rows: packed sequences and none
    # of K.TOKEN_KEYS or the actor's row counts set by the user (see token_budgets_allowed)
    token_budgets: bool = False
    # (actor, critic) trained with FSDP2's CPU offload policy (strategy fsdp2 + offload_policy, the user's choice):
    # weights, gradients and AdamW state in host memory, the optimizer step on the host, each FSDP unit streamed in
    host_offload: tuple[bool, bool] = (False, False)
    host_memory_bytes: int | None = None  # the machine's RAM (None: unknown), for what host_offload keeps there
    # (actor, critic) the plan may put under that policy itself, below sm_80 where nothing else fits: the user set
    # none of the keys that decide where the model lives (config_keys.offload_owner_keys)
    policy_free: tuple[bool, bool] = (False, False)
    # verl's v1 trainer runs the critic: both its passes take K.CRITIC_TOKENS tokens per micro-batch, its row
    # keys unread; critic_tokens is that budget where the user set it (None: the planner's, or verl's default)
    critic_v1: bool = False
    critic_tokens: int | None = None
    settings: Mapping[str, Setting] = field(default_factory=dict)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def rows(self) -> int:
        """Sequences per step on one GPU."""
        return max(1, self.train_batch * self.n // self.world)

    @property
    def mini_rows(self) -> int:
        return max(1, self.mini_batch * self.n // self.world)

    @property
    def critic_mini_rows(self) -> int:
        return max(1, self.critic_mini_batch * self.n // self.world)

    def optimizer_steps(self, critic: bool) -> int:
        """AdamW steps in one update of the actor (or critic): epochs x mini-batches."""
        mini = self.critic_mini_rows if critic else self.mini_rows
        return self.epochs[critic] * -(-self.rows // mini)

    def critic_budget_planned(self, free: frozenset[str]) -> bool:
        """The planner writes the critic's v1 token budget: the user left it, and the critic's rows are planned."""
        rows_free = K.CRITIC_MICRO in free or K.CRITIC_FWD_MICRO in free
        return self.critic_v1 and self.critic_tokens is None and rows_free

    @property
    def critic_budget_unplanned(self) -> int:
        """The critic's v1 token budget when the planner writes none: the user's, else verl's default."""
        return self.critic_tokens or K.CRITIC_TOKENS_DEFAULT

    def critic_budget_rows(self) -> int:
        """Full-length rows in one critic micro-batch under that budget."""
        return max(1, min(self.critic_budget_unplanned // self.seq_len, self.rows))

    def setting(self, key: str) -> Setting:
        return self.settings.get(key, Setting(None, False))

    def with_(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_verl_config(
        cls,
        config: Any,
        card_bytes: int,
        device: str,
        is_requested: Callable[[str], bool],
        dtypes: Mapping[str, str],
        engine: str,
        on_gpu: bool = True,
        shape_loader: Callable[[str], ModelShape] | None = None,
        adam_step: tuple[str, str] = ("default", "default"),
        stale_views: frozenset[str] = frozenset(),
        fused_head: str = "off",
        fused_chunk: int = 512,
        packed: bool = False,
    ) -> JobSpec:
        """From a composed verl DictConfig. `dtypes`: {"train", "train.critic", "rollout"} short names as the
        dtype resolvers chose them; `adam_step`: (actor, critic) AdamW implementation, as the
        memory.optimizer_step decisions chose them; `stale_views`: the roles whose offloaded GPU copy stays (see
        JobSpec.stale_views); `fused_head`, `fused_chunk`: see JobSpec; `packed`: use_remove_padding as decided.
        Raises ValueError when the model's config cannot be read."""
        from omegaconf import OmegaConf

        def get(key: str, default: Any = None) -> Any:
            value = OmegaConf.select(config, key, default=default, throw_on_missing=False)
            return default if value is None else value

        remote = bool(get("actor_rollout_ref.model.trust_remote_code"))
        load = shape_loader or (lambda p: ModelShape.from_path(p, remote))
        actor_path = os.path.expanduser(str(get("actor_rollout_ref.model.path", "")))

        def load_for(key: str, path: str) -> ModelShape:
            try:
                return load(path)
            except (OSError, ValueError) as e:
                raise type(e)(f"{key}={path}: {e}") from e

        actor = load_for("actor_rollout_ref.model.path", actor_path)
        critic_enable = get("critic.enable")
        need_critic = bool(critic_enable) if critic_enable is not None else get("algorithm.adv_estimator") == "gae"
        critic = None
        if need_critic:
            critic_path = os.path.expanduser(str(get("critic.model.path", actor_path) or actor_path))
            critic = actor if critic_path == actor_path else load_for("critic.model.path", critic_path)
        world = trainer_gpus(config)

        host_offload = (cpu_offload_policy(config, ACTOR), need_critic and cpu_offload_policy(config, CRITIC))

        def policy_free(role: str, on: bool) -> bool:
            keys = offload_owner_keys(role)
            return not on and not any(is_requested(k) and not Setting(get(k), True).auto for k in keys)

        settings = {k: Setting(OmegaConf.select(config, k, default=None), is_requested(k)) for k in K.PLANNED_KEYS}
        token_keys_set = any(is_requested(k) for k in K.TOKEN_KEYS)
        train_batch = int(get("data.train_batch_size", 1))
        mini = int(get("actor_rollout_ref.actor.ppo_mini_batch_size", train_batch))
        return cls(
            actor=actor,
            critic=critic,
            need_ref=bool(get("algorithm.use_kl_in_reward", False)) or bool(get("actor_rollout_ref.actor.use_kl_loss")),
            card_bytes=card_bytes,
            device=device,
            prompt_len=int(get("data.max_prompt_length", 512)),
            response_len=int(get("data.max_response_length", 512)),
            train_batch=train_batch,
            n=int(get("actor_rollout_ref.rollout.n", 1)),
            mini_batch=mini,
            critic_mini_batch=int(get("critic.ppo_mini_batch_size", mini)),
            epochs=(
                int(get("actor_rollout_ref.actor.ppo_epochs", 1)),
                int(get("critic.ppo_epochs", get("actor_rollout_ref.actor.ppo_epochs", 1))),
            ),
            world=max(1, world),
            train_bytes=DTYPE_BYTES.get(str(dtypes.get("train", "fp32")).lower(), 4),
            critic_train_bytes=DTYPE_BYTES.get(str(dtypes.get("train.critic", dtypes.get("train", "fp32"))).lower(), 4),
            rollout_bytes=DTYPE_BYTES.get(str(dtypes.get("rollout", "fp32")).lower(), 4),
            engine=str(engine),
            on_gpu=on_gpu,
            rollout_sleeps=on_gpu
            and str(engine) == "hf"
            and bool(get("actor_rollout_ref.rollout.free_cache_engine", True)),
            actor_entropy=float(get("actor_rollout_ref.actor.entropy_coeff", 0) or 0) != 0,
            use_dynamic_bsz=bool(get("actor_rollout_ref.actor.use_dynamic_bsz", False)),
            sync_bucket_bytes=int(get(K.SYNC_BUCKET_MB, 2048)) << 20,
            adam_step=tuple(adam_step),
            stale_views=frozenset(stale_views),
            fused_head=fused_head,
            fused_chunk=int(fused_chunk),
            token_budgets=token_budgets_allowed(packed, token_keys_set, settings),
            host_offload=host_offload,
            policy_free=(policy_free(ACTOR, host_offload[0]), need_critic and policy_free(CRITIC, host_offload[1])),
            critic_v1=need_critic and bool(get("trainer.use_v1", True)),
            critic_tokens=int(get(K.CRITIC_TOKENS)) if is_requested(K.CRITIC_TOKENS) else None,
            settings=settings,
        )
