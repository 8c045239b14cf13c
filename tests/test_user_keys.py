"""What counts as requested: Hydra overrides and the user's own config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_compat.user_keys import (
    RequestedKeys,
    keys_from_config_file,
    keys_from_overrides,
    requested_keys,
    requested_keys_from_hydra,
    verl_config_dir,
)


def test_override_prefixes_are_stripped() -> None:
    keys = keys_from_overrides(["a.b=1", "+c.d=x", "++e.f=2", "~g.h", "actor_rollout_ref.rollout.dtype=bfloat16", "  "])
    assert keys == {"a.b", "c.d", "e.f", "g.h", "actor_rollout_ref.rollout.dtype"}


def test_dict_valued_override_requests_each_leaf() -> None:
    keys = keys_from_overrides(["+critic.fsdp.mixed_precision={param_dtype:bf16,reduce_dtype:fp32}"])
    assert {"critic.fsdp.mixed_precision.param_dtype", "critic.fsdp.mixed_precision.reduce_dtype"} <= keys


def test_membership_covers_parents_not_siblings() -> None:
    req = RequestedKeys({"x.mixed_precision.param_dtype"})
    assert "x.mixed_precision.param_dtype" in req
    assert "x.mixed_precision" in req
    assert "x.mixed_precision.reduce_dtype" not in req
    assert "x.mixed" not in req  # prefix match is per dotted component
    assert req.any(["nope", "x.mixed_precision"]) == "x.mixed_precision"


def test_user_config_file_keys(tmp_path: Path) -> None:
    path = tmp_path / "my_ppo.yaml"
    path.write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "hydra:\n  run:\n    dir: out\n"
        "actor_rollout_ref:\n  rollout:\n    dtype: bfloat16\n    name: hf\n"
        "  model:\n    override_config: {}\n"
    )
    keys = keys_from_config_file(path)
    assert keys == {
        "actor_rollout_ref.rollout.dtype",
        "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.model.override_config",
    }
    both = requested_keys(["trainer.device=cpu"], str(path))
    assert "trainer.device" in both and "actor_rollout_ref.rollout.dtype" in both


def test_verls_own_ppo_trainer_is_not_a_request() -> None:
    own = verl_config_dir() / "ppo_trainer.yaml"
    assert own.is_file()
    assert len(requested_keys([], str(own))) == 0


def test_outside_hydra_nothing_is_requested() -> None:
    req = requested_keys_from_hydra()
    assert len(req) == 0 and req.known is False


def test_inside_a_hydra_run_overrides_and_user_file_count(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    user = tmp_path / "mine.yaml"
    user.write_text("defaults:\n  - ppo_trainer\n  - _self_\nactor_rollout_ref:\n  rollout:\n    name: hf\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(
                config_name="mine",
                overrides=[
                    "actor_rollout_ref.rollout.dtype=bfloat16",
                    f"hydra.searchpath=[file://{verl_config_dir()}]",
                ],
                return_hydra_config=True,
            )
            HydraConfig.instance().set_config(cfg)
            req = requested_keys_from_hydra()
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
    assert "actor_rollout_ref.rollout.dtype" in req  # command line
    assert "actor_rollout_ref.rollout.name" in req  # the user's primary config file
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" not in req  # verl's default


def test_empty_value_is_still_a_request_and_garbage_is_hydras_error() -> None:
    from hydra.errors import OverrideParseException

    assert keys_from_overrides(["a.b="]) == {"a.b"}
    with pytest.raises(OverrideParseException):
        keys_from_overrides(["a.b=[1,"])  # Hydra refuses it on the command line before verl runs
