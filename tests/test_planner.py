"""The memory planner over catalog profiles x Qwen2.5 sizes x algorithms: a plan fits by its own estimate, values
the user set are kept, and a job that cannot fit is refused with the overflow and a change that does fit."""

from __future__ import annotations

import dataclasses
import re

import pytest
from planner_shapes import config_dict, write_config

from verl_compat.catalog import get_profile
from verl_compat.planner import keys as K
from verl_compat.planner.estimate import GIB
from verl_compat.planner.job import JobSpec, Setting
from verl_compat.planner.search import PlanError, plan_job
from verl_compat.planner.shape import ModelShape

PROFILES = ["p40", "p100", "v100", "t4", "gtx1660"]
DTYPE = {"p40": 4, "p100": 2, "v100": 2, "t4": 2, "gtx1660": 4}
ALGOS = {  # (critic, reference, samples per prompt)
    "ppo_gae_kl_reward": (True, True, 1),
    "grpo_kl_loss": (False, True, 4),
    "ppo_no_ref": (True, False, 1),
}


def _job(profile: str, size: str, algo: str, batch: int = 32, sleeps: bool = True, **settings) -> JobSpec:
    p = get_profile(profile)
    shape = ModelShape.from_config(config_dict(size))
    critic, ref, n = ALGOS[algo]
    b = DTYPE[profile]
    return JobSpec(
        actor=shape,
        critic=shape if critic else None,
        need_ref=ref,
        card_bytes=p.total_memory_bytes,
        device=p.describe(),
        prompt_len=256,
        response_len=256,
        train_batch=batch,
        n=n,
        mini_batch=batch,
        critic_mini_batch=batch,
        train_bytes=b,
        critic_train_bytes=b,
        rollout_bytes=b,
        rollout_sleeps=sleeps,  # the hf server frees its GPU memory between generations (verl's default)
        settings={k: Setting(v, True) for k, v in settings.items()},
    )


def test_parameter_counts_match_the_published_sizes():
    counts = {s: ModelShape.from_config(config_dict(s)).lm_params / 1e9 for s in ("0.5B", "1.5B", "3B", "7B")}
    assert counts == pytest.approx({"0.5B": 0.494, "1.5B": 1.544, "3B": 3.086, "7B": 7.616}, rel=0.01)


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("size", ["0.5B", "1.5B", "3B", "7B"])
@pytest.mark.parametrize("profile", PROFILES)
def test_plan_fits_by_its_own_estimate_or_is_refused_with_numbers(profile, size, algo):
    job = _job(profile, size, algo)
    try:
        plan = plan_job(job, profile)
    except PlanError as e:
        msg = str(e)
        over = float(re.search(r"([\d.]+) GiB more than the card", msg).group(1))
        assert over > 0 and "Smallest change that fits" in msg and get_profile(profile).describe() in msg
        needed = float(re.search(r"the smallest plan needs ([\d.]+) GiB", msg).group(1))
        assert needed * GIB > job.card_bytes
        return
    e = plan.estimate
    assert e.fits and e.total <= job.card_bytes
    assert e.share("trainer") >= max(ph.total for ph in e.trainer)
    assert e.share("rollout") >= e.rollout_peak.total
    c = plan.choice
    assert job.mini_rows % c.actor_micro == 0 and job.critic_mini_rows % c.critic_micro == 0
    assert 1 <= c.rollout_batch <= job.rows
    writes = plan.writes()
    assert (K.CRITIC_MICRO in writes) == (job.critic is not None)
    assert (K.REF_MICRO in writes) == job.need_ref
    assert writes[K.ROLLOUT_TOKENS] == c.rollout_batch * job.seq_len


