"""Quilt-style patch files: a DEP-3 header, then unified diffs against paths `a/verl/...` -> `b/verl/...`.

Applying is exact: every context and removed line must match byte for byte. A hunk whose lines match only at
another position is an *offset* (reported, refused when materialising); no fuzz, no 3-way merge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HEADER_FIELDS = ("Description", "Forwarded", "Compat-Hook", "Last-Update")
HOOKS = ("dtype", "attention", "kernels", "rollout", "memory", "platform")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchFormatError(ValueError):
    pass


@dataclass
class Hunk:
    old_start: int  # 1-based line number in the file before the patch (0 when the old range is empty)
    new_start: int
    lines: list[str]  # each starts with ' ', '-' or '+', without the trailing newline
    header: str = ""  # the '@@ ... @@' line, for messages

    @property
    def old_lines(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " -"]

    @property
    def new_lines(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " +"]


@dataclass
class FileDiff:
    path: str  # relative to the repository root, e.g. "verl/trainer/main_ppo.py"
    hunks: list[Hunk] = field(default_factory=list)


@dataclass
class PatchFile:
    name: str
    header: dict[str, str]
    header_text: str
    files: list[FileDiff]

    def missing_header_fields(self) -> list[str]:
        return [f for f in HEADER_FIELDS if not self.header.get(f)]


def _strip_prefix(path: str) -> str:
    path = path.split("\t", 1)[0].strip()
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse_patch(name: str, text: str) -> PatchFile:
    lines = text.splitlines()
    i = 0
    header_lines: list[str] = []
    while i < len(lines) and not lines[i].startswith("--- "):
        header_lines.append(lines[i])
        i += 1
    header: dict[str, str] = {}
    last = None
    for ln in header_lines:
        m = re.match(r"^([A-Za-z][A-Za-z-]*):\s*(.*)$", ln)
        if m and m.group(1) not in ("diff", "index"):
            last = m.group(1)
            header[last] = m.group(2).strip()
        elif last and ln.startswith(" ") and ln.strip():
            header[last] += "\n" + ln.strip()  # DEP-3 continuation line
    files: list[FileDiff] = []
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchFormatError(f"{name}: line {i + 1}: '---' not followed by '+++'")
        fd = FileDiff(path=_strip_prefix(lines[i + 1][4:]))
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise PatchFormatError(f"{name}: line {i + 1}: malformed hunk header {lines[i]!r}")
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(old_start=int(m.group(1)), new_start=int(m.group(3)), lines=[], header=lines[i])
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_n or seen_new < new_n):
                ln = lines[i]
                if ln.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                tag = ln[:1] or " "  # an empty line inside a hunk is an empty context line
                if tag not in " +-":
                    raise PatchFormatError(f"{name}: line {i + 1}: hunk {hunk.header} ends early")
                hunk.lines.append(tag + ln[1:])
                seen_old += tag in " -"
                seen_new += tag in " +"
                i += 1
            if seen_old != old_n or seen_new != new_n:
                raise PatchFormatError(f"{name}: hunk {hunk.header} in {fd.path} has the wrong line count")
            fd.hunks.append(hunk)
        files.append(fd)
    return PatchFile(name=name, header=header, header_text="\n".join(header_lines).rstrip("\n"), files=files)


@dataclass
class HunkResult:
    file: str
    index: int  # 1-based hunk number within the file
    header: str
    status: str  # "clean" | "offset" | "conflict"
    offset: int = 0
    detail: str = ""


class HunkConflict(Exception):
    def __init__(self, result: HunkResult):
        self.result = result
        super().__init__(result.detail)


def _find(lines: list[str], needle: list[str], expected: int) -> int | None:
    """Exact match position nearest to `expected` (0-based), or None."""
    if not needle:
        return max(0, min(expected, len(lines)))
    n = len(needle)
    best = None
    for pos in range(0, len(lines) - n + 1):
        if lines[pos : pos + n] == needle and (best is None or abs(pos - expected) < abs(best - expected)):
            best = pos
    return best


def apply_file_diff(
    patch_name: str, fd: FileDiff, old: list[str], allow_offset: bool
) -> tuple[list[str], list[HunkResult]]:
    """Apply one file's hunks to `old` (lines without newlines). Raises HunkConflict on the first failure."""
    out = list(old)
    shift = 0  # how far earlier hunks moved later line numbers
    results = []
    for k, h in enumerate(fd.hunks, 1):
        want = h.old_lines
        expected = (h.old_start - 1 if h.old_start > 0 else 0) + shift
        pos = expected if out[expected : expected + len(want)] == want else _find(out, want, expected)
        res = HunkResult(file=fd.path, index=k, header=h.header, status="clean")
        if pos is None:
            got = out[expected : expected + len(want)]
            first_bad = next(
                (j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got))
            )
            res.status = "conflict"
            res.detail = (
                f"{patch_name}: hunk #{k} {h.header} does not apply to {fd.path}: at line {expected + first_bad + 1} "
                f"the patch expects {want[first_bad] if first_bad < len(want) else '<end of file>'!r} "
                f"but the file has {got[first_bad] if first_bad < len(got) else '<end of file>'!r}"
            )
            raise HunkConflict(res)
        if pos != expected:
            res.status = "offset"
            res.offset = pos - expected
            res.detail = f"{patch_name}: hunk #{k} {h.header} of {fd.path} applies {res.offset:+d} lines away"
            if not allow_offset:
                res.status = "conflict"
                res.detail += " (materialising needs exact positions: run `verl-compat fork refresh`)"
                raise HunkConflict(res)
        out[pos : pos + len(want)] = h.new_lines
        shift += len(h.new_lines) - len(want) + (pos - expected)
        results.append(res)
    return out, results
