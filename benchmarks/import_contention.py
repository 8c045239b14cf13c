"""How much the trainer worker's imports slow down beside the helper processes that import at the same time.

In the planned P40 job the trainer worker imports torch, tensordict, transformers and verl (10-16 s on the GPU
hosts) while the prestarted helpers (agent-loop and reward-loop workers, the router), the rollout server and
TransferQueue's processes import the same stack. This times one foreground ``import MODULE`` in a fresh
interpreter alone and beside N background interpreters importing the same module, started at the same moment,
at the foreground's priority or N nice steps lower (all of them niced as Ray runs its workers, 15 steps),
variants alternated. A variant's median over the alone variant's says what the helpers' imports cost the
trainer's, and whether lowering their priority gives it back.

    python benchmarks/import_contention.py --out benchmarks/results/import_contention_HOST.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

CODE = "import time, importlib; t = time.perf_counter(); importlib.import_module({m!r}); print(time.perf_counter() - t)"


def _start(module: str, nice: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CODE.format(m=module)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )


def _one(module: str, background: int, nice: int, base: int) -> float:
    """Seconds the foreground import took (measured inside it, so interpreter start-up is left out)."""
    others = [_start(module, base + nice) for _ in range(background)]
    fg = _start(module, base)
    out, _ = fg.communicate()
    for p in others:
        p.wait()
    return float(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default="verl.workers.engine_workers", help="what the trainer worker imports")
    ap.add_argument("--background", type=int, default=12, help="helper-like processes importing beside it")
    ap.add_argument("--nice", type=int, default=10, help="how many steps lower the niced variant runs them")
    ap.add_argument("--base-nice", type=int, default=15, help="every process's nice (Ray's workers run at 15)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("import_contention.json"))
    args = ap.parse_args(argv)

    _one(args.module, 0, 0, 0)  # first touch of every file, for no variant
    variants = {
        "alone": (0, 0),
        f"beside {args.background}": (args.background, 0),
        f"beside {args.background}, niced {args.nice}": (args.background, args.nice),
    }
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, (n, nice) in variants.items():
            runs[name].append(_one(args.module, n, nice, args.base_nice))
    med = {name: statistics.median(times) for name, times in runs.items()}
    result = {
        "what": __doc__.split("\n\n")[0],
        "command": " ".join(["python", *sys.argv]),
        "host": {"cpus": os.cpu_count(), "machine": platform.node(), "python": platform.python_version()},
        "module": args.module,
        "base_nice": args.base_nice,
        "seconds": runs,
        "median_s": med,
        "ratio_to_alone": {name: round(m / med["alone"], 2) for name, m in med.items()},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name in variants:
        print(f"{name:28s} {med[name]:6.2f} s  x{result['ratio_to_alone'][name]:.2f}  {runs[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
