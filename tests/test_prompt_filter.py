"""verl's overlong-prompt filter through verl_compat.data.prompt_filter (patches/0015): the rows upstream's
datasets.filter keeps, in the same order, in-process for small datasets; upstream's call for large ones."""

from __future__ import annotations

import datasets
import pytest

from verl_compat.data import prompt_filter


def _frame() -> datasets.Dataset:
    words = [3, 40, 7, 12, 90, 1, 12]
    return datasets.Dataset.from_dict({"prompt": [" ".join(["w"] * n) for n in words], "i": list(range(len(words)))})


def _len(doc) -> int:
    return len(doc["prompt"].split())


@pytest.mark.parametrize("in_process_rows", [100_000, 0])  # in-process, and upstream's datasets.filter
def test_keeps_the_rows_datasets_filter_keeps(monkeypatch: pytest.MonkeyPatch, in_process_rows: int) -> None:
    monkeypatch.setattr(prompt_filter, "IN_PROCESS_ROWS", in_process_rows)
    frame = _frame()
    ours = prompt_filter.keep_short_prompts(frame, _len, 12, num_proc=1, desc="test")
    theirs = frame.filter(lambda doc: _len(doc) <= 12)
    assert ours["i"] == theirs["i"] == [0, 2, 3, 5, 6]
    assert ours.column_names == frame.column_names


def test_nothing_filtered_returns_the_dataset_itself() -> None:
    frame = _frame()
    assert prompt_filter.keep_short_prompts(frame, _len, 1000, num_proc=4, desc="test") is frame


def test_rl_dataset_filters_through_the_seam(tmp_path) -> None:
    """verl's RLHFDataset with filter_overlong_prompts: the long prompt is dropped, the others kept in order."""
    from omegaconf import OmegaConf

    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl_compat.quickstart.model import char_tokenizer

    tokenizer = char_tokenizer(tmp_path / "tokenizer")  # one token per character
    rows = [{"prompt": [{"role": "user", "content": text}], "i": i} for i, text in enumerate(["hi", "x" * 100, "ok"])]
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    config = OmegaConf.create({"max_prompt_length": 64, "filter_overlong_prompts": True, "prompt_key": "prompt"})
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config)
    assert dataset.dataframe["i"] == [0, 2]
