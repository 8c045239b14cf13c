"""Continuous batching, prefix sharing, abort, sleep/wake and per-row sampling of the hf engine on CPU (eager path,
same scheduler as CUDA). Asserted on the engine's batch log and event log, never on time."""

from __future__ import annotations

import asyncio
import copy

import torch
from test_rollout_engine import PROMPTS, recomputed_logprobs, tiny_llama, tiny_qwen_tied
from transformers import GenerationConfig

from verl_compat.rollout.engine import HFGenerationEngine


def full(n: int, **extra) -> dict:
    """Greedy, EOS ignored: the row runs exactly n tokens."""
    return {"temperature": 0, "max_tokens": n, "ignore_eos": True, **extra}


def reference(model, prompt: list[int], n: int, **kwargs) -> list[int]:
    ref = copy.deepcopy(model)
    ref.generation_config = GenerationConfig(pad_token_id=0, eos_token_id=None)
    out = ref.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, **kwargs)
    return out[0, len(prompt) :].tolist()


def engine_for(model, **kwargs) -> HFGenerationEngine:
    return HFGenerationEngine(copy.deepcopy(model), dtype=torch.float32, **kwargs)


def finish_step(engine, rid: str) -> int:
    return next(step for step, kind, r, _ in engine.events if kind == "finish" and r == rid)


def admit(engine, rid: str) -> tuple[int, int]:
    return next((step, slot) for step, kind, r, slot in engine.events if kind == "admit" and r == rid)


def test_short_request_returns_while_long_runs_and_its_slot_is_refilled():
    model = tiny_llama()
    engine = engine_for(model, max_batch_size=2, stop_check_interval=2)
    assert engine.enforce_eager and not engine.scheduler.use_graphs  # CPU: eager, whatever was asked

    async def run():
        long = asyncio.create_task(engine.generate(PROMPTS[0], full(200), "long"))
        short = asyncio.create_task(engine.generate(PROMPTS[1], full(3), "short"))
        third = asyncio.create_task(engine.generate(PROMPTS[2], full(5), "third"))  # no free slot yet
        s = await short
        t = await third
        assert not long.done()  # both returned while the long one is still decoding
        return s, t, await long

    s, t, long = asyncio.run(run())
    assert engine.batch_log == [("long", "short"), ("third",)]
    assert admit(engine, "third")[1] == admit(engine, "short")[1]  # the freed slot took the waiting request
    assert finish_step(engine, "short") <= admit(engine, "third")[0] < finish_step(engine, "long")
    assert finish_step(engine, "third") < finish_step(engine, "long")
    assert engine.scheduler.runs[-1]["requests"] == 3 and engine.scheduler.runs[-1]["steps"] >= 199
    for prompt, result, n in ((PROMPTS[1], s, 3), (PROMPTS[2], t, 5), (PROMPTS[0], long, 200)):
        assert result.token_ids == reference(model, prompt, n) and result.finish_reason == "length"


def test_rows_are_compacted_into_low_slots():
    model = tiny_llama()
    engine = engine_for(model, max_batch_size=4, stop_check_interval=1)
    jobs = [("a", PROMPTS[1], 2), ("b", PROMPTS[2], 2), ("c", PROMPTS[3], 2), ("long", PROMPTS[0], 30)]

    async def run():
        return await asyncio.gather(*[engine.generate(p, full(n), rid) for rid, p, n in jobs])

    results = asyncio.run(run())
    assert admit(engine, "long")[1] == 3
    assert engine.scheduler.cache.slots == 4
    for (_, prompt, n), result in zip(jobs, results, strict=True):
        assert result.token_ids == reference(model, prompt, n)


def test_one_batch_per_step_and_prefix_sharing():
    """GRPO: 3 prompts x n=4 samples all run in one batch; each prompt is prefilled once and its KV copied."""
    model = tiny_qwen_tied()
    engine = engine_for(model)
    sampled = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "logprobs": True}
    jobs = [(f"p{p}s{s}", PROMPTS[p], {**sampled, "seed": 10 * p + s}) for p in range(3) for s in range(4)]
    jobs += [("g0", PROMPTS[0], full(12)), ("g1", PROMPTS[0], full(12))]

    async def run():
        return await asyncio.gather(*[engine.generate(p, params, rid) for rid, p, params in jobs])

    results = asyncio.run(run())
    assert engine.batch_log == [tuple(rid for rid, _, _ in jobs)]
    assert engine.scheduler.prefill_rows == 3  # not 14
    for (_, prompt, _), result in zip(jobs[:12], results[:12], strict=True):
        expected = recomputed_logprobs(model, prompt, result.token_ids)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)
    assert len({tuple(r.token_ids) for r in results[:4]}) > 1  # different seeds, different samples
    assert results[12].token_ids == results[13].token_ids == reference(model, PROMPTS[0], 12)


