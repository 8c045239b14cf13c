"""Getting a pristine upstream verl: the wheel (from VERL_COMPAT_UPSTREAM, the cache or pip), verified, unpacked."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ENV_WHEEL = "VERL_COMPAT_UPSTREAM"


class UpstreamError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(version: str, wheel_name: str, cache: Path, use_env: bool = True) -> Path:
    """Path to the upstream wheel: $VERL_COMPAT_UPSTREAM, else the cache, else `pip download` into the cache."""
    env = os.environ.get(ENV_WHEEL, "").strip() if use_env else ""
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            p = p / wheel_name
        if not p.is_file():
            raise UpstreamError(f"{ENV_WHEEL}={env} does not point at {wheel_name} (a file or a folder holding it)")
        return p
    cached = cache / "wheels" / wheel_name
    if cached.is_file():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    before = set(cached.parent.glob(f"verl-{version}-*.whl"))
    # pip knows the index (and any mirror the user configured); never name an index host here
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    cmd += ["-d", str(cached.parent), f"verl=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not cached.is_file():  # another release may carry another wheel tag than the name we guessed
        got = sorted(set(cached.parent.glob(f"verl-{version}-*.whl")) - before)
        if proc.returncode == 0 and got:
            return got[0]
    if proc.returncode != 0 or not cached.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise UpstreamError(
            f"could not download upstream verl {version} with pip ({' | '.join(tail)}). "
            f"On a machine without a package index, download {wheel_name} elsewhere and set {ENV_WHEEL}=/path/to/it"
        )
    return cached


def verify_wheel(path: Path, expected_sha256: str) -> None:
    got = sha256_of(path)
    if got != expected_sha256.lower():
        raise UpstreamError(
            f"refusing {path}: sha256 {got} does not match the pin {expected_sha256} in patches/upstream.toml. "
            "The file is not the pinned upstream release (corrupt download or a different build); delete it and "
            "retry, or fix the pin if you are deliberately moving to another release"
        )


def extract_package(wheel: Path, dest: Path, package: str = "verl") -> Path:
    """Extract only `package/` from the wheel into dest/package (the wheel's top-level tests/ and scripts/
    packages must never be installed)."""
    out = dest / package
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith(package + "/")]
        if not members:
            raise UpstreamError(f"{wheel} has no {package}/ package")
        for m in members:
            z.extract(m, dest)
    return out
