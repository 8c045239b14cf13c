"""`plan_job`: the fastest plan (by `speed.step_seconds`) whose estimate fits the card; values the user set are
kept, and a job that cannot fit raises `PlanError` with the overflow and the smallest change that fits.

Search: every combination of offload (actor/critic params and optimizer), gradient checkpointing and rollout
batch; for each, the rollout's share beside the trainer's compute phases is fixed (the asleep server's where it
sleeps between generations, else its generation peak), and each trainer phase independently takes the largest
micro-batch that fits what is left (a larger micro-batch is never slower, and phases do not share activations);
the estimate then checks every moment of the step, the weight sync beside the awake server too.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from verl_compat.config_keys import offload_policy_keys
from verl_compat.errors import VerlCompatError
from verl_compat.planner import keys as K
from verl_compat.planner.estimate import (
    ADAM_STATES,
    CONTEXT_ROLLOUT,
    CONTEXT_TRAINER,
    FRAGMENTATION,
    GIB,
    HEADROOM,
    HOST_PROCESSES,
    HOST_SLACK,
    Choice,
    Estimate,
    beside_compute,
    beyond_activations,
    estimate,
    phase_activations,
    rollout_phases,
    step_bytes,
    sync_staging_bytes,
    trainer_phases,
)
from verl_compat.planner.job import JobSpec
from verl_compat.planner.speed import step_seconds

# Choice field per planned key (rollout keys are derived from rollout_batch).
FIELD = {
    K.ACTOR_MICRO: "actor_micro",
    K.LOGPROB_MICRO: "logprob_micro",
    K.REF_MICRO: "ref_micro",
    K.CRITIC_MICRO: "critic_micro",
    K.CRITIC_FWD_MICRO: "critic_fwd_micro",
    K.ACTOR_PARAM_OFFLOAD: "actor_param_offload",
    K.ACTOR_OPTIM_OFFLOAD: "actor_optim_offload",
    K.CRITIC_PARAM_OFFLOAD: "critic_param_offload",
    K.CRITIC_OPTIM_OFFLOAD: "critic_optim_offload",
    K.ACTOR_GC: "actor_gc",
    K.CRITIC_GC: "critic_gc",
    K.ROLLOUT_BATCH: "rollout_batch",
}
_MICRO_PHASE = {  # micro-batch field -> the trainer phase it sizes
    "logprob_micro": "old_log_prob",
    "ref_micro": "ref",
    "critic_fwd_micro": "values",
    "critic_micro": "update_critic",
    "actor_micro": "update_actor",
}


class PlanError(VerlCompatError, ValueError):
    """The job cannot fit the card: says by how much, where the peak is, and the smallest change that fits."""


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _divisors(n: int) -> list[int]:
    return sorted({d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}, reverse=True)


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass
class MemoryPlan:
    job: JobSpec
    choice: Choice
    estimate: Estimate
    seconds: dict[str, float]
    free: frozenset[str]  # keys the planner chose (the rest kept as the config holds them)
    notes: list[str] = field(default_factory=list)
    policy_roles: tuple[str, ...] = ()  # roles the plan put under FSDP2's CPU offload policy (job.policy_free)

    @property
    def shares(self) -> dict[str, int]:
        """The per-process caps of a simulated card. The rollout gets its share; the trainer, where the estimate's
        errors live (verl's phases, the allocator), also gets what the plan leaves free and half the headroom, so
        an underestimate there costs headroom rather than the job. Where the server sleeps between generations the
        trainer's cap counts the asleep server only: the two caps then add up to more than the card, and
        `verl_compat.simulate`'s card guard lowers each cap to what the other process leaves, as the card would."""
        e = self.estimate
        rollout = e.share("rollout")
        trainer = e.share("trainer")
        if e.on_gpu and e.fits:  # beside the asleep server where it sleeps (the card guard keeps the sum within it)
            trainer = max(trainer, self.job.card_bytes - e.beside_compute - e.contexts - e.headroom // 2)
        return {"trainer": trainer, "rollout": rollout}

    def host_bytes(self) -> dict[str, int]:
        """Host memory the FSDP2 CPU offload policy keeps per model (master weights, grads and AdamW's two states)
        and, beside it, the reference's weights (streamed from the host too) and the weight sync's staging bucket
        in shared memory (the actor is gathered on the host). Empty without the policy. Not
        counted: the job's processes themselves (about 0.4-0.5 GiB each, benchmarks/helper_memory.py)."""
        job, out = self.job, {}
        per_param = job.master_bytes * (2 + ADAM_STATES)
        if job.host_offload[0]:
            out["actor"] = job.actor.lm_params // job.world * per_param
        if job.host_offload[1] and job.critic:
            out["critic"] = job.critic.value_params // job.world * per_param
        if out and job.need_ref:
            out["reference weights"] = job.actor.lm_params // job.world * job.master_bytes
        if job.host_offload[0] and sync_staging_bytes(job):
            out["weight sync staging bucket"] = sync_staging_bytes(job)
        return out

    def host_need(self) -> int:
        """What the job needs free on the host under the policy: host_bytes with the measured slack, and the job's
        processes (estimate.HOST_PROCESSES / HOST_SLACK). 0 without the policy."""
        host = sum(self.host_bytes().values())
        return int(host * (1 + HOST_SLACK)) + HOST_PROCESSES if host else 0

    def host_line(self) -> str:
        what = ", ".join(f"{role} {gib(n)}" for role, n in self.host_bytes().items())
        return (
            f"{what}, {HOST_SLACK:.0%} slack and the job's processes {gib(HOST_PROCESSES)}: at least "
            f"{gib(self.host_need())}"
        )

    def value(self, key: str) -> Any:
        if key == K.ROLLOUT_TOKENS:
            return self.choice.rollout_batch * self.job.seq_len
        if key == K.GPU_UTIL:
            used = self.estimate.share("rollout") + CONTEXT_ROLLOUT
            return max(0.05, math.floor(100 * used / self.job.card_bytes) / 100)
        return getattr(self.choice, FIELD[key])

    def writes(self) -> dict[str, Any]:
        """{config key: planned value} for the keys the planner may fill."""
        out = {}
        hf = self.job.engine == "hf"
        for key in self.free:
            if key in (K.ROLLOUT_BATCH, K.ROLLOUT_TOKENS) and not hf:
                continue
            if key == K.GPU_UTIL and hf:
                continue
            if self.job.critic is None and key.startswith("critic."):
                continue
            if not self.job.need_ref and key == K.REF_MICRO:
                continue
            out[key] = self.value(key)
        if self.job.critic is not None and self.job.critic_budget_planned(self.free):
            out[K.CRITIC_TOKENS] = self.choice.critic_micro * self.job.seq_len
        if self.job.token_budgets and all(k in self.free for k in K.TOKEN_BUDGET_OF.values()):
            out |= self.token_budgets()
        for role in self.policy_roles:
            strategy_key, policy_key = offload_policy_keys(role)
            out |= {strategy_key: "fsdp2", policy_key: True}
        return out

    def token_budgets(self) -> dict[str, Any]:
        """verl's use_dynamic_bsz for the actor's passes: each budget is the planned rows x (prompt + response),
        the same bound on a micro-batch's tokens, filled with more of the shorter sequences (the row counts stay
        written: verl ignores them while the budgets are on)."""
        job, out = self.job, {K.ACTOR_DYNAMIC: True, K.LOGPROB_DYNAMIC: True}
        for tokens_key, rows_key in K.TOKEN_BUDGET_OF.items():
            if rows_key == K.REF_MICRO and not job.need_ref:
                continue
            out[tokens_key] = self.value(rows_key) * job.seq_len
        if job.need_ref:
            out[K.REF_DYNAMIC] = True
        return out

    def table(self) -> list[str]:
        """The estimate per process and phase, and the plan, as text lines (the doctor prints them)."""
        e, job = self.estimate, self.job
        lines = [
            f"model {job.actor.describe()}; {job.rows} sequences/step of {job.prompt_len}+{job.response_len} "
            f"tokens per GPU of {job.world} (trainer.n_gpus_per_node x trainer.nnodes); critic "
            f"{'yes' if job.critic else 'no'}, reference {'yes' if job.need_ref else 'no'}",
        ]
        for ph in [*e.trainer, *e.rollout]:
            parts = ", ".join(f"{k} {gib(v)}" for k, v in ph.parts.items()) or "nothing on the card"
            lines.append(f"{ph.process}/{ph.name}: {gib(ph.total)} = {parts}")
        moment, held = e.peak_moment
        when = (
            "the server sleeps between generations (rollout.free_cache_engine), so the trainer's phases share the card "
            "with the asleep server and only its sync phase with the awake one"
            if e.rollout_sleeps
            else "both peaks at once"
        )
        lines.append(
            f"card {gib(job.card_bytes)} at its fullest moment, {moment}: {gib(held)} (with {FRAGMENTATION:.0%} "
            f"allocator slack) + CUDA contexts {gib(e.contexts)} + headroom {gib(e.headroom)} ({HEADROOM:.0%}); "
            f"free {gib(-e.overflow)}; {when}"
        )
        if self.host_bytes():
            by = f", planned for the {' and '.join(self.policy_roles)}" if self.policy_roles else ""
            lines.append(
                f"host memory under FSDP2's CPU offload policy{by} (its models' weights, grads and AdamW state): "
                f"{self.host_line()} free on the host"
            )
        if e.on_gpu and e.fits:
            caps = self.shares
            beside = "the asleep server's share" if e.rollout_sleeps else "the rollout's share"
            lines.append(
                f"simulated-card caps: trainer {gib(caps['trainer'])} (the card less {beside}, the contexts and half "
                f"the headroom), rollout {gib(caps['rollout'])}; each lowered to what the other process leaves"
            )
        total = sum(self.seconds.values())
        lines.append(
            "estimated step (ranking only) "
            + f"{total:.1f} s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items() if v)
        )
        writes = self.writes()
        chosen = ", ".join(
            f"{k.split('.', 1)[1] if k.startswith('actor_rollout_ref.') else k}={v}" for k, v in sorted(writes.items())
        )
        lines.append(f"plan: {chosen or '(nothing to fill: every value is set)'}")
        budgets = {k: v for k, v in writes.items() if k in K.TOKEN_BUDGET_OF}
        if budgets:
            what = ", ".join(f"{K.LABELS[K.TOKEN_BUDGET_OF[k]]} {v}" for k, v in budgets.items())
            lines.append(f"micro-batches by token budget (verl's use_dynamic_bsz): {what} tokens")
        if job.critic_v1 and job.critic is not None:
            tokens = writes.get(K.CRITIC_TOKENS, job.critic_budget_unplanned)
            whose = "planned" if K.CRITIC_TOKENS in writes else "as set" if job.critic_tokens else "verl's default"
            lines.append(
                f"critic micro-batches by token budget (verl's v1 trainer reads {K.CRITIC_TOKENS} for both "
                f"passes): {tokens} tokens, {whose}; estimated at {self.choice.critic_micro} full-length rows "
                "(padded micro-batches of shorter sequences hold more rows)"
            )
        if job.fused_head != "off":
            how = "fused (verl's FusedLinearForPPO, torch)" if self.choice.fused_head else "unfused logits"
            lines.append(f"actor head: {how}{'' if job.fused_head == 'free' else ', as set'}")
        lines.extend(f"note: {n}" for n in self.notes)
        return lines


def _options(job: JobSpec, key: str, free: frozenset[str]) -> list[Any]:
    """Candidate values of one Choice field: the planner's set when free, else the config's value."""
    s = job.setting(key)
    fld = FIELD[key]
    if fld in ("critic_micro", "critic_fwd_micro") and job.critic_v1 and not job.critic_budget_planned(free):
        return [job.critic_budget_rows()]  # verl sizes both passes by the token budget, not by these keys
    if key not in free:
        if fld.endswith("micro") or fld == "rollout_batch":
            v = _as_int(s.value)
            return [v if v and v > 0 else (job.rows if fld == "rollout_batch" else 1)]
        return [bool(s.value)]
    if fld in ("actor_micro",):
        return _divisors(job.mini_rows)
    if fld == "critic_micro":
        return _divisors(job.critic_mini_rows)
    if fld.endswith("micro"):
        return _divisors(job.rows)
    if fld == "rollout_batch":
        return sorted({-(-job.rows // k) for k in range(1, job.rows + 1)}, reverse=True)
    if fld.startswith("critic") and job.critic is None:
        return [False]
    if fld.endswith("_offload") and job.host_offload[fld.startswith("critic")]:
        return [False]  # FSDP2's CPU offload policy already holds that model on the host; verl ignores these keys
    return [False, True]


def _trainer_budget(job: JobSpec, beside: int) -> int:
    """What a trainer compute phase may hold (before the allocator slack) beside `beside`, the rollout's share at
    that moment."""
    contexts = CONTEXT_TRAINER + CONTEXT_ROLLOUT if job.on_gpu else 0
    left = job.card_bytes - int(job.card_bytes * HEADROOM) - contexts - beside
    return int(left / (1 + FRAGMENTATION))


def _search(
    job: JobSpec, free: frozenset[str], device_name: str, closest_too: bool = False
) -> tuple[MemoryPlan | None, Estimate | None]:
    """(best plan or None, and with `closest_too` the least-overflowing estimate, for the error message)."""
    opts = {fld: _options(job, key, free) for key, fld in FIELD.items()}
    opts["fused_head"] = {"off": [False], "on": [True], "free": [False, True]}[job.fused_head]
    flags = ["actor_param_offload", "actor_optim_offload", "critic_param_offload", "critic_optim_offload"]
    flags += ["actor_gc", "critic_gc", "fused_head"]
    smallest = {f: min(opts[f]) for f in _MICRO_PHASE}
    best: tuple[float, int, MemoryPlan] | None = None
    closest: Estimate | None = None
    for combo in itertools.product(*(opts[f] for f in flags)):
        base = Choice(**dict(zip(flags, combo, strict=True)), **smallest, rollout_batch=1)
        # each phase's size for each of its micro-batch candidates (phases do not depend on the rollout batch)
        phases = {p.name: p for p in trainer_phases(job, base)}
        sized: dict[str, list[tuple[int, int]]] = {}
        for fld, phase in _MICRO_PHASE.items():
            ph = phases.get(phase)
            fixed = ph.total - ph.parts.get("activations", 0) - beyond_activations(ph) if ph else 0
            step = step_bytes(job, phase, base)
            sized[fld] = [
                (v, fixed + max(step, phase_activations(job, phase, v, base)) if ph else 0) for v in opts[fld]
            ]
        penalty = sum(bool(v) for v in combo)
        for batch in opts["rollout_batch"]:
            choice = dataclasses.replace(base, rollout_batch=batch)
            budget = _trainer_budget(job, beside_compute(rollout_phases(job, choice), job.rollout_sleeps))
            picks = {fld: next((v for v, total in sized[fld] if total <= budget), None) for fld in _MICRO_PHASE}
            if job.critic_v1 and picks["critic_micro"] and picks["critic_fwd_micro"]:
                # one budget for both critic passes: the smaller fits both
                picks["critic_micro"] = picks["critic_fwd_micro"] = min(
                    picks["critic_micro"], picks["critic_fwd_micro"]
                )
            ok = all(v is not None for v in picks.values())
            if not ok and not closest_too:
                continue
            choice = dataclasses.replace(choice, **{f: v for f, v in picks.items() if v is not None})
            est = estimate(job, choice)
            if closest_too and (closest is None or est.overflow < closest.overflow):
                closest = est
            if not ok or not est.fits:
                continue
            seconds = step_seconds(job, choice, device_name)
            rank = (sum(seconds.values()), penalty)
            if best is None or rank < best[:2]:
                best = (*rank, MemoryPlan(job, choice, est, seconds, free))
    return (best[2] if best else None), closest


def free_keys(job: JobSpec, sm80: bool) -> frozenset[str]:
    """Keys the planner may choose: `auto` ones always; on older cards and CPUs also every key the user left."""
    return frozenset(k for k in K.PLANNED_KEYS if job.setting(k).auto or (not sm80 and not job.setting(k).requested))


def plan_job(job: JobSpec, device_name: str, sm80: bool = False) -> MemoryPlan:
    """The plan for `job` on the card (`device_name`: catalog name, for the speed ranking). Below sm_80, where
    nothing else fits, FSDP2's CPU offload policy for the roles whose placement the user left (job.policy_free)."""
    free = free_keys(job, sm80)
    plan, _ = _search(job, free, device_name)
    roles = [r for r, ok in zip(("actor", "critic"), job.policy_free, strict=True) if ok]
    if plan is None and roles and job.on_gpu and not sm80:
        plan, _ = _policy_search(job, free, device_name, roles)
        if plan is not None:
            plan.notes.append(
                f"FSDP2's CPU offload policy for the {' and '.join(plan.policy_roles)}: nothing else fits the card "
                "(verl's param and optimizer offload bring the whole model and its AdamW state back for the update)"
            )
    if plan is not None:
        _check_host_memory(plan)
        if job.use_dynamic_bsz:
            plan.notes.append("use_dynamic_bsz=true: verl sizes micro-batches by its token budgets instead")
        return plan
    _, closest = _search(job, free, device_name, closest_too=True)
    raise PlanError(_explain_misfit(job, free, closest, device_name))


def _check_host_memory(plan: MemoryPlan) -> None:
    """The models under FSDP2's CPU offload policy live in host memory: more than the machine has cannot run."""
    need, ram = plan.host_need(), plan.job.host_memory_bytes
    if not need or not ram or not plan.job.on_gpu or need <= ram:
        return
    raise PlanError(
        f"verl-compat memory plan: FSDP2's CPU offload policy (offload_policy=true under strategy fsdp2) keeps each "
        f"model's weights, gradients and AdamW state in host memory: {plan.host_line()}, more than this machine's "
        f"{gib(ram)}. Fix: run on a machine with at least that much memory free, or train a smaller model"
    )


def _policy_keys(roles: Iterable[str]) -> str:
    """The verl keys that put `roles` under FSDP2's CPU offload policy."""
    return " ".join(f"{s}=fsdp2 {p}=true" for s, p in map(offload_policy_keys, roles))


def _policy_search(
    job: JobSpec, free: frozenset[str], device_name: str, roles: list[str]
) -> tuple[MemoryPlan | None, list[str]]:
    """The fastest plan with FSDP2's CPU offload policy for one of `roles` or both, among those whose host memory
    fits this machine (plan.policy_roles says which); and, described, those that fit the card but not the host."""
    candidates = [(r,) for r in roles] + ([tuple(roles)] if len(roles) == 2 else [])
    best: MemoryPlan | None = None
    too_big: list[str] = []
    for on in candidates:
        host = (job.host_offload[0] or "actor" in on, job.host_offload[1] or "critic" in on)
        plan, _ = _search(job.with_(host_offload=host), free, device_name)
        if plan is None:
            continue
        plan.policy_roles = on
        ram = job.host_memory_bytes
        if ram and plan.host_need() > ram:
            too_big.append(f"{' and '.join(on)} {gib(plan.host_need())}")
        elif best is None or sum(plan.seconds.values()) < sum(best.seconds.values()):
            best = plan
    return best, too_big


def _offload_policy_fix(job: JobSpec, free: frozenset[str], device_name: str) -> tuple[str | None, str | None]:
    """(fix, note): FSDP2's CPU offload policy for the actor, the critic or both, where the user left it off, if
    that fits the card and the job's host memory fits the machine; else a note when it would fit the card but not
    this machine's memory."""
    trained = ["actor", "critic"] if job.critic else ["actor"]
    plan, too_big = _policy_search(job, free, device_name, [r for r in trained if not job.host_offload[r == "critic"]])
    if plan is not None:
        ram = job.host_memory_bytes
        has = f"; this machine has {gib(ram)}" if ram else ""
        on = " and ".join(plan.policy_roles)
        return (
            f"{_policy_keys(plan.policy_roles)} (FSDP2's CPU offload policy: the {on}'s weights, gradients and AdamW "
            f"state in host memory, at least {gib(plan.host_need())} with the job's processes{has}; the optimizer "
            "steps there, slower)"
        ), None
    if too_big:  # said, so that a user on a bigger machine knows the way
        return None, (
            f"FSDP2's CPU offload policy ({_policy_keys(trained)}) would fit the card but needs more host memory "
            f"than this machine's {gib(job.host_memory_bytes)}: {', '.join(too_big)}"
        )
    return None, None


def _explain_misfit(job: JobSpec, free: frozenset[str], closest: Estimate, device_name: str) -> str:
    peak = closest.trainer_peak
    parts = ", ".join(f"{k} {gib(v)}" for k, v in sorted(peak.parts.items(), key=lambda kv: -kv[1])[:5])
    fixed = [k for k in K.PLANNED_KEYS if k not in free and job.setting(k).requested]
    head = (
        f"the job does not fit on {job.device}: even the smallest plan needs {gib(closest.total)}, "
        f"{gib(closest.overflow)} more than the card's {gib(job.card_bytes)} "
        f"(trainer peak {peak.name} {gib(peak.total)}: {parts}; rollout {gib(closest.rollout_peak.total)}; "
        f"CUDA contexts {gib(closest.contexts)}; headroom {HEADROOM:.0%})"
    )
    if fixed:
        head += "; kept as set: " + ", ".join(f"{k}={job.setting(k).value}" for k in fixed)
    return f"verl-compat memory plan: {head}. Smallest change that fits: {_smallest_fix(job, free, fixed, device_name)}"


def _smallest_fix(job: JobSpec, free: frozenset[str], fixed: list[str], device_name: str) -> str:
    """One kept value released (micro-batches first, then offload, checkpointing, the rollout batch), else all
    of them, else shorter responses or a smaller model."""
    held = [k for k in K.PLANNED_KEYS if k not in free and k in FIELD]
    if job.critic_v1 and job.critic_tokens:  # the user's critic budget sizes the critic's passes, not its row keys
        critic_rows = frozenset({K.CRITIC_MICRO, K.CRITIC_FWD_MICRO})
        plan, _ = _search(job.with_(critic_tokens=None), free | critic_rows, device_name)
        if plan is not None:
            tokens = plan.writes()[K.CRITIC_TOKENS]
            return (
                f"set {K.CRITIC_TOKENS}={tokens} ({K.LABELS[K.CRITIC_TOKENS]}) or remove it and let verl-compat plan it"
            )
    for key in held:
        plan, _ = _search(job, free | {key}, device_name)
        if plan is not None:
            how = "or remove it and let verl-compat plan it" if key in fixed else "or set it to auto"
            return f"set {key}={plan.value(key)} ({K.LABELS[key]}) {how}"
    everything = free | frozenset(held)
    if held:
        plan, _ = _search(job, everything, device_name)
        if plan is not None:
            changes = [f"{k}={plan.value(k)}" for k in held if plan.value(k) != _current(job, k)]
            return "set " + ", ".join(changes) + " (or set them to auto and let verl-compat plan them)"
    length = _largest(lambda r: _search(job.with_(response_len=r), everything, device_name)[0], job.response_len)
    fix, note = _offload_policy_fix(job, everything, device_name) if job.on_gpu else (None, None)
    fixes = [fix] if fix else []
    if length:
        fixes.append(f"data.max_response_length={length} (shorter responses)")
    layers = _largest(
        lambda n: _search(
            job.with_(actor=_scaled(job.actor, n), critic=job.critic and _scaled(job.critic, n)),
            everything,
            device_name,
        )[0],
        job.actor.layers,
    )
    if layers:
        small = _scaled(job.actor, layers)
        billions = small.lm_params / 1e9
        fixes.append(f"a smaller model (at most ~{billions:.2f}B parameters, e.g. {layers} layers of this width)")
    said = " or ".join(fixes) if fixes else "a card with more memory: nothing of this model's width fits"
    return f"{said}. Note: {note}" if note else said


def _current(job: JobSpec, key: str) -> Any:
    return _options(job, key, frozenset())[0]


def _scaled(shape, layers: int):
    return dataclasses.replace(shape, layers=layers)


def _largest(fits, upper: int) -> int | None:
    """The largest n in [1, upper) for which fits(n) is truthy (monotone), by bisection."""
    lo, hi = 0, upper  # fits(lo) assumed for lo=0 sentinel, not fits(hi)
    if not fits(1):
        return None
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def describe_keys(keys: Iterable[str]) -> str:
    return ", ".join(K.LABELS.get(k, k) for k in keys)
