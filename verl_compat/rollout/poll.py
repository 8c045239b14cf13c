"""How long verl's v1 ReplayBuffer sleeps between polls of TransferQueue (replay_buffer.py ``_wait_for_next_poll``).

Upstream sleeps a fixed ``poll_interval`` (2.0 s, not configurable), so a step's ``timing_s/gen`` moves in 2 s
steps whatever the batch took; with the small batches old cards train that is most of the generation time.
Below sm_80 (and on CPU) the wait adapts instead: at least ``FLOOR_S``, and at most as long as keeps one poll's own
work (``tq.kv_list`` and the bookkeeping after it, measured between calls) under ``BUSY_FRACTION`` of the time, so
a large buffer whose poll is expensive backs off toward upstream's value, never beyond it. The wait at most doubles
from one poll to the next: the time between two ``sample`` calls (a training step, which can be shorter than 2 s)
looks like one slow poll and must not set the first wait of the next step.

sm_80+ keeps upstream's 2.0 s: the project returns upstream's behaviour there unless it is a plain bug, and this is
a documented trade (TransferQueue controller load against latency; trainer_separate_async.py reads the same
``poll_interval`` as its wait threshold), not a bug.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

from verl_compat.rollout import stats

FLOOR_S = 0.01
BUSY_FRACTION = 0.1


class AdaptivePoll:
    """Interval for the next sleep from the work done since the previous one ended."""

    def __init__(self, upstream_s: float, floor_s: float = FLOOR_S, busy_fraction: float = BUSY_FRACTION):
        self.upstream_s = float(upstream_s)
        self.floor_s = min(float(floor_s), self.upstream_s)
        self.busy_fraction = float(busy_fraction)
        self._wake_at: float | None = None
        self._last: float | None = None

    def next_interval(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        work = 0.0 if self._wake_at is None else max(0.0, now - self._wake_at)
        target = work * (1 - self.busy_fraction) / self.busy_fraction
        ceiling = 2 * self._last if self._last is not None else self.floor_s
        interval = min(self.upstream_s, max(self.floor_s, min(target, ceiling)))
        self._wake_at, self._last = now + interval, interval
        return interval


_POLLERS: weakref.WeakKeyDictionary[Any, AdaptivePoll] = weakref.WeakKeyDictionary()


def replay_poll_interval(replay_buffer: Any) -> float:
    """Seconds to sleep before the next poll (seam: replay_buffer.py ``_wait_for_next_poll``)."""
    from verl_compat.detect import detect

    upstream = replay_buffer.poll_interval
    if detect().is_ampere_or_newer:
        return upstream
    poller = _POLLERS.get(replay_buffer)
    if poller is None or poller.upstream_s != upstream:
        poller = _POLLERS[replay_buffer] = AdaptivePoll(upstream)
    interval = poller.next_interval()
    if os.environ.get(stats.STATS_ENV):  # tests and benchmarks check the waits verl's loop really made
        stats.record("replay_poll", interval_s=interval)
    return interval
