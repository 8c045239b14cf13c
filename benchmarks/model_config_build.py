"""verl's HFModelConfig build (tokenizer, processor, generation and model config) with verl's ``hf_processor`` and
with verl-compat's (patch 0025, verl_compat.text_only_processor), alternated in one process.

A PPO job builds it three times on the start-up's critical path (the driver's ``_init_tokenizer`` and critic
config, the trainer worker's ``init_model``), GRPO twice. The folder is the PPO benchmark job's
(benchmarks/ppo_job.py: the Qwen2.5 tokenizer saved beside a model config), so the tokenizer is the real one.

    python benchmarks/model_config_build.py --out benchmarks/results/model_config_build_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo_job  # noqa: E402  (benchmarks/ppo_job.py: the job's model folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="builds per variant, alternated")
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/model-config-build/tiny"))
    ap.add_argument("--out", type=Path, default=Path("model_config_build.json"))
    args = ap.parse_args(argv)

    import transformers
    from omegaconf import OmegaConf

    import verl_compat.seams
    from verl.utils import hf_processor as verls
    from verl.utils.config import omega_conf_to_dataclass

    model_dir = ppo_job.build_model(args.model_dir, shape="tiny")
    section = OmegaConf.create({"_target_": "verl.workers.config.HFModelConfig", "path": str(model_dir)})
    ours = verl_compat.seams.hf_processor
    loads: list[str] = []
    real = transformers.AutoTokenizer.from_pretrained.__func__
    counted = classmethod(lambda cls, *a, **k: loads.append("") or real(cls, *a, **k))
    transformers.AutoTokenizer.from_pretrained = counted
    omega_conf_to_dataclass(section)  # imports and first-touch file reads, for neither variant

    runs: dict[str, list[float]] = {"verl's hf_processor": [], "verl-compat's": []}
    tokenizer_loads: dict[str, int] = {}
    processors: dict[str, str] = {}
    for _ in range(args.reps):
        for name, seam in (("verl's hf_processor", verls), ("verl-compat's", ours)):
            verl_compat.seams.hf_processor = seam
            loads.clear()
            t = time.perf_counter()
            built = omega_conf_to_dataclass(section)
            runs[name].append(time.perf_counter() - t)
            tokenizer_loads[name] = len(loads)
            processors[name] = repr(built.processor)
    verl_compat.seams.hf_processor = ours
    medians = {name: statistics.median(times) for name, times in runs.items()}
    result = {
        "what": __doc__.split("\n\n")[0],
        "model_dir": str(model_dir),
        "transformers": transformers.__version__,
        "reps": args.reps,
        "build_s": runs,
        "median_s": medians,
        "ratio": medians["verl-compat's"] / medians["verl's hf_processor"],
        "tokenizer_loads_per_build": tokenizer_loads,
        "processor": processors,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, m in medians.items():
        print(f"{name:22s} median {m:.3f} s  tokenizer loads {tokenizer_loads[name]}  processor {processors[name]}")
    print(f"ratio {result['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
