"""HFGenerationEngine on CPU with tiny random models (no Ray, no verl, no network)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from tiny_configs import EOS, tiny_config
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl_compat.errors import IncompatibleRequestError
from verl_compat.rollout.engine import HFGenerationEngine
from verl_compat.rollout.sampling import SamplingSpec, resolve_max_tokens
from verl_compat.rollout.weights import UnknownWeightError

PROMPTS = [[5, 17, 42, 9, 100], [7, 8], [250, 3, 3, 61, 90, 12, 14, 200, 11], [33]]


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(LlamaConfig)).eval()


def tiny_qwen_tied(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config(Qwen2Config, tie_word_embeddings=True)).eval()


def reference_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=EOS, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def recomputed_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    """What the actor computes: one forward over prompt + response, log_softmax, gather the response tokens."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return lp.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


def greedy(max_tokens: int = 12, **extra) -> dict:
    return {"temperature": 0, "top_p": 1.0, "top_k": -1, "max_tokens": max_tokens, **extra}


@pytest.fixture
def llama_pair():
    model = tiny_llama()
    return HFGenerationEngine(copy.deepcopy(model), dtype=torch.float32, attn_implementation="sdpa"), model


def test_greedy_matches_model_generate(llama_pair):
    engine, ref = llama_pair

    async def run():
        return await asyncio.gather(*[engine.generate(p, greedy(), f"r{i}") for i, p in enumerate(PROMPTS)])

    results = asyncio.run(run())
    for prompt, result in zip(PROMPTS, results, strict=True):
        expected = reference_greedy(ref, prompt, 12)
        if EOS in expected:  # generate pads after EOS; the engine strips the padding and keeps EOS
            expected = expected[: expected.index(EOS) + 1]
        assert result.token_ids == expected
        assert result.log_probs is None
        assert result.finish_reason == ("stop" if expected[-1] == EOS else "length")


def test_sampled_logprobs_match_recomputed_forward(llama_pair):
    engine, ref = llama_pair
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16, "logprobs": True}

    async def run():
        calls = [engine.generate(p, {**params, "seed": i}, f"s{i}") for i, p in enumerate(PROMPTS)]
        return await asyncio.gather(*calls)

    for prompt, result in zip(PROMPTS, asyncio.run(run()), strict=True):
        assert len(result.log_probs) == len(result.token_ids) > 0
        expected = recomputed_logprobs(ref, prompt, result.token_ids)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)

    # Processed log-probs (vLLM processed_logprobs): with temperature T they are log_softmax(logits / T).
    result = asyncio.run(engine.generate(PROMPTS[0], {**params, "temperature": 0.7, "seed": 3}, "t"))
    expected = recomputed_logprobs(ref, PROMPTS[0], result.token_ids, temperature=0.7)
    torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)


def test_seed_top_k_top_p_and_per_row_limits(llama_pair):
    engine, _ = llama_pair
    sampled = {"temperature": 1.0, "top_k": 5, "top_p": 0.9, "max_tokens": 10, "seed": 7, "logprobs": True}

    async def run():
        return await asyncio.gather(
            engine.generate(PROMPTS[0], sampled, "a"),
            engine.generate(PROMPTS[0], sampled, "b"),
            engine.generate(PROMPTS[1], greedy(max_tokens=3), "c"),
            engine.generate(PROMPTS[2], {**greedy(max_tokens=6), "ignore_eos": True}, "d"),
        )

    a, b, c, d = asyncio.run(run())
    assert engine.batch_log == [("a", "b", "c", "d")]
    assert a.token_ids == b.token_ids  # same seed, same prompt, same batch -> same sample
    assert len(c.token_ids) <= 3 and len(d.token_ids) == 6
    # top_k=5 renormalises over at most 5 tokens: every chosen token keeps log-prob >= log(1/5)-ish mass share
    assert all(lp <= 0 for lp in a.log_probs)


def test_stops_on_eos_and_stop_token_ids(llama_pair):
    engine, ref = llama_pair
    first = reference_greedy(ref, PROMPTS[0], 1)[0]
    engine.eos_token_ids = (first,)
    result = asyncio.run(engine.generate(PROMPTS[0], greedy(), "eos"))
    assert result.token_ids == [first] and result.finish_reason == "stop"
    engine.eos_token_ids = (EOS,)
    second = reference_greedy(ref, PROMPTS[0], 2)[1]
    result = asyncio.run(engine.generate(PROMPTS[0], greedy(stop_token_ids=[second]), "stop"))
    assert result.token_ids == [first, second] and result.finish_reason == "stop"


