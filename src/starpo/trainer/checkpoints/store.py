"""Atomic checkpoints and the RNG state that makes a resumed run repeat an unbroken one.

Layout: `run_dir/checkpoints/step_000010/{state.pt, meta.json}` (folder names from
`starpo.runs`). A checkpoint is written
into a hidden temp folder and renamed into place only once complete, and `meta.json`
(written last) records each file's size and SHA-256, so a crash mid-save, a truncated
copy or a flipped byte never makes a checkpoint that gets loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from starpo import runs
from starpo.errors import UserError
from starpo.logs import warn

FORMAT = 1
STATE_FILE = "state.pt"
META_FILE = "meta.json"
_TEMP_DIR = re.compile(r"\.(?:tmp|old)-step_\d+-(\d+)")
_warned_corrupt: set[Path] = set()


# ---- RNG state ---------------------------------------------------------------------------


def capture_rng_state(extra_generators: dict[str, torch.Generator] | None = None) -> dict:
    """Python, numpy-global, torch CPU/CUDA and named generators' states, to checkpoint."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generators": {name: g.get_state() for name, g in (extra_generators or {}).items()},
    }


def restore_rng_state(
    state: dict, extra_generators: dict[str, torch.Generator] | None = None
) -> None:
    """Put back what `capture_rng_state` recorded; the named generators must match."""
    extra_generators = extra_generators or {}
    saved = state["generators"]
    if set(saved) != set(extra_generators):
        raise ValueError(
            f"checkpoint has RNG generators {sorted(saved)}, caller passed "
            f"{sorted(extra_generators)}"
        )
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    # Resumed on other hardware (no GPU, or another GPU count), CUDA keeps its fresh seed:
    # the saved per-device states have no counterpart to go to.
    if state["cuda"] is not None and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
    for name, generator in extra_generators.items():
        generator.set_state(saved[name])


# ---- writing -----------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a no-op where directories can't be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


class _HashingWriter:
    """A write-only file that hashes the bytes passing through it.

    `torch.save` writes its zip archive front to back through `write` (it never seeks:
    this object has no `seek`, so a torch that tried would fail the save, not record a
    wrong hash), so the digest is the file's, without reading the file back.
    """

    CHUNK = 1 << 22  # hashed, then written while still in the CPU's cache

    def __init__(self, file: Any) -> None:
        self.file, self.digest = file, hashlib.sha256()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self.CHUNK):
            chunk = view[start : start + self.CHUNK]
            self.digest.update(chunk)
            self.file.write(chunk)
        return len(view)

    def flush(self) -> None:
        self.file.flush()


