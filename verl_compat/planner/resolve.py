"""The planner behind the `memory` resolvers: decisions for the doctor, config writes for the driver seam, and
the per-process shares that the simulated card's memory caps read (`VERL_COMPAT_MEMORY_SHARES`)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import OmegaConf

from verl_compat.config_keys import ACTOR, decision_suffix, fused_keys, offload_policy_keys
from verl_compat.decision import Decision
from verl_compat.detect import host as host_facts
from verl_compat.planner import keys as K
from verl_compat.planner.job import JobSpec
from verl_compat.planner.search import MemoryPlan, PlanError, plan_job
from verl_compat.planner.shape import ModelShape
from verl_compat.preflight import devices_per_node_problem
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.kernels import UPSTREAM_FUSED_CHUNK

SHARES_ENV = "VERL_COMPAT_MEMORY_SHARES"  # {"trainer": bytes, "rollout": bytes}: read by simulate.prepare_device
PLAN = "memory.plan"


def card_bytes(profile: DeviceProfile) -> int | None:
    """The card's memory; on a CPU the host's RAM (trainer and rollout share it)."""
    if profile.total_memory_bytes:
        return int(profile.total_memory_bytes)
    if profile.is_cpu:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def speed_name(profile: DeviceProfile) -> str:
    """Catalog key for the speed ranking (a detected 'Tesla P40' is the catalog's p40)."""
    from verl_compat.catalog import CATALOG

    if profile.name in CATALOG:
        return profile.name
    return next((k for k, e in CATALOG.items() if e.model == profile.name), profile.name)


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == K.AUTO


def _decision(profile: DeviceProfile, category: str, key: str, value: Any, defaulted: bool, reasons, upstream=None):
    return Decision(category, key, value, defaulted, profile.describe(), reasons=tuple(reasons), upstream=upstream)


def stale_views(decisions: Mapping[str, Decision], dtypes: Mapping[str, str]) -> frozenset[str]:
    """The roles whose GPU copy outlives a move to the host (verl_compat.fsdp_views): none where
    memory.moved_views releases it, else every role trained in fp32 (upstream's behaviour)."""
    if _value(decisions, "memory.moved_views", "keep") == "release":
        return frozenset()
    fp32 = ("fp32", "float32")
    roles = {"actor": dtypes.get("train"), "ref": dtypes.get("train"), "critic": dtypes.get("train.critic")}
    return frozenset(role for role, d in roles.items() if d in fp32)


FUSED = "kernels.fused"


def fused_head_mode(decisions: Mapping[str, Decision]) -> str:
    """JobSpec.fused_head from the actor's kernels.fused decision."""
    d = decisions.get(FUSED)
    if d is None or d.value in (None, "off"):
        return "off"
    return "free" if d.defaulted and d.value == "torch" else "on"


def _fused_off(decisions: Mapping[str, Decision], why: str) -> Decision:
    return dataclasses.replace(decisions[FUSED], value="off", reasons=(why,))


def _fused_outcome(plan: MemoryPlan, decisions: Mapping[str, Decision]) -> tuple[Decision, dict[str, Any]]:
    """The actor's kernels.fused decision as the plan settles it (one record), and its two verl keys."""
    if plan.choice.fused_head:
        d = decisions[FUSED]
        why = (
            f"memory plan: the fused head bounds the logits to one {plan.job.fused_chunk}-token chunk, "
            "so larger micro-batches fit"
        )
        use_key, backend_key = fused_keys(ACTOR)
        return dataclasses.replace(d, reasons=(*d.reasons, why)), {use_key: True, backend_key: "torch"}
    why = (
        "memory plan: unfused; the fastest plan that fits does not gain by the fused head (its chunk holds more "
        "than one sequence's logits, and its backward projects the vocabulary once more)"
    )
    return _fused_off(decisions, why), {}


def plan_decisions(
    config: Any,
    profile: DeviceProfile,
    is_requested: Callable[[str], bool],
    decisions: Mapping[str, Decision],
    shape_loader: Callable[[str], ModelShape] | None = None,
) -> tuple[dict[str, Decision], dict[str, Any]]:
    """(decisions, writes). Raises PlanError when a value the user set (or `auto`) cannot fit the card."""
    autos = [k for k in K.PLANNED_KEYS if is_auto(OmegaConf.select(config, k, default=None))]
    sm80 = profile.is_ampere_or_newer
    memory = card_bytes(profile)
    dtypes = {
        "train": _value(decisions, "dtype.train", "bf16" if sm80 else "fp32"),
        "train.critic": _value(decisions, "dtype.train.critic", _value(decisions, "dtype.train", "fp32")),
        "rollout": _value(decisions, "dtype.rollout", "bfloat16" if sm80 else "float32"),
    }
    engine = _value(decisions, "rollout.engine", "hf")
    try:
        if memory is None:
            raise ValueError(f"the memory of {profile.describe()} is unknown")
        adam = tuple(str(_value(decisions, f"memory.optimizer_step{r}", "default")) for r in ("", ".critic"))
        stale = stale_views(decisions, dtypes)
        job = JobSpec.from_verl_config(
            config,
            memory,
            profile.describe(),
            is_requested,
            dtypes,
            engine,
            not profile.is_cpu,
            shape_loader,
            adam,
            stale,
            fused_head_mode(decisions),
            _value(decisions, "kernels.fused_chunk", UPSTREAM_FUSED_CHUNK),
            bool(_value(decisions, "attention.remove_padding", False)),
        ).with_(
            host_memory_bytes=host_facts().memory_bytes,
            optimizer_at_step=_value(decisions, "memory.optimizer_load", "at_entry") == "at_step",
        )
        if _value(decisions, "platform.device", "cuda") != "cuda":  # the policy pins host memory for a GPU
            job = job.with_(policy_free=(False, False))
    except (OSError, ValueError) as e:  # no model config to read (verl's default path, a typo): nothing planned
        if autos:
            raise PlanError(
                f"verl-compat memory plan: {', '.join(autos)}=auto needs the model's config, which could not be "
                f"read ({type(e).__name__}: {e}). Fix: set actor_rollout_ref.model.path to a local model folder "
                "or give these keys numbers"
            ) from e
        why = f"no plan: {type(e).__name__}: {e}"
        out = {PLAN: _decision(profile, PLAN, "(plan)", None, True, [why, "the config's memory values are kept"])}
        if fused_head_mode(decisions) == "free":  # the fused head is the plan's to choose: without one, upstream's
            out[FUSED] = _fused_off(decisions, "no memory plan: upstream's unfused head")
        return out, {}
    if sm80 and not autos:
        why = "sm_80+: upstream verl's memory values, unchanged (set a key to `auto` to have it planned)"
        return {PLAN: _decision(profile, PLAN, "(plan)", None, True, [why])}, {}
    plan = plan_job(job, speed_name(profile), sm80)  # PlanError propagates: the start-up error
    ranks = devices_per_node_problem(config)
    if ranks is not None:  # the job's start-up refuses it; the doctor shows the plan with the reason
        plan.notes.append(f"planned per GPU for {job.world} GPUs, but {ranks[1]}. Fix: {ranks[2]}")
    writes = plan.writes()
    fused_writes: dict[str, Any] = {}
    if job.fused_head == "free":
        fused, fused_writes = _fused_outcome(plan, decisions)
    for key in autos:  # an `auto` the plan has no use for (no critic, not the hf engine) still needs a value
        writes.setdefault(key, _UNUSED.get(key, 1))
    changed = {
        k: v
        for k, v in {**writes, **fused_writes}.items()
        if OmegaConf.select(config, k, default=None) != v or _interpolated(config, k)
    }
    out = {PLAN: _decision(profile, PLAN, "(plan)", _summary(plan, writes), True, plan.table())}
    if job.fused_head == "free":
        out[FUSED] = fused
    out |= _policy_outcome(plan, profile, decisions)
    for key in K.PLANNED_KEYS:
        s = job.setting(key)
        if key in writes:
            out[f"memory.{key}"] = _decision(
                profile, f"memory.{key}", key, writes[key], True, [f"planned ({K.LABELS[key]})"], s.value
            )
        elif s.fixed:
            out[f"memory.{key}"] = _decision(
                profile, f"memory.{key}", key, s.value, False, ["requested explicitly; fits the plan's estimate"]
            )
    return out, changed


def _policy_outcome(plan: MemoryPlan, profile: DeviceProfile, decisions: Mapping[str, Decision]) -> dict[str, Decision]:
    """The roles the plan put under FSDP2's CPU offload policy: their platform.strategy decision as the plan
    settles it (one record per role), and the offload_policy key's."""
    out = {}
    for role in plan.policy_roles:
        sfx = decision_suffix(role)
        _, policy_key = offload_policy_keys(role)
        why = f"memory plan: FSDP2, for its CPU offload policy ({policy_key}=true): nothing else fits the card"
        name = f"platform.strategy{sfx}"
        old = decisions.get(name)
        if old is not None:
            out[name] = dataclasses.replace(old, value="fsdp2", reasons=(*old.reasons, why))
        reasons = [
            f"planned: the {role}'s weights, gradients and AdamW state in host memory, each FSDP unit streamed to "
            f"the card for its pass and the optimizer step on the host ({plan.host_line()} on the host)"
        ]
        out[f"memory.offload_policy{sfx}"] = _decision(
            profile, f"memory.offload_policy{sfx}", policy_key, True, True, reasons, False
        )
    return out


def _interpolated(config: Any, key: str) -> bool:
    """A key whose value follows another (`${...}`): written even when it holds the planned value now, since the
    key it follows may be planned too (rollout.log_prob_max_token_len_per_gpu follows the actor's budget)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent, default=None) if parent else config
    try:
        return node is not None and OmegaConf.is_interpolation(node, leaf)
    except (KeyError, ValueError, AttributeError):
        return False


# What an unused `auto` becomes: upstream's default where it has one, else the smallest valid value.
_UNUSED = {
    K.GPU_UTIL: 0.5,
    K.ROLLOUT_TOKENS: None,
    **{k: False for k in (*K.OFFLOAD_KEYS, *K.GC_KEYS)},
}


def _value(decisions: Mapping[str, Decision], name: str, default: Any) -> Any:
    d = decisions.get(name)
    return default if d is None or d.value is None else d.value


class PlanSummary(dict):
    """The plan's numbers (JSON in `doctor --json`); one short line in the text report."""

    def __repr__(self) -> str:
        shares = self["shares"]
        return (
            f"fits: {self['total'] / 2**30:.1f} of {self['card'] / 2**30:.1f} GiB "
            f"(trainer {shares['trainer'] / 2**30:.1f}, rollout {shares['rollout'] / 2**30:.1f} GiB)"
        )


def _summary(plan: MemoryPlan, writes: dict[str, Any]) -> dict[str, Any]:
    e = plan.estimate
    return PlanSummary(
        {
            "shares": plan.shares,
            "contexts": e.contexts,
            "headroom": e.headroom,
            "card": plan.job.card_bytes,
            "total": e.total,
            "trainer_peak_phase": e.trainer_peak.name,
            "writes": writes,
        }
    )


def export_shares(decisions: Mapping[str, Decision]) -> dict[str, int] | None:
    """Driver side: hand the plan's per-process shares to the Ray workers through the environment (a local Ray
    cluster started by the driver inherits it)."""
    d = decisions.get(PLAN)
    shares = d.value.get("shares") if d is not None and isinstance(d.value, dict) else None
    if shares:
        os.environ[SHARES_ENV] = json.dumps(shares)
    else:  # no plan this time: a share left from an earlier job in this process must not cap this one
        os.environ.pop(SHARES_ENV, None)
    return shares


def planned_share(process: str) -> int | None:
    """Worker side: this process's share in bytes, if the driver planned one."""
    raw = os.environ.get(SHARES_ENV)
    if not raw:
        return None
    try:
        value = json.loads(raw).get(process)
    except (ValueError, AttributeError):
        raise PlanError(f"{SHARES_ENV}={raw!r} is not the JSON object the driver writes") from None
    return int(value) if value else None


__all__ = ["PlanError", "export_shares", "is_auto", "plan_decisions", "planned_share"]
