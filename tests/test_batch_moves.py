"""kernels.batch_moves: a micro-batch moved to the device with its non-tensor fields kept (verl_compat.batch_moves),
the same TensorDict as TensorDict.to gives; below sm_80 and on CPUs only (patch 0027)."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from verl_compat import batch_moves, seams
from verl_compat.catalog import get_profile
from verl_compat.policy import compose_ppo_config, decide


def _micro_batch(rows: int = 4) -> TensorDict:
    """The shape of the v1 trainer's micro-batches: nested token tensors, per-sample non-tensor fields, scalar
    metadata, a plain tensor and a nested TensorDict."""
    lengths = [3 + i for i in range(rows)]
    njt = torch.nested.as_nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)
    batch = TensorDict(
        {
            "input_ids": njt,
            "log_probs": torch.nested.as_nested_tensor([torch.rand(n) for n in lengths], layout=torch.jagged),
            "rm_scores": torch.rand(rows, 2),
            "raw_prompt": NonTensorStack(*[[{"role": "user", "content": f"q{i}"}] for i in range(rows)]),
            "uid": NonTensorStack(*[f"u{i}" for i in range(rows)]),
            "extra": TensorDict({"mask": torch.ones(rows, 3, dtype=torch.bool)}, batch_size=[rows]),
        },
        batch_size=[rows],
    )
    batch["temperature"] = NonTensorData(0.7)
    return batch


def _assert_same(got: TensorDict, want: TensorDict) -> None:
    assert type(got) is type(want) and got.batch_size == want.batch_size and got.device == want.device
    assert sorted(map(str, got.keys(include_nested=True))) == sorted(map(str, want.keys(include_nested=True)))
    for key in want.keys(include_nested=True, leaves_only=True):
        a, b = got.get(key), want.get(key)
        assert type(a) is type(b), key
        if isinstance(b, torch.Tensor) and b.is_nested:
            assert a.device == b.device and torch.equal(a.values(), b.values()), key
            assert torch.equal(a.offsets(), b.offsets()), key
        elif isinstance(b, torch.Tensor):
            assert a.device == b.device and torch.equal(a, b), key
        else:
            assert a == b, key


def test_the_same_batch_as_tensordict_to_with_non_tensors_shared():
    batch = _micro_batch()
    moved = batch_moves.to_device(batch, "cpu")
    _assert_same(moved, batch.to("cpu"))
    assert moved["raw_prompt"] == [[{"role": "user", "content": f"q{i}"}] for i in range(4)]
    assert moved["temperature"] == 0.7
    # kept, not rebuilt: the same NonTensorStack object, where TensorDict.to makes a new one
    assert moved._get_str("uid", None) is batch._get_str("uid", None)
    assert batch.to("cpu")._get_str("uid", None) is not batch._get_str("uid", None)


def test_names_kept_and_other_kinds_through_their_own_to():
    named = TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2], names=["rows"])
    assert batch_moves.to_device(named, "cpu").names == ["rows"]
    lazy = TensorDict.lazy_stack([TensorDict({"x": torch.zeros(3)}, []) for _ in range(2)])
    assert torch.equal(batch_moves.to_device(lazy, "cpu")["x"], torch.zeros(2, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_tensors_move_and_the_batch_says_so():
    batch = _micro_batch()
    moved = batch_moves.to_device(batch, torch.cuda.current_device())
    _assert_same(moved, batch.to(torch.cuda.current_device()))
    assert moved["input_ids"].is_cuda and moved["extra", "mask"].is_cuda


@pytest.mark.parametrize(("profile", "ours"), [("p40", True), ("t4", True), ("cpu", True), ("a100", False)])
def test_the_seam_moves_tensors_only_below_sm80(monkeypatch, profile, ours):
    calls = []
    monkeypatch.setattr(seams, "_profile", lambda: get_profile(profile))
    monkeypatch.setattr(batch_moves, "to_device", lambda b, d: calls.append(d) or b)
    batch = _micro_batch()
    seams.batch_to_device(batch, "cpu")
    assert calls == (["cpu"] if ours else [])
    decisions, _ = decide(compose_ppo_config([]), get_profile(profile), [])  # the doctor's record says the same
    assert decisions["kernels.batch_moves"].value == ("tensors" if ours else "tensordict")
    assert decisions["kernels.batch_moves"].identity is not ours


def test_verls_engine_asks_the_seam():
    """patch 0027: the FSDP engine's forward_step moves its micro-batch through the seam."""
    import inspect

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    source = inspect.getsource(FSDPEngineWithLMHead.forward_step)
    assert "verl_compat.seams.batch_to_device(micro_batch, get_device_id())" in source
    assert "micro_batch.to(" not in source
