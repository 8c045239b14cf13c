"""The job policy: read a verl config, resolve every category for a device, and write the results back.

`resolve_job_config` is what the driver-side seam calls (verl/trainer/main_ppo.py, right after auto_set_device).
On sm_80+ it writes nothing (the only exception: a missing/`auto` rollout.name, which upstream refuses anyway).
`default_policy` composes verl's own ppo_trainer config and returns the decisions, for the doctor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_compat.config_keys import (
    ACTOR,
    CRITIC,
    FSDP_ROLES,
    MODEL_ROLES,
    ROLLOUT,
    cpu_offload_policy,
    decision_suffix,
    fused_keys,
    trainer_gpus,
)
from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers import attention, dtype, helpers, kernels, memory, placement, rollout_engine
from verl_compat.resolvers.registry import Registry, Request
from verl_compat.user_keys import RequestedKeys, doctor_searchpath, requested_keys, verl_config_dir

UPSTREAM_ATTN = "flash_attention_2"
FULL_FP32_REDUCE = {"reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _get(config: DictConfig, key: str, default: Any = None) -> Any:
    value = OmegaConf.select(config, key, default=default, throw_on_missing=False)
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


@dataclass
class _Plan:
    """Decisions, and the config writes they imply (applied only by resolve_job_config)."""

    config: DictConfig
    profile: DeviceProfile
    requested: RequestedKeys
    registry: Registry | None
    platform: DeviceProfile  # where the job runs: the profile, or the CPU for a simulated card on a CPU host
    decisions: dict[str, Decision] = field(default_factory=dict)
    writes: dict[str, Any] = field(default_factory=dict)

    def request(
        self, category: str, keys: Iterable[str], upstream: Any, facts: dict[str, Any] | None = None, value: Any = None
    ) -> Request:
        """A Request for the first of `keys` the user set (else the first key, holding upstream's default)."""
        keys = list(keys)
        asked = self.requested.any(keys)
        key = asked or keys[0]
        current = _get(self.config, key) if value is None else value
        return Request(
            category, key, current if current is not None else upstream, asked is not None, upstream, facts or {}
        )

    def add(self, name: str, decision: Decision, write_key: str | None = None) -> Decision:
        """Record a decision; a defaulted one that differs from what the config means (its value, or upstream's
        default where it holds none) is written back to `write_key`. Identity on sm_80+ therefore writes nothing."""
        self.decisions[name] = decision
        current = _get(self.config, write_key) if write_key is not None else None
        effective = current if current is not None else decision.upstream
        if write_key is not None and decision.defaulted and effective != decision.value:
            self.writes[write_key] = decision.value
        return decision


def decide(
    config: DictConfig,
    profile: DeviceProfile,
    requested: RequestedKeys | Iterable[str],
    registry: Registry | None = None,
    platform: DeviceProfile | None = None,
) -> tuple[dict[str, Decision], dict[str, Any]]:
    """Resolve every category; raise IncompatibleRequestError for an explicit request the device cannot honour.

    `platform` decides placement (trainer.device, FSDP strategy) when it differs from the card (see
    `placement_profile`); every other category follows `profile`.
    Returns (decisions by doctor category name, {config key: value} writes). Pure: `config` is not modified.
    """
    if not isinstance(requested, RequestedKeys):
        requested = RequestedKeys(requested)
    plan = _Plan(config, profile, requested, registry, platform or profile)
    plan.decisions["torch"] = placement.resolve_torch_build(profile)
    _placement(plan)
    train = _dtypes(plan)
    _model_config_dtypes(plan, train)
    attn = _attention(plan)
    _kernels(plan)
    _rollout(plan, train, attn)
    _memory(plan)
    return plan.decisions, plan.writes


def placement_profile(profile: DeviceProfile) -> DeviceProfile | None:
    """The CPU profile where a simulated GPU runs on a host without one (VERL_COMPAT_DEVICE=p40 on a laptop):
    the card decides dtypes, attention, kernels and rollout; the tensors, the FSDP strategy and the process
    group live on the CPU platform (verl_compat.cpu.host). None where the job runs on the profile's device."""
    from verl_compat.cpu import cpu_platform_wanted
    from verl_compat.detect import cpu_profile

    if profile.simulated and not profile.is_cpu and cpu_platform_wanted():
        return cpu_profile()
    return None


def _placement(plan: _Plan) -> None:
    p = plan.platform
    plan.add(
        "platform.device",
        placement.resolve_device(plan.request("platform.device", ["trainer.device"], "cuda"), p, plan.registry),
        "trainer.device",
    )
    for role in (ACTOR, CRITIC):
        key = f"{FSDP_ROLES[role][1]}.strategy"
        decision = placement.resolve_strategy(plan.request("platform.strategy", [key], "fsdp"), p, plan.registry)
        plan.add(f"platform.strategy{decision_suffix(role)}", decision, key)
    gpus = trainer_gpus(plan.config)
    for key, helper in helpers.HELPERS.items():  # they share the host: the card's policy
        legacy = [helper.legacy] if helper.legacy else []
        request = plan.request("platform.helpers", [key, *legacy], helper.upstream, {"gpus": gpus, "helper": helper})
        plan.add(helper.name, helpers.resolve_helpers(request, plan.profile, plan.registry), key)


def _dtypes(plan: _Plan) -> str:
    """dtype.train / dtype.master per FSDP role. Returns the actor's training compute dtype (short name)."""
    p, actor_train = plan.profile, "bf16"
    for role, (fsdp, _) in FSDP_ROLES.items():
        mp_key = f"{fsdp}.mixed_precision"
        mp = _get(plan.config, mp_key) or {}
        # upstream: mixed_precision None -> bf16/fp32/fp32; a dict without param_dtype -> .get("param_dtype", "bf16")
        req = plan.request("dtype.train", [f"{mp_key}.param_dtype"], "bf16", value=mp.get("param_dtype"))
        decision = plan.add(f"dtype.train{decision_suffix(role)}", dtype.resolve_train(req, p, plan.registry))
        train = dtype.canonical(decision.value) or str(decision.value)
        for sub in ("reduce_dtype", "buffer_dtype"):  # validated when given; fp32 otherwise
            sub_key = f"{mp_key}.{sub}"
            if sub_key in plan.requested and mp.get(sub) is not None:
                dtype.resolve_reduce(Request("dtype.reduce", sub_key, mp[sub], True, "fp32"), p, plan.registry)
        if not decision.identity:  # the device's policy: the param dtype, and fp32 reduce/buffer spelled out
            resolved = {"param_dtype": mp.get("param_dtype") if req.requested else train}
            resolved |= {k: mp.get(k) or v for k, v in FULL_FP32_REDUCE.items()}
            if resolved != mp:
                plan.writes[mp_key] = {**mp, **resolved}
        if role == ACTOR:
            actor_train = train
        facts = {"forward_only": bool(_get(plan.config, f"{fsdp}.forward_only"))}
        master = plan.request("dtype.master", [f"{fsdp}.model_dtype"], "fp32", facts)
        plan.add(
            f"dtype.master{decision_suffix(role)}",
            dtype.resolve_master(master, p, plan.registry),
            f"{fsdp}.model_dtype",
        )
    return actor_train


def _model_config_dtypes(plan: _Plan, train: str) -> None:
    """A dtype in a model's override_config (transformers' torch_dtype / dtype) is a request like any other:
    validated for the device (bf16 on a P40 is refused), never rewritten; "auto" defers to the checkpoint."""
    for role, model in MODEL_ROLES.items():
        for sub in ("torch_dtype", "dtype"):
            key = f"{model}.override_config.{sub}"
            value = _get(plan.config, key)
            if key not in plan.requested or value is None or str(value).strip().lower() == "auto":
                continue
            req = Request("dtype.model", key, value, True, None, {"train_dtype": train})
            plan.add(f"dtype.model{decision_suffix(role)}", dtype.resolve_rollout(req, plan.profile, plan.registry))


def _attention(plan: _Plan) -> str:
    """attention + attention.remove_padding per model. Returns the actor's attention implementation."""
    p, actor_attn = plan.profile, UPSTREAM_ATTN
    for role, model in MODEL_ROLES.items():
        key = f"{model}.override_config.attn_implementation"
        attn = plan.add(
            f"attention{decision_suffix(role)}",
            attention.resolve_attention(plan.request("attention", [key], UPSTREAM_ATTN), p, plan.registry),
            key,
        )
        if role == ACTOR:
            actor_attn = attn.value
        fsdp, role_cfg = FSDP_ROLES[role]
        facts = {
            "attention": attn.value,
            "ulysses_sp": max(
                int(_get(plan.config, f"{fsdp}.ulysses_sequence_parallel_size") or 1),
                int(_get(plan.config, f"{role_cfg}.ulysses_sequence_parallel_size") or 1),
            ),
            "pad_to_length": bool(_get(plan.config, f"{fsdp}.pad_to_length")),
        }
        rmpad_key = f"{model}.use_remove_padding"
        req = plan.request("attention.remove_padding", [rmpad_key], True, facts)
        plan.add(
            f"attention.remove_padding{decision_suffix(role)}",
            attention.resolve_remove_padding(req, p, plan.registry),
            rmpad_key,
        )
    return actor_attn


def _kernels(plan: _Plan) -> None:
    p = plan.profile
    for role, (fsdp, role_cfg) in FSDP_ROLES.items():
        key = f"{fsdp}.use_torch_compile"
        # the role-level use_torch_compile is a legacy key the FSDP engine ignores; typing it still is a request
        keys = [key] if role == CRITIC else [key, f"{role_cfg}.use_torch_compile"]
        req = plan.request("kernels.torch_compile", keys, True)
        plan.add(
            f"kernels.torch_compile{decision_suffix(role)}", kernels.resolve_torch_compile(req, p, plan.registry), key
        )
    triton = plan.add(
        "kernels.triton",
        kernels.resolve_triton(
            Request("kernels.triton", "Triton kernels (VERL_DISABLE_FLASH_ATTN_CE)", True, False, True),
            p,
            plan.registry,
        ),
    )
    upstream_ce = p.package("flash_attn").installed
    plan.add(
        "kernels.flash_ce",
        kernels.resolve_flash_ce(
            Request(
                "kernels.flash_ce",
                "flash-attn cross-entropy (VERL_DISABLE_FLASH_ATTN_CE)",
                upstream_ce,
                False,
                upstream_ce,
                {"triton": triton.value},
            ),
            p,
            plan.registry,
        ),
    )
    # no config key sets them: defaulted requests with upstream's value (the worker seams ask the same)
    chunk = kernels.UPSTREAM_FUSED_CHUNK
    chunk_request = Request("kernels.fused_chunk", kernels.FUSED_CHUNK_KEY, chunk, False, chunk)
    plan.add("kernels.fused_chunk", kernels.resolve_fused_chunk(chunk_request, p, plan.registry))
    norm = kernels.UPSTREAM_RMS_NORM
    norm_request = Request("kernels.rms_norm", kernels.RMS_NORM_KEY, norm, False, norm)
    plan.add("kernels.rms_norm", kernels.resolve_rms_norm(norm_request, p, plan.registry))
    moves = kernels.UPSTREAM_BATCH_MOVES
    moves_request = Request("kernels.batch_moves", kernels.BATCH_MOVES_KEY, moves, False, moves)
    plan.add("kernels.batch_moves", kernels.resolve_batch_moves(moves_request, p, plan.registry))
    logprobs_request = Request("kernels.logprobs", kernels.LOGPROBS_KEY, "rowwise", False, "rowwise")
    plan.add("kernels.logprobs", kernels.resolve_logprobs(logprobs_request, p, plan.registry))
    for role, model in MODEL_ROLES.items():
        use_key, backend_key = fused_keys(role)
        on = bool(_get(plan.config, use_key))
        value = (_get(plan.config, backend_key) or "torch") if on else "off"
        asked = use_key in plan.requested or (on and backend_key in plan.requested)
        key = backend_key if on and backend_key in plan.requested else use_key
        req = Request("kernels.fused", key, value, asked, "off", facts={"lm_head": role == ACTOR})
        # a defaulted "torch" (the actor, below sm_80) is the memory plan's to take or leave: it writes the keys
        plan.add(f"kernels.fused{decision_suffix(role)}", kernels.resolve_fused(req, p, plan.registry))
        liger_key = f"{model}.use_liger"
        plan.add(
            f"kernels.liger{decision_suffix(role)}",
            kernels.resolve_liger(plan.request("kernels.liger", [liger_key], False), p, plan.registry),
            liger_key,
        )


def _rollout(plan: _Plan, train: str, attn: str) -> None:
    p = plan.profile
    name_key = f"{ROLLOUT}.name"
    engine = plan.add(
        "rollout.engine",
        rollout_engine.resolve_engine(plan.request("rollout.engine", [name_key], None), p, plan.registry),
        name_key,
    )
    facts = {"engine": engine.value, "train_dtype": train, "attention": attn}
    dtype_key = f"{ROLLOUT}.dtype"
    plan.add(
        "dtype.rollout",
        dtype.resolve_rollout(plan.request("dtype.rollout", [dtype_key], "bfloat16", facts), p, plan.registry),
        dtype_key,
    )
    tp_key = f"{ROLLOUT}.tensor_model_parallel_size"
    plan.add(
        "rollout.tensor_parallel",
        rollout_engine.resolve_tensor_parallel(plan.request("rollout.tensor_parallel", [tp_key], 2, facts), p),
        tp_key,
    )
    eager_key = f"{ROLLOUT}.enforce_eager"
    plan.add(
        "rollout.enforce_eager",
        rollout_engine.resolve_enforce_eager(
            plan.request("rollout.enforce_eager", [eager_key], False, facts), p, plan.registry
        ),
        eager_key,
    )
    ckpt_key = f"{ROLLOUT}.checkpoint_engine.backend"
    plan.add(
        "rollout.checkpoint_engine",
        rollout_engine.resolve_checkpoint_engine(
            plan.request("rollout.checkpoint_engine", [ckpt_key], "naive", facts), p, plan.registry
        ),
    )


def _memory(plan: _Plan) -> None:
    p, engine = plan.profile, plan.decisions["rollout.engine"].value
    util = plan.request("memory.gpu_memory_utilization", [f"{ROLLOUT}.gpu_memory_utilization"], 0.5, {"engine": engine})
    plan.add("memory.gpu_memory_utilization", memory.resolve_gpu_memory_utilization(util, p))
    _optimizer_step(plan)
    # no config key sets it: a defaulted request with upstream's value (the seams ask the same)
    views = Request("memory.moved_views", memory.MOVED_VIEWS_KEY, "keep", False, "keep")
    plan.add("memory.moved_views", memory.resolve_moved_views(views, p, plan.registry))
    offload = Request("memory.offload_init", memory.OFFLOAD_INIT_KEY, "first_forward", False, "first_forward")
    plan.add("memory.offload_init", memory.resolve_offload_init(offload, p, plan.registry))
    # the same for when an offloaded AdamW state comes back (verl's FSDP engine's step brings it: optimizer_state)
    facts = {"engine_step": _get(plan.config, "actor_rollout_ref.actor.strategy") in ("fsdp", "fsdp2")}
    load = Request("memory.optimizer_load", memory.OPTIMIZER_LOAD_KEY, "at_entry", False, "at_entry", facts)
    plan.add("memory.optimizer_load", memory.resolve_optimizer_load(load, p, plan.registry))
    # offload, gradient checkpointing, micro-batches and the rollout batch: the memory planner
    planned, writes = memory.resolve_plan(plan.config, p, plan.requested.__contains__, plan.decisions)
    plan.decisions.update(planned)
    plan.writes.update(writes)
    if any(name.startswith("memory.offload_policy") for name in planned):  # the step moved to the host
        _optimizer_step(plan)


def _optimizer_step(plan: _Plan) -> None:
    """AdamW's implementation per trained role, written into optim.override_optimizer_config where the user left
    that dict unset (a dict they set is theirs, whatever it holds)."""
    from verl_compat.preflight import needs_critic

    roles = [(ACTOR, "actor_rollout_ref.actor.optim")]
    if needs_critic(plan.config):
        roles.append((CRITIC, "critic.optim"))
    for role, optim in roles:
        key = f"{optim}.override_optimizer_config"
        facts = {
            "optimizer": _get(plan.config, f"{optim}.optimizer"),
            "optimizer_impl": _get(plan.config, f"{optim}.optimizer_impl"),
            "offload_policy": cpu_offload_policy(plan.config, role, plan.writes),
        }
        # a dict (or one of its keys) the user set is passed through as theirs: reported, never replaced
        request = plan.request("memory.optimizer_step", [key, f"{key}.fused", f"{key}.foreach"], "default", facts)
        decision = memory.resolve_optimizer_step(request, plan.profile, plan.registry)
        plan.add(f"memory.optimizer_step{decision_suffix(role)}", decision)
        override = memory.OPTIMIZER_OVERRIDES.get(decision.value) if isinstance(decision.value, str) else None
        if override and decision.defaulted:
            plan.writes[key] = dict(override)
        elif decision.defaulted:  # a second pass (the plan moved the step to the host) undoes the first's write
            plan.writes.pop(key, None)


def apply_writes(config: DictConfig, writes: dict[str, Any]) -> None:
    """Write resolved values into the verl config (struct mode: new keys such as mixed_precision are force-added)."""
    for key, value in writes.items():
        OmegaConf.update(config, key, value, merge=False, force_add=True)


def resolve_job_config(
    config: DictConfig,
    profile: DeviceProfile,
    requested: RequestedKeys | Iterable[str],
    registry: Registry | None = None,
    platform: DeviceProfile | None = None,
) -> dict[str, Decision]:
    """Validate the user's requests for `profile` and write the resolved values into `config` (in place)."""
    decisions, writes = decide(config, profile, requested, registry, platform)
    apply_writes(config, writes)
    memory.export_shares(decisions)  # the per-process memory caps of a simulated card
    return decisions


def compose_ppo_config(overrides: Iterable[str] = (), config_name: str = "ppo_trainer") -> DictConfig:
    """verl's own ppo_trainer config, composed with Hydra's compose API (installed or materialised verl)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # e.g. called from inside a running Hydra app or a test
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def default_policy(
    profile: DeviceProfile, overrides: list[str] | None = None, config_file: str | None = None
) -> dict[str, Decision]:
    """The decisions for verl's default PPO config on `profile` (the doctor's policy section).

    `config_file` is a user's own Hydra config: its keys count as requested. It is composed from its own folder
    with verl's config folder on the search path, like `python -m verl.trainer.main_ppo --config-path ...`.
    """
    from verl_compat.plugins import load_plugins
    from verl_compat.value_checks import check_values

    load_plugins()
    overrides = list(overrides or [])
    requested = requested_keys(overrides, config_file)
    if config_file is None:
        config = compose_ppo_config(overrides)
    else:
        config = _compose_user_config(config_file, overrides)
    decisions, writes = decide(config, profile, requested, platform=placement_profile(profile))
    apply_writes(config, writes)
    check_values(config, profile.describe())  # a value valid nowhere, as main_ppo refuses it
    return decisions


def _compose_user_config(config_file: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    path = os.path.abspath(config_file)
    folder, name = os.path.dirname(path), os.path.splitext(os.path.basename(path))[0]
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    search = doctor_searchpath(path)  # the file's own search path, then verl's configs
    with initialize_config_dir(config_dir=folder, version_base=None):
        return compose(config_name=name, overrides=[*overrides, search])