@pytest.mark.parametrize("profile", ["p40", "t4"])
def test_a_sleeping_rollout_server_leaves_the_trainers_phases_the_card(profile):
    """Where the server frees its weights and KV cache between generations, each trainer compute phase shares the
    card with the asleep server only, and the weight sync with the awake one; a server that stays awake
    (rollout.free_cache_engine=false) is on the card beside every phase, so the trainer gets less."""
    from verl_compat.planner.estimate import FRAGMENTATION, SYNC

    sleeping = plan_job(_job(profile, "0.5B", "ppo_gae_kl_reward"), profile)
    e = sleeping.estimate
    room = job_room = e.card_bytes - e.contexts - e.headroom
    for ph in e.trainer:
        beside = e.share("rollout") if ph.name == SYNC else e.asleep
        assert ph.total * (1 + FRAGMENTATION) + beside <= room, ph.name
    assert e.asleep < e.share("rollout") / 4
    awake = plan_job(_job(profile, "0.5B", "ppo_gae_kl_reward", sleeps=False), profile).estimate
    assert [p.name for p in awake.rollout] == ["generate"]
    assert awake.share("trainer") + awake.share("rollout") <= job_room
    assert e.share("trainer") + e.share("rollout") > job_room  # more than both peaks at once would allow
    assert e.share("trainer") > awake.share("trainer")
    caps = sleeping.shares  # the simulated card's caps: the card guard keeps their sum within the card
    assert caps["trainer"] == e.card_bytes - e.asleep - e.contexts - e.headroom // 2


def test_small_models_fit_every_old_card_with_16_gb_or_more():
    for profile in ("p40", "p100", "v100", "t4"):
        for algo in ALGOS:
            assert plan_job(_job(profile, "0.5B", algo), profile).estimate.fits


def test_the_p40_ppo_job_batches_the_whole_rollout():
    plan = plan_job(_job("p40", "0.5B", "ppo_gae_kl_reward"), "p40")
    assert plan.choice.rollout_batch == 32  # one generate call for the step's 32 sequences
    assert plan.estimate.total <= get_profile("p40").total_memory_bytes
    assert not plan.choice.actor_param_offload  # a 22.4 GiB card keeps the 0.5B actor's weights on it


def test_an_impossible_explicit_micro_batch_is_refused_with_the_overflow_and_a_fix_that_fits():
    job = _job("p40", "0.5B", "ppo_gae_kl_reward", **{K.ACTOR_MICRO: 32})
    with pytest.raises(PlanError) as err:
        plan_job(job, "p40")
    msg = str(err.value)
    assert f"kept as set: {K.ACTOR_MICRO}=32" in msg and "update_actor" in msg
    over = float(re.search(r"([\d.]+) GiB more than the card", msg).group(1))
    assert 1 < over < 60
    fixed = int(re.search(rf"set {re.escape(K.ACTOR_MICRO)}=(\d+)", msg).group(1))
    assert fixed < 32
    assert plan_job(_job("p40", "0.5B", "ppo_gae_kl_reward", **{K.ACTOR_MICRO: fixed}), "p40").estimate.fits


def test_a_model_too_big_for_the_card_gets_shorter_responses_or_a_smaller_model():
    job = _job("p40", "1.5B", "ppo_gae_kl_reward")
    with pytest.raises(PlanError) as err:
        plan_job(job, "p40")
    msg = str(err.value)
    m = re.search(r"at most ~([\d.]+)B parameters, e\.g\. (\d+) layers", msg)
    assert m, msg
    layers = int(m.group(2))
    smaller = job.with_(actor=dataclasses.replace(job.actor, layers=layers), critic=None)
    smaller = smaller.with_(critic=smaller.actor)
    assert plan_job(smaller, "p40").estimate.fits
    bigger = smaller.with_(actor=dataclasses.replace(job.actor, layers=layers + 1))
    bigger = bigger.with_(critic=bigger.actor)
    with pytest.raises(PlanError):
        plan_job(bigger, "p40")


def test_responses_too_long_for_the_card_get_a_length_that_fits():
    job = _job("p40", "0.5B", "ppo_gae_kl_reward").with_(response_len=16384)
    with pytest.raises(PlanError) as err:
        plan_job(job, "p40")
    length = int(re.search(r"data.max_response_length=(\d+)", str(err.value)).group(1))
    assert 256 < length < 16384
    assert plan_job(job.with_(response_len=length), "p40").estimate.fits
    with pytest.raises(PlanError):
        plan_job(job.with_(response_len=length + 1), "p40")


def test_values_the_user_set_are_kept():
    kept = {K.ACTOR_MICRO: 2, K.ACTOR_GC: True, K.ROLLOUT_BATCH: 8}
    plan = plan_job(_job("p40", "0.5B", "ppo_gae_kl_reward", **kept), "p40")
    assert (plan.choice.actor_micro, plan.choice.actor_gc, plan.choice.rollout_batch) == (2, True, 8)
    assert not set(kept) & set(plan.writes())


