"""`verl-compat fork check`: the series is well formed, every patch has its header, and all apply exactly."""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from verl_compat.fork.apply import apply_series
from verl_compat.fork.materialize import pristine_tree
from verl_compat.fork.patchfile import HOOKS, PatchFile
from verl_compat.fork.pin import Layout
from verl_compat.fork.series import load_series, series_names


@dataclass
class CheckResult:
    problems: list[str] = field(default_factory=list)
    patches: int = 0
    files: int = 0
    lines_removed: int = 0  # upstream lines a patch replaces or deletes
    lines_added: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def _header_problems(p: PatchFile) -> list[str]:
    out = [f"{p.name}: header field {f!r} is missing" for f in p.missing_header_fields()]
    hook = p.header.get("Compat-Hook", "")
    if hook and hook not in HOOKS:
        out.append(f"{p.name}: Compat-Hook {hook!r} is not one of {', '.join(HOOKS)}")
    forwarded = p.header.get("Forwarded", "")
    if forwarded and forwarded not in ("no", "not-needed") and not re.match(r"https?://", forwarded):
        out.append(f"{p.name}: Forwarded {forwarded!r} is not 'no', 'not-needed' or a URL (DEP-3)")
    date = p.header.get("Last-Update", "")
    if date and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        out.append(f"{p.name}: Last-Update {date!r} is not YYYY-MM-DD")
    if not p.files:
        out.append(f"{p.name}: has no diff")
    return out


# Python keywords that branch, loop, leave or catch. A seam is a call; `x if c else y`, `a and b` and an early
# `return` inside verl are logic, and logic lives in verl_compat (upstream's own keywords on a replaced line are
# allowed: only keywords the hunk adds count).
CONTROL_FLOW = frozenset(
    {
        "if", "elif", "else", "for", "while", "try", "except", "finally", "with", "return", "raise", "yield",
        "break", "continue", "and", "or", "lambda", "assert",
    }
)  # fmt: skip
_STRING = re.compile(r"""(?s)('{3}.*?'{3}|"{3}.*?"{3}|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")""")
_WORD = re.compile(r"\b[A-Za-z_]+\b")


def control_flow_words(lines: list[str]) -> Counter[str]:
    """Control-flow keywords in source lines, outside string literals and comments."""
    words: Counter[str] = Counter()
    for line in lines:
        code = _STRING.sub('""', line).split("#", 1)[0]
        words.update(w for w in _WORD.findall(code) if w in CONTROL_FLOW)
    return words


def _seam_problems(p: PatchFile) -> list[str]:
    """Seams only: every hunk that adds code calls into verl_compat and adds no control flow to verl."""
    out = []
    for fd in p.files:
        for k, h in enumerate(fd.hunks, 1):
            added = [ln[1:] for ln in h.lines if ln.startswith("+") and ln[1:].strip()]
            removed = [ln[1:] for ln in h.lines if ln.startswith("-")]
            where = f"{p.name}: hunk #{k} {h.header} of {fd.path}"
            if added and not any("verl_compat" in ln for ln in added):
                out.append(f"{where} adds code that does not call verl_compat")
            extra = control_flow_words(added) - control_flow_words(removed)
            if extra:
                words = ", ".join(sorted(extra))
                out.append(f"{where} adds control flow ({words}): move the logic into verl_compat, keep one call")
    return out


def check(layout: Layout) -> CheckResult:
    res = CheckResult()
    listed = series_names(layout)
    on_disk = sorted(q.name for q in layout.patches.glob("*.patch"))
    for name in sorted(set(on_disk) - set(listed)):
        res.problems.append(f"patches/{name} is not listed in patches/series")
    for name in [n for n in listed if not (layout.patches / n).is_file()]:
        res.problems.append(f"patches/series lists {name} but the file is missing")
    dupes = {n for n in listed if listed.count(n) > 1}
    res.problems += [f"patches/series lists {n} more than once" for n in sorted(dupes)]
    if res.problems:
        return res
    patches = load_series(layout)
    for p in patches:
        res.problems += _header_problems(p) + _seam_problems(p)
        for fd in p.files:
            for h in fd.hunks:
                res.lines_removed += sum(1 for ln in h.lines if ln.startswith("-"))
                res.lines_added += sum(1 for ln in h.lines if ln.startswith("+"))
    res.patches = len(patches)
    res.files = len({fd.path for p in patches for fd in p.files})
    with tempfile.TemporaryDirectory() as tmp:
        root = pristine_tree(layout, Path(tmp))
        for r in apply_series(root, patches, allow_offset=False, stop_on_error=False):
            if r.status != "clean":
                res.problems.append(r.error or f"{r.name}: does not apply")
    return res