def test_abort_mid_batch_returns_partial_results_then_serves_again():
    model = tiny_llama()
    engine = engine_for(model, max_batch_size=1, stop_check_interval=1)

    async def run():
        long = asyncio.create_task(engine.generate(PROMPTS[0], full(400), "long"))
        queued = asyncio.create_task(engine.generate(PROMPTS[1], full(5), "queued"))
        while engine.scheduler.steps < 5:
            await asyncio.sleep(0.005)
        aborted = await engine.abort_all()
        partial, dropped = await long, await queued
        after = await engine.generate(PROMPTS[1], full(5), "after")
        return aborted, partial, dropped, after

    aborted, partial, dropped, after = asyncio.run(run())
    assert set(aborted) == {"long", "queued"}
    assert partial.finish_reason == "abort" and 5 <= len(partial.token_ids) < 400
    assert partial.token_ids == reference(model, PROMPTS[0], len(partial.token_ids))
    assert dropped.finish_reason == "abort" and dropped.token_ids == []
    assert after.finish_reason == "length" and after.token_ids == reference(model, PROMPTS[1], 5)
    assert engine.num_pending == 0


def test_sleep_frees_the_kv_cache_and_wake_restores_it():
    engine = engine_for(tiny_llama())

    async def run():
        first = await engine.generate(PROMPTS[2], full(10), "1")
        assert engine.scheduler.cache is not None
        await engine.sleep()
        assert engine.scheduler.cache is None and engine.scheduler.state is None and engine.scheduler.runner is None
        await engine.wake_up()
        second = await engine.generate(PROMPTS[2], full(10), "2")
        assert engine.scheduler.cache is not None
        return first, second

    first, second = asyncio.run(run())
    assert first.token_ids == second.token_ids


def test_per_row_sampling_params_in_one_batch():
    model = tiny_llama()
    engine = engine_for(model)
    prompt = PROMPTS[2]
    sample = {"temperature": 1.0, "max_tokens": 10, "logprobs": True, "ignore_eos": True}
    jobs = {
        "greedy": full(10, logprobs=True),
        "top_k_1": {**sample, "top_k": 1, "seed": 1},
        "top_p_tiny": {**sample, "top_p": 1e-6, "seed": 2},
        "t07": {**sample, "temperature": 0.7, "seed": 3},
        "rep": full(10, repetition_penalty=1.5),
        "short": full(3),
    }

    async def run():
        return await asyncio.gather(*[engine.generate(prompt, params, rid) for rid, params in jobs.items()])

    r = dict(zip(jobs, asyncio.run(run()), strict=True))
    assert engine.batch_log == [tuple(jobs)]
    expected = reference(model, prompt, 10)
    assert r["greedy"].token_ids == r["top_k_1"].token_ids == r["top_p_tiny"].token_ids == expected
    torch.testing.assert_close(torch.tensor(r["greedy"].log_probs), recomputed_logprobs(model, prompt, expected))
    assert r["top_k_1"].log_probs == [0.0] * 10 and r["top_p_tiny"].log_probs == [0.0] * 10
    lp = recomputed_logprobs(model, prompt, r["t07"].token_ids, temperature=0.7)
    torch.testing.assert_close(torch.tensor(r["t07"].log_probs), lp, atol=1e-4, rtol=0)
    assert r["rep"].token_ids == reference(model, prompt, 10, repetition_penalty=1.5)
    assert r["rep"].log_probs is None and len(r["short"].token_ids) == 3


def test_fast_decode_matches_the_models_own_forward():
    """The few-kernel Llama/Qwen2 decode step against the HF forward through the same slot cache."""
    sampled = {"temperature": 0.8, "max_tokens": 16, "logprobs": True, "ignore_eos": True}
    for model in (tiny_llama(), tiny_qwen_tied()):
        fast, slow = engine_for(model), engine_for(model)
        slow.scheduler.fast_decode = False
        jobs = [(f"s{i}", p, {**sampled, "seed": i}) for i, p in enumerate(PROMPTS)]

        async def run(engine, jobs=jobs):
            return await asyncio.gather(*[engine.generate(p, params, rid) for rid, p, params in jobs])

        a, b = asyncio.run(run(fast)), asyncio.run(run(slow))
        assert fast.scheduler.runner.fast is not None and slow.scheduler.runner.fast is None
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(torch.tensor(x.log_probs), torch.tensor(y.log_probs), atol=1e-5, rtol=0)


