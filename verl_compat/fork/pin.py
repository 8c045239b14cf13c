"""The pin (`patches/upstream.toml`) and the repository paths the fork tooling works on."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib is not in the standard library; the pin file is flat enough to read by hand
    tomllib = None


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    wheel: str
    sha256: str


@dataclass(frozen=True)
class Layout:
    """Where things live in a checkout: root/patches, root/verl, root/.verl-compat (scratch and cache)."""

    root: Path
    cache_dir: Path | None = None  # where wheels and scratch trees go; default root/.verl-compat

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def series(self) -> Path:
        return self.patches / "series"

    @property
    def pin_file(self) -> Path:
        return self.patches / "upstream.toml"

    @property
    def target(self) -> Path:
        return self.root / "verl"

    @property
    def stamp(self) -> Path:
        return self.target / ".verl-compat-stamp.json"

    @property
    def cache(self) -> Path:
        return self.cache_dir or self.root / ".verl-compat"


def _parse_flat_toml(text: str) -> dict:
    out: dict = {}
    section = out
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = out.setdefault(line[1:-1].strip(), {})
            continue
        key, _, value = line.partition("=")
        section[key.strip()] = value.strip().strip('"')
    return out


def read_pin(layout: Layout) -> Pin:
    text = layout.pin_file.read_text(encoding="utf-8")
    data = tomllib.loads(text) if tomllib else _parse_flat_toml(text)
    up = data["upstream"]
    return Pin(name=up["name"], version=up["version"], wheel=up["wheel"], sha256=up["sha256"].lower())


def find_root(start: Path | None = None) -> Path:
    """The checkout root: the nearest folder above `start` (default: this file) holding patches/series."""
    here = (start or Path(__file__)).resolve()
    for p in [here, *here.parents]:
        if (p / "patches" / "series").is_file():
            return p
    raise FileNotFoundError(
        "cannot find the verl-compat checkout (a folder with patches/series); run from the repository root"
    )
