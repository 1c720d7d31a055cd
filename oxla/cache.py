"""A persistent compilation cache, so a second process skips XLA compiles it has seen before."""

from __future__ import annotations

import os

import jax


def enable_compilation_cache(path: str | os.PathLike[str]) -> None:
    """Keep compiled XLA executables in `path` (JAX's persistent cache) for later processes.

    This sets JAX's process-wide cache options: every executable is cached, however fast its
    compile was. Call it before the first compile.
    """
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", os.fspath(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
