"""Materialise `verl/` = pinned upstream wheel + patches/series, atomically, with a stamp for no-op re-runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from verl_compat.fork.apply import apply_series
from verl_compat.fork.pin import Layout, read_pin
from verl_compat.fork.series import load_series, series_digest
from verl_compat.fork.upstream import extract_package, fetch_wheel, verify_wheel


class MaterializeError(RuntimeError):
    pass


def tree_digest(root: Path) -> str:
    """Hash of every file under root (bytecode caches and the stamp excluded): detects hand edits to verl/."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix == ".pyc" or p.name == ".verl-compat-stamp.json":
            continue
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def read_stamp(layout: Layout) -> dict | None:
    try:
        return json.loads(layout.stamp.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def pristine_tree(layout: Layout, dest: Path, version: str | None = None, wheel: str | None = None) -> Path:
    """Unpack the pinned (or another) upstream release's verl/ into dest; returns dest (which holds verl/)."""
    pin = read_pin(layout)
    if version is None or version == pin.version:
        path = fetch_wheel(pin.version, pin.wheel, layout.cache)
        verify_wheel(path, pin.sha256)
    else:
        path = fetch_wheel(version, wheel or f"verl-{version}-py3-none-any.whl", layout.cache, use_env=False)
    extract_package(path, dest)
    return dest


def materialize(layout: Layout, force: bool = False, log=print) -> str:
    """Returns "unchanged" or "materialised". Raises MaterializeError naming the patch and hunk on a conflict."""
    pin = read_pin(layout)
    digest = series_digest(layout)
    stamp = read_stamp(layout)
    edited = stamp is not None and layout.target.is_dir() and tree_digest(layout.target) != stamp.get("tree")
    if edited and not force:
        raise MaterializeError(
            "verl/ has hand edits that are not in patches/ yet; materialising would lose them. "
            "Run `verl-compat fork refresh` to turn them into patches, or `verl-compat fork materialize --force` "
            "to discard them"
        )
    if stamp and not edited and stamp.get("series") == digest and stamp.get("sha256") == pin.sha256:
        return "unchanged"
    if layout.target.exists() and stamp is None and not force:
        raise MaterializeError(
            f"{layout.target} exists but was not made by verl-compat (no stamp); move it away or use --force"
        )
    layout.cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="materialize-", dir=layout.cache))
    try:
        pristine_tree(layout, scratch)
        patches = load_series(layout)
        reports = apply_series(scratch, patches)
        bad = [r for r in reports if r.status != "clean"]
        if bad:
            raise MaterializeError(
                f"patch {bad[0].name} does not apply to upstream verl {pin.version}: {bad[0].error}. "
                "Fix the patch (edit verl/ and run `verl-compat fork refresh`) or see `verl-compat fork check`"
            )
        new_tree = scratch / "verl"
        stamp_data = {
            "upstream": pin.version,
            "sha256": pin.sha256,
            "series": digest,
            "patches": [p.name for p in patches],
            "tree": tree_digest(new_tree),
        }
        (new_tree / ".verl-compat-stamp.json").write_text(json.dumps(stamp_data, indent=1) + "\n", encoding="utf-8")
        # swap in with two renames inside the same filesystem: verl/ is never half-written
        old = None
        if layout.target.exists():
            old = scratch / "old-verl"
            os.replace(layout.target, old)
        os.replace(new_tree, layout.target)
        log(f"verl-compat: materialised verl {pin.version} + {len(patches)} patches into {layout.target}")
        return "materialised"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
