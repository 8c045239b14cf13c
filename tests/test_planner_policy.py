"""The planner behind the memory resolvers: verl's own config in, planned values out (only where allowed), the
plan in the doctor, and the per-process shares that cap a simulated card's processes."""

from __future__ import annotations

import json
import types

import pytest
from omegaconf import OmegaConf
from planner_shapes import ppo_job_overrides, write_config

from verl_compat.catalog import get_profile
from verl_compat.planner import keys as K
from verl_compat.planner.resolve import SHARES_ENV, planned_share
from verl_compat.planner.search import PlanError
from verl_compat.policy import compose_ppo_config, decide, resolve_job_config
from verl_compat.resolvers.memory import host_fused_adamw
from verl_compat.user_keys import RequestedKeys


@pytest.fixture(scope="module")
def job_overrides(tmp_path_factory) -> list[str]:
    return ppo_job_overrides(tmp_path_factory.mktemp("m"))


def _decide(profile: str, overrides: list[str]):
    config = compose_ppo_config(overrides)
    requested = RequestedKeys(o.split("=", 1)[0].lstrip("+") for o in overrides)
    return config, *decide(config, get_profile(profile), requested)


def test_p40_gets_a_plan_for_every_value_left_unset(job_overrides):
    _, decisions, writes = _decide("p40", job_overrides)
    for key in (K.ACTOR_MICRO, K.LOGPROB_MICRO, K.REF_MICRO, K.CRITIC_MICRO, K.ROLLOUT_BATCH):
        assert isinstance(writes[key], int) and writes[key] >= 1, key
    assert writes[K.ROLLOUT_BATCH] == 32
    plan = decisions["memory.plan"]
    assert any(r.startswith("trainer/update_actor:") for r in plan.reasons)
    assert any(r.startswith("rollout/generate:") for r in plan.reasons)
    assert plan.value["total"] <= get_profile("p40").total_memory_bytes
    assert repr(plan.value).startswith("fits: ")


def test_the_plan_counts_the_asleep_rollout_server_only_where_verl_frees_its_memory(job_overrides):
    card = get_profile("p40").total_memory_bytes
    _, sleeping, _ = _decide("p40", job_overrides)
    _, awake, _ = _decide("p40", [*job_overrides, "actor_rollout_ref.rollout.free_cache_engine=false"])
    s, a = sleeping["memory.plan"], awake["memory.plan"]
    assert any(r.startswith("rollout/asleep:") for r in s.reasons)
    assert not any(r.startswith("rollout/asleep:") for r in a.reasons)
    assert sum(a.value["shares"].values()) <= card < sum(s.value["shares"].values())
    assert s.value["total"] <= card and a.value["total"] <= card


def test_a_value_the_user_set_is_kept_or_refused_at_start_up(job_overrides):
    _, decisions, writes = _decide("p40", [*job_overrides, f"{K.ACTOR_MICRO}=2"])
    assert K.ACTOR_MICRO not in writes and decisions[f"memory.{K.ACTOR_MICRO}"].value == 2
    # the logits of 32 sequences (the user turned the fused head off, which is kept) cannot fit
    unfused = "actor_rollout_ref.model.use_fused_kernels=false"
    with pytest.raises(PlanError, match=rf"kept as set: {K.ACTOR_MICRO}=32.*Smallest change that fits: set "):
        _decide("p40", [*job_overrides, unfused, f"{K.ACTOR_MICRO}=32", f"{K.LOGPROB_MICRO}=32"])


def test_sm80_keeps_upstream_values_and_plans_only_auto(job_overrides):
    _, _, writes = _decide("a100", job_overrides)
    assert not set(writes) & set(K.PLANNED_KEYS)
    config, _, writes = _decide("a100", [*job_overrides, f"{K.ACTOR_MICRO}=auto"])
    planned = {k: v for k, v in writes.items() if k in K.PLANNED_KEYS}
    assert list(planned) == [K.ACTOR_MICRO] and isinstance(planned[K.ACTOR_MICRO], int)


def test_auto_without_a_readable_model_is_an_error():
    with pytest.raises(PlanError, match="needs the model's config"):
        _decide("p40", ["actor_rollout_ref.model.path=/nonexistent/model", f"{K.ACTOR_MICRO}=auto"])


