"""`patches/series`: the order the patches apply in (quilt format, '#' comments, one patch a line)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from verl_compat.fork.patchfile import PatchFile, parse_patch
from verl_compat.fork.pin import Layout


def series_names(layout: Layout) -> list[str]:
    names = []
    for raw in layout.series.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.append(line.split()[0])  # quilt allows options such as -p1 after the name
    return names


def load_series(layout: Layout) -> list[PatchFile]:
    out = []
    for name in series_names(layout):
        path = layout.patches / name
        if not path.is_file():
            raise FileNotFoundError(f"patches/series lists {name!r} but patches/{name} does not exist")
        out.append(parse_patch(name, path.read_text(encoding="utf-8")))
    return out


def series_digest(layout: Layout) -> str:
    """Hash of the pin, the series and every listed patch: a change to any of them re-materialises."""
    h = hashlib.sha256()
    h.update(layout.pin_file.read_bytes())
    h.update(layout.series.read_bytes())
    for name in series_names(layout):
        p: Path = layout.patches / name
        h.update(name.encode() + b"\0")
        h.update(p.read_bytes() if p.is_file() else b"<missing>")
    return h.hexdigest()
