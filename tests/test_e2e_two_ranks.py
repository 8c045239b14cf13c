"""End to end on this CPU with `trainer.n_gpus_per_node=2`: GRPO over two FSDP2 ranks (gloo), one hf rollout
replica per rank, to step 2, checkpoint, then resume to step 3 (issue 11; the two-card setup on a CPU).

Same job and fixtures as tests/test_e2e.py (tiny random Llama, `verl-compat quickstart`, rule-based scorer). What
two ranks add, and what is checked here: the checkpoint holds one shard per rank; two rollout servers (one per
rank) each served requests in every step; each trainer rank sent the weights to its own server after every update,
and the rollout's token probabilities equal the actor's (a replica left on its dummy start-up weights, or on the
previous step's, would differ by orders of magnitude).
"""

from __future__ import annotations

import pytest
from test_e2e import _assert_finite, _records, _run, _steps

pytestmark = pytest.mark.e2e

RANKS = 2
# fp32 actor and rollout on the CPU: measured <= 4e-8 (research/cpu-feasibility.md: 2.3e-9 on one rank)
PROBS_DIFF_MAX = 1e-4


def test_grpo_two_ranks_two_replicas_then_resume(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    out = tmp_path_factory.mktemp("ckpt")
    first = tmp_path_factory.mktemp("m") / "first.jsonl"
    _run("grpo", home, out, 2, first, f"trainer.n_gpus_per_node={RANKS}")
    rows = _steps(first)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        _assert_finite(r)
        assert "actor/pg_loss" in r["data"]
        diff = r["data"]["training/rollout_probs_diff_max"]
        assert diff < PROBS_DIFF_MAX, f"step {r['step']}: rollout vs actor probabilities differ by {diff}"

    records = _records(first.with_suffix(".rollout.jsonl"))
    servers = {r["pid"] for r in records if r["kind"] == "rollout_batch"}
    assert len(servers) == RANKS, f"expected one rollout server per rank, batches came from {servers}"
    for version in (0, 1):  # a server's global_steps: the weights it serves (synced after step `version`)
        batches = [r for r in records if r["kind"] == "rollout_batch" and r["global_steps"] == version]
        assert {b["pid"] for b in batches} == servers and all(b["requests"] > 0 for b in batches), batches
    sent = [r for r in records if r["kind"] == "trainer_weights_sent"]
    received = [r for r in records if r["kind"] == "rollout_weights_received"]
    trainers = {r["pid"] for r in sent}
    assert len(trainers) == RANKS, "every trainer rank leads its own replica and sends to it"
    for pid in trainers:  # the sync at start-up and one after each of the 2 updates
        assert sorted(r["global_steps"] for r in sent if r["pid"] == pid) == [0, 1, 2]
    assert {r["pid"] for r in received} == servers and len(received) == len(sent)
    assert len({r["tensors"] for r in received}) == 1 and all(r["tensors"] > 0 for r in received)

    ckpt = out / "grpo"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    actor = ckpt / "global_step_2" / "actor"
    for rank in range(RANKS):
        assert (actor / f"model_world_size_{RANKS}_rank_{rank}.pt").is_file()
        assert (actor / f"optim_world_size_{RANKS}_rank_{rank}.pt").is_file()

    second = tmp_path_factory.mktemp("m") / "second.jsonl"
    proc = _run("grpo", home, out, 3, second, f"trainer.n_gpus_per_node={RANKS}")
    resumed = _steps(second)
    assert [r["step"] for r in resumed] == [3]
    assert resumed[0]["data"]["training/rollout_probs_diff_max"] < PROBS_DIFF_MAX
    assert "global_step_2" in proc.stdout + proc.stderr
