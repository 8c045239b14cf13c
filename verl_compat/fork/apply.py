"""Apply a series of patches to an unpacked upstream tree, file by file, exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from verl_compat.fork.patchfile import HunkConflict, HunkResult, PatchFile, apply_file_diff


@dataclass
class PatchReport:
    name: str
    hunks: list[HunkResult] = field(default_factory=list)
    error: str = ""

    @property
    def status(self) -> str:
        if self.error or any(h.status == "conflict" for h in self.hunks):
            return "conflict"
        if any(h.status == "offset" for h in self.hunks):
            return "offset"
        return "clean"


def _read(path: Path) -> tuple[list[str], bool]:
    text = path.read_text(encoding="utf-8")
    return text.splitlines(), text.endswith("\n")


def _write(path: Path, lines: list[str], trailing_newline: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + ("\n" if trailing_newline and lines else ""), encoding="utf-8")


def apply_patch(root: Path, patch: PatchFile, allow_offset: bool = False) -> PatchReport:
    """Apply one patch under `root` (which holds verl/). On a conflict nothing of this patch is written."""
    report = PatchReport(name=patch.name)
    staged: list[tuple[Path, list[str], bool]] = []
    for fd in patch.files:
        target = root / fd.path
        if target.is_file():
            old, nl = _read(target)
        elif all(h.old_start == 0 for h in fd.hunks):  # a patch may create a file
            old, nl = [], True
        else:
            report.error = f"{patch.name}: {fd.path} does not exist in upstream"
            return report
        try:
            new, results = apply_file_diff(patch.name, fd, old, allow_offset)
        except HunkConflict as e:
            report.hunks.append(e.result)
            report.error = e.result.detail
            return report
        report.hunks.extend(results)
        staged.append((target, new, nl))
    for target, new, nl in staged:
        _write(target, new, nl)
    return report


def apply_series(root: Path, patches: list[PatchFile], allow_offset: bool = False, stop_on_error: bool = True):
    """Apply patches in order; returns the per-patch reports (stops at the first conflict unless told not to)."""
    reports = []
    for p in patches:
        r = apply_patch(root, p, allow_offset=allow_offset)
        reports.append(r)
        if r.status == "conflict" and stop_on_error:
            break
    return reports
