"""HFServer / HFServerAdapter / registration without Ray: the methods verl calls, in-process.

Also holds the tiny offline model folder helpers that test_rollout_ray.py reuses."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest
import torch
from tiny_configs import EOS, VOCAB, tiny_config

from verl_compat.errors import IncompatibleRequestError


def make_tiny_model_dir(path: Path, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {"<pad>": 0, "<s>": 1, "</s>": EOS, **{f"t{i}": i for i in range(3, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>"
    )
    config = tiny_config(Qwen2Config, tie_word_embeddings=True, max_position_embeddings=256)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def rollout_config(**overrides):
    from verl.workers.config import RolloutConfig

    values = dict(
        name="hf",
        mode="async",
        tensor_model_parallel_size=1,
        prompt_length=16,
        response_length=8,
        dtype="float32",
        load_format="auto",
        calculate_log_probs=True,
    )
    values.update(overrides)
    return RolloutConfig(**values)


def recomputed_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return lp.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


VERL_PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture(scope="module")
def model_config(model_dir):
    from verl.workers.config import HFModelConfig

    return HFModelConfig(path=str(model_dir))


async def test_server_generate_gate_and_weights(model_dir, model_config):
    from transformers import AutoModelForCausalLM

    from verl.workers.rollout.replica import TokenOutput
    from verl_compat.rollout.server import HFServer

    server = HFServer(rollout_config(), model_config)
    await server.launch_server()
    assert server.engine.eos_token_ids == (2,) and server.engine.model.dtype == torch.float32

    prompt = [5, 17, 42, 9]
    out = await server.generate(prompt_ids=prompt, sampling_params=dict(VERL_PARAMS, seed=1), request_id="a")
    assert isinstance(out, TokenOutput) and out.stop_reason == "completed"
    # No max_tokens in the request: vLLM's rule gives min(response_length, prompt_length + response_length - 4) = 8
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = recomputed_logprobs(reference, prompt, out.token_ids)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)

    await server.set_global_steps(3)
    out = await server.generate(prompt, {"temperature": 0, "max_tokens": 3}, "b")
    assert out.extra_fields["global_steps"] == 3 and out.log_probs is None and len(out.token_ids) <= 3

    # Gate: a rejecting abort answers new requests "aborted"; a plain abort parks them until resume.
    await server.abort_all_requests(reject_request=True)
    assert (await server.generate(prompt, {}, "c")).stop_reason == "aborted"
    await server.abort_all_requests()
    parked = asyncio.create_task(server.generate(prompt, {"max_tokens": 2}, "d"))
    await asyncio.sleep(0.05)
    assert not parked.done()
    await server.resume_generation()
    assert (await parked).stop_reason == "completed"

    # Memory / cache / profile hooks the replica fans out.
    for method in ("sleep", "clear_kv_cache", "release_kv_cache", "resume_kv_cache", "start_profile", "stop_profile"):
        await getattr(server, method)()
    await server.wake_up(tags=["weights"])
    await server.wake_up(tags=["kv_cache"])
    await server.wait_for_requests_to_drain()

    # Weight sync bucket as the adapter sends it.
    zeros = [(n, torch.zeros_like(t)) for n, t in reference.state_dict().items() if n.endswith("norm.weight")]
    assert await server.load_weights(zeros) == len(zeros)
    synced = [t for n, t in server.engine.model.state_dict().items() if n.endswith("norm.weight")]
    assert all(float(t.abs().sum()) == 0 for t in synced)


async def test_dummy_load_format_then_weight_sync(model_dir, model_config):
    from transformers import AutoModelForCausalLM

    from verl_compat.rollout.server import HFServer

    server = HFServer(rollout_config(load_format="dummy"), model_config)
    await server.launch_server()
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    await server.load_weights(list(reference.state_dict().items()))
    prompt = [7, 8, 9]
    out = await server.generate(prompt, {"temperature": 0, "max_tokens": 6}, "g")
    expected = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6, eos_token_id=2)
    assert out.token_ids == expected[0, len(prompt) :].tolist()[: len(out.token_ids)]


def test_warm_model_config_taken_only_for_the_same_section(model_dir):
    """A prestarted server builds the model config in warm; configure takes it only for an identical section."""
    from omegaconf import OmegaConf

    from verl_compat.rollout.server import HFServer

    section = OmegaConf.create({"path": str(model_dir), "trust_remote_code": False})
    server = HFServer()
    server.warm(section)
    warm_built = server._prebuilt.value
    server.configure(rollout_config(), OmegaConf.create({"path": str(model_dir), "trust_remote_code": False}))
    assert server.model_config_from_warm and server.model_config is warm_built

    other = HFServer()
    other.warm(section)
    other_built = other._prebuilt.value
    changed = OmegaConf.create({"path": str(model_dir), "trust_remote_code": False, "use_shm": False})
    other.configure(rollout_config(), changed)  # the driver's section changed after prestart: built again
    assert not other.model_config_from_warm and other.model_config is not other_built
    assert other.model_config.local_path == warm_built.local_path

    broken = HFServer()
    broken.warm(OmegaConf.create({"path": str(model_dir / "missing")}))  # reported by configure, not by warm
    assert "_prebuilt" not in broken.__dict__


def test_tensor_parallel_rejected_by_server_and_adapter(model_config, monkeypatch):
    from verl_compat.rollout.adapter import HFServerAdapter
    from verl_compat.rollout.server import HFServer

    with pytest.raises(IncompatibleRequestError, match="tensor_model_parallel_size=1"):
        HFServer(rollout_config(tensor_model_parallel_size=2), model_config)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(IncompatibleRequestError, match="tensor_model_parallel_size=1"):
        HFServerAdapter(rollout_config(tensor_model_parallel_size=2), model_config, device_mesh=None)


async def test_adapter_rank_arithmetic(model_config, monkeypatch):
    from verl_compat.rollout.adapter import HFServerAdapter
    from verl_compat.rollout.transfer import BucketSender

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("RAY_LOCAL_WORLD_SIZE", "4")
    adapter = HFServerAdapter(config=rollout_config(), model_config=model_config, device_mesh=None)
    assert (adapter.replica_rank, adapter.rollout_rank, adapter.node_rank) == (3, 0, 0)
    assert adapter.is_leader_rank and adapter.sleep_level == 1
    adapter.sleep_level = 2  # engine_workers assigns it

    tensors = [(f"w{i}", torch.ones(256)) for i in range(5)]  # 1 KiB each
    sizes = []

    async def deliver(meta):
        sizes.append(len(meta["tensors"]))

    report = await BucketSender(bucket_bytes=2048).send(iter(tensors), deliver)
    assert sizes == [2, 2, 1] and report.buckets == 3 and report.bytes == 5 * 1024


def test_registration_is_idempotent(monkeypatch):
    from verl.workers.rollout import base, replica
    from verl_compat.rollout import ADAPTER_FQN, register_adapters, register_replicas
    from verl_compat.rollout.replica import HFReplica

    registry = dict(base._ROLLOUT_REGISTRY)
    register_adapters(registry)
    register_adapters(registry)
    assert registry[("hf", "async")] == ADAPTER_FQN
    module, cls = ADAPTER_FQN.rsplit(".", 1)
    assert issubclass(getattr(importlib.import_module(module), cls), base.BaseRollout)

    monkeypatch.setattr(replica.RolloutReplicaRegistry, "_registry", dict(replica.RolloutReplicaRegistry._registry))
    register_replicas(replica.RolloutReplicaRegistry)
    register_replicas(replica.RolloutReplicaRegistry)
    assert replica.RolloutReplicaRegistry.get("hf") is HFReplica
