"""What the per-sample non-tensor fields cost a trainer pass's TransferQueue fetch.

Every pass of verl's v1 trainer (old log-prob, reference, values, both updates) starts with its worker fetching
the step's rows from TransferQueue, every field of them: the token tensors and about twenty per-sample
non-tensor fields (raw_prompt, reward_model, extra_info, ...) that the engine's passes do not read. Here one
TransferQueue (the job's own storage settings: one SimpleStorage unit) holds 32 rows shaped like a PPO step's
(benchmarks/batch_moves.py's batch), and a Ray actor fetches them with every field and with the tensors only,
alternated; the median ms of each and their ratio are printed as JSON.

    python benchmarks/tq_fetch_fields.py [--rows 32] [--repeats 15] [--out FILE]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import ray
from batch_moves import cli, emit

HERE = os.path.dirname(os.path.abspath(__file__))


def _conf():
    """TransferQueue as verl's own config sets it up for a one-GPU job with one storage unit (the plan's count)."""
    from verl_compat import tq_prestart
    from verl_compat.policy import compose_ppo_config

    return tq_prestart.conf_for(compose_ppo_config(["transfer_queue.backend.SimpleStorage.num_data_storage_units=1"]))


@ray.remote(num_cpus=0)
class _Worker:
    """Stands in for a trainer worker: puts a step's rows, then fetches them both ways."""

    def run(self, conf, rows: int, repeats: int) -> dict:
        sys.path.insert(0, HERE)
        import transfer_queue as tq
        from batch_moves import NON_TENSOR, SCALARS, trainer_batch

        tq.init(conf)
        batch = trainer_batch(rows)
        for key in SCALARS:  # per-pass metadata travels in the request, not in TransferQueue
            del batch[key]
        keys = [f"row{i}" for i in range(rows)]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=batch)
        every = list(batch.keys())
        variants = {"every_field": every, "tensors_only": [k for k in every if k not in NON_TENSOR]}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(3):  # alternated rounds
            for name, fields in variants.items():
                for _ in range(repeats):
                    start = time.perf_counter()
                    tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
                    times[name].append((time.perf_counter() - start) * 1e3)
        tq.close()
        out = {name: round(statistics.median(v), 2) for name, v in times.items()}
        out["ratio_tensors_only_to_every_field"] = round(out["tensors_only"] / out["every_field"], 3)
        out["fields"] = {"every_field": len(every), "non_tensor": len(NON_TENSOR)}
        return out


def main() -> None:
    args = cli(__doc__, repeats=15)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = {"rows": args.rows, **ray.get(_Worker.remote().run.remote(_conf(), args.rows, args.repeats))}
    finally:
        ray.shutdown()
    emit(result, args.out)


if __name__ == "__main__":
    main()
