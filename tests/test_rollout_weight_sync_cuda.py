"""Weight sync over CUDA IPC between two processes on one GPU, and the sleep that frees the rollout's weights.
Skipped without CUDA (runs on the GPU machine)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp

import pytest
import torch
from test_rollout_server import VERL_PARAMS, make_tiny_model_dir, recomputed_logprobs, rollout_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _serve(conn, model_dir: str) -> None:
    """The rollout server's process: answers (method, kwargs) calls from the pipe until None."""
    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.replica import RolloutMode
    from verl_compat.rollout.server import HFServer

    async def main():
        server = HFServer(
            rollout_config(load_format="dummy", free_cache_engine=True),
            HFModelConfig(path=model_dir),
            rollout_mode=RolloutMode.HYBRID,
            cuda_visible_devices="0",
        )
        await server.launch_server()
        while (message := await asyncio.to_thread(conn.recv)) is not None:
            method, kwargs = message
            try:
                if method == "memory":
                    result = {
                        "allocated": torch.cuda.memory_allocated(),
                        "weights_on_device": server._weight_bytes_on_device(),  # noqa: SLF001
                    }
                else:
                    result = await getattr(server, method)(**kwargs)
                conn.send(("ok", result))
            except Exception as exc:  # noqa: BLE001 - sent back to the test
                conn.send(("error", repr(exc)))

    asyncio.run(main())


async def _call(conn, method: str, **kwargs):
    conn.send((method, kwargs))
    status, result = await asyncio.to_thread(conn.recv)
    assert status == "ok", result
    return result


def test_cuda_ipc_sync_and_discarding_sleep(tmp_path):
    asyncio.run(_ipc_sync_and_discarding_sleep(tmp_path))  # plain asyncio: the GPU machine has no pytest-asyncio


async def _ipc_sync_and_discarding_sleep(tmp_path):
    from transformers import AutoModelForCausalLM

    from verl_compat.rollout.transfer import CUDA_IPC, BucketSender

    rollout_dir = make_tiny_model_dir(tmp_path / "rollout", seed=0)
    trained_dir = make_tiny_model_dir(tmp_path / "trained", seed=1)
    trained = AutoModelForCausalLM.from_pretrained(trained_dir, dtype=torch.float32).eval()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, str(rollout_dir)), daemon=True)
    proc.start()
    try:
        awake = await _call(parent, "memory")
        await _call(parent, "sleep")
        asleep = await _call(parent, "memory")
        assert asleep["weights_on_device"] == 0 and awake["weights_on_device"] > 0
        assert awake["allocated"] - asleep["allocated"] >= awake["weights_on_device"], "sleep freed the weights"
        await _call(parent, "wake_up", tags=["weights"])

        info = await _call(parent, "weight_sync_info")
        embed_bytes = trained.get_input_embeddings().weight.numel() * 4
        sender = BucketSender(embed_bytes // 2, max_total_numel=info["total_numel"])
        on_gpu = ((n, t.cuda()) for n, t in trained.state_dict().items())  # what the FSDP actor yields

        async def deliver(meta):
            return await _call(parent, "receive_bucket", meta=meta)

        async def finish():
            return await _call(parent, "finish_weight_sync")

        report = await sender.send(on_gpu, deliver, finish)
        received = report.received
        assert report.transport == CUDA_IPC and received["transports"] == [CUDA_IPC]
        assert report.buckets > 2 and report.direct >= 1, "the embedding is above the bucket: its own handle"
        assert received["weight_bytes_on_device"] == awake["weights_on_device"], "one copy of the weights"

        await _call(parent, "wake_up", tags=["kv_cache"])
        prompt = [5, 17, 42, 9]
        out = await _call(parent, "generate", prompt_ids=prompt, sampling_params=dict(VERL_PARAMS), request_id="g")
        expected = recomputed_logprobs(trained, prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)
    finally:
        parent.send(None)
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
