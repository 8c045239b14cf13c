"""The planner's estimate against memory measured on this CPU (torch's MemTracker: every live tensor by kind)
for a tiny Qwen2 running verl's own log-prob code: an update step (with and without gradient checkpointing) and
a no-grad log-prob + entropy pass. Tolerance: the estimate may exceed the measured peak by up to 25% and fall
short of it by at most 10%."""

from __future__ import annotations

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_compat.planner.estimate import Choice, trainer_phases
from verl_compat.planner.job import JobSpec
from verl_compat.planner.shape import ModelShape

SHAPES = {
    "mha-ish": dict(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),
    "gqa-big-vocab": dict(
        vocab_size=8192,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    ),
}
LOW, HIGH = 0.90, 1.25


def _peak(step, *tracked) -> int:
    tracker = MemTracker()
    tracker.track_external(*tracked)
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("gc", [False, True])
def test_estimate_matches_measured_peak(name, gc):
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    torch.manual_seed(0)
    fields = SHAPES[name]
    vocab = fields["vocab_size"]
    model = Qwen2ForCausalLM(Qwen2Config(**fields, attn_implementation="sdpa"))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    micro, seq = 3, 256
    ids = torch.randint(0, vocab, (micro, seq))
    labels = ids.roll(-1, 1).reshape(-1)

    def update():
        logits = model(input_ids=ids, use_cache=False).logits.reshape(-1, vocab)
        logprobs_from_logits(logits, labels).mean().neg().backward()
        optim.step()
        optim.zero_grad()

    def old_log_prob():
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits.reshape(-1, vocab)
            logprobs_from_logits(logits, labels)
            entropy_from_logits(logits)

    if gc:
        model.gradient_checkpointing_enable()
    update()  # steady state: AdamW's state exists, as in every update after the first
    measured_update = _peak(update, model, optim)
    model.gradient_checkpointing_disable()
    measured_fwd = _peak(old_log_prob, model, optim)

    job = JobSpec(
        actor=ModelShape.from_config(fields),
        critic=None,
        need_ref=False,
        card_bytes=2**34,
        device="cpu",
        prompt_len=seq // 2,
        response_len=seq - seq // 2,
        train_batch=micro,
        n=1,
        mini_batch=micro,
        critic_mini_batch=micro,
        on_gpu=False,
    )
    choice = Choice(micro, micro, micro, micro, micro, False, False, False, False, gc, False, micro)
    phases = {p.name: p.total for p in trainer_phases(job, choice)}
    assert LOW <= phases["update_actor"] / measured_update <= HIGH, (phases["update_actor"], measured_update)
    assert LOW <= phases["old_log_prob"] / measured_fwd <= HIGH, (phases["old_log_prob"], measured_fwd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("chunk", [128, 512])
def test_fused_head_estimate_matches_measured_transient(dtype, chunk):
    """verl's FusedLinearForPPO, the second micro-batch of an update (the weight's gradient already exists, as when
    verl accumulates), and a no-grad log-prob pass: the transient above inputs, weight and gradients against the
    estimate's chunk term."""
    from verl.utils.experimental.torch_functional import FusedLinearForPPO
    from verl_compat.planner.estimate import _fused_head_bytes

    torch.manual_seed(0)
    vocab, hidden, tokens = 8192, 256, 1024
    weight = torch.randn(vocab, hidden, dtype=dtype, requires_grad=True)
    hidden_states = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    head = FusedLinearForPPO(chunk_size=chunk)
    config = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": 1, "num_attention_heads": 4}
    shape = ModelShape.from_config({**config, "intermediate_size": 512})
    b, outputs = weight.element_size(), tokens * 4 * 2  # the fp32 log-prob and entropy outputs

    def micro_batch():
        log_probs, _ = head(hidden_states, weight, labels)
        log_probs.sum().backward()

    def forward_only():
        with torch.no_grad():
            head(hidden_states, weight, labels)

    micro_batch()  # the first: the gradients now exist
    peak = _peak(micro_batch, weight, hidden_states, weight.grad, hidden_states.grad)
    held = 2 * (weight.numel() + hidden_states.numel()) * b  # tensors and their gradients
    estimate = _fused_head_bytes(shape, tokens, b, True, False, chunk)
    assert LOW * (peak - held - outputs) <= estimate <= HIGH * (peak - held - outputs), (peak - held, estimate)
    peak = _peak(forward_only, weight, hidden_states, weight.grad, hidden_states.grad)
    estimate = _fused_head_bytes(shape, tokens, b, False, True, chunk)
    assert LOW * (peak - held - outputs) <= estimate <= HIGH * (peak - held - outputs), (peak - held, estimate)