def test_shares_reach_the_simulated_cards_memory_caps(job_overrides, monkeypatch):
    monkeypatch.setenv(SHARES_ENV, "")  # recorded, so the value the driver seam exports is undone afterwards
    config = compose_ppo_config(job_overrides)
    decisions = resolve_job_config(config, get_profile("p40"), RequestedKeys(o.split("=")[0] for o in job_overrides))
    shares = json.loads(__import__("os").environ[SHARES_ENV])
    assert shares == decisions["memory.plan"].value["shares"]
    assert config.actor_rollout_ref.rollout.engine_kwargs.hf.max_batch_size == 32  # written into verl's config

    import torch

    from verl_compat import simulate

    real = 141 * 2**30
    calls = []
    monkeypatch.setattr(simulate, "_capped", set())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=real))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append(f))
    monkeypatch.setattr(torch.backends.cuda, "enable_flash_sdp", lambda on: None)
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda on: None)
    guards = []
    monkeypatch.setattr(simulate, "card_guard", lambda device, card, share: guards.append((device, card, share)))
    card = get_profile("p40").total_memory_bytes
    assert simulate.prepare_device(get_profile("p40"), "trainer") == pytest.approx(shares["trainer"] / real)
    simulate._capped.clear()
    assert simulate.prepare_device(get_profile("p40"), "rollout") == pytest.approx(shares["rollout"] / real)
    # the rollout sleeps between generations, so the two shares add up to more than the card; each process's
    # card guard keeps the sum within it
    assert guards == [(0, card, shares["trainer"]), (0, card, shares["rollout"])]
    assert planned_share("trainer") == shares["trainer"]
    monkeypatch.setenv(SHARES_ENV, "not json")
    with pytest.raises(PlanError, match=SHARES_ENV):
        planned_share("trainer")


ACTOR_OPT = "actor_rollout_ref.actor.optim.override_optimizer_config"
CRITIC_OPT = "critic.optim.override_optimizer_config"


@pytest.mark.parametrize(
    ("profile", "step", "written"),
    [
        ("p40", "fused", {"fused": True}),
        ("t4", "fused", {"fused": True}),
        ("v100", "fused", {"fused": True}),
        ("cpu", "default", None),
        ("a100", "default", None),
    ],
)
def test_adamw_step_without_the_whole_model_temporary_on_old_gpus(job_overrides, profile, step, written):
    """foreach AdamW's whole-model sqrt(exp_avg_sq) is what the planned P40 critic update OOMed in. On an fp32 GPU
    the fused kernel (ATen CUDA, not Triton) steps in place, under fp16 loss scaling (T4, V100) too, with verl's
    scaler from verl_compat.loss_scaling (tests/test_loss_scaling.py); the plan counts what each needs."""
    _, decisions, writes = _decide(profile, job_overrides)
    assert writes.get(ACTOR_OPT) == written and writes.get(CRITIC_OPT) == written
    assert decisions["memory.optimizer_step"].value == step
    if step == "fused":
        assert not any("sqrt(exp_avg_sq)" in r for r in decisions["memory.plan"].reasons)


def test_the_users_optimizer_settings_are_kept(job_overrides):
    _, decisions, writes = _decide("p40", [*job_overrides, f"+{ACTOR_OPT}.foreach=false"])
    assert ACTOR_OPT not in writes and writes[CRITIC_OPT] == {"fused": True}  # the critic's is still planned
    assert not decisions["memory.optimizer_step"].defaulted
    # another optimizer than torch's AdamW: nothing written, the step's temporary is counted
    torchao = "actor_rollout_ref.actor.optim.optimizer_impl=torchao.optim"
    _, decisions, writes = _decide("p40", [*job_overrides, torchao])
    assert ACTOR_OPT not in writes and decisions["memory.optimizer_step"].value == "default"


def test_the_plans_fused_head_is_one_decision_and_both_of_verls_keys(job_overrides):
    config, decisions, writes = _decide("p40", job_overrides)
    assert decisions["kernels.fused"].value == "torch"
    assert any(r.startswith("memory plan: the fused head") for r in decisions["kernels.fused"].reasons)
    assert writes["actor_rollout_ref.model.use_fused_kernels"] is True
    backend = "actor_rollout_ref.model.fused_kernel_options.impl_backend"  # verl's default is torch already
    assert writes.get(backend, OmegaConf.select(config, backend)) == "torch"
    assert "critic.model.use_fused_kernels" not in writes and decisions["kernels.fused.critic"].value == "off"
    _, decisions, writes = _decide("p40", [*job_overrides, "actor_rollout_ref.model.use_fused_kernels=false"])
    assert decisions["kernels.fused"].value == "off" and not decisions["kernels.fused"].defaulted
    assert "actor_rollout_ref.model.use_fused_kernels" not in writes
    _, decisions, writes = _decide("a100", job_overrides)
    assert decisions["kernels.fused"].value == "off" and "actor_rollout_ref.model.use_fused_kernels" not in writes


