"""The hf rollout server's memory over many PPO-step cycles, two processes on one GPU as in verl's loop.

Round I's in-loop runs showed the asleep rollout process growing by 34 MiB per step in nvidia-smi (850 -> 986 MiB
over five steps, every setting, fp32 and fp16) while torch's allocator held nothing: memory outside the caching
allocator, which over a 300-step run would add about 10 GiB to a 24 GB card. This reproduces the cycle without
Ray or the trainer: a "trainer" process holds Qwen2.5-0.5B-shaped weights on the GPU and, per cycle, wakes the
server's weights, sends them over CUDA IPC (BucketSender, as the hf replica's sync does), wakes the KV cache,
generates one batch, and puts the server to sleep. After each sleep it records the server's nvidia-smi memory and
torch's allocated/reserved there.

Variants, each with its own server process: ``graphs`` (CUDA-graph decode, the default) and ``eager``
(``enforce_eager``), so a growth that only one shows names its cause. Reports the asleep memory per cycle and the
growth per cycle over the second half (the first cycles load kernels).

    VERL_COMPAT_DEVICE=p40 python benchmarks/rollout_memory_cycles.py --cycles 12 --out rollout_memory_cycles.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def nvidia_smi_mib(pid: int) -> int | None:
    """The process's memory on the GPU as nvidia-smi reports it; None without one."""
    import ppo_job

    try:
        return ppo_job.per_process_mib().get(pid)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _serve(conn, model_dir: str, eager: bool, prompt_len: int, response_len: int) -> None:
    """The server's process: answers (method, kwargs) from the pipe until None."""
    import torch

    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode
    from verl_compat.rollout.server import HFServer

    async def main():
        config = RolloutConfig(
            name="hf",
            mode="async",
            tensor_model_parallel_size=1,
            prompt_length=prompt_len,
            response_length=response_len,
            dtype="float32",
            load_format="dummy",
            calculate_log_probs=True,
            free_cache_engine=True,
            enforce_eager=eager,
        )
        server = HFServer(
            config, HFModelConfig(path=model_dir), rollout_mode=RolloutMode.HYBRID, cuda_visible_devices="0"
        )
        await server.launch_server()
        while (message := await asyncio.to_thread(conn.recv)) is not None:
            method, kwargs = message
            try:
                if method == "memory":
                    result = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
                elif method == "generate_batch":
                    prompts = kwargs["prompts"]
                    outs = await asyncio.gather(
                        *(
                            server.generate(prompt_ids=p, sampling_params=dict(PARAMS), request_id=f"r{i}")
                            for i, p in enumerate(prompts)
                        )
                    )
                    result = sum(len(o.token_ids) for o in outs)
                else:
                    result = await getattr(server, method)(**kwargs)
                conn.send(("ok", result))
            except Exception as exc:  # noqa: BLE001 - sent back to the driver
                conn.send(("error", repr(exc)))

    asyncio.run(main())


async def _call(conn, method: str, **kwargs):
    conn.send((method, kwargs))
    status, result = await asyncio.to_thread(conn.recv)
    if status != "ok":
        raise RuntimeError(f"server {method}: {result}")
    return result


async def run_variant(name: str, model_dir: Path, cycles: int, batch: int, prompt_len: int, response_len: int):
    import torch
    from transformers import AutoModelForCausalLM

    from verl_compat.rollout.transfer import BucketSender

    device = "cuda" if torch.cuda.is_available() else "cpu"
    trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    weights = {n: t.detach() for n, t in trained.state_dict().items()}
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, str(model_dir), name == "eager", prompt_len, response_len))
    proc.start()
    g = torch.Generator().manual_seed(0)
    rows = []
    try:
        await _call(parent, "memory")  # the server is up
        await _call(parent, "sleep")
        for cycle in range(cycles):
            t0 = time.perf_counter()
            await _call(parent, "wake_up", tags=["weights"])
            info = await _call(parent, "weight_sync_info")
            sender = BucketSender(2 << 30, max_total_numel=info["total_numel"])

            async def deliver(meta):
                return await _call(parent, "receive_bucket", meta=meta)

            async def finish():
                return await _call(parent, "finish_weight_sync")

            await sender.send(iter(weights.items()), deliver, finish)
            await _call(parent, "wake_up", tags=["kv_cache"])
            prompts = torch.randint(100, 150000, (batch, prompt_len), generator=g).tolist()
            tokens = await _call(parent, "generate_batch", prompts=prompts)
            awake_mib = nvidia_smi_mib(proc.pid)
            await _call(parent, "sleep")
            mem = await _call(parent, "memory")
            rows.append(
                {
                    "cycle": cycle,
                    "asleep_mib": nvidia_smi_mib(proc.pid),
                    "awake_mib": awake_mib,
                    "allocated": mem["allocated"],
                    "reserved": mem["reserved"],
                    "tokens": tokens,
                    "cycle_s": round(time.perf_counter() - t0, 3),
                }
            )
            print(name, rows[-1], flush=True)
    finally:
        parent.send(None)
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    del trained, weights
    torch.cuda.empty_cache()
    asleep = [r["asleep_mib"] for r in rows if r["asleep_mib"] is not None]
    half = asleep[len(asleep) // 2 :]
    growth = (half[-1] - half[0]) / max(1, len(half) - 1) if len(half) > 1 else None
    return {"rows": rows, "asleep_mib": asleep, "growth_mib_per_cycle_second_half": growth}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--variants", default="graphs,eager")
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="ppo_job.SHAPES key (tiny: a CPU smoke run)")
    ap.add_argument("--out", type=Path, default=Path("rollout_memory_cycles.json"))
    args = ap.parse_args(argv)

    import ppo_job

    model_dir = Path(tempfile.mkdtemp(prefix="memcycles-")) / "model"
    ppo_job.build_model(model_dir, args.shape)
    report: dict[str, Any] = {
        "profile": os.environ.get("VERL_COMPAT_DEVICE", "(real)"),
        "args": vars(args) | {"out": str(args.out)},
    }
    for name in args.variants.split(","):
        report[name] = asyncio.run(run_variant(name, model_dir, args.cycles, args.batch, args.prompt, args.response))
    args.out.write_text(json.dumps(report, indent=1))
    for name in args.variants.split(","):
        v = report[name]
        print(f"{name}: asleep MiB {v['asleep_mib']}; per cycle, second half: {v['growth_mib_per_cycle_second_half']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
