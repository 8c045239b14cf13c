"""HFReplica + HFServer actor + HFServerAdapter wired through a local Ray cluster (CPU, ~25 s)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch
from test_rollout_server import make_tiny_model_dir, recomputed_logprobs, rollout_config

ray = pytest.importorskip("ray")


@ray.remote
class _TrainerWorkerStub:
    """Stands in for a verl trainer worker: launch_servers only asks it where it runs."""

    def ping(self) -> bool:
        return True


async def test_replica_server_adapter_round_trip(local_ray, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from verl.workers.config import HFModelConfig
    from verl_compat.rollout.adapter import HFServerAdapter
    from verl_compat.rollout.replica import HFReplica

    model_dir = make_tiny_model_dir(tmp_path / "model", seed=0)
    trained_dir = make_tiny_model_dir(tmp_path / "trained", seed=1)  # "the actor after an update"
    config = rollout_config(load_format="dummy")
    model_config = HFModelConfig(path=str(model_dir))

    replica = HFReplica(replica_rank=0, config=config, model_config=model_config, gpus_per_node=1)
    assert replica.rollout_worker_use_gpu() in (True, False)
    await replica.init_hybrid(SimpleNamespace(workers=[_TrainerWorkerStub.remote()]))
    server = replica.server_handle
    assert replica.server_address == "hf_server_0_0"

    # Trainer side: rank 0 owns replica 0 and pushes the actor's weights (HF names, fp32) into the server.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("RAY_LOCAL_WORLD_SIZE", "1")
    adapter = HFServerAdapter(config=config, model_config=model_config, device_mesh=None)
    trained = AutoModelForCausalLM.from_pretrained(trained_dir, dtype=torch.float32).eval()
    await adapter.release()
    await adapter.resume(tags=["weights"])
    # The tensors travel through a shared-memory bucket; only metadata goes through Ray (no object store).
    monkeypatch.setattr(ray, "put", lambda *a, **k: pytest.fail("weight sync must not use Ray's object store"))
    await adapter.update_weights(iter(trained.state_dict().items()), global_steps=4)
    assert adapter.last_sync.transport == "shared_memory" and adapter.last_sync.tensors == len(trained.state_dict())
    monkeypatch.undo()
    await adapter.resume(tags=["kv_cache"])

    prompts = [[5, 17, 42, 9], [7, 8], [250, 3, 61, 90, 12]]
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    outputs = await asyncio.gather(
        *[
            server.generate.remote(request_id=f"r{i}", prompt_ids=p, sampling_params=dict(params), image_data=None)
            for i, p in enumerate(prompts)
        ]
    )
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.stop_reason == "completed" and out.extra_fields["global_steps"] == 4
        expected = recomputed_logprobs(trained, prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)
    batches = await server.get_batch_log.remote()
    # The three concurrent calls were batched (the server waits a few ms for a burst to land).
    assert sorted(r for batch in batches for r in batch) == ["r0", "r1", "r2"]
    assert max(len(batch) for batch in batches) >= 2

    await replica.abort_all_requests()
    await replica.resume_generation()
    await replica.sleep()
    await replica.wake_up()
    await replica.clear_kv_cache()


def _job_config(model_dir, **rollout):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}, "nnodes": 1, "n_gpus_per_node": 1},
            "actor_rollout_ref": {
                "hybrid_engine": True,
                "model": {"path": str(model_dir), "trust_remote_code": False},
                "rollout": {"name": "hf", "tensor_model_parallel_size": 1, "max_num_seqs": 1024, **rollout},
            },
        }
    )


async def test_prestarted_server_is_adopted(local_ray, tmp_path):
    """The driver's early server process (prestart_servers) is the one the replica serves from."""
    from verl_compat.rollout.prestart import prestart_servers
    from verl_compat.rollout.replica import HFReplica

    model_dir = make_tiny_model_dir(tmp_path / "model", seed=0)
    for _ in range(100):  # an earlier test's server of the same name must be gone
        try:
            ray.kill(ray.get_actor("hf_server_0_0"))
        except ValueError:
            break
        await asyncio.sleep(0.1)
    assert prestart_servers(_job_config(model_dir)) == ["hf_server_0_0"]
    early = ray.get_actor("hf_server_0_0")
    assert not await early.__ray_call__.remote(lambda server: server.configured)
    await early.warm.remote()  # returns once the driver's warm-up imports are done
    warmed = await early.__ray_call__.remote(lambda s: "verl.workers.engine_workers" in __import__("sys").modules)
    assert warmed  # what configure's arguments import arrives imported

    # verl's LLMServerManager hands the replica the job's model section (config.actor_rollout_ref.model)
    model_section = _job_config(model_dir).actor_rollout_ref.model
    replica = HFReplica(replica_rank=0, config=rollout_config(load_format="dummy"), model_config=model_section,
                        gpus_per_node=1)  # fmt: skip
    await replica.init_hybrid(SimpleNamespace(workers=[_TrainerWorkerStub.remote()]))
    server = replica.server_handle
    assert server._actor_id == early._actor_id  # adopted, not a second process
    assert await server.__ray_call__.remote(lambda s: s.configured)
    assert await server.__ray_call__.remote(lambda s: s.model_config_from_warm)  # warm's build, not a second one
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out = await server.generate.remote(request_id="a", prompt_ids=[5, 17, 42], sampling_params=params)
    assert out.stop_reason == "completed" and len(out.token_ids) > 0
    ray.kill(server)


def test_prestart_only_where_the_replica_adopts(tmp_path):
    from verl_compat.rollout.prestart import server_names

    assert server_names(_job_config(tmp_path)) == ["hf_server_0_0"]
    two = _job_config(tmp_path)
    two.trainer.n_gpus_per_node = 4
    two.actor_rollout_ref.rollout.tensor_model_parallel_size = 2
    assert server_names(two) == ["hf_server_0_0", "hf_server_1_0"]
    for change in (
        {"actor_rollout_ref": {"rollout": {"name": "vllm"}}},
        {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"hf": {"prestart": False}}}}},
        {"trainer": {"v1": {"trainer_mode": "separate_async"}}},
        {"trainer": {"use_v1": False}},
        {"trainer": {"nnodes": 2}},
        {"actor_rollout_ref": {"hybrid_engine": False}},
    ):
        from omegaconf import OmegaConf

        assert server_names(OmegaConf.merge(_job_config(tmp_path), change)) == [], change