def test_without_a_plan_the_head_stays_upstreams():
    _, decisions, writes = _decide("p40", ["actor_rollout_ref.model.path=/nonexistent/model"])
    assert decisions["kernels.fused"].value == "off" and "actor_rollout_ref.model.use_fused_kernels" not in writes


def test_the_actors_passes_get_token_budgets_in_place_of_row_counts(job_overrides, monkeypatch):
    monkeypatch.setenv(SHARES_ENV, "")  # recorded, so the shares resolve_job_config exports are undone afterwards
    seq = 512  # 256 + 256
    _, decisions, writes = _decide("p40", job_overrides)
    assert writes[K.ACTOR_DYNAMIC] is True and writes[K.LOGPROB_DYNAMIC] is True and writes[K.REF_DYNAMIC] is True
    assert any(r.startswith("micro-batches by token budget") for r in decisions["memory.plan"].reasons)
    # written into verl's config as planned, interpolated defaults included (they follow the actor's budget); a
    # budget equal to verl's default (16,384) needs no write
    config = compose_ppo_config(job_overrides)
    resolve_job_config(config, get_profile("p40"), RequestedKeys(o.split("=", 1)[0] for o in job_overrides))
    for tokens_key, rows_key in K.TOKEN_BUDGET_OF.items():
        rows = OmegaConf.select(config, rows_key)
        assert OmegaConf.select(config, tokens_key) == rows * seq, tokens_key  # the same bound on a micro-batch
        assert writes.get(tokens_key, rows * seq) == rows * seq
    # a row count of the user's, a token key of the user's, or padded sequences: rows, as verl would run them
    for extra in (
        [f"{K.ACTOR_MICRO}=2"],
        [f"{K.ACTOR_DYNAMIC}=false"],
        [f"{K.LOGPROB_TOKENS}=4096"],
        ["actor_rollout_ref.model.use_remove_padding=false"],
    ):
        _, _, writes = _decide("p40", [*job_overrides, *extra])
        assert not set(writes) & set(K.TOKEN_KEYS), extra
    _, _, writes = _decide("a100", job_overrides)  # sm_80+: upstream's
    assert not set(writes) & set(K.TOKEN_KEYS)


HOST_OPTIMIZER = [  # FSDP2's CPU offload policy for actor and critic: weights, grads and AdamW on the host
    "actor_rollout_ref.actor.strategy=fsdp2",
    "critic.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
    "critic.fsdp.offload_policy=true",
]


def _host_with(monkeypatch, gib: int) -> None:
    """This machine's RAM as the planner sees it (the offload policy's models live there)."""
    from verl_compat import machine
    from verl_compat.planner import resolve

    facts = machine.HostFacts(cpu_count=16, memory_bytes=gib << 30, accelerator=False, accelerator_via=None)
    monkeypatch.setattr(resolve, "host_facts", lambda: facts)


@pytest.fixture
def ppo_15b(tmp_path) -> list[str]:
    model = write_config(tmp_path / "qwen2.5-1.5b", "1.5B")
    return [
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        "trainer.n_gpus_per_node=1",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "critic.ppo_mini_batch_size=8",
        "data.max_prompt_length=256",
        "data.max_response_length=256",
        "algorithm.use_kl_in_reward=true",
    ]


HELD = [  # the user decided where both models live (verl's param offload): the plan may not change that
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "critic.fsdp.param_offload=true",
]


