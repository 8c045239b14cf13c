"""Slow package probes cached on disk (verl_compat.probe_cache): a job's processes probe once per install."""

from __future__ import annotations

import json
import os

import pytest

from verl_compat import packages, paths, probe_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    packages._xformers_cpp_ops.cache_clear()
    yield tmp_path / "home" / "probes"
    packages._xformers_cpp_ops.cache_clear()


def _counting(result, keep=True):
    calls = []

    def probe():
        calls.append(1)
        return list(result), keep

    return probe, calls


def test_hit_skips_the_probe_and_a_new_key_probes_again(cache):
    probe, calls = _counting(["broken"])
    key = {"torch": "2.13.0", "binaries": [["/x/_C.so", 10, 1]]}
    assert probe_cache.cached("thing", key, probe) == ["broken"]
    assert probe_cache.cached("thing", dict(key), probe) == ["broken"]
    assert len(calls) == 1
    assert json.loads((cache / "thing.json").read_text()) == {"key": key, "reasons": ["broken"]}
    moved = {**key, "binaries": [["/x/_C.so", 10, 2]]}  # the binary was reinstalled
    assert probe_cache.cached("thing", moved, probe) == ["broken"]
    assert len(calls) == 2


def test_a_check_that_could_not_run_is_not_kept(cache):
    probe, calls = _counting(["could not check: TimeoutExpired"], keep=False)
    probe_cache.cached("thing", {"k": 1}, probe)
    probe_cache.cached("thing", {"k": 1}, probe)
    assert len(calls) == 2 and not (cache / "thing.json").exists()


def test_unwritable_or_corrupt_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(paths.HOME_ENV, str(blocker / "sub"))  # a file where the folder should be
    probe, calls = _counting([])
    assert probe_cache.cached("thing", {"k": 1}, probe) == [] and len(calls) == 1
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "c"))
    (tmp_path / "c" / "probes").mkdir(parents=True)
    (tmp_path / "c" / "probes" / "thing.json").write_text("{not json")
    assert probe_cache.cached("thing", {"k": 1}, probe) == [] and len(calls) == 2
    assert json.loads((tmp_path / "c" / "probes" / "thing.json").read_text())["key"] == {"k": 1}  # repaired


def test_kept_in_verl_compats_home(monkeypatch, tmp_path):
    """One folder for verl-compat's files (the quickstart's model and data too): VERL_COMPAT_HOME, else
    ~/.cache/verl-compat."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path))
    assert probe_cache.path("thing") == tmp_path / "probes" / "thing.json"
    monkeypatch.delenv(paths.HOME_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert probe_cache.path("thing") == tmp_path / ".cache" / "verl-compat" / "probes" / "thing.json"


def test_xformers_check_runs_once_across_processes(cache, monkeypatch):
    """Each process has its own functools cache (cleared here to stand for a new process); the disk cache
    answers the second one, and another torch build probes again."""
    probe, calls = _counting(["xformers' C++/CUDA ops do not load with this torch: undefined symbol"])
    monkeypatch.setattr(packages, "_probe_xformers_cpp_ops", probe)
    first = packages._xformers_cpp_ops("2.13.0+cu126", "0.0.35")
    packages._xformers_cpp_ops.cache_clear()
    assert packages._xformers_cpp_ops("2.13.0+cu126", "0.0.35") == first and len(calls) == 1
    packages._xformers_cpp_ops.cache_clear()
    packages._xformers_cpp_ops("2.12.0+cu126", "0.0.35")
    assert len(calls) == 2


def test_the_real_check_is_cached(cache):
    """The subprocess itself (xformers need not be installed: its import error is the answer, and is kept)."""
    reasons = packages._xformers_cpp_ops("test-build", "test")
    packages._xformers_cpp_ops.cache_clear()
    assert packages._xformers_cpp_ops("test-build", "test") == reasons
    held = json.loads((cache / "xformers_cpp_ops.json").read_text())
    assert held["key"]["python"] and os.path.isabs(held["key"]["python"])
    if held["reasons"]:  # a failed check says where it is kept, so that a user can have it checked again
        assert reasons == [*held["reasons"], f"checked once per install, kept in {cache / 'xformers_cpp_ops.json'} "
                           "(delete it to check again)"]  # fmt: skip
    else:
        assert reasons == []
