"""kill -9 during a checkpoint write and a truncated checkpoint file, then a resume (CPU, tiny model).

Run 1 trains GRPO with a checkpoint after every step and is killed with SIGKILL (the driver, Ray and every
worker at once) as soon as step 3's checkpoint folder appears, i.e. while its files are being written. Then one
file of step 2's checkpoint is cut in half, as a full disk or an interrupted copy leaves it. Run 2 must skip
both, naming the files, resume from step 1 (the newest complete checkpoint) and train steps 2 and 3 exactly once.

Both runs simulate a P40 on this CPU-only host (VERL_COMPAT_DEVICE=p40, as the README shows how to check a P40
job): the card's policy (fp32, sdpa, hf rollout) on the CPU platform (trainer.device=cpu, FSDP2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from verl_compat import checkpoints

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 900


def _cmd(home: Path, out: Path, steps: int) -> list[str]:
    cmd = [sys.executable, "-m", "verl_compat.cli", "quickstart", "--algo", "grpo", "--model", "tiny"]
    cmd += ["--steps", str(steps), "--home", str(home), "--out", str(out), "--train-size", "64", "--val-size", "8"]
    return cmd + ["trainer.logger=[console,file]", "trainer.save_freq=1"]


def _env(metrics: Path) -> dict[str, str]:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", VERL_FILE_LOGGER_PATH=str(metrics))
    return env | {"VERL_COMPAT_DEVICE": "p40"}


def _steps(metrics: Path) -> list[int]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    return [r["step"] for r in rows if "step" in r and "data" in r]


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the run and every process it started (Ray's GCS, raylet, workers), newest first."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in [*tree, psutil.Process(proc.pid)]:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)
    psutil.wait_procs(tree, timeout=30)


def test_kill_during_save_and_truncated_file_then_resume(tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    ckpt = out / "grpo"
    first = tmp_path / "first.jsonl"
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(_cmd(home, out, 3), env=_env(first), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not (ckpt / "global_step_3").exists():
            assert proc.poll() is None, f"run 1 ended before step 3 was saved:\n{(tmp_path / 'first.log').read_text()}"
            assert time.monotonic() < deadline, "run 1 never reached step 3's checkpoint"
            time.sleep(0.002)
    finally:
        _kill_tree(proc)
        log.close()

    # the kill landed during the write: step 3 has no manifest, the tracker still says 2
    assert not (ckpt / "global_step_3" / checkpoints.MANIFEST).exists()
    assert (ckpt / checkpoints.TRACKER).read_text().strip() == "2"
    assert _steps(first)[:2] == [1, 2]
    for step in (1, 2):
        assert checkpoints.verify(ckpt / f"global_step_{step}") is None

    shard = ckpt / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    second = tmp_path / "second.jsonl"
    run = subprocess.run(_cmd(home, out, 3), env=_env(second), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-6000:]
    assert f"{ckpt / 'global_step_3' / checkpoints.MANIFEST}: is missing" in text
    assert f"{shard}: has " in text
    assert f"Resuming from {ckpt / 'global_step_1'}" in text
    assert "trainer.device: cuda -> cpu on cpu" in text and "param_dtype: bf16 -> fp32 on p40 (sm_61" in text
    assert _steps(second) == [2, 3]  # step 1 is not repeated; steps 2 and 3 (whose checkpoints broke) are not lost
    assert (ckpt / checkpoints.TRACKER).read_text().strip() == "3"
    assert checkpoints.verify(ckpt / "global_step_3") is None and checkpoints.verify(ckpt / "global_step_2") is None
