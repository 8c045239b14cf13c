"""A micro-batch of verl's v1 trainer moved to the device: TensorDict.to against verl_compat.batch_moves.

The batch has the fields a CPU PPO run's micro-batches carried into verl's forward_step (the v1 trainer of verl
0.9.1): 18 per-sample non-tensor fields, 11 scalar metadata entries and 9 nested token tensors, here of 300-512
tokens per row. Both variants run in one process, alternated, on the CPU and,
where there is one, the GPU; the median ms of each and their ratio are printed as JSON.

    python benchmarks/batch_moves.py [--rows 32] [--repeats 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from verl_compat.batch_moves import to_device

NON_TENSOR = (
    "ability data_source extra_fields extra_info global_steps index interaction_kwargs metrics mm_processor_kwargs "
    "mm_processor_output multi_modal_inputs num_turns prompt raw_prompt reward_model session_id tools_kwargs uid"
).split()
SCALARS = {
    "temperature": 1.0, "calculate_entropy": True, "compute_loss": False, "use_remove_padding": True,
    "use_dynamic_bsz": True, "max_token_len_per_gpu": 16384, "micro_batch_size_per_gpu": 32,
    "use_fused_kernels": False, "sp_size": 1, "batch_num_tokens": 10860, "dp_size": 1,
}  # fmt: skip
FLOAT_NESTED = ("rm_scores", "rollout_log_probs", "dummy_tensor", "loss_mask", "response_mask")
LONG_NESTED = ("prompts", "input_ids", "responses", "position_ids")


def trainer_batch(rows: int) -> TensorDict:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(300, 513, (rows,), generator=gen).tolist()

    def nested(dtype: torch.dtype) -> torch.Tensor:
        return torch.nested.as_nested_tensor([torch.zeros(n, dtype=dtype) for n in lengths], layout=torch.jagged)

    fields: dict = {k: nested(torch.float32) for k in FLOAT_NESTED}
    fields.update({k: nested(torch.long) for k in LONG_NESTED})
    for key in NON_TENSOR:
        rich = key in ("extra_info", "reward_model", "raw_prompt")
        items = [{"question": "x" * 200, "index": i} if rich else f"{key}{i}" for i in range(rows)]
        fields[key] = NonTensorStack(*items)
    batch = TensorDict(fields, batch_size=[rows])
    for key, value in SCALARS.items():
        batch[key] = NonTensorData(value)
    return batch


def _median_ms(fn, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(batch: TensorDict, device: str, repeats: int) -> dict:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    variants = {"tensordict_to": lambda: batch.to(device), "batch_moves": lambda: to_device(batch, device)}
    for fn in variants.values():  # warm-up: allocator, CUDA context, lazy imports
        fn()
    ms = {name: [] for name in variants}
    for _ in range(3):  # alternated rounds, so drift hits both
        for name, fn in variants.items():
            ms[name].append(_median_ms(fn, repeats, sync))
    out = {name: round(statistics.median(v), 3) for name, v in ms.items()}
    out["ratio_batch_moves_to_tensordict"] = round(out["batch_moves"] / out["tensordict_to"], 4)
    return out


def cli(doc: str, repeats: int) -> argparse.Namespace:
    """The options these host-work benchmarks share: rows of the batch, repeats per round, an output file."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out")
    return parser.parse_args()


def emit(result: dict, out: str | None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def main() -> None:
    args = cli(__doc__, repeats=30)
    batch = trainer_batch(args.rows)
    result = {
        "rows": args.rows,
        "fields": {"non_tensor": len(NON_TENSOR), "scalars": len(SCALARS), "nested": len(FLOAT_NESTED + LONG_NESTED)},
        "host": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cpu": measure(batch, "cpu", args.repeats),
    }
    if torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name()
        result["cuda"] = measure(batch, "cuda", args.repeats)
    emit(result, args.out)


if __name__ == "__main__":
    main()
