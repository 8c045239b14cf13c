"""Regenerate patch files from the edited `verl/` tree against pristine upstream, deterministically.

Every change between pristine upstream and `verl/` is a block of lines (difflib opcodes). A block belongs to the
patch that already touches that region of upstream; a block no patch touches is new and goes into the patch
named with `--into` (or is reported). Patch i is then the diff between upstream + blocks of patches < i and
upstream + blocks of patches <= i, so each patch keeps exact context for its place in the series.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from verl_compat.fork.apply import apply_patch
from verl_compat.fork.materialize import pristine_tree, read_stamp, tree_digest
from verl_compat.fork.patchfile import PatchFile
from verl_compat.fork.pin import Layout
from verl_compat.fork.series import load_series

Block = tuple[int, int, int, int]  # difflib opcode ranges: upstream [i1, i2) became edited [j1, j2)


@dataclass
class RefreshResult:
    written: list[str]
    unchanged: list[str]
    unassigned: list[str]  # "path:line" of changes no patch owns (only when --into is not given)


def _blocks(old: list[str], new: list[str]) -> list[Block]:
    sm = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"]


def _touched_regions(pristine: list[str], patches_for_file: list[tuple[int, list[str]]]) -> dict[int, list[Block]]:
    """Upstream regions each existing patch touches: replay the patches and diff each step back to upstream."""
    regions: dict[int, list[Block]] = {}
    seen: set[Block] = set()
    for idx, after in patches_for_file:
        blocks = set(_blocks(pristine, after))
        regions[idx] = sorted(blocks - seen) or sorted(blocks)
        seen |= blocks
    return regions


def _overlaps(b: Block, region: Block) -> bool:
    lo, hi = b[0], max(b[1], b[0] + 1)
    rlo, rhi = region[0] - 1, max(region[1], region[0] + 1) + 1  # adjacent edits stay with their patch
    return lo < rhi and rlo < hi


def _compose(pristine: list[str], edited: list[str], blocks: list[Block]) -> list[str]:
    out: list[str] = []
    pos = 0
    for i1, i2, j1, j2 in sorted(blocks):
        out.extend(pristine[pos:i1])
        out.extend(edited[j1:j2])
        pos = i2
    out.extend(pristine[pos:])
    return out


def _unified(path: str, a: list[str], b: list[str]) -> list[str]:
    return list(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3, lineterm=""))


def render_patch(header_text: str, diffs: dict[str, list[str]]) -> str:
    body = []
    for path in sorted(diffs):
        body.extend(diffs[path])
    return header_text.rstrip("\n") + "\n---\n" + "\n".join(body) + "\n"


def refresh(layout: Layout, into: str | None = None, today: str | None = None) -> RefreshResult:
    stamp = read_stamp(layout)
    if stamp is None:
        raise RuntimeError("verl/ is not materialised; run `verl-compat fork materialize` first")
    patches = load_series(layout)
    names = [p.name for p in patches]
    if into is not None and into not in names:
        raise ValueError(f"--into {into!r} is not in patches/series ({', '.join(names)})")
    with tempfile.TemporaryDirectory(dir=layout.cache) as tmp:
        pristine_root = pristine_tree(layout, Path(tmp) / "pristine")
        # replay the current series to learn which upstream regions each patch owns
        replay_root = pristine_tree(layout, Path(tmp) / "replay")
        per_file_steps: dict[str, list[tuple[int, list[str]]]] = {}
        for idx, p in enumerate(patches):
            rep = apply_patch(replay_root, p)
            if rep.status != "clean":
                raise RuntimeError(f"the current series does not apply ({rep.error}); fix it before refreshing")
            for fd in p.files:
                per_file_steps.setdefault(fd.path, []).append(
                    (idx, (replay_root / fd.path).read_text(encoding="utf-8").splitlines())
                )
        changed = _changed_files(pristine_root, layout.root)
        owned: dict[int, dict[str, list[Block]]] = {i: {} for i in range(len(patches))}
        unassigned: list[str] = []
        texts: dict[str, tuple[list[str], list[str]]] = {}
        for rel in sorted(set(changed) | set(per_file_steps)):
            up_path, ed_path = pristine_root / rel, layout.root / rel
            up = up_path.read_text(encoding="utf-8").splitlines() if up_path.is_file() else []
            ed = ed_path.read_text(encoding="utf-8").splitlines() if ed_path.is_file() else []
            texts[rel] = (up, ed)
            regions = _touched_regions(up, per_file_steps.get(rel, []))
            for b in _blocks(up, ed):
                owner = next((i for i, regs in sorted(regions.items()) if any(_overlaps(b, r) for r in regs)), None)
                if owner is None and into is not None:
                    owner = names.index(into)
                if owner is None:
                    unassigned.append(f"{rel}:{b[2] + 1}")
                    continue
                owned[owner].setdefault(rel, []).append(b)
    written, unchanged = [], []
    applied: dict[str, list[Block]] = {}
    for idx, p in enumerate(patches):
        diffs = {}
        for rel, blocks in owned[idx].items():
            up, ed = texts[rel]
            before = _compose(up, ed, applied.get(rel, []))
            applied.setdefault(rel, []).extend(blocks)
            after = _compose(up, ed, applied[rel])
            diffs[rel] = _unified(rel, before, after)
        old_text = (layout.patches / p.name).read_text(encoding="utf-8")
        new_text = render_patch(_strip_separator(p), diffs)
        if _body(new_text) == _body(old_text):
            unchanged.append(p.name)
            continue
        new_text = _bump_last_update(new_text, today)
        (layout.patches / p.name).write_text(new_text, encoding="utf-8")
        written.append(p.name)
    if written and not unassigned:
        _restamp(layout)
    return RefreshResult(written=written, unchanged=unchanged, unassigned=unassigned)


def _changed_files(pristine_root: Path, repo_root: Path) -> list[str]:
    out = []
    up_dir, ed_dir = pristine_root / "verl", repo_root / "verl"
    for p in sorted(ed_dir.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix == ".pyc" or p.name == ".verl-compat-stamp.json":
            continue
        rel = p.relative_to(repo_root).as_posix()
        q = up_dir / p.relative_to(ed_dir)
        if not q.is_file() or q.read_bytes() != p.read_bytes():
            out.append(rel)
    return out


def _strip_separator(p: PatchFile) -> str:
    lines = p.header_text.splitlines()
    while lines and lines[-1].strip() in ("---", ""):
        lines.pop()
    return "\n".join(lines)


def _body(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("Last-Update:"))


def _bump_last_update(text: str, today: str | None) -> str:
    today = today or _dt.date.today().isoformat()
    return (
        "\n".join(f"Last-Update: {today}" if ln.startswith("Last-Update:") else ln for ln in text.splitlines()) + "\n"
    )


def _restamp(layout: Layout) -> None:
    import json

    from verl_compat.fork.series import series_digest

    stamp = read_stamp(layout) or {}
    stamp["series"] = series_digest(layout)
    stamp["tree"] = tree_digest(layout.target)
    layout.stamp.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