def test_other_architectures_use_their_own_forward():
    from tiny_configs import tiny_config
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(tiny_config(MistralConfig, sliding_window=None)).eval()
    engine = engine_for(model)
    result = asyncio.run(engine.generate(PROMPTS[0], full(12), "m"))
    assert engine.scheduler.runner.fast is None
    assert result.token_ids == reference(model, PROMPTS[0], 12)


def test_models_without_full_attention_are_refused_at_start_up():
    import pytest
    from tiny_configs import tiny_config
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_compat.errors import IncompatibleRequestError

    model = Qwen2ForCausalLM(tiny_config(Qwen2Config, use_sliding_window=True, sliding_window=4, max_window_layers=0))
    with pytest.raises(IncompatibleRequestError, match="actor_rollout_ref.rollout.name='hf'.*sliding_attention"):
        HFGenerationEngine(model)


def test_kv_cache_takes_only_the_slots_the_workload_needs():
    engine = engine_for(tiny_llama())  # max_batch_size 256

    async def burst(n: int, tag: str, max_tokens: int = 4):
        return await asyncio.gather(*[engine.generate(PROMPTS[i % 4], full(max_tokens), f"{tag}{i}") for i in range(n)])

    asyncio.run(burst(3, "a"))
    assert engine.scheduler.cache.slots == 4 and engine.scheduler.cache.max_len == 128
    asyncio.run(burst(2, "b"))
    assert engine.scheduler.cache.slots == 4  # kept: it never shrinks
    asyncio.run(burst(9, "c", max_tokens=130))
    assert engine.scheduler.cache.slots == 16 and engine.scheduler.cache.max_len == 256  # grown while idle
    assert engine.batch_log[-1] == tuple(f"c{i}" for i in range(9))


LATER = (130, 40, 41)  # the first needs a longer cache than the running row's


def test_cache_grows_mid_run_for_requests_that_arrive_later():
    """A lone first request must not cap the batch: later arrivals grow the cache (running rows copied over)."""
    model = tiny_llama()
    engine = engine_for(model, stop_check_interval=2)

    async def run():
        first = asyncio.create_task(engine.generate(PROMPTS[0], full(100), "first"))
        while engine.scheduler.steps < 4:
            await asyncio.sleep(0.002)
        assert engine.scheduler.cache.slots == 1
        later = [engine.generate(PROMPTS[1 + i], full(LATER[i]), f"later{i}") for i in range(3)]
        return await asyncio.gather(first, *later)

    results = asyncio.run(run())
    assert engine.scheduler.cache.slots == 4 and engine.scheduler.cache.max_len == 256  # both dims grew
    assert engine.batch_log == [("first",), ("later0", "later1", "later2")]
    assert all(admit(engine, f"later{i}")[0] < finish_step(engine, "first") for i in range(3))
    expected = [reference(model, PROMPTS[0], 100)] + [reference(model, PROMPTS[1 + i], LATER[i]) for i in range(3)]
    assert [r.token_ids for r in results] == expected


def test_first_batch_waits_for_a_burst_that_is_still_arriving():
    """Requests 30 ms apart with a 50 ms window: one window would batch the first two and leave the third to
    join later (a cache growth and its graphs, a prefill inside the decode); the window extends while requests
    keep arriving, so all three start together. Asserted on the batch log and the scheduler's counters."""
    engine = engine_for(tiny_llama(), batch_window_s=0.05)

    async def staggered():
        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(engine.generate(PROMPTS[i], full(4), f"r{i}")))
            await asyncio.sleep(0.03)
        return await asyncio.gather(*tasks)

    asyncio.run(staggered())
    assert engine.batch_log == [("r0", "r1", "r2")]
    counters = engine.scheduler.counters()
    assert counters["admission_rounds"] == 1 and counters["allocations"] == 1 and counters["decode_steps"] >= 3
    assert counters["captures"] == 0  # CPU: eager decode, no graphs
