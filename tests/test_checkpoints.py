"""Complete checkpoints only: the manifest written last, verified on resume (verl_compat.checkpoints).

The folders are laid out as verl's v1 trainer writes them (actor shards from torch.save, the HF config and
weights, data.pt, the tracker); tests/test_e2e_checkpoints.py does the same through real training runs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from verl_compat import checkpoints
from verl_compat.errors import InvalidSettingError


def _save_step(root: Path, step: int, *, seal: bool = True, tracker: bool = True) -> Path:
    folder = root / f"global_step_{step}"
    actor = folder / "actor"
    (actor / "huggingface").mkdir(parents=True)
    torch.save({"w": torch.randn(64, 64)}, actor / "model_world_size_1_rank_0.pt")
    torch.save({"state": {0: {"exp_avg": torch.randn(64, 64)}}}, actor / "optim_world_size_1_rank_0.pt")
    torch.save({"lr_scheduler": {}, "rng": torch.get_rng_state()}, actor / "extra_state_world_size_1_rank_0.pt")
    (actor / "huggingface" / "config.json").write_text('{"model_type": "llama"}')
    save_file({"w": torch.zeros(8, 8)}, actor / "huggingface" / "model.safetensors")
    torch.save({"epoch": 0, "step": step}, folder / "data.pt")
    if seal:
        checkpoints.seal(folder)
    if tracker:
        (root / checkpoints.TRACKER).write_text(str(step))
    return folder


def _cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_sealed_checkpoint_verifies(tmp_path):
    folder = _save_step(tmp_path, 1)
    assert checkpoints.verify(folder) is None
    assert checkpoints.resume_folder(tmp_path) == str(folder)


def test_no_checkpoint_trains_from_scratch(tmp_path):
    assert checkpoints.resume_folder(tmp_path) is None
    assert checkpoints.resume_folder(tmp_path / "never-created") is None


def test_truncated_file_in_latest_falls_back_with_a_warning(tmp_path, caplog):
    _save_step(tmp_path, 1)
    second = _save_step(tmp_path, 2)
    shard = second / "actor" / "model_world_size_1_rank_0.pt"
    _cut(shard)
    with caplog.at_level(logging.WARNING, logger="verl_compat.checkpoints"):
        chosen = checkpoints.resume_folder(tmp_path)
    assert chosen == str(tmp_path / "global_step_1")
    text = caplog.text
    assert str(shard) in text and "the manifest written at save time says" in text
    assert f"resuming from {tmp_path / 'global_step_1'}" in text


def test_killed_during_save_no_manifest(tmp_path, caplog):
    """Killed while writing step 3: its files are partly there, no manifest, tracker still at 2."""
    _save_step(tmp_path, 1)
    _save_step(tmp_path, 2)
    third = _save_step(tmp_path, 3, seal=False, tracker=False)
    (third / "data.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="verl_compat.checkpoints"):
        assert checkpoints.resume_folder(tmp_path) == str(tmp_path / "global_step_2")
    assert f"{third / checkpoints.MANIFEST}: is missing: the save of this checkpoint did not finish" in caplog.text


def test_killed_after_manifest_before_tracker(tmp_path):
    """The manifest is written last of the checkpoint's files: a sealed step 3 is complete even if the tracker
    still says 2 (killed between the two writes)."""
    _save_step(tmp_path, 2)
    _save_step(tmp_path, 3, tracker=False)
    assert checkpoints.resume_folder(tmp_path) == str(tmp_path / "global_step_3")


def test_tracker_killed_while_written(tmp_path, caplog):
    """An empty tracker (upstream: int('') crashes the resume) is read around, with a warning."""
    _save_step(tmp_path, 1)
    (tmp_path / checkpoints.TRACKER).write_text("")
    with caplog.at_level(logging.WARNING, logger="verl_compat.checkpoints"):
        assert checkpoints.resume_folder(tmp_path) == str(tmp_path / "global_step_1")
    assert checkpoints.TRACKER in caplog.text


def test_tracker_pointing_at_a_deleted_folder(tmp_path):
    """Upstream trains from scratch silently; the newest complete folder is used instead."""
    _save_step(tmp_path, 1)
    (tmp_path / checkpoints.TRACKER).write_text("5")
    assert checkpoints.resume_folder(tmp_path) == str(tmp_path / "global_step_1")


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda f: (f / "actor" / "optim_world_size_1_rank_0.pt").unlink(), "is missing (the manifest lists it)"),
        (lambda f: (f / checkpoints.MANIFEST).write_text('{"files": '), "cannot be read"),
        (lambda f: _cut(f / "actor" / "huggingface" / "model.safetensors", 0.9), "the manifest written at save time"),
    ],
)
def test_damage_is_named(tmp_path, damage, why):
    folder = _save_step(tmp_path, 1)
    damage(folder)
    problem = checkpoints.verify(folder)
    assert problem is not None and why in str(problem)


def test_none_usable_is_one_error_naming_the_folder(tmp_path):
    only = _save_step(tmp_path, 4)
    _cut(only / "data.pt")
    with pytest.raises(InvalidSettingError) as e:
        checkpoints.resume_folder(tmp_path, "cpu")
    msg = str(e.value)
    assert msg.startswith(f"trainer.default_local_dir='{tmp_path}' cannot be used on cpu")
    assert str(only / "data.pt") in msg and "Fix: move the broken global_step_* folders" in msg
    assert "trainer.resume_mode=disable" in msg


def test_legacy_checkpoints_without_manifest(tmp_path):
    """Saved before the seam (or by upstream verl): accepted up to the tracker when every file is whole."""
    first = _save_step(tmp_path, 1, seal=False)
    assert checkpoints.resume_folder(tmp_path) == str(first)
    _cut(first / "actor" / "model_world_size_1_rank_0.pt", 0.8)  # the zip directory at the end is gone
    problem = checkpoints.verify(first, legacy_ok=True)
    assert problem is not None and "no zip directory at its end" in str(problem)
    second = _save_step(tmp_path, 2, seal=False, tracker=False)  # newer than the tracker: not trusted
    assert checkpoints.verify(second, legacy_ok=False) is not None


def test_resume_path_must_be_complete(tmp_path):
    _save_step(tmp_path, 1)
    broken = _save_step(tmp_path, 2)
    _cut(broken / "actor" / "extra_state_world_size_1_rank_0.pt")
    checkpoints.check_resume_path(tmp_path / "global_step_1")
    with pytest.raises(InvalidSettingError) as e:
        checkpoints.check_resume_path(broken, "cpu")
    msg = str(e.value)
    assert msg.startswith(f"trainer.resume_from_path='{broken}' cannot be used on cpu")
    assert "extra_state_world_size_1_rank_0.pt" in msg
    assert f"the newest complete one there is {tmp_path / 'global_step_1'}" in msg


def test_seal_is_atomic_and_skips_itself(tmp_path):
    folder = _save_step(tmp_path, 1)
    checkpoints.seal(folder)  # a second seal lists the same files, not the manifest or its temp file
    listed = json.loads((folder / checkpoints.MANIFEST).read_text())["files"]
    assert checkpoints.MANIFEST not in listed and not any(name.endswith(".tmp") for name in listed)
    assert "data.pt" in listed and "actor/huggingface/model.safetensors" in listed