def _write_folder(folder: Path, step: int, state: dict[str, Any]) -> None:
    """state.pt (hashed as it is written), then meta.json describing it; both fsynced
    before the folder is renamed."""
    folder.mkdir(parents=True)
    state_path = folder / STATE_FILE
    with open(state_path, "wb") as file:
        writer = _HashingWriter(file)
        torch.save(state, writer)
        file.flush()
        os.fsync(file.fileno())
    meta = {
        "step": step,
        "format": FORMAT,
        "files": {STATE_FILE: state_path.stat().st_size},
        "sha256": {STATE_FILE: writer.digest.hexdigest()},
    }
    with open(folder / META_FILE, "w", encoding="utf-8") as file:
        json.dump(meta, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    _fsync_dir(folder)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_stale_temps(checkpoints: Path) -> None:
    """Temp folders of failed saves and removals only take disk space.

    Ours are stale too (this process saves one checkpoint at a time); another live
    process's are left alone.
    """
    if not checkpoints.is_dir():
        return
    for path in checkpoints.iterdir():
        match = _TEMP_DIR.fullmatch(path.name)
        if match:
            pid = int(match.group(1))
            if pid == os.getpid() or not _pid_alive(pid):
                shutil.rmtree(path, ignore_errors=True)


def _step_dirs(checkpoints: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every `step_N` folder, newest first; temp folders are skipped."""
    return runs.step_dirs(checkpoints)[::-1]


def save_checkpoint(
    run_dir: Path, step: int, state: dict[str, Any], keep: int, keep_every: int = 0
) -> Path:
    """Write `state` as `run_dir/checkpoints/step_NNNNNN/` atomically; keep the newest `keep`,
    and older ones whose step is a multiple of `keep_every` (0: none).

    An existing folder for the same step is replaced: it is removed first (POSIX cannot
    rename a folder over a non-empty one), so readers see the old checkpoint, then none
    for this step, then the new one, never a partial one.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    checkpoints = runs.RunFolder(run_dir).checkpoints
    checkpoints.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(checkpoints)
    name = runs.step_name(step)
    target = checkpoints / name
    tmp = checkpoints / f".tmp-{name}-{os.getpid()}"
    try:
        _write_folder(tmp, step, state)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        _remove(target)
    os.replace(tmp, target)
    _fsync_dir(checkpoints)
    for older, path in _step_dirs(checkpoints)[keep:]:
        if not (keep_every and older % keep_every == 0):
            _remove(path)
    return target


def _remove(folder: Path) -> None:
    """Delete a checkpoint folder; renamed first so that it vanishes at once, not file by file."""
    doomed = folder.with_name(f".old-{folder.name}-{os.getpid()}")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


# ---- finding and reading -----------------------------------------------------------------


def check_writable(run_dir: Path) -> None:
    """A one-line UserError when `run_dir` cannot be created or written (checked before
    any model loads, so a mistyped or read-only --out costs nothing)."""
    runs.check_writable(run_dir)


def check_free_space(run_dir: Path, need_bytes: int) -> None:
    """A one-line UserError when the disk of `run_dir` has less room than one checkpoint
    needs (with a 10% margin). A save that still runs out of space fails before its rename,
    so the previous checkpoint stays the one resume loads."""
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes * 1.1:
        raise UserError(
            f"a checkpoint of this run needs about {need_bytes / 2**30:.2f} GiB, and the disk "
            f"of {run_dir} has {free / 2**30:.2f} GiB free; free some space or choose "
            "another --out"
        )


def checkpoint_bytes(folder: Path) -> int:
    """Bytes on disk of one checkpoint folder."""
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def _read_meta(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _problem(folder: Path, step: int | None = None) -> str | None:
    """Why `folder` is not a usable checkpoint, or None when its files match meta.json.

    `step`, when given, is the step the folder's name promises.
    """
    meta = _read_meta(folder)
    if meta is None:
        return f"missing or unreadable {META_FILE}"
    if meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        return f"{META_FILE} is not format {FORMAT}"
    if step is not None and meta.get("step") != step:
        return f"{META_FILE} records step {meta.get('step')}, not {step}"
    for name, size in meta["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, expected {size}"
    return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder of `run_dir`, or None.

    Incomplete or corrupt folders are skipped with one warning each on stderr; a
    checkpoint's content hash is only checked by `load_checkpoint` (reading 0.5 GB of
    weights just to list checkpoints would be slow).
    """
    for step, folder in _step_dirs(runs.RunFolder(run_dir).checkpoints):
        problem = _problem(folder, step)
        if problem is None:
            return folder
        if folder not in _warned_corrupt:
            _warned_corrupt.add(folder)
            warn(f"skipping corrupt checkpoint {folder}: {problem}", "starpo.checkpoint")
    return None


def find_resume_point(run_dir: Path) -> Path:
    """The checkpoint `--resume` continues from; a UserError when there is none.

    Folders a killed run left half-written or half-removed are deleted first: a resumed
    run may finish without another save, which is where they are otherwise cleaned up.
    """
    _remove_stale_temps(runs.RunFolder(run_dir).checkpoints)
    folder = latest_checkpoint(run_dir)
    if folder is None:
        raise UserError(
            f"no checkpoint in {runs.RunFolder(run_dir).checkpoints} to resume from; "
            "start without --resume"
        )
    return folder


def checkpoint_step(folder: Path) -> int:
    """The training step a checkpoint folder was saved at (from its meta.json)."""
    meta = _read_meta(Path(folder))
    if meta is None or not isinstance(meta.get("step"), int):
        raise UserError(f"{folder} is not a checkpoint folder (no valid {META_FILE})")
    return meta["step"]


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """The state dict saved by `save_checkpoint`, from its folder (or its state.pt).

    Uses `torch.load(weights_only=False)`: the state holds numpy RNG tuples and config
    dicts, and the file is one this package wrote. Never point it at untrusted files.
    Tensors land on `map_location` (CPU by default; load_state_dict moves them).
    """
    path = Path(path)
    folder, file = (path.parent, path) if path.is_file() else (path, path / STATE_FILE)
    advice = "delete it or resume from an earlier checkpoint"
    meta = _read_meta(folder)
    if meta is not None:  # a bare state.pt without meta.json is loaded unchecked
        problem = _problem(folder)
        expected = meta.get("sha256", {}).get(file.name)
        if problem is None and expected and _sha256(file) != expected:
            problem = f"{file.name} does not match its recorded SHA-256"
        if problem is not None:
            raise UserError(f"checkpoint {folder} is corrupt ({problem}); {advice}")
    try:
        return torch.load(file, map_location=map_location, weights_only=False)
    except FileNotFoundError as exc:
        raise UserError(f"no checkpoint file {file}; {advice}") from exc
    except Exception as exc:  # torch raises many types (pickle, zip, EOF) for one cause
        raise UserError(f"checkpoint {file} is corrupt ({exc}); {advice}") from exc
