"""`verl-compat fork rebase --to VERSION`: how the series fares on another upstream release, patch by patch."""

from __future__ import annotations

import tempfile
from pathlib import Path

from verl_compat.fork.apply import PatchReport, apply_series
from verl_compat.fork.materialize import pristine_tree
from verl_compat.fork.pin import Layout
from verl_compat.fork.series import load_series


def rebase_report(layout: Layout, version: str) -> list[PatchReport]:
    patches = load_series(layout)
    with tempfile.TemporaryDirectory(dir=_scratch(layout)) as tmp:
        root = pristine_tree(layout, Path(tmp), version=version)
        # keep going past a conflict: the maintainer wants the whole picture in one run
        return apply_series(root, patches, allow_offset=True, stop_on_error=False)


def _scratch(layout: Layout) -> Path:
    layout.cache.mkdir(parents=True, exist_ok=True)
    return layout.cache


def format_report(version: str, reports: list[PatchReport], patches_by_name: dict | None = None) -> str:
    lines = [f"rebase onto verl {version}: {len(reports)} patches"]
    for r in reports:
        lines.append(f"  {r.status:<9} {r.name}")
        for h in r.hunks:
            if h.status == "offset":
                lines.append(f"      hunk #{h.index} {h.header} in {h.file}: offset {h.offset:+d}")
            elif h.status == "conflict":
                lines.append(f"      {h.detail}")
        if r.error and not any(h.status == "conflict" for h in r.hunks):
            lines.append(f"      {r.error}")
        if r.status == "conflict" and patches_by_name and r.name in patches_by_name:
            lines += _failing_hunk_text(patches_by_name[r.name], r)
    counts = {s: sum(r.status == s for r in reports) for s in ("clean", "offset", "conflict")}
    lines.append("summary: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def _failing_hunk_text(patch, report: PatchReport) -> list[str]:
    for h in report.hunks:
        if h.status != "conflict":
            continue
        for fd in patch.files:
            if fd.path == h.file and 0 < h.index <= len(fd.hunks):
                return ["      failing hunk:"] + [f"        {ln}" for ln in [h.header, *fd.hunks[h.index - 1].lines]]
    return []