def test_fsdp2_cpu_offload_policy_is_counted_so_a_15b_ppo_job_is_not_refused(ppo_15b, job_overrides, monkeypatch):
    """A Qwen2.5-1.5B PPO job needs 16 bytes per parameter on a P40 during the update under verl's param and
    optimizer offload (AdamW's state comes back for the step), so with the user's param offload it is refused, and
    the refusal names the policy as the fix; with the user's FSDP2 CPU offload policy the step is on the host and
    only streamed units, their gradients and activations are on the card."""
    _host_with(monkeypatch, 128)
    base = ppo_15b
    # weights, grads and the larger of the activations and AdamW's state (it comes back for the step only)
    with pytest.raises(
        PlanError, match=r"trainer peak update_\w+ 23\.00 GiB: \w+ optimizer, brought for the step"
    ) as refused:
        _decide("p40", [*base, *HELD])
    fix = str(refused.value).split("Smallest change that fits: ", 1)[1]
    keys = "actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.fsdp_config.offload_policy=true"
    assert fix.startswith(f"{keys} critic.strategy=fsdp2 critic.fsdp.offload_policy=true (FSDP2's CPU offload policy")
    assert "at least 69.01 GiB with the job's processes; this machine has 128.00 GiB" in fix
    _, decisions, writes = _decide("p40", [*base, *HOST_OPTIMIZER])
    plan = decisions["memory.plan"]
    assert plan.value["total"] <= get_profile("p40").total_memory_bytes
    update = next(r for r in plan.reasons if r.startswith("trainer/update_actor:"))
    assert "actor units streamed from host" in update and "actor unit gradients on their way to the host" in update
    assert "actor optimizer" not in update and "actor weights" not in update and "critic weights" not in update
    sync = next(r for r in plan.reasons if r.startswith("trainer/update_weights:"))
    assert "staging bucket" not in sync  # gathered on the host, staged in shared memory
    assert any("host optimizer" in r for r in plan.reasons if r.startswith("estimated step"))
    host = next(r for r in plan.reasons if r.startswith("host memory under FSDP2's CPU offload policy"))
    assert "actor 23.00 GiB" in host and "critic 23.00 GiB" in host  # 16 bytes per parameter each, on the host
    assert (
        "reference weights 5.75 GiB" in host and "weight sync staging bucket 2.00 GiB" in host
    )  # the default 2048 MB bucket
    # with the measured slack and processes (tests/test_planner_cuda_calibration.py)
    assert "20% slack and the job's processes 4.50 GiB: at least 69.01 GiB free on the host" in host
    # the step runs on the host: AdamW's fused host kernel there (torch's default is the per-parameter loop)
    assert host_fused_adamw()  # torch 2.13 has it
    assert decisions["memory.optimizer_step"].value == "fused" and writes[ACTOR_OPT] == {"fused": True}
    # under fp16 loss scaling (T4) too (verl_compat.loss_scaling's flags suit the fused kernel)
    assert _decide("t4", [*base, *HOST_OPTIMIZER])[1]["memory.optimizer_step"].value == "fused"
    # a torch without the host kernel: the per-parameter loop, one parameter's temporaries
    monkeypatch.setattr("verl_compat.resolvers.memory.host_fused_adamw", lambda: False)
    _, decisions, writes = _decide("p40", [*base, *HOST_OPTIMIZER])
    assert decisions["memory.optimizer_step"].value == "loop" and writes[ACTOR_OPT] == {"foreach": False}
    # verl ignores param/optimizer offload under the offload policy: the plan leaves them off
    for key in (K.ACTOR_PARAM_OFFLOAD, K.ACTOR_OPTIM_OFFLOAD, K.CRITIC_PARAM_OFFLOAD, K.CRITIC_OPTIM_OFFLOAD):
        assert writes.get(key, False) is False, key


POLICY_KEYS = {  # what HOST_OPTIMIZER sets, as the plan writes it
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "critic.strategy": "fsdp2",
    "actor_rollout_ref.actor.fsdp_config.offload_policy": True,
    "critic.fsdp.offload_policy": True,
}


