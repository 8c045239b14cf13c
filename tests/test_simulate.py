"""A simulated card changes nothing where there is no real GPU, and never for a real card's profile."""

from __future__ import annotations

import dataclasses

from verl_compat.catalog import get_profile
from verl_compat.simulate import prepare_device


def test_no_cap_without_a_cuda_device():
    assert prepare_device(get_profile("p40")) is None  # this machine has no GPU


def test_no_cap_for_real_or_cpu_profiles():
    real = dataclasses.replace(get_profile("p40"), simulated=False)
    assert prepare_device(real) is None
    assert prepare_device(get_profile("cpu")) is None


GIB = 2**30


def _fake_gpu(monkeypatch, total: int, used: dict[str, int]):
    """torch.cuda's memory queries over a fake GPU: `used` holds what is in use beside this process's allocator
    ("beside") and what this process's allocator reserved ("own"); returns the caps set."""
    import torch

    caps: list[float] = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (total - used["beside"] - used["own"], total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: used["own"])
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: caps.append(f))
    return caps


def test_the_card_guard_gives_a_process_what_the_others_leave_of_the_card(monkeypatch):
    from verl_compat.simulate import guarded_fraction

    total, card = 141 * GIB, 22 * GIB
    used = {"beside": 2 * GIB, "own": 5 * GIB}  # the asleep rollout and both contexts; the trainer's 5 GiB
    _fake_gpu(monkeypatch, total, used)
    assert guarded_fraction(0, card, share=19 * GIB) * total == 19 * GIB  # the share where the card leaves more
    used["beside"] = 6 * GIB  # the rollout awake
    assert guarded_fraction(0, card, share=19 * GIB) * total == 16 * GIB  # the card less what the others hold
    used["beside"] = 30 * GIB
    assert guarded_fraction(0, card, share=19 * GIB) == 0.0  # never negative


def test_the_card_guard_thread_follows_the_other_processes(monkeypatch):
    import threading
    import time

    from verl_compat import simulate

    total, card = 141 * GIB, 22 * GIB
    used = {"beside": 2 * GIB, "own": 0}
    caps = _fake_gpu(monkeypatch, total, used)
    monkeypatch.setattr(simulate, "GUARD_PERIOD_S", 0.001)
    stop = threading.Event()
    thread = simulate.card_guard(0, card, 19 * GIB, stop)
    try:
        deadline = time.time() + 10
        while not caps and time.time() < deadline:
            time.sleep(0.001)
        used["beside"] = 10 * GIB
        while (not caps or caps[-1] * total != 12 * GIB) and time.time() < deadline:
            time.sleep(0.001)
    finally:
        stop.set()
        thread.join(5)
    assert caps[0] * total == 19 * GIB and caps[-1] * total == 12 * GIB
    assert len(caps) == len(set(caps))  # set only when it changes
    assert not thread.is_alive()
