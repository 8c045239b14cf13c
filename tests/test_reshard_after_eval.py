"""patches/0016: after an eval phase on one rank, every FSDP2 unit is resharded (upstream reshards the root only
when fsdp_size > 1, so a forward-only reference kept its gathered parameters on the card)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule, fully_shard

from verl_compat import seams
from verl_compat.catalog import get_profile


def _unsharded(model: torch.nn.Module) -> list[str]:
    out = []
    for name, unit in model.named_modules():
        if isinstance(unit, FSDPModule):
            group = unit._get_fsdp_state()._fsdp_param_group
            if group is not None and group.is_unsharded:
                out.append(name or "root")
    return out


@pytest.fixture
def sharded_model(single_rank):
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    fully_shard(model[0])
    fully_shard(model)  # the root keeps its parameters gathered after forward (FSDP2's default for the root)
    with torch.no_grad():
        model(torch.randn(2, 8))
    return model


@pytest.mark.parametrize(("name", "frees"), [("p40", True), ("t4", True), ("cpu", True), ("a100", False)])
def test_gathered_parameters_released_below_sm80(monkeypatch, sharded_model, name: str, frees: bool) -> None:
    monkeypatch.setattr(seams, "_profile", lambda: get_profile(name))
    assert _unsharded(sharded_model) == ["root"]  # what upstream leaves on one rank
    seams.release_gathered_params(sharded_model)
    assert _unsharded(sharded_model) == ([] if frees else ["root"])
    with torch.no_grad():  # and the model still runs
        assert sharded_model(torch.randn(2, 8)).shape == (2, 8)
