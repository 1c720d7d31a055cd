"""The host machine: files a user names (regular files only) and its memory."""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path

NOT_REGULAR = "not a regular file (a directory, device, FIFO or socket)"


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular file.

    Raises:
        OSError: the file cannot be opened or read, or it is not a regular file: /dev/zero would
            never end and a FIFO would block, so neither is read (strerror says which).
    """
    # O_NONBLOCK: opening a FIFO must not wait for a writer; for a regular file it means nothing
    try:
        fd = os.open(Path(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except ValueError:  # Python refuses a path with a NUL byte before the OS sees it
        raise OSError(errno.EINVAL, "the path contains a NUL byte", str(path)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, NOT_REGULAR, str(path))
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Refuse to replace `path` by renaming a temp file over it unless it is absent or a regular
    file: renaming over /dev/null (as root) or a directory would replace it.

    Raises:
        OSError: it exists and is a directory, a device, a FIFO, a socket or a link to one.
    """
    if not os.path.lexists(path) or is_regular(path):
        return
    if os.path.isdir(path):
        raise OSError(errno.EISDIR, "it is a directory", str(path))
    raise OSError(errno.EINVAL, "it is not a regular file (a device, FIFO or socket); writing "
                  "would replace it", str(path))


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names a regular file (symlinks followed); never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags (Linux: /proc/cpuinfo; elsewhere none are assumed)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_avx512() -> bool:
    """Whether this CPU has AVX-512F."""
    return "avx512f" in cpu_flags()


def has_avx2_fma() -> bool:
    """Whether this CPU has AVX2 and FMA."""
    return {"avx2", "fma"} <= cpu_flags()


@functools.cache
def machine_memory() -> int:
    """Physical memory in bytes (the default limit for one value)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 40
