"""Arithmetic tasks from reasoning-gym, written in verl's RL dataset format (parquet)."""

from __future__ import annotations

from pathlib import Path

INSTRUCTION = "Solve the problem. End your reply with the final number."
# Easy settings: SmolLM2-135M solves some but not all of them when sampling, so GRPO's groups get mixed rewards
# (reasoning-gym's defaults, up to 6 terms of 4 digits, score about 0 and leave nothing to learn from).
TASK_CONFIGS = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ("+", "-", "*"),
        "allow_parentheses": False,
        "allow_negation": False,
    },
}
DEFAULT_TASKS = tuple(TASK_CONFIGS)


def make_rows(task: str, size: int, seed: int, split: str) -> list[dict]:
    import reasoning_gym  # an optional dependency: `pip install -e ".[quickstart]"`

    ds = reasoning_gym.create_dataset(task, size=size, seed=seed, **TASK_CONFIGS.get(task, {}))
    rows = []
    for i in range(size):
        e = ds[i]
        rows.append(
            {
                "data_source": f"reasoning_gym/{task}",
                "prompt": [{"role": "user", "content": f"{e['question']}\n{INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(e["answer"])},
                "extra_info": {"split": split, "index": i, "task": task},
            }
        )
    return rows


def write_dataset(out_dir: Path, train_size: int = 256, val_size: int = 32, tasks=DEFAULT_TASKS) -> tuple[Path, Path]:
    """Writes train.parquet and val.parquet (different seeds, so validation questions are unseen)."""
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, size, seed in (("train", train_size, 42), ("val", val_size, 4242)):
        rows = []
        for k, task in enumerate(tasks):
            rows += make_rows(task, size // len(tasks), seed + k, split)
        path = out_dir / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        paths.append(path)
    return paths[0], paths[1]
