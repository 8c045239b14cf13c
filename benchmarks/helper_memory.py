"""Host memory and import time of the helper processes verl starts per job, each measured in a fresh Python
process that imports what that Ray actor imports (a reward-loop worker, a TransferQueue storage unit, an
agent-loop worker), several times; the medians, with the count upstream starts and the count verl-compat starts
on one GPU below sm_80 (`platform.helpers`).

    python benchmarks/helper_memory.py --repeat 3 --out helper_memory.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

# helper -> (the module its Ray actor class lives in, the config key that counts it)
HELPERS = {
    "reward-loop worker": ("verl.experimental.reward_loop.reward_loop", "reward.num_workers"),
    "TransferQueue storage unit": ("transfer_queue", "transfer_queue.backend.SimpleStorage.num_data_storage_units"),
    "agent-loop worker": ("verl.experimental.agent_loop.agent_loop", "actor_rollout_ref.rollout.agent.num_workers"),
}
PROBE = (
    "import importlib, json, resource, sys, time; t = time.perf_counter(); importlib.import_module(sys.argv[1]); "
    "print(json.dumps({'import_s': time.perf_counter() - t, "
    "'maxrss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))"
)


def measure(module: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def counts(key: str) -> tuple[int, int]:
    """(upstream's count, verl-compat's on one simulated P40) from the policy itself."""
    from verl_compat.catalog import get_profile
    from verl_compat.policy import compose_ppo_config, decide

    config = compose_ppo_config(["trainer.n_gpus_per_node=1"])
    _, writes = decide(config, get_profile("p40"), [])
    from omegaconf import OmegaConf

    upstream = int(OmegaConf.select(config, key))
    return upstream, int(writes.get(key, upstream))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("helper_memory.json"))
    args = ap.parse_args(argv)
    rows = []
    for name, (module, key) in HELPERS.items():
        runs = [measure(module) for _ in range(args.repeat)]
        upstream, ours = counts(key)
        rss = statistics.median(r["maxrss_mib"] for r in runs)
        rows.append(
            {
                "helper": name,
                "module": module,
                "key": key,
                "maxrss_mib": round(rss),
                "import_s": round(statistics.median(r["import_s"] for r in runs), 2),
                "upstream_count": upstream,
                "verl_compat_count_one_p40": ours,
                "host_mib_saved": round(rss * (upstream - ours)),
            }
        )
    args.out.write_text(json.dumps({"repeat": args.repeat, "rows": rows}, indent=1) + "\n")
    print(f"{'helper':28} {'RSS MiB':>8} {'import s':>9} {'upstream':>9} {'one P40':>8} {'MiB saved':>10}")
    for r in rows:
        print(
            f"{r['helper']:28} {r['maxrss_mib']:>8} {r['import_s']:>9} {r['upstream_count']:>9} "
            f"{r['verl_compat_count_one_p40']:>8} {r['host_mib_saved']:>10}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