def test_auto_is_planned_and_sm80_plans_only_auto():
    p = get_profile("a100")
    base = _job("p40", "1.5B", "ppo_gae_kl_reward")
    settings = {k: Setting(None, False) for k in K.PLANNED_KEYS} | {K.ACTOR_MICRO: Setting("auto", True)}
    job = base.with_(
        card_bytes=p.total_memory_bytes,
        device=p.describe(),
        train_bytes=2,
        rollout_bytes=2,
        critic_train_bytes=2,
        settings=settings,
    )
    with pytest.raises(PlanError) as err:  # upstream's values (no offload) cannot hold 1.5B actor + critic
        plan_job(job, "a100", sm80=True)
    assert "optimizer_offload=True" in str(err.value) and "set them to auto" in str(err.value)
    small = job.with_(
        actor=ModelShape.from_config(config_dict("0.5B")), critic=ModelShape.from_config(config_dict("0.5B"))
    )
    plan = plan_job(small, "a100", sm80=True)
    assert set(plan.writes()) == {K.ACTOR_MICRO}
    assert plan.estimate.fits and plan.choice.actor_gc is False and plan.choice.actor_optim_offload is False


def test_more_memory_never_plans_a_slower_step():
    small = plan_job(_job("t4", "0.5B", "ppo_gae_kl_reward"), "t4")
    big_card = _job("t4", "0.5B", "ppo_gae_kl_reward").with_(card_bytes=32 * GIB)
    big = plan_job(big_card, "t4")
    assert sum(big.seconds.values()) <= sum(small.seconds.values())


def test_the_model_shape_is_read_from_config_json_without_weights(tmp_path):
    folder = write_config(tmp_path / "q", "1.5B")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    assert ModelShape.from_path(str(folder)) == ModelShape.from_config(config_dict("1.5B"))
    with pytest.raises(FileNotFoundError, match="no model folder"):
        ModelShape.from_path(str(tmp_path / "missing"))


def test_the_fused_head_holds_one_chunk_of_logits_whatever_the_micro_batch():
    from verl_compat.planner.estimate import Choice, phase_activations

    job = _job("p40", "0.5B", "ppo_gae_kl_reward")
    base = Choice(1, 1, 1, 1, 1, False, False, False, False, True, True, 32)
    fused = dataclasses.replace(base, fused_head=True)
    for phase in ("update_actor", "old_log_prob", "ref"):
        unfused_1, fused_1 = phase_activations(job, phase, 1, base), phase_activations(job, phase, 1, fused)
        unfused_32, fused_32 = phase_activations(job, phase, 32, base), phase_activations(job, phase, 32, fused)
        assert fused_32 < unfused_32 / 4, phase  # 32 sequences' logits against one 512-token chunk
        assert fused_32 < 3 * fused_1, phase  # the chunk is fixed; only hidden states grow with the batch
        if phase == "update_actor":
            assert fused_1 > unfused_1  # one sequence's logits need less than the chunk's work tensors


def test_the_plan_takes_the_fused_head_where_it_lets_micro_batches_grow_and_leaves_it_where_it_costs():
    p40 = plan_job(_job("p40", "0.5B", "ppo_gae_kl_reward").with_(fused_head="free"), "p40")
    assert p40.choice.fused_head and p40.choice.logprob_micro > 4
    unfused = plan_job(_job("p40", "0.5B", "ppo_gae_kl_reward"), "p40")  # the head left off: as before
    assert not unfused.choice.fused_head and unfused.choice.logprob_micro < p40.choice.logprob_micro
    assert any(line.startswith("actor head: fused") for line in p40.table())
    # a T4's 15 GB beside an awake server: the update runs one sequence per micro-batch, where the chunk would
    # hold more (with the server asleep the update has room for 16 sequences, and takes the head)
    t4 = plan_job(_job("t4", "0.5B", "ppo_gae_kl_reward", sleeps=False).with_(fused_head="free"), "t4")
    assert not t4.choice.fused_head and t4.choice.actor_micro == 1
    forced = plan_job(_job("t4", "0.5B", "ppo_gae_kl_reward").with_(fused_head="on", fused_chunk=128), "t4")
    assert forced.choice.fused_head  # a user's choice is kept
    # with the smaller chunk below sm_80 (kernels.fused_chunk) the T4's update takes it too, and grows
    small = plan_job(_job("t4", "0.5B", "ppo_gae_kl_reward").with_(fused_head="free", fused_chunk=128), "t4")
    assert small.choice.fused_head and small.choice.actor_micro > 1
