"""Checkpoints that are complete or not used: a manifest written last, verified on resume.

verl writes `global_step_N/` (actor and critic shards from the workers, `data.pt` from the trainer) and then
`latest_checkpointed_iteration.txt`. Resume trusts that tracker: a file truncated by a full disk or a copy that
stopped half-way makes resume die ~95 s later deep inside torch.load, naming neither the file nor the folder; a
tracker pointing at a deleted folder silently trains from scratch; an empty tracker (killed while writing it)
crashes on int('').

Seams (patches/0013): `seal(folder)` in the trainer's `_save_checkpoint`, after every file is written and before
the tracker; `resume_folder(root)` instead of `find_latest_ckpt_path` in `_load_checkpoint`;
`check_resume_path(folder)` for an explicit `trainer.resume_from_path`. The driver runs `check_at_startup` before
Ray starts, so a folder with no usable checkpoint stops the job at once.

A folder is complete when its manifest lists every file with its size and each file has that size and a whole
framing (torch zip directory, safetensors header). Folders without a manifest (saved by upstream verl, or with
`async_save`) are accepted only up to the tracker's step and only with a whole framing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_compat.errors import InvalidSettingError

log = logging.getLogger("verl_compat.checkpoints")

MANIFEST = "verl_compat_manifest.json"
TRACKER = "latest_checkpointed_iteration.txt"  # verl/utils/checkpoint/checkpoint_manager.py
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_FORMAT = 1


@dataclass(frozen=True)
class Problem:
    """Why a checkpoint folder cannot be resumed from: the first bad file and what is wrong with it."""

    folder: Path
    file: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}"


# Save side ------------------------------------------------------------------------------------------------------
def seal(folder: str | os.PathLike[str]) -> Path:
    """Write `folder`'s manifest (every file with its size). Call once every file of the checkpoint is written."""
    root = Path(folder)
    files = {rel: (root / rel).stat().st_size for rel in _walk(root)}
    tmp = root / f".{MANIFEST}.tmp"
    with tmp.open("w") as f:
        json.dump({"format": _FORMAT, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)  # atomic: a manifest is whole or absent
    log.info("verl-compat: sealed checkpoint %s (%d files)", root, len(files))
    return root / MANIFEST


def _walk(root: Path) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name in (MANIFEST, f".{MANIFEST}.tmp"):
                continue
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


# Verify side ----------------------------------------------------------------------------------------------------
def verify(folder: str | os.PathLike[str], *, legacy_ok: bool = False) -> Problem | None:
    """None when `folder` is a complete checkpoint. `legacy_ok`: a folder without a manifest is checked by the
    framing of its files only (checkpoints saved before this seam existed)."""
    root = Path(folder)
    manifest = root / MANIFEST
    if not root.is_dir():
        return Problem(root, root, "does not exist")
    if not manifest.exists():
        if not legacy_ok:
            return Problem(root, manifest, "is missing: the save of this checkpoint did not finish")
        names = _walk(root)
        if not names:
            return Problem(root, root, "is empty")
        return _first_framing_problem(root, names)
    try:
        listed = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Problem(root, manifest, f"cannot be read ({type(e).__name__}: {e})")
    for rel, size in sorted(listed.items()):
        path = root / rel
        try:
            actual = path.stat().st_size
        except OSError:
            return Problem(root, path, "is missing (the manifest lists it)")
        if actual != size:
            return Problem(root, path, f"has {actual} bytes, the manifest written at save time says {size}")
    return _first_framing_problem(root, sorted(listed))


def _first_framing_problem(root: Path, names: list[str]) -> Problem | None:
    for rel in names:
        reason = framing_problem(root / rel)
        if reason is not None:
            return Problem(root, root / rel, reason)
    return None


def framing_problem(path: Path) -> str | None:
    """Cheap whole-file check by format (reads a header or the zip directory, never the tensors)."""
    try:
        if path.suffix in (".pt", ".pth") and path.stat().st_size > 0:
            with zipfile.ZipFile(path) as z:  # torch.save's format; a cut file has no central directory
                size = path.stat().st_size
                if any(i.header_offset + i.compress_size > size for i in z.infolist()):
                    return "is cut short (a zip entry ends past the end of the file)"
        elif path.suffix == ".safetensors":
            return _safetensors_problem(path)
        elif path.suffix == ".json" and path.stat().st_size < 64 * 2**20:
            json.loads(path.read_text())
    except zipfile.BadZipFile:
        return "is not a whole torch checkpoint file (truncated: no zip directory at its end)"
    except (ValueError, UnicodeDecodeError) as e:
        return f"is not valid JSON ({e})"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "is cut short (no safetensors header)"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return "is cut short (the safetensors header runs past the end of the file)"
        header = json.loads(f.read(n))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"is cut short ({size} bytes; its header describes {8 + n + end})"
    return None


# Resume side ----------------------------------------------------------------------------------------------------
def step_folders(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, folder) of every `global_step_N` under `root`, newest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in base.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def tracker_step(root: str | os.PathLike[str]) -> int | None:
    path = Path(root) / TRACKER
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("verl-compat: %s cannot be read (%s); looking at the checkpoint folders themselves", path, e)
        return None


def _resume_candidates(root: str | os.PathLike[str]) -> tuple[Path | None, list[Problem]]:
    """The newest complete checkpoint under `root` (None when there is none) and the newer ones it skipped."""
    tracker = tracker_step(root)
    skipped: list[Problem] = []
    for step, folder in step_folders(root):
        problem = verify(folder, legacy_ok=tracker is not None and step <= tracker)
        if problem is None:
            return folder, skipped
        skipped.append(problem)
    return None, skipped


def resume_folder(root: str | os.PathLike[str], device: str = "this host") -> str | None:
    """The folder verl resumes from in `resume_mode=auto`: the newest complete `global_step_N` under `root`.

    None (train from scratch, as upstream) when `root` holds no checkpoint folder at all. An incomplete newer one
    is skipped with a warning naming the bad file; when none is complete, InvalidSettingError names `root`.
    """
    folder, skipped = _resume_candidates(root)
    for problem in skipped:
        log.warning("verl-compat: skipping checkpoint %s: %s", problem.folder.name, problem)
    if folder is not None:
        if skipped:
            log.warning("verl-compat: resuming from %s, the newest complete checkpoint", folder)
        return str(folder)
    if not skipped:
        return None
    raise InvalidSettingError(
        "trainer.default_local_dir",
        str(root),
        device,
        "resume_mode=auto found checkpoints but none is complete: " + "; ".join(str(p) for p in skipped),
        f"move the broken global_step_* folders out of {root} (then the job trains from scratch), restore them "
        "from a copy, or set trainer.resume_mode=disable",
    )


def check_resume_path(folder: str | os.PathLike[str], device: str = "this host") -> None:
    """`trainer.resume_mode=resume_path`: the folder the user named must be complete (it is never replaced)."""
    root = Path(folder).parent
    problem = verify(folder, legacy_ok=_legacy_ok(folder))
    if problem is None:
        return
    newest, _ = _resume_candidates(root)
    alternative = f" (the newest complete one there is {newest})" if newest is not None else ""
    raise InvalidSettingError(
        "trainer.resume_from_path",
        str(folder),
        device,
        f"the checkpoint is not complete: {problem}",
        f"point trainer.resume_from_path at a complete checkpoint{alternative}, or set trainer.resume_mode=auto",
    )


def _legacy_ok(folder: str | os.PathLike[str]) -> bool:
    m = _STEP_DIR.match(Path(folder).name)
    tracker = tracker_step(Path(folder).parent)
    return m is not None and tracker is not None and int(m.group(1)) <= tracker


def check_at_startup(config: Any, device: str) -> None:
    """Driver side, before Ray: the checkpoint this job would resume from exists and is complete."""
    from omegaconf import OmegaConf

    mode = OmegaConf.select(config, "trainer.resume_mode", default="auto")
    if mode == "auto":
        root = OmegaConf.select(config, "trainer.default_local_dir", default=None)
        if root:
            resume_folder(os.path.abspath(os.path.expanduser(str(root))), device)
    elif mode == "resume_path":
        path = OmegaConf.select(config, "trainer.resume_from_path", default=None)
        if isinstance(path, str) and "global_step_" in path:  # other values: upstream's own assertions
            check_resume_path(os.path.abspath(os.path.expanduser(path)), device)