def test_the_plan_turns_the_offload_policy_on_where_nothing_else_fits(ppo_15b, job_overrides, monkeypatch):
    """Where the user left the models' placement to verl-compat and nothing else fits the card, the plan puts the
    models under FSDP2's CPU offload policy itself: the same plan as the user's keys give, one strategy record per
    role (platform.strategy, settled by the plan), and AdamW's step resolved for the host."""
    _host_with(monkeypatch, 128)
    config, decisions, writes = _decide("p40", ppo_15b)
    assert {k: writes[k] for k in POLICY_KEYS} == POLICY_KEYS
    _, by_user, user_writes = _decide("p40", [*ppo_15b, *HOST_OPTIMIZER])
    assert {k: v for k, v in writes.items() if k not in POLICY_KEYS} == user_writes
    assert decisions["memory.plan"].value["total"] == by_user["memory.plan"].value["total"]
    for sfx in ("", ".critic"):
        strategy = decisions[f"platform.strategy{sfx}"]
        assert strategy.value == "fsdp2" and strategy.reasons[-1].startswith("memory plan: FSDP2, for its CPU offload")
        assert decisions[f"memory.offload_policy{sfx}"].value is True
    assert any("planned for the actor and critic" in r for r in decisions["memory.plan"].reasons)
    assert any(
        r.startswith("note: FSDP2's CPU offload policy for the actor and critic")
        for r in decisions["memory.plan"].reasons
    )
    # the reference follows the actor's strategy in verl's config
    resolved = compose_ppo_config(ppo_15b)
    resolve_job_config(resolved, get_profile("p40"), RequestedKeys(o.split("=", 1)[0] for o in ppo_15b))
    assert OmegaConf.select(resolved, "actor_rollout_ref.ref.strategy") == "fsdp2"
    assert decisions["memory.optimizer_step"].value == "fused" and writes[ACTOR_OPT] == {"fused": True}
    monkeypatch.setattr("verl_compat.resolvers.memory.host_fused_adamw", lambda: False)
    decisions, writes = _decide("p40", ppo_15b)[1:]
    assert decisions["memory.optimizer_step"].value == "loop" and writes[ACTOR_OPT] == {"foreach": False}
    # a job that fits without it (0.5B), sm_80+ and a model's placement the user set: not turned on
    for profile, job in (("p40", job_overrides), ("a100", ppo_15b)):
        writes = _decide(profile, job)[2]
        assert not set(writes) & set(POLICY_KEYS), profile
    for held in (HELD[0], "actor_rollout_ref.actor.strategy=fsdp", "critic.fsdp.offload_policy=false"):
        with pytest.raises(PlanError):  # the other model alone under the policy does not fit
            _decide("p40", [*ppo_15b, held])


def test_the_offload_policy_counts_only_under_fsdp2():
    from verl_compat.config_keys import ACTOR, CRITIC, cpu_offload_policy

    def config(*overrides):
        return OmegaConf.from_dotlist(list(overrides))

    assert cpu_offload_policy(config(*HOST_OPTIMIZER), ACTOR) and cpu_offload_policy(config(*HOST_OPTIMIZER), CRITIC)
    # FSDP1 (verl's default strategy) ignores offload_policy
    assert not cpu_offload_policy(config("actor_rollout_ref.actor.fsdp_config.offload_policy=true"), ACTOR)
    assert not cpu_offload_policy(config("actor_rollout_ref.actor.strategy=fsdp2"), ACTOR)


def test_the_offload_policy_needs_the_host_memory_it_keeps(ppo_15b, monkeypatch):
    """The models under the policy live in host memory: a machine with less is refused at start-up with the
    numbers, and a refusal on such a machine names the policy only as a note (it would not run here)."""
    _host_with(monkeypatch, 32)
    with pytest.raises(PlanError, match=r"actor 23\.00 GiB.*at least 69\.01 GiB, more than this machine's 32\.00 GiB"):
        _decide("p40", [*ppo_15b, *HOST_OPTIMIZER])
    with pytest.raises(PlanError) as refused:
        _decide("p40", ppo_15b)
    fix = str(refused.value).split("Smallest change that fits: ", 1)[1]
    assert fix.startswith("a smaller model")
    assert "Note: FSDP2's CPU offload policy (" in fix and "needs more host memory than this machine's 32.00 GiB" in fix


def test_the_plan_says_how_many_gpus_it_planned_for_and_when_this_host_has_fewer(job_overrides, monkeypatch):
    """verl's default trainer.n_gpus_per_node is 8: the plan is per GPU of 8, and on a host with one GPU it says
    that the job's start-up will refuse it, with the fix."""
    monkeypatch.setattr("verl_compat.preflight.host_gpu_count", lambda: 1)
    eight = [o for o in job_overrides if not o.startswith("trainer.n_gpus_per_node=")]
    reasons = _decide("p40", eight)[1]["memory.plan"].reasons
    assert "32 sequences/step" not in reasons[0] and "tokens per GPU of 8 (trainer.n_gpus_per_node" in reasons[0]
    note = next(r for r in reasons if r.startswith("note: planned per GPU for 8 GPUs"))
    assert "this single-node run has 1" in note and "Fix: set trainer.n_gpus_per_node=1" in note
    reasons = _decide("p40", job_overrides)[1]["memory.plan"].reasons
    assert "tokens per GPU of 1 " in reasons[0] and not any(r.startswith("note: planned per GPU") for r in reasons)