def test_concurrent_requests_are_batched(llama_pair):
    engine, ref = llama_pair
    engine.max_batch_size = 2

    async def run():
        return await asyncio.gather(*[engine.generate(PROMPTS[i % 4], greedy(6), f"q{i}") for i in range(5)])

    results = asyncio.run(run())
    assert engine.batch_log == [("q0", "q1"), ("q2", "q3"), ("q4",)]
    for i, result in enumerate(results):
        expected = reference_greedy(ref, PROMPTS[i % 4], 6)
        assert result.token_ids == expected[: len(result.token_ids)]

    # A token budget splits batches too (cost = prompt + max_tokens per row).
    engine.max_batch_size, engine.max_batch_tokens = 64, 20
    asyncio.run(run())
    assert [len(b) for b in engine.batch_log[3:]] == [2, 1, 2]  # 11+8 | 15 | 7+11


def test_update_weights_changes_generation():
    old = tiny_qwen_tied(seed=0)
    engine = HFGenerationEngine(copy.deepcopy(old), dtype=torch.float32, attn_implementation="sdpa")
    new = tiny_qwen_tied(seed=1)
    params = {"temperature": 1.0, "max_tokens": 12, "logprobs": True, "seed": 5}
    before = asyncio.run(engine.generate(PROMPTS[2], params, "before"))

    # As verl sends them: HF checkpoint keys, fp64 here to exercise the cast, tied embedding under both names.
    sent = [(k, v.double()) for k, v in new.state_dict().items()]
    assert "lm_head.weight" in dict(sent)
    loaded = asyncio.run(engine.update_weights(sent))
    assert loaded == len(sent)
    after = asyncio.run(engine.generate(PROMPTS[2], params, "after"))
    assert (after.token_ids, after.log_probs) != (before.token_ids, before.log_probs)
    # The new weights are the ones in use: log-probs are the fresh model's, not the old one's.
    lp = torch.tensor(after.log_probs)
    torch.testing.assert_close(lp, recomputed_logprobs(new, PROMPTS[2], after.token_ids), atol=1e-4, rtol=0)
    assert not torch.allclose(lp, recomputed_logprobs(old, PROMPTS[2], after.token_ids), atol=1e-2)
    greedy_after = asyncio.run(engine.generate(PROMPTS[0], greedy(), "greedy")).token_ids
    assert greedy_after == reference_greedy(new, PROMPTS[0], 12)[: len(greedy_after)]
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    assert engine.model.lm_head.weight.dtype == torch.float32

    with pytest.raises(UnknownWeightError, match="model.layers.0.mlp.experts.0.up_proj.weight"):
        engine.load_weights([("model.layers.0.mlp.experts.0.up_proj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])


def test_tensor_parallel_rejected():
    with pytest.raises(IncompatibleRequestError) as err:
        HFGenerationEngine(tiny_llama(), tensor_parallel_size=2)
    message = str(err.value)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in message
    assert "set actor_rollout_ref.rollout.tensor_model_parallel_size=1" in message


def test_sleep_wake_up_round_trip(llama_pair):
    engine, _ = llama_pair

    async def run():
        first = await engine.generate(PROMPTS[2], greedy(), "1")
        await engine.sleep()
        assert engine.asleep
        await engine.wake_up()
        second = await engine.generate(PROMPTS[2], greedy(), "2")
        return first, second

    first, second = asyncio.run(run())
    assert first.token_ids == second.token_ids and not engine.asleep


def test_abort_all_answers_queued_requests(llama_pair):
    engine, _ = llama_pair

    async def run():
        tasks = [asyncio.create_task(engine.generate(p, greedy(), f"x{i}")) for i, p in enumerate(PROMPTS)]
        await asyncio.sleep(0)  # queued, batcher not yet run
        aborted = await engine.abort_all()
        return aborted, await asyncio.gather(*tasks)

    aborted, results = asyncio.run(run())
    assert set(aborted) == {"x0", "x1", "x2", "x3"}
    assert all(r.finish_reason == "abort" and r.token_ids == [] for r in results)


def test_sampling_params_parsing_and_max_tokens_rule():
    spec = SamplingSpec.from_vllm({"temperature": 0, "top_k": -1, "logprobs": 0, "max_new_tokens": 4})
    assert spec.greedy and spec.top_k == 0 and spec.logprobs and spec.max_tokens == 4
    assert not SamplingSpec.from_vllm({"logprobs": False}).logprobs
    assert not SamplingSpec.from_vllm({"logprobs": None}).logprobs
    with pytest.raises(ValueError, match="stop strings"):
        SamplingSpec.from_vllm({"stop": ["\n"]})
    # vLLM server default: min(response_length, prompt_length + response_length - len(prompt)), clamped.
    rule = dict(prompt_length=10, response_length=8, max_model_len=100)
    assert resolve_max_tokens({}, 4, **rule) == 8
    assert resolve_max_tokens({}, 15, **rule) == 3
    assert resolve_max_tokens({"max_tokens": 500}, 4, **rule) == 96
    with pytest.raises(ValueError, match="no room"):
        resolve_max_tokens({}, 100, **rule)
