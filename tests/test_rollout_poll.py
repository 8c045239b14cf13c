"""The ReplayBuffer poll seam (patches/0013, verl_compat/rollout/poll.py): upstream's 2.0 s on sm_80+, a short
adaptive poll below sm_80 and on CPU. The intervals are computed from injected clocks; nothing sleeps."""

from __future__ import annotations

import pytest

from verl_compat.detect import ENV_VAR, reset_cache
from verl_compat.rollout.poll import FLOOR_S, AdaptivePoll


def test_adaptive_poll_is_short_and_backs_off_with_expensive_polls():
    poll = AdaptivePoll(upstream_s=2.0)
    t = 100.0
    assert poll.next_interval(now=t) == FLOOR_S  # first wait of a sample() call
    t += FLOOR_S + 0.001  # the poll after it took 1 ms of work: stay at the floor
    assert poll.next_interval(now=t) == FLOOR_S
    # polls that take 50 ms: the wait doubles per poll up to 9x the work (polling keeps <= 10% of the time)
    waits = []
    for _ in range(8):
        t += poll._last + 0.05  # noqa: SLF001 - the wait just returned, then the poll's work
        waits.append(poll.next_interval(now=t))
    assert waits[:5] == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32]) and waits[-1] == pytest.approx(0.45)
    # however expensive a poll, never longer than upstream
    for _ in range(6):
        t += poll._last + 1.5  # noqa: SLF001
        last = poll.next_interval(now=t)
    assert last == 2.0


def test_a_short_training_step_between_samples_is_not_a_slow_poll():
    """sample() of step 2 starts 1.9 s after step 1's last poll: its first wait stays short."""
    poll = AdaptivePoll(upstream_s=2.0)
    t = 0.0
    for _ in range(5):
        t += poll.next_interval(now=t) + 0.001
    t += 1.9  # the rest of step 1 (training) and the start of step 2
    assert poll.next_interval(now=t) <= 2 * FLOOR_S


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
