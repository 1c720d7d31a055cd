"""Atomic file writes: a crash leaves either the old file or the new one, never half of one;
models over protobuf's 2 GiB limit keep their tensors in a data file beside the model."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx import ModelProto, TensorProto

from oxla.errors import TrainingError
from oxla.load import ModelSource, iter_tensors, load_model

CHUNK = 1 << 20
# protobuf refuses to serialise 2 GiB; 64 MiB is left for the graph, names and small tensors
EXTERNAL_LIMIT = (1 << 31) - (1 << 26)
INLINE_BYTES = 1024   # smaller tensors stay in the model file (onnx's own size threshold)
ALIGN = 64            # tensor offsets in the data file, so a reader may map them aligned


def _write_all(f: BinaryIO, data: bytes | memoryview) -> None:
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


def _temp(target: Path, folder: Path) -> tuple[int, str]:
    try:
        return tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise TrainingError(f"cannot write '{target}': {e.strerror}") from None


def _write_temp(target: Path, folder: Path, chunks: Iterator[bytes | memoryview]) -> str:
    """Write `chunks` to a fsynced temp file beside `target`; returns its path (removed on failure)."""
    fd, tmp = _temp(target, folder)
    try:
        os.fchmod(fd, _file_mode(target))
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                _write_all(f, chunk)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:  # a full disk (ENOSPC) or a file-size limit (EFBIG): the old file stays
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise TrainingError(f"cannot write '{target}': {e.strerror or e}; the previous file, if "
                            "any, is unchanged") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` through a temp file in the same folder, fsync, then rename.

    Returns:
        The path written.

    Raises:
        TrainingError: the folder is missing or not writable.
    """
    target = Path(path)
    folder = _folder(target)
    tmp = _write_temp(target, folder, iter([data]))
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)
    return target


def _folder(target: Path) -> Path:
    """The folder to write `target` in; refuses a target that exists and is not a regular file
    (a directory, a device node, a socket: renaming over it would replace it)."""
    folder = target.resolve().parent
    if not folder.is_dir():
        raise TrainingError(f"cannot write '{target}': folder '{folder}' does not exist")
    if os.path.lexists(target) and not target.is_file():
        kind = "a directory" if target.is_dir() else "not a regular file"
        raise TrainingError(f"cannot write '{target}': it is {kind}")
    return folder


def _tensors(model: ModelProto) -> Iterator[TensorProto]:
    yield from iter_tensors(model.graph)
    for info in model.training_info:
        yield from iter_tensors(info.initialization)
        yield from iter_tensors(info.algorithm)


def tensor_bytes(model: ModelProto) -> int:
    """The bytes the model's tensors hold in memory (raw data; typed fields counted too)."""
    # ByteSize serializes, which protobuf refuses over 2 GiB: raw data is measured directly
    return sum(len(t.raw_data) if t.HasField("raw_data") else t.ByteSize() for t in _tensors(model))


def _our_data_files(target: Path) -> set[str]:
    """Data files an earlier save of `target` wrote (to remove once the new model is in place)."""
    try:
        old = onnx.load(str(target), load_external_data=False)
    except Exception:  # no file, or not a model: nothing of ours to remove
        return set()
    prefix = f"{target.name}."
    return {e.value for t in _tensors(old) for e in t.external_data
            if e.key == "location" and e.value.startswith(prefix) and e.value.endswith(".data")}


def _externalize(model: ModelProto, location: str) -> list[memoryview]:
    """Move every tensor of INLINE_BYTES or more into `location`; returns the file's chunks."""
    chunks: list[memoryview] = []
    offset = 0
    for t in _tensors(model):
        if not t.HasField("raw_data"):
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t), t.name))
        if len(t.raw_data) < INLINE_BYTES:
            continue
        pad = -offset % ALIGN
        if pad:
            chunks.append(memoryview(bytes(pad)))
            offset += pad
        raw = t.raw_data
        chunks.append(memoryview(raw))
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            t.external_data.add(key=key, value=value)
        offset += len(raw)
    return chunks


def save_model(model: ModelProto, path: str | os.PathLike[str], *, external_data: bool | None = None,
               limit: int = EXTERNAL_LIMIT) -> Path:
    """Serialize `model` and write it atomically, its tensors in a data file when large.

    With external data the tensors go to `NAME.<token>.data` beside the model (a fresh name
    each save, so the old model never points into a new data file): the data file is written
    and fsynced, then the model, then both renamed into place, data first; the data file of the
    previous save is removed last. A crash at any point leaves the old model whole (and maybe a
    stray temp or data file).

    Args:
        model: the model (modified: large tensors are moved out of it when external).
        path: the .onnx file to write.
        external_data: True to always, False to never, None (default) to write external data
            when the tensors hold more than `limit` bytes.
        limit: the automatic threshold (just under protobuf's 2 GiB; tests lower it).

    Returns:
        The path written.

    Raises:
        TrainingError: the folder is missing or not writable, or a model too large to write
            without external data.
    """
    target = Path(path)
    size = tensor_bytes(model)
    if external_data is None:
        external_data = size > limit
    if not external_data:
        if size > EXTERNAL_LIMIT:
            raise TrainingError(f"cannot write '{target}' as one file: its tensors hold {size} bytes, "
                                f"over protobuf's 2 GiB limit; save with external_data=True")
        return atomic_write(target, model.SerializeToString())
    folder = _folder(target)
    stale = _our_data_files(target)
    location = f"{target.name}.{secrets.token_hex(6)}.data"
    data_tmp = _write_temp(target, folder, iter(_externalize(model, location)))
    try:
        model_tmp = _write_temp(target, folder, iter([model.SerializeToString()]))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(data_tmp)
        raise
    os.replace(data_tmp, folder / location)
    os.replace(model_tmp, target)
    _fsync_dir(folder)
    for name in stale - {location}:
        with contextlib.suppress(OSError):
            (folder / name).unlink()
    return target


def load_saved(source: ModelSource) -> ModelProto:
    """load_model: a file with external data is checked by onnx.checker on its path (a model over
    2 GiB cannot be checked as one in-memory proto), and graph inputs/outputs without a shape
    load, as load_model's do.

    Raises:
        InvalidModelError: as load_model.
    """
    return load_model(source)
