"""HFGenerationEngine on a CUDA device: device placement, fp16, sleep frees device memory. Skipped without CUDA.

Runs without pytest too (``python tests/test_rollout_cuda.py``), for the GPU machine that lacks it.
"""

from __future__ import annotations

import asyncio
import copy

import torch

try:
    import pytest

    pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
except ImportError:  # the GPU machine runs this file as a script
    pytest = None

PROMPTS = [[5, 17, 42, 9, 100], [7, 8], [250, 3, 3, 61, 90, 12, 14, 200, 11]]


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


def test_cuda_greedy_sleep_wake_and_weight_sync():
    from verl_compat.rollout.engine import HFGenerationEngine

    model = _tiny_llama()
    ref = copy.deepcopy(model).to("cuda", torch.float16)
    engine = HFGenerationEngine(model, dtype=torch.float16, attn_implementation="sdpa", device="cuda")
    params = {"temperature": 0, "max_tokens": 12}

    async def batch(tag: str):
        return await asyncio.gather(*[engine.generate(p, params, f"{tag}{i}") for i, p in enumerate(PROMPTS)])

    first = asyncio.run(batch("a"))
    assert engine.batch_log[-1] == ("a0", "a1", "a2")
    out = ref.generate(torch.tensor([PROMPTS[0]], device="cuda"), do_sample=False, max_new_tokens=12, eos_token_id=2)
    expected = out[0, len(PROMPTS[0]) :].tolist()
    assert first[0].token_ids == expected[: len(first[0].token_ids)]

    torch.cuda.synchronize()
    awake_bytes = torch.cuda.memory_allocated()
    asyncio.run(engine.sleep())
    assert next(engine.model.parameters()).device.type == "cpu"
    assert torch.cuda.memory_allocated() < awake_bytes
    asyncio.run(engine.wake_up())
    assert next(engine.model.parameters()).device.type == "cuda"
    again = asyncio.run(batch("b"))
    assert [r.token_ids for r in again] == [r.token_ids for r in first]

    # Weight sync while asleep (verl: release, then resume weights, then update) from fp32 CPU tensors.
    new = _tiny_llama(seed=1)
    asyncio.run(engine.sleep())
    asyncio.run(engine.wake_up())
    asyncio.run(engine.update_weights(list(new.state_dict().items())))
    assert engine.model.model.norm.weight.dtype == torch.float16
    synced = asyncio.run(engine.generate(PROMPTS[0], {**params, "logprobs": True}, "c"))
    new_ref = new.to("cuda", torch.float16)
    prompt = torch.tensor([PROMPTS[0]], device="cuda")
    out = new_ref.generate(prompt, do_sample=False, max_new_tokens=12, eos_token_id=2)
    assert synced.token_ids == out[0, len(PROMPTS[0]) :].tolist()[: len(synced.token_ids)]
    assert len(synced.log_probs) == len(synced.token_ids)


if __name__ == "__main__":
    test_cuda_greedy_sleep_wake_and_weight_sync()
    print("cuda rollout engine test: OK")
