"""The default job's assets: reasoning-gym data in verl's format, the rule-based scorer, the tiny model."""

from __future__ import annotations

import pandas as pd
import pytest

from verl_compat.quickstart.data import write_dataset
from verl_compat.quickstart.model import tiny_llama
from verl_compat.quickstart.reward import compute_score


def test_dataset_has_verl_columns_and_unseen_validation(tmp_path):
    train, val = write_dataset(tmp_path, train_size=8, val_size=4)
    t, v = pd.read_parquet(train), pd.read_parquet(val)
    assert len(t) == 8 and len(v) == 4
    for col in ("data_source", "prompt", "reward_model", "extra_info"):
        assert col in t.columns
    row = t.iloc[0]
    assert row["prompt"][0]["role"] == "user" and row["reward_model"]["ground_truth"]
    assert not set(t["prompt"].map(lambda p: p[0]["content"])) & set(v["prompt"].map(lambda p: p[0]["content"]))


@pytest.mark.parametrize(
    "response,truth,score",
    [
        ("The answer to this arithmetic problem is 7.", "7", 1.0),
        ("3 + 4 = 7", "7", 1.0),
        ("It is 1,234", "1234", 1.0),
        ("-5 * -6 = 30.0", "30", 1.0),
        ("The answer is 8.", "7", 0.0),
        ("I don't know", "7", 0.0),
        ("7 ... no wait, 9", "7", 0.0),
    ],
)
def test_scorer(response, truth, score):
    assert compute_score("reasoning_gym/chain_sum", response, truth) == score


def test_tiny_model_roundtrips_chat_text(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_llama(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "4 + 3 ="}], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.decode(ids) == "<|im_start|>user\n4 + 3 =<|im_end|>\n<|im_start|>assistant\n"
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
