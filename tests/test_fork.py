"""Fork tooling on the real pinned upstream wheel: materialise, check, refresh, rebase, and the installed tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from verl_compat.fork.check import check, control_flow_words
from verl_compat.fork.materialize import MaterializeError, materialize, read_stamp
from verl_compat.fork.pin import Layout, read_pin
from verl_compat.fork.refresh import refresh
from verl_compat.fork.series import load_series
from verl_compat.fork.upstream import UpstreamError, fetch_wheel, verify_wheel

ROOT = Path(__file__).resolve().parents[1]
REPO = Layout(ROOT)


@pytest.fixture(scope="session")
def wheel() -> Path:
    pin = read_pin(REPO)
    path = fetch_wheel(pin.version, pin.wheel, REPO.cache)
    verify_wheel(path, pin.sha256)
    return path


@pytest.fixture
def checkout(tmp_path, wheel, monkeypatch) -> Layout:
    """A scratch checkout: a copy of patches/ and nothing else; the wheel comes from VERL_COMPAT_UPSTREAM."""
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    monkeypatch.setenv("VERL_COMPAT_UPSTREAM", str(wheel))
    return Layout(tmp_path)


def _patched_files() -> set[str]:
    return {fd.path for p in load_series(REPO) for fd in p.files}


def test_git_tracks_no_upstream_code():
    out = subprocess.run(["git", "ls-files", "verl"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_untouched_files_are_byte_identical_to_the_pinned_wheel(wheel):
    import verl

    installed = Path(verl.__file__).resolve().parent
    assert installed == ROOT / "verl", "the editable install must map verl to the materialised tree"
    touched = _patched_files()
    checked = 0
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.startswith("verl/") or name.endswith("/") or name in touched:
                continue
            assert (ROOT / name).read_bytes() == z.read(name), f"{name} differs from upstream"
            checked += 1
        wheel_files = {n for n in z.namelist() if n.startswith("verl/") and not n.endswith("/")}
    assert checked > 300
    local = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "verl").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.name != ".verl-compat-stamp.json"
    }
    assert local == wheel_files, "materialised tree holds files the wheel lacks (or misses some)"
    assert not (ROOT / "tests" / "special_e2e").exists(), "the wheel's top-level tests/ must never be installed"


def test_verl_imports_with_compat_version():
    out = subprocess.run(
        [sys.executable, "-c", "import verl, verl_compat; print(verl.__version__, verl_compat.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["0.9.1", "0.9.1+compat.1"]


def test_check_passes_on_the_series(checkout):
    res = check(checkout)
    assert res.ok, res.problems
    assert res.patches == len(load_series(checkout)) >= 1
    assert res.lines_added >= 1


def test_check_cli_prints_lines_touched():
    out = subprocess.run(
        [sys.executable, "-m", "verl_compat.cli", "fork", "check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "upstream lines touched" in out.stdout and "fork check: OK" in out.stdout


def test_check_names_the_hunk_of_a_corrupted_patch(checkout):
    first = load_series(checkout)[0]
    path = checkout.patches / first.name
    lines = path.read_text().splitlines()
    # corrupt the first context line of the first hunk
    at = next(i for i, ln in enumerate(lines) if ln.startswith("@@")) + 1
    lines[at] = " this line is not in upstream verl"
    path.write_text("\n".join(lines) + "\n")
    res = check(checkout)
    assert not res.ok
    msg = "\n".join(res.problems)
    assert first.name in msg and "hunk #1" in msg and "@@ -" in msg and first.files[0].path in msg


def test_check_flags_an_unlisted_patch(checkout):
    (checkout.patches / "9999-stray.patch").write_text("Description: x\n")
    res = check(checkout)
    assert any("9999-stray.patch is not listed" in m for m in res.problems)


def test_missing_header_field_fails(checkout):
    p = checkout.patches / load_series(checkout)[0].name
    p.write_text("\n".join(ln for ln in p.read_text().splitlines() if not ln.startswith("Compat-Hook:")) + "\n")
    res = check(checkout)
    assert any("'Compat-Hook' is missing" in m for m in res.problems)


def test_patch_adding_logic_outside_verl_compat_fails_check(checkout):
    p = checkout.patches / load_series(checkout)[0].name
    text = p.read_text().replace("+import verl_compat.activate", "+import os as _os")
    p.write_text(text)
    assert any("does not call verl_compat" in m for m in check(checkout).problems)


@pytest.mark.parametrize(
    ("patch", "seam", "logic", "words"),
    [
        (  # 0011 before the review: the gate written inside verl
            "0011-kernels-compile-and-triton-ce.patch",
            "+    _use_flash_ce = verl_compat.seams.flash_ce(_use_flash_ce)",
            "+    _use_flash_ce = _use_flash_ce and verl_compat.seams.use_triton()",
            "and",
        ),
        (  # 0003 before the review: an early return inside verl
            "0003-cpu-ray-resource-pools.patch",
            "+        verl_compat.cpu.check_ray_resources(self)",
            "+        if not verl_compat.cpu.ray_use_accelerator(): return verl_compat.cpu.check_ray_cpu_resources()",
            "if, return",
        ),
    ],
)
def test_patch_adding_control_flow_fails_check(checkout, patch, seam, logic, words):
    p = checkout.patches / patch
    text = p.read_text()
    assert seam in text
    p.write_text(text.replace(seam, logic, 1))
    problems = [m for m in check(checkout).problems if "adds control flow" in m]
    assert len(problems) == 1 and patch in problems[0] and f"({words})" in problems[0], problems


def test_control_flow_words_ignore_strings_comments_and_kept_keywords():
    assert not control_flow_words(['x = f("if a or b")  # if not, return', "import verl_compat.seams"])
    assert control_flow_words(["y = a if c else b"]) == {"if": 1, "else": 1}
    # upstream's own `if` on a replaced line is not added control flow (0011's torch.compile line)
    added, removed = ["    if verl_compat.seams.torch_compile(x)"], ["    if x  #  use torch compile by default"]
    assert not control_flow_words(added) - control_flow_words(removed)


def test_forwarded_field_follows_dep3(checkout):
    p = checkout.patches / "0005-value-model-attention-seam.patch"
    assert "\nForwarded: no\n" in p.read_text()  # an upstream bug (verl #5210), not yet forwarded
    p.write_text(p.read_text().replace("Forwarded: no", "Forwarded: maybe"))
    assert any("Forwarded 'maybe'" in m for m in check(checkout).problems)


def test_setup_imports_only_the_fork_tooling():
    """setup.py runs in pip's build environment: it imports verl_compat.fork and no runtime module."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['setup.py', '--name']\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
        "print(sorted(m for m in sys.modules if m.startswith('verl_compat')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = eval(out.stdout.strip().splitlines()[-1])
    assert "verl_compat.fork.materialize" in loaded
    assert all(m == "verl_compat" or m.startswith("verl_compat.fork") for m in loaded), loaded


