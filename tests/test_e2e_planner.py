"""End to end on this CPU with the memory planner on: `verl-compat quickstart --algo ppo` (a real
`python -m verl.trainer.main_ppo` with a critic, a reference and the hf rollout engine) with every memory value
handed to the planner (`auto`), packed sequences through sdpa_varlen (so the actor's passes run on the planner's
token budgets, verl's use_dynamic_bsz), two steps."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from verl_compat.planner import keys as K

pytestmark = pytest.mark.e2e

AUTO = [K.ACTOR_MICRO, K.LOGPROB_MICRO, K.REF_MICRO, K.CRITIC_MICRO, K.ACTOR_GC, K.ACTOR_PARAM_OFFLOAD]


def test_ppo_two_steps_with_the_planner(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    env = dict(os.environ, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", VERL_FILE_LOGGER_PATH=str(metrics))
    cmd = [sys.executable, "-m", "verl_compat.cli", "quickstart", "--algo", "ppo", "--model", "tiny", "--steps", "2"]
    cmd += ["--home", str(tmp_path / "home"), "--out", str(tmp_path / "ckpt"), "--train-size", "32"]
    cmd += ["--val-size", "8", "trainer.logger=[console,file]", "trainer.save_freq=-1"]
    cmd += ["actor_rollout_ref.model.use_remove_padding=true", *(f"{k}=auto" for k in AUTO)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "step" in r and "data" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert "critic/vf_loss" in r["data"] and "actor/pg_loss" in r["data"]
        assert all(math.isfinite(v) for v in r["data"].values() if isinstance(v, float))
    # verl prints the resolved config: the planner's numbers reached it, no `auto` is left
    assert not re.search(r"'ppo_micro_batch_size_per_gpu': 'auto'", out)
    assert re.search(r"'max_batch_tokens': \d+", out), "the rollout's KV budget was not planned"
    assert "'attn_implementation': 'sdpa_varlen'" in out
    # packed sequences and no row count of the user's: the actor's passes are sized by token budgets
    assert re.search(r"'use_dynamic_bsz': True", out), "the planner's token budgets did not reach verl"
    assert re.search(r"'ppo_max_token_len_per_gpu': \d+", out)
