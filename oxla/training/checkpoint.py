"""Atomic file writes: a crash leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from onnx import ModelProto

from oxla.errors import TrainingError

CHUNK = 1 << 20


def _write_all(f: BinaryIO, data: bytes) -> None:
    """Write in chunks (a kill mid-write leaves a partial temp file, never a partial target)."""
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):
        f.write(view[start:start + CHUNK])


def _fsync_dir(folder: Path) -> None:
    # The rename is durable only once the folder's entry is on disk; some filesystems refuse.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _file_mode(target: Path) -> int:
    """The mode a plain open() would give (mkstemp makes 0600 files), or the target's own."""
    try:
        return target.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` through a temp file in the same folder, fsync, then rename.

    Returns:
        The path written.

    Raises:
        TrainingError: the folder is missing or not writable.
    """
    target = Path(path)
    folder = target.resolve().parent
    if not folder.is_dir():
        raise TrainingError(f"cannot write '{target}': folder '{folder}' does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise TrainingError(f"cannot write '{target}': {e.strerror}") from None
    try:
        os.fchmod(fd, _file_mode(target))
        with os.fdopen(fd, "wb") as f:
            _write_all(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)
    return target


def save_model(model: ModelProto, path: str | os.PathLike[str]) -> Path:
    """Serialize `model` and write it atomically."""
    return atomic_write(path, model.SerializeToString())
