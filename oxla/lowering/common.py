"""Helpers the rule families share: axes, accumulation dtypes, numpy-or-jax, random keys.

One implementation and one wording each, so that every op says "axis 3 is out of range for
rank 3 (valid: -3..2)" the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from oxla.errors import too_large
from oxla.host import machine_memory
from oxla.lowering.values import is_static
from oxla.lru import LRU

# Tables rules derive from their attributes (see `DerivedTables`): an interpreter keeps this many.
DERIVED_CACHE = 64


def axis_index(cx: Any, axis: int, rank: int, what: str = "axis") -> int:
    """A possibly negative axis as an index in [0, rank); fails when out of range."""
    if not -rank <= axis < rank:
        raise cx.fail(f"{what} {axis} is out of range for rank {rank} (valid: {-rank}..{rank - 1})")
    return axis % rank


class DerivedTables:
    """Tables rules derive from attribute values (a lookup dict, an n-gram trie), kept while the
    very same attribute objects come back: a host step parses its node's attributes once and
    passes those objects on every call, so its tables are built once. Each interpreter (a
    session's) holds its own, gone with it; rules reach it as `cx.derived`.

    Keyed by `what` and the objects' identities (hashing a vocabulary every call would cost what
    the cache saves); an entry holds its objects, so no other object takes their ids while it is
    cached. Rules use it for host values only: a trace parses attributes anew each time.
    """

    def __init__(self, maxsize: int = DERIVED_CACHE) -> None:
        self._tables: LRU[tuple[tuple[Any, ...], Any]] = LRU(maxsize)

    def get[T](self, what: str, sources: tuple[Any, ...], build: Callable[[], T]) -> T:
        key = (what, *map(id, sources))
        hit = self._tables.get(key, count_miss=False)
        if hit is not None and all(a is b for a, b in zip(hit[0], sources, strict=True)):
            return hit[1]  # type: ignore[no-any-return]
        value = build()
        self._tables.setdefault(key, (sources, value))
        return value


def axis_indices(cx: Any, axes: Iterable[int], rank: int, what: str = "axes") -> list[int]:
    """Distinct axes normalized to [0, rank), in the given order; fails on duplicates."""
    axes = tuple(int(a) for a in axes)
    out = [axis_index(cx, a, rank, what[:-1] if what.endswith("s") else what) for a in axes]
    if len(set(out)) != len(out):
        raise cx.fail(f"{what} {axes} name an axis twice")
    return out


def normalize_axes(cx: Any, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """Axes to reduce over, sorted and distinct; a scalar accepts axis 0 / -1 and has no axes."""
    if rank == 0:
        for a in axes:
            if a not in (0, -1):
                raise cx.fail(f"axis {a} is out of range for rank 0 (valid: -1..0)")
        return ()
    return tuple(sorted({axis_index(cx, int(a), rank) for a in axes}))


def memory_limit(cx: Any) -> int:
    """The most bytes one value may take: Options.memory_limit, else the machine's memory."""
    return cx.options.memory_limit or machine_memory()


def check_size(cx: Any, shape: Sequence[int], dtype: Any) -> None:
    """Refuse an output of `shape` larger than the memory limit before anything allocates it.

    Rules whose output size comes from input *values* (a shape, repeats, pads, a depth, a trip
    count) call it: folded constants and host steps compute eagerly, where the interpreter's own
    check on the result would come after the allocation.
    """
    if not all(isinstance(d, int | np.integer) for d in shape):
        return  # symbolic dims (jax.export): nothing is allocated here
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        return  # the rule reports a negative dimension in its own words
    size = math.prod(dims) * np.dtype(dtype).itemsize
    limit = memory_limit(cx)
    if size > limit:
        raise too_large(cx.ref.describe(), dims, np.dtype(dtype), size, limit)


_NUMPY = (np.ndarray, np.generic)


def check_eager(cx: Any, fn: Callable[..., Any], *values: Any, bounded: bool = True) -> None:
    """Before `fn(*values)` runs eagerly on static values (a folded constant, a host step),
    refuse an output over the memory limit; traced values need nothing (the interpreter checks
    their abstract outputs before XLA allocates them).

    `bounded`: the output has at most the product of the inputs' largest dims aligned from the
    right (broadcasting, matmul): within the limit, nothing more is computed. Otherwise (einsum)
    the shapes are evaluated abstractly every time.
    """
    arrays = [v for v in values if v is not None]
    # numpy values only: sequences and maps have no one output shape, traced values are checked
    # abstractly by the interpreter, strings are sized by their rules (this runs per host step)
    if not all(isinstance(v, _NUMPY) and v.dtype.kind != "O" for v in arrays):
        return
    if bounded:
        rank = max((v.ndim for v in arrays), default=0)
        dims = [1] * rank
        for v in arrays:
            for i, d in enumerate(reversed(v.shape)):
                if d > dims[i]:
                    dims[i] = d
        itemsize = max((v.itemsize for v in arrays), default=1)
        if math.prod(dims) * max(itemsize, 8) <= memory_limit(cx):
            return
    specs = [None if v is None else jax.ShapeDtypeStruct(v.shape, v.dtype) for v in values]
    try:
        out = jax.eval_shape(fn, *specs)
    except Exception:  # the computation itself fails: it reports that in its own words
        return
    for leaf in jax.tree.leaves(out):
        check_size(cx, leaf.shape, leaf.dtype)


def accum_dtype(dtype: Any) -> np.dtype:
    """The dtype to accumulate in: float32 for 16-bit and smaller floats, else the dtype itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def xp(*values: Any) -> Any:
    """numpy when every value is static (strings and folded shapes stay numpy), else jax.numpy."""
    return np if all(is_static(v) for v in values) else jnp


_ENTROPY = np.random.default_rng()


def _fresh_seed() -> np.ndarray:
    return np.asarray(_ENTROPY.integers(0, 2**63, dtype=np.int64))


def host_seed() -> jax.Array:
    """A seed drawn on the host every time the compiled function runs (never folded or merged:
    a side-effecting callback)."""
    return io_callback(_fresh_seed, jax.ShapeDtypeStruct((), jnp.int64))


def random_key(seed: float | None) -> jax.Array:
    """A PRNG key from a seed attribute, or from a fresh host seed on every run when absent."""
    return jax.random.key(int(seed) if seed is not None else host_seed())
