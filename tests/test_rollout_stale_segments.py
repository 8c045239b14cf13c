"""Weight-sync segments left in /dev/shm by a process killed mid-sync (rollout/transfer.py sweep_stale_segments):
a creator killed with its resource tracker leaves its segment behind, which is RAM until reboot; the next sync in
the same pid namespace removes it, and never a segment whose creator still runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_compat.rollout import transfer

pytestmark = pytest.mark.skipif(not transfer.SHM_DIR.is_dir(), reason="no /dev/shm on this system")

CHILD = """
import os, sys, time
from verl_compat.rollout import transfer
segment = transfer._Segment(transfer.SHARED_MEMORY, 1 << 20, None)  # as a sync's bucket
print(segment.shm.name, flush=True)
time.sleep(60)  # killed here, mid-sync
"""


def _killed_mid_sync() -> str:
    """A child that holds a segment, SIGKILLed with its whole process group (its resource tracker included)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True)
    name = proc.stdout.readline().strip()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(0.2)  # the tracker's death too
    return name


def test_a_segment_of_a_killed_sync_is_removed_by_the_next_one(caplog) -> None:
    name = _killed_mid_sync()
    assert name.startswith(transfer.SEGMENT_PREFIX) and (transfer.SHM_DIR / name).exists(), "the leak to clean"
    with caplog.at_level("WARNING", logger="verl_compat.rollout.transfer"):
        removed = transfer.sweep_stale_segments()
    assert name in removed and not (transfer.SHM_DIR / name).exists()
    assert "no longer run" in caplog.text


def test_live_creators_and_other_pid_namespaces_keep_their_segments(tmp_path: Path) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ns = transfer._pid_namespace()  # noqa: SLF001
        keep = [
            transfer.segment_name(os.getpid(), "mine"),  # this process's own, mid-sync
            transfer.segment_name(live.pid, "live"),  # a running creator's
            f"{transfer.SEGMENT_PREFIX}{ns + 1}_{live.pid + 10**6}_other",  # another pid namespace: not judged here
            f"{transfer.SEGMENT_PREFIX}0123abcd",  # an unattributed name (before pids were in the names)
            "someone_elses_segment",
        ]
        for n in keep:
            (tmp_path / n).write_bytes(b"x")
        dead = transfer.segment_name(_dead_pid(), "dead")
        (tmp_path / dead).write_bytes(b"x" * 4096)
        assert transfer.sweep_stale_segments(tmp_path) == [dead]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    finally:
        live.kill()
        live.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
