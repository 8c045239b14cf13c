"""The ReplayBuffer poll seam (patches/0013, verl_compat/rollout/poll.py): upstream's 2.0 s on sm_80+, a short
adaptive poll below sm_80 and on CPU. The intervals are computed from injected clocks; nothing sleeps."""

from __future__ import annotations

import pytest

from verl_compat.detect import ENV_VAR, reset_cache
from verl_compat.rollout.poll import FLOOR_S, AdaptivePoll


def test_adaptive_poll_is_short_and_backs_off_with_expensive_polls():
    poll = AdaptivePoll(upstream_s=2.0)
    assert poll.next_interval(now=100.0) == FLOOR_S  # first wait of a sample() call
    # the poll after it took 1 ms of work: stay at the floor
    assert poll.next_interval(now=100.0 + FLOOR_S + 0.001) == FLOOR_S
    # a poll that took 50 ms: wait 9x that, so polling keeps at most 10% of the time
    t = 100.0 + 2 * FLOOR_S + 0.001
    assert poll.next_interval(now=t + 0.05) == pytest.approx(0.45)
    # a very expensive poll never waits longer than upstream
    t2 = t + 0.05 + 0.45
    assert poll.next_interval(now=t2 + 1.5) == 2.0
    # the next sample() call, a whole training step later, starts short again
    assert poll.next_interval(now=t2 + 1.5 + 2.0 + 60.0) == FLOOR_S


class _Buffer:
    poll_interval = 2.0  # what _wait_for_next_poll reads of a ReplayBuffer (no TransferQueue needed)


@pytest.mark.parametrize(("device", "upstream_kept"), [("a100", True), ("h100", True), ("p40", False), ("cpu", False)])
def test_replay_buffer_waits_through_the_seam(device, upstream_kept, monkeypatch):
    """Upstream's own _wait_for_next_poll, patched: what it sleeps per simulated device."""
    from verl.trainer.ppo.v1 import replay_buffer

    monkeypatch.setenv(ENV_VAR, device)
    reset_cache()
    slept: list[float] = []
    monkeypatch.setattr(replay_buffer.time, "sleep", slept.append)
    buffer = _Buffer()
    replay_buffer.ReplayBuffer._wait_for_next_poll(buffer, "train", last_debug_time=float("inf"))
    replay_buffer.ReplayBuffer._wait_for_next_poll(buffer, "train", last_debug_time=float("inf"))
    assert slept == ([2.0, 2.0] if upstream_kept else [FLOOR_S, FLOOR_S])