def test_materialiser_refuses_a_wheel_with_the_wrong_sha256(tmp_path, wheel, monkeypatch):
    bad = tmp_path / wheel.name
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    shutil.copytree(ROOT / "patches", tmp_path / "co" / "patches")
    monkeypatch.setenv("VERL_COMPAT_UPSTREAM", str(bad))
    layout = Layout(tmp_path / "co")
    with pytest.raises(UpstreamError, match="does not match the pin"):
        materialize(layout, log=lambda m: None)
    assert not layout.target.exists()


def test_materialise_is_a_noop_when_unchanged_and_redone_when_the_series_changes(checkout):
    assert materialize(checkout, log=lambda m: None) == "materialised"
    assert materialize(checkout, log=lambda m: None) == "unchanged"
    stamp = read_stamp(checkout)
    assert stamp["upstream"] == "0.9.1" and stamp["patches"] == [p.name for p in load_series(checkout)]
    series = checkout.series
    series.write_text(series.read_text() + "# a comment changes the digest\n")
    assert materialize(checkout, log=lambda m: None) == "materialised"


def test_materialise_refuses_to_lose_hand_edits(checkout):
    materialize(checkout, log=lambda m: None)
    f = checkout.target / "protocol.py"
    f.write_text(f.read_text() + "\n# my edit\n")
    checkout.series.write_text(checkout.series.read_text() + "\n")
    with pytest.raises(MaterializeError, match="fork refresh"):
        materialize(checkout, log=lambda m: None)
    assert "# my edit" in f.read_text()


def test_conflicting_patch_names_patch_and_hunk_when_materialising(checkout):
    first = load_series(checkout)[0]
    p = checkout.patches / first.name
    p.write_text(p.read_text().replace(' os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")', " nope = 1"))
    with pytest.raises(MaterializeError) as e:
        materialize(checkout, log=lambda m: None)
    assert first.name in str(e.value) and "hunk #1" in str(e.value)


def test_refresh_regenerates_a_patch_from_the_edited_tree_deterministically(checkout):
    materialize(checkout, log=lambda m: None)
    first = load_series(checkout)[0]
    target = checkout.root / first.files[0].path
    text = target.read_text()
    marker = "import verl_compat.activate"
    assert marker in text
    target.write_text(text.replace(marker, "import verl_compat.activate  # edited seam", 1))
    res = refresh(checkout, today="2030-01-02")
    assert res.written == [first.name] and not res.unassigned
    new_text = (checkout.patches / first.name).read_text()
    assert "+import verl_compat.activate  # edited seam" in new_text and "Last-Update: 2030-01-02" in new_text
    assert check(checkout).ok
    again = refresh(checkout, today="2030-01-02")
    assert again.written == [] and (checkout.patches / first.name).read_text() == new_text
    assert materialize(checkout, log=lambda m: None) == "unchanged"


def test_refresh_reports_changes_no_patch_owns(checkout):
    materialize(checkout, log=lambda m: None)
    f = checkout.target / "protocol.py"
    f.write_text(f.read_text() + "\nimport verl_compat  # new seam\n")
    res = refresh(checkout)
    assert res.unassigned and res.unassigned[0].startswith("verl/protocol.py:")


def test_rebase_reports_per_patch_without_crashing():
    out = subprocess.run(
        [sys.executable, "-m", "verl_compat.cli", "fork", "rebase", "--to", "0.9.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode in (0, 1), out.stderr
    assert "rebase onto verl 0.9.0" in out.stdout
    for p in load_series(REPO):
        assert p.name in out.stdout
    assert "summary:" in out.stdout
