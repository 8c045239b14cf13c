"""Packed sequences (remove padding) through `sdpa_varlen` equal the padded path within fp32 tolerance on this
CPU: a tiny GQA model's logits and gradients, generation, and verl's own FSDP engine (log-probs and the actor
update's loss with use_remove_padding on and off)."""

from __future__ import annotations

import pytest
import torch
from engine_harness import compose_ppo_config, overrides, padded, padded_batch, to_engine_input
from tiny_configs import tiny_config

from verl_compat.packed import VARLEN, packed_segments, register

LENS = [5, 9, 3, 7]


@pytest.fixture(scope="module")
def model_pair():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    register()
    torch.manual_seed(0)
    varlen = Qwen2ForCausalLM._from_config(tiny_config(Qwen2Config), attn_implementation=VARLEN, dtype=torch.float32)
    sdpa = Qwen2ForCausalLM._from_config(tiny_config(Qwen2Config), attn_implementation="sdpa", dtype=torch.float32)
    sdpa.load_state_dict(varlen.state_dict())
    return varlen, sdpa


def _batch():
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 300, (n,), generator=g) for n in LENS]
    ids = torch.zeros(len(LENS), max(LENS), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    packed = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(n) for n in LENS])[None]
    return ids, mask, packed, positions


def test_segments_come_from_position_resets():
    pos = torch.cat([torch.arange(n) for n in LENS])[None]
    assert packed_segments(pos, sum(LENS), {}).tolist() == [0, 5, 14, 17, 24]
    assert packed_segments(torch.arange(10)[None], 10, {}) is None  # one sequence: plain causal attention
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    assert packed_segments(None, 10, {"cu_seq_lens_q": cu}).tolist() == [0, 4, 10]


def test_packed_logits_and_grads_equal_the_padded_path(model_pair):
    varlen, sdpa = model_pair
    ids, mask, packed, positions = _batch()
    padded_logits = sdpa(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    reference = torch.cat([padded_logits[i, :n] for i, n in enumerate(LENS)])
    packed_logits = varlen(input_ids=packed, position_ids=positions).logits[0]
    torch.testing.assert_close(packed_logits, reference, rtol=1e-5, atol=1e-5)
    # the same loss, backpropagated through both paths, gives the same gradients
    target = packed[0].roll(-1)
    for logits, model in ((packed_logits, varlen), (reference, sdpa)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(logits, target).backward()
    for (name, a), (_, b) in zip(varlen.named_parameters(), sdpa.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_generation_is_plain_sdpa(model_pair):
    varlen, sdpa = model_pair
    ids, mask, _, _ = _batch()
    left = torch.zeros_like(ids[:, :4])
    left_mask = torch.zeros_like(left)
    for i, n in enumerate(LENS):  # left-padded prompts, as the rollout engine batches them
        k = min(n, 4)
        left[i, 4 - k :], left_mask[i, 4 - k :] = ids[i, :k], 1
    kw = dict(attention_mask=left_mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(varlen.generate(left, **kw), sdpa.generate(left, **kw))


# verl's engine -------------------------------------------------------------------------------------------------
def test_verl_engine_log_probs_and_loss_equal_with_and_without_remove_padding(tmp_path, single_rank, monkeypatch):
    from engine_harness import actor_update_input

    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl_compat.quickstart.model import tiny_llama

    model = tiny_llama(tmp_path / "tiny")
    fields = padded_batch(vocab_size=90)
    mask = fields["response_mask"].bool()
    import verl_compat.packed.attention as varlen_mod

    calls = []
    loop = varlen_mod._varlen_loop
    monkeypatch.setattr(varlen_mod, "_varlen_loop", lambda *a: calls.append(a[3].numel() - 1) or loop(*a))
    results = {}
    for rmpad in (True, False):
        calls.clear()
        config = compose_ppo_config([*overrides(model), f"actor_rollout_ref.model.use_remove_padding={rmpad}"])
        assert config.actor_rollout_ref.model.override_config.attn_implementation == VARLEN  # the CPU's choice
        actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
        actor.init_model()
        assert actor.actor.engine.module.config._attn_implementation == VARLEN
        td = to_engine_input(fields, calculate_entropy=True, compute_loss=False)
        out = actor.compute_log_prob(td)
        log_probs = padded(out, "log_probs", td).float()
        update = actor.update_actor(actor_update_input(fields, log_probs, log_probs))
        loss = [float(v) for v in tu.get(update, "metrics")["loss"]]
        results[rmpad] = (log_probs[mask], loss)
        # packed micro-batches went through the varlen path (2 sequences per micro-batch), padded ones did not
        assert (calls and set(calls) == {2}) if rmpad else not calls
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-5)
    assert results[True][1] == pytest.approx(results[False][1], rel=1e-5, abs=1e-6)
