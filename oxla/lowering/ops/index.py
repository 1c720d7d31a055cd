"""Indexing: Gather*, Scatter*, TensorScatter, OneHot, NonZero, Compress, Unique, ReverseSequence."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from oxla.lowering.common import axis_index, check_size, xp
from oxla.lowering.registry import rule


def _wrap(cx, indices, size: int | np.ndarray, what: str = "indices"):
    """Indices as int64 with negative ones counted from the end; out-of-range ones are an error
    (the spec's; onnxruntime raises too), checked now when static, after the run when traced."""
    if isinstance(indices, np.ndarray | np.generic) and isinstance(size, int):
        # static indices (a host step, a constant): numpy, its extremes checked (no mask)
        indices = np.asarray(indices, np.int64)
        if not indices.size:
            return indices
        low, high = int(indices.min()), int(indices.max())
        if low < -size or high >= size:
            bad = (indices < -size) | (indices >= size)
            raise cx.fail(f"{what} {indices[bad].tolist()} out of range for size {size}")
        return indices if low >= 0 else np.where(indices < 0, indices + size, indices)
    indices = indices.astype(np.int64)
    if cx.is_static(indices) and np.size(indices):
        bad = (indices < -np.asarray(size)) | (indices >= np.asarray(size))
        if np.any(bad):
            raise cx.fail(f"{what} {np.asarray(indices)[bad].tolist()} out of range for size {size}")
    elif np.size(indices):
        n = np.asarray(size, np.int64)
        ok = ((indices >= -n) & (indices < n)).reshape(-1)
        witness = indices.reshape(-1)[jnp.argmin(ok)]
        cx.check(ok, f"{what} out of range for size {size} (valid: {-int(n)}..{int(n) - 1}), "
                     "got {witness}", witness)
    lib = xp(indices)  # numpy for static indices (a host step, a constant): no JAX dispatch
    return lib.where(indices < 0, indices + lib.asarray(size, lib.int64), indices)


def _element_index(cx, indices, axis: int, size: int) -> tuple:
    """The full index of each entry of `indices`: its own position, with `axis` replaced by its value."""
    grids = list(jnp.meshgrid(*[jnp.arange(n) for n in indices.shape], indexing="ij", sparse=True))
    grids[axis] = _wrap(cx, indices, size)
    return tuple(grids)


# --- Gather -----------------------------------------------------------------------------------

@rule("Gather", since=1)
def gather(cx, data, indices, *, axis=0):
    """out = take(data, indices, axis); indices may be negative (v1+; v11 made that official)."""
    ax = axis_index(cx, axis, max(len(data.shape), 1))
    # a few thousand constant indices into constant rows can make a huge constant
    check_size(cx, [*data.shape[:ax], *indices.shape, *data.shape[ax + 1:]], data.dtype)
    if data.dtype == object:  # strings live on the host
        return np.take(data, np.asarray(_wrap(cx, cx.static(indices), data.shape[ax])), axis=ax)
    return jnp.take(data, _wrap(cx, indices, data.shape[ax]), axis=ax)


@rule("GatherElements", since=11)
def gather_elements(cx, data, indices, *, axis=0):
    """out[i][j][k] = data[index[i][j][k]][j][k] for axis 0 (likewise for other axes) (v11+)."""
    ax = axis_index(cx, axis, max(len(data.shape), 1))
    cx.expect_rank("indices", indices, len(data.shape))
    return data[_element_index(cx, indices, ax, data.shape[ax])]


def _nd_index(cx, data, indices, batch_dims: int) -> tuple:
    """Advanced index selecting data[b..., indices[b..., i..., :]] on data flattened to one batch dim."""
    k = indices.shape[-1]
    if not 1 <= k <= len(data.shape) - batch_dims:
        raise cx.fail(f"indices.shape[-1] must lie in [1, {len(data.shape) - batch_dims}], got {k}")
    if data.shape[:batch_dims] != indices.shape[:batch_dims]:
        raise cx.shape_error(f"the first {batch_dims} dims of data {data.shape} and indices "
                      f"{indices.shape} must be equal (batch_dims)")
    inner = indices.shape[batch_dims:-1]
    batch = jnp.arange(int(np.prod(data.shape[:batch_dims]))).reshape((-1,) + (1,) * len(inner))
    flat = indices.reshape((-1, *inner, k))
    dims = data.shape[batch_dims:]
    return (batch, *(_wrap(cx, flat[..., j], dims[j]) for j in range(k)))


@rule("GatherND", since=11)
def gather_nd(cx, data, indices, *, batch_dims=0):
    """out[b..., i...] = data[b..., indices[b..., i...]] (v11+; v12: batch_dims)."""
    index = _nd_index(cx, data, indices, batch_dims)
    flat = data.reshape((-1, *data.shape[batch_dims:]))
    out = flat[index]
    return out.reshape(data.shape[:batch_dims] + out.shape[1:])


# --- Scatter ----------------------------------------------------------------------------------

def _apply(cx, target, reduction: str, updates):
    """target is `data.at[index]`; `reduction` says how updates combine with what is there."""
    ops = {"none": target.set, "add": target.add, "mul": target.multiply,
           "max": target.max, "min": target.min}
    if reduction not in ops:
        raise cx.fail(f"reduction must be one of {', '.join(ops)}, got '{reduction}'")
    return ops[reduction](updates)


def _scatter_elements(cx, data, indices, updates, axis: int, reduction: str):
    ax = axis_index(cx, axis, max(len(data.shape), 1))
    cx.expect_rank("indices", indices, len(data.shape))
    if indices.shape != updates.shape:
        raise cx.shape_error(f"indices {indices.shape} and updates {updates.shape} must have one shape")
    return _apply(cx, data.at[_element_index(cx, indices, ax, data.shape[ax])], reduction, updates)


@rule("ScatterElements", since=11)
def scatter_elements(cx, data, indices, updates, *, axis=0, reduction="none"):
    """out = data; out[index[i][j]][j] (axis 0) = / += / *= / max= / min= updates[i][j] (v11+; v16, v18: reduction)."""
    return _scatter_elements(cx, data, indices, updates, axis, reduction)


@rule("Scatter", since=9)
def scatter(cx, data, indices, updates, *, axis=0):
    """ScatterElements without reduction (v9-v10; deprecated from v11)."""
    return _scatter_elements(cx, data, indices, updates, axis, "none")


@rule("ScatterND", since=11)
def scatter_nd(cx, data, indices, updates, *, reduction="none"):
    """out = data; out[indices[i...]] = (or reduce with) updates[i...] (v11+; v16, v18: reduction)."""
    k = indices.shape[-1]
    if not 1 <= k <= len(data.shape):
        raise cx.fail(f"indices.shape[-1] must lie in [1, {len(data.shape)}], got {k}")
    index = tuple(_wrap(cx, indices[..., j], data.shape[j]) for j in range(k))
    return _apply(cx, data.at[index], reduction, updates)


@rule("TensorScatter", since=24)
def tensor_scatter(cx, past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """present = past; present[b, ..., w[b] + s, ...] = update[b, ..., s, ...] along axis (v24+)."""
    rank = len(past_cache.shape)
    ax = axis_index(cx, axis, max(rank, 1))
    if ax == 0:
        raise cx.fail("axis must not be the batch axis 0")
    if mode not in ("linear", "circular"):
        raise cx.fail(f"mode must be 'linear' or 'circular', got '{mode}'")
    batch, seq, max_seq = past_cache.shape[0], update.shape[ax], past_cache.shape[ax]
    start = jnp.zeros((batch,), jnp.int64) if write_indices is None else write_indices.astype(jnp.int64)
    pos = start[:, None] + jnp.arange(seq)  # (batch, seq)
    if mode == "circular":
        pos = pos % max_seq
    grids = list(jnp.meshgrid(*[jnp.arange(n) for n in update.shape], indexing="ij", sparse=True))
    shape = [1] * rank
    shape[0], shape[ax] = batch, seq
    grids[ax] = pos.reshape(shape)
    # positions past the end are dropped in linear mode (the spec leaves them undefined)
    return past_cache.at[tuple(grids)].set(update, mode="drop")


# --- one-hot, selection -----------------------------------------------------------------------

@rule("OneHot", since=9, static=("depth",))
def one_hot(cx, indices, depth, values, *, axis=-1):
    """out[..., d, ...] = values[1] where indices == d (negative counted from depth) else values[0] (v9+)."""
    n = int(np.asarray(depth).reshape(-1)[0])  # depth may be a float, or a 1-element vector
    if n < 1:
        raise cx.fail(f"depth must be positive, got {n}")
    rank = len(indices.shape) + 1
    ax = axis_index(cx, axis, max(rank, 1))
    shape = list(indices.shape)
    shape.insert(ax, n)
    check_size(cx, shape, values.dtype)
    idx = jnp.expand_dims(indices.astype(jnp.int64), ax)  # float indices truncate, as the reference does
    idx = jnp.where(idx < 0, idx + n, idx)  # v11: negative indices count from depth
    shape = [1] * rank
    shape[ax] = n
    hot = idx == jnp.arange(n).reshape(shape)
    if values.dtype == object:  # strings live on the host
        return np.where(np.asarray(cx.static(hot)), values.reshape(-1)[1], values.reshape(-1)[0])
    values = values.reshape(-1)
    return jnp.where(hot, values[1], values[0])


@rule("NonZero", since=9, static=("*",))
def non_zero(cx, x):
    """Indices of the non-zero elements, shape (rank, count), row-major order (host op, v9+)."""
    x = np.asarray(x)
    count = int(np.count_nonzero(x))
    if x.ndim == 0:
        return np.zeros((0, count), np.int64)
    check_size(cx, [x.ndim, count], np.int64)  # before np.nonzero allocates the rows
    return np.stack(np.nonzero(x)).astype(np.int64)


@rule("Compress", since=9, static=("condition",))
def compress(cx, input, condition, *, axis=None):
    """numpy.compress: the slices along axis (the flat input if absent) where condition holds (v9+)."""
    cond = np.asarray(condition).reshape(-1).astype(bool)
    data = input.reshape(-1) if axis is None else input
    ax = 0 if axis is None else axis_index(cx, axis, max(len(input.shape), 1))
    if cond.size > data.shape[ax] and cond[data.shape[ax]:].any():
        raise cx.fail(f"condition selects index {int(np.flatnonzero(cond)[-1])} beyond size {data.shape[ax]}")
    # a condition shorter than the axis leaves the rest unselected, as numpy does
    keep = np.flatnonzero(cond[: data.shape[ax]])
    if cx.is_static(data):
        return np.take(np.asarray(data), keep, axis=ax)
    return jnp.take(data, jnp.asarray(keep), axis=ax)


@rule("Unique", since=11, static=("*",))
def unique(cx, x, *, axis=None, sorted=1):
    """(Y, indices, inverse_indices, counts) of the unique elements or slices along axis (host op, v11+)."""
    x = np.asarray(x)
    data = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else axis_index(cx, axis, max(x.ndim, 1))
    check_size(cx, [3, data.size], np.int64)  # first, inverse and counts: one int64 per element at most
    y, first, inverse, counts = np.unique(data, return_index=True, return_inverse=True,
                                          return_counts=True, axis=ax)
    inverse = inverse.reshape(-1)
    if not sorted:
        # order by first occurrence; inverse indices follow the new positions
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(data, first, axis=ax)
    i64 = np.int64
    return y, first.astype(i64), inverse.astype(i64), counts.astype(i64)


@rule("ReverseSequence", since=10)
def reverse_sequence(cx, input, sequence_lens, *, batch_axis=1, time_axis=0):
    """Per batch entry b, reverse the first sequence_lens[b] steps along time_axis (v10+)."""
    rank = len(input.shape)
    if {batch_axis, time_axis} != {0, 1}:
        raise cx.fail(f"batch_axis and time_axis must be 0 and 1 in some order, got {batch_axis} and {time_axis}")
    bx, tx = batch_axis, time_axis
    steps = jnp.arange(input.shape[tx])[None, :]
    lens = sequence_lens.astype(jnp.int64)[:, None]
    src = jnp.where(steps < lens, lens - 1 - steps, steps)  # (batch, time)
    if bx > tx:
        src = src.T
    shape = [1] * rank
    shape[bx], shape[tx] = input.shape[bx], input.shape[tx]
    src = jnp.broadcast_to(src.reshape(shape), input.shape)
    return jnp.take_along_axis(input, src, axis=tx)
