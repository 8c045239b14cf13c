"""A refusal is one short message (key, device, reason, fix) and exit code 2; the traceback only under
HYDRA_FULL_ERROR=1; every fix names the value the device's own policy uses."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import huggingface_hub
import pytest
from omegaconf import OmegaConf
from startup_harness import QUICKSTART_CONFIG, assert_refused, parquet_file, run_main, tiny_model_dir

from verl_compat import catalog
from verl_compat.detect import reset_cache
from verl_compat.errors import IncompatibleRequestError
from verl_compat.policy import compose_ppo_config, decide
from verl_compat.quickstart import reward
from verl_compat.refusal import EXIT_CODE

MP = "actor_rollout_ref.actor.fsdp_config.mixed_precision"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    return {"model": tiny_model_dir(root), "data": parquet_file(root / "d.parquet")}


def _base(assets, tmp_path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={assets['model']}",
        f"data.train_files={assets['data']}",
        f"data.val_files={assets['data']}",
        f"reward.custom_reward_function.path={reward.__file__}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]


@pytest.fixture
def job(assets, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def run(*overrides: str, device: str | None = None):
        if device is not None:
            monkeypatch.setenv("VERL_COMPAT_DEVICE", device)
        reset_cache()
        return run_main(monkeypatch, capsys, tmp_path, [*_base(assets, tmp_path), *overrides])

    return run


def test_policy_refusal_is_one_short_message(job):
    result = job("actor_rollout_ref.rollout.dtype=bfloat16", device="p40")
    assert_refused(result, "actor_rollout_ref.rollout.dtype='bfloat16'", "p40 (sm_61", "needs native bf16", "Fix:")
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[1] == "(set HYDRA_FULL_ERROR=1 for the full traceback)", result.err
    assert "ray init kwargs" not in result.out and EXIT_CODE == 2


def test_full_traceback_only_under_hydra_full_error(job, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(IncompatibleRequestError) as e:
        job("actor_rollout_ref.rollout.dtype=bfloat16", device="p40")
    assert e.value.key == "actor_rollout_ref.rollout.dtype" and "p40" in e.value.device


def test_unknown_simulated_card_is_refused_the_same_way(job):
    result = job(device="p41")
    assert_refused(result, "VERL_COMPAT_DEVICE='p41'", "unknown device profile", "(closest: p40)", code=EXIT_CODE)


def test_v100_reduce_dtype_fix_names_fp32(job):
    """The V100 policy reduces gradients in fp32: the fix must not suggest fp16 (it did before)."""
    result = job(f"++{MP}.reduce_dtype=bf16", device="v100")
    assert_refused(result, f"{MP}.reduce_dtype='bf16'", "v100 (sm_70", "needs native bf16")
    assert f"Fix: set {MP}.reduce_dtype=fp32" in result.err, result.err


def test_dict_valued_mixed_precision_override(job):
    result = job(f"++{MP}={{param_dtype: bf16, reduce_dtype: fp32}}", device="v100")
    assert_refused(result, f"{MP}.param_dtype='bf16'", "v100", "needs native bf16", f"Fix: set {MP}.param_dtype=fp16")


# Every fix text agrees with the policy the device gets by default ----------------------------------------------
# (key, value to request, how the policy's own value is read from (config, writes))
FIX_CASES = [
    (f"{MP}.param_dtype", "bf16", lambda c, w: w.get(MP, {}).get("param_dtype", "bf16")),
    (f"{MP}.reduce_dtype", "bf16", lambda c, w: w.get(MP, {}).get("reduce_dtype", "fp32")),
    (f"{MP}.buffer_dtype", "bf16", lambda c, w: w.get(MP, {}).get("buffer_dtype", "fp32")),
    ("actor_rollout_ref.rollout.dtype", "bfloat16", None),
    ("actor_rollout_ref.actor.fsdp_config.model_dtype", "fp16", None),
    ("actor_rollout_ref.model.override_config.attn_implementation", "flash_attention_2", None),
    ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", "true", None),
    ("actor_rollout_ref.model.use_liger", "true", None),
    ("actor_rollout_ref.rollout.name", "vllm", None),
]


def _canon(value: object) -> str:
    from verl_compat.resolvers.dtype import canonical

    text = str(value).lower()
    return canonical(text) or text


@pytest.fixture(scope="module")
def composed() -> dict[str, object]:
    """verl's config with each FIX_CASES request, composed once (decide() does not modify it)."""
    configs = {key: compose_ppo_config([f"++{key}={value}"]) for key, value, _ in FIX_CASES}
    return {"": compose_ppo_config([]), **configs}


@pytest.mark.parametrize("name", [n for n in catalog.profile_names() if n not in ("a100", "h100")])
def test_fix_texts_name_the_policy_value(name, composed):
    profile = catalog.get_profile(name)
    base = composed[""]
    _, writes = decide(base, profile, [])
    refused = 0
    for key, _value, policy_of in FIX_CASES:
        try:
            decide(composed[key], profile, [key])
        except IncompatibleRequestError as e:
            refused += 1
            suggested = re.search(rf"set {re.escape(key)}=(\S+)", e.fix)
            assert suggested, f"{name}: fix names no value for {key}: {e.fix}"
            policy = policy_of(base, writes) if policy_of else writes.get(key, OmegaConf.select(base, key))
            assert _canon(suggested.group(1)) == _canon(policy), f"{name}: {key} fix {e.fix!r} vs policy {policy!r}"
    if name in ("p40", "v100", "t4"):
        assert refused >= 3, f"{name}: expected refusals for bf16 / flash-attn requests"


# The real command line ------------------------------------------------------------------------------------------
_GUARD = """
import runpy, sys
import ray
def _no_ray(*a, **k):
    print("RAY WAS STARTED", file=sys.stderr)
    raise SystemExit(99)
ray.init = _no_ray
sys.argv = ["main_ppo.py", *sys.argv[1:]]
runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)
"""


def test_command_line_refusal_exit_code_and_output(assets, tmp_path):
    """`python -m verl.trainer.main_ppo ...` as typed, with ray.init replaced by a tripwire."""
    env = dict(os.environ, VERL_COMPAT_DEVICE="t4", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    args = [f"--config-path={QUICKSTART_CONFIG}", "--config-name=grpo", *_base(assets, tmp_path)]
    args += [f"hydra.run.dir={tmp_path / 'h'}", "actor_rollout_ref.rollout.dtype=BF16"]
    cmd = [sys.executable, "-c", _GUARD, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == EXIT_CODE, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "RAY WAS STARTED" not in proc.stderr and "Traceback" not in proc.stderr
    assert "Error executing job with overrides" not in proc.stderr
    assert "actor_rollout_ref.rollout.dtype='BF16' cannot run on t4 (sm_75" in proc.stderr
    assert "Fix: set actor_rollout_ref.rollout.dtype=float16" in proc.stderr

    env["HYDRA_FULL_ERROR"] = "1"
    full = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert full.returncode == 1 and "Traceback" in full.stderr and "IncompatibleRequestError" in full.stderr
    assert "RAY WAS STARTED" not in full.stderr
