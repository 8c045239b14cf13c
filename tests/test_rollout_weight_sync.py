"""Weight sync trainer -> hf rollout server through shared memory (rollout/transfer.py), in-process on a CPU, and
the sleep that discards the weights (rollout/weights.py ParameterStorage). Seconds each."""

from __future__ import annotations

import os

import pytest
import torch
from test_rollout_server import VERL_PARAMS, make_tiny_model_dir, recomputed_logprobs, rollout_config

from verl_compat.rollout import transfer
from verl_compat.rollout.transfer import SHARED_MEMORY, BucketSender
from verl_compat.rollout.weights import UnknownWeightError


def _our_segments() -> set[str]:
    shm = transfer.SHM_DIR
    return {n for n in os.listdir(shm) if n.startswith(transfer.SEGMENT_PREFIX)} if shm.is_dir() else set()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sync")
    return make_tiny_model_dir(root / "rollout", seed=0), make_tiny_model_dir(root / "trained", seed=1)


async def _server(model_dir, **overrides):
    from verl.workers.config import HFModelConfig
    from verl_compat.rollout.server import HFServer

    server = HFServer(rollout_config(**overrides), HFModelConfig(path=str(model_dir)))
    await server.launch_server()
    return server


def _trained(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


async def _sync(server, model, bucket_bytes: int):
    info = await server.weight_sync_info()
    sender = BucketSender(bucket_bytes, max_total_numel=info["total_numel"])
    report = await sender.send(iter(model.state_dict().items()), server.receive_bucket, server.finish_weight_sync)
    return report, report.received


async def test_shared_memory_sync_arrives_equal(dirs, monkeypatch):
    import ray

    def no_object_store(*args, **kwargs):
        raise AssertionError("weight sync must not go through Ray's object store")

    monkeypatch.setattr(ray, "put", no_object_store)
    rollout_dir, trained_dir = dirs
    server = await _server(rollout_dir)
    trained = _trained(trained_dir)
    before = _our_segments()
    # A small bucket: several buckets, and the embedding (above the bucket) in a segment of its own.
    embed_bytes = trained.get_input_embeddings().weight.numel() * 4
    report, received = await _sync(server, trained, bucket_bytes=embed_bytes // 2)
    assert report.transport == SHARED_MEMORY and received["transports"] == [SHARED_MEMORY]
    assert report.buckets > 2 and report.direct >= 1
    assert report.tensors == len(trained.state_dict()) == received["tensors"]
    for name, tensor in server.engine.model.state_dict().items():
        torch.testing.assert_close(tensor, trained.state_dict()[name], atol=0, rtol=0)
    assert _our_segments() == before, "every shared-memory segment is unlinked after the sync"

    prompt = [5, 17, 42, 9]
    out = await server.generate(prompt, dict(VERL_PARAMS, seed=3), "after-sync")
    expected = recomputed_logprobs(trained, prompt, out.token_ids)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)


async def test_unknown_weight_name_refused_and_segments_freed(dirs):
    rollout_dir, trained_dir = dirs
    server = await _server(rollout_dir)
    before_values = {n: t.clone() for n, t in server.engine.model.state_dict().items()}
    bad = [("model.layers.0.mlp.not_a_weight", torch.ones(4, 4))]
    sender = BucketSender(1 << 20)
    existing = _our_segments()  # another process's (a run killed mid-sync leaves its segments) are not ours
    with pytest.raises(UnknownWeightError, match="not_a_weight"):
        await sender.send(iter(bad), server.receive_bucket)
    assert server._receiver is None  # noqa: SLF001 - the failed sync's segments were closed
    assert _our_segments() == existing
    for name, tensor in server.engine.model.state_dict().items():
        assert torch.equal(tensor, before_values[name])
    # the next sync works
    report, _ = await _sync(server, _trained(trained_dir), bucket_bytes=1 << 20)
    assert report.transport == SHARED_MEMORY


async def test_discarding_sleep_then_wake_and_sync(dirs, monkeypatch):
    """The accelerator path of sleep (free the weights, no host copy) exercised on CPU tensors."""
    from verl.workers.rollout.replica import RolloutMode
    from verl_compat.rollout.server import HFServer

    rollout_dir, trained_dir = dirs
    server = await _server(rollout_dir, free_cache_engine=True)
    server.rollout_mode = RolloutMode.HYBRID
    monkeypatch.setattr(HFServer, "_discards_weights", lambda self: True)
    trained = _trained(trained_dir)
    weight_bytes = sum(p.numel() * 4 for p in server.engine.model.parameters())

    await server.sleep()
    assert sum(p.numel() for p in server.engine.model.parameters()) == 0, "sleep freed every weight"
    await server.wake_up(tags=["weights"])
    assert sum(p.numel() * 4 for p in server.engine.model.parameters()) == weight_bytes
    with pytest.raises(RuntimeError, match="before a weight sync refilled them"):
        await server.generate([5, 6], {"max_tokens": 2}, "too-early")

    # A sync that leaves tensors out is refused at its end, naming them.
    partial = [(n, t) for n, t in trained.state_dict().items() if "layers.0." in n]
    sender = BucketSender(1 << 20)
    await sender.send(iter(partial), server.receive_bucket)
    with pytest.raises(RuntimeError, match="did not send"):
        await server.finish_weight_sync()

    await _sync(server, trained, bucket_bytes=1 << 20)
    await server.wake_up(tags=["kv_cache"])
    prompt = [7, 8, 9, 10]
    out = await server.generate(prompt, dict(VERL_PARAMS, seed=5), "after-wake")
    expected = recomputed_logprobs(trained, prompt, out.token_ids)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)
    # tied embeddings stay one tensor through release/allocate
    model = server.engine.model
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight


async def test_cpu_server_keeps_weights_when_asleep(dirs):
    """On a CPU there is no card to free: sleep keeps the weights and needs no sync afterwards."""
    from verl.workers.rollout.replica import RolloutMode

    server = await _server(dirs[0], free_cache_engine=True)
    server.rollout_mode = RolloutMode.HYBRID
    await server.sleep()
    await server.wake_up(tags=["weights"])
    out = await server.generate([5, 6, 7], {"temperature": 0, "max_tokens": 2}, "cpu")
    assert out.stop_reason == "completed"


@pytest.mark.parametrize(("mode", "device", "discards"), [("HYBRID", "cuda", True), ("COLOCATED", "cuda", False),
                                                          ("HYBRID", "cpu", False)])  # fmt: skip
def test_only_a_trainer_refilled_accelerator_server_discards(mode, device, discards, dirs):
    """A colocated server (reward model: nobody syncs it) keeps its weights; so does any CPU server."""
    from types import SimpleNamespace

    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.replica import RolloutMode
    from verl_compat.rollout.server import HFServer

    server = HFServer(rollout_config(), HFModelConfig(path=str(dirs[0])), rollout_mode=RolloutMode[mode])
    server.engine = SimpleNamespace(device=torch.device(device))
    assert server._discards_weights() is discards  # noqa: SLF001
