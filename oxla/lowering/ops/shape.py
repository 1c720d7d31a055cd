"""Shape ops: Constant, Identity, Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Expand,
ConstantOfShape, Range, EyeLike; shapes fold at trace time."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from oxla.dtypes import is_float, to_numpy_dtype
from oxla.lowering.common import axis_indices, check_size, xp
from oxla.lowering.registry import rule

# ConstantOfShape results up to this many elements stay static (numpy) so shape arithmetic folds;
# larger ones (weights in some models) are built by XLA as a broadcast instead of being baked into
# the program as constants (slow compiles; the same limit as LargeConstantToInitializerPass).
STATIC_FILL_LIMIT = 1024


@rule("Constant", since=1)
def constant(cx, *, sparse_value=None, value=None, value_float=None, value_floats=None,
             value_int=None, value_ints=None, value_string=None, value_strings=None):
    """Y = the one attribute given (v1: value; v11: sparse_value; v12+: value_* scalars, lists)."""
    given = {k: v for k, v in (("value", value), ("sparse_value", sparse_value),
                               ("value_float", value_float), ("value_floats", value_floats),
                               ("value_int", value_int), ("value_ints", value_ints),
                               ("value_string", value_string), ("value_strings", value_strings))
             if v is not None}
    if len(given) != 1:
        names = ", ".join(given) or "none"
        raise cx.fail(f"Constant needs exactly one value attribute, got {names}")
    (name, v), = given.items()
    if name in ("value", "sparse_value"):
        return np.asarray(v)
    if name.startswith("value_float"):
        return np.asarray(v, np.float32)
    if name.startswith("value_int"):
        return np.asarray(v, np.int64)
    return np.asarray(v, object)


@rule("Identity", since=1)
def identity(cx, x):
    """Y = X (tensors, sequences and optionals alike)."""
    return x


@rule("Shape", since=15)
def shape(cx, data, *, end=None, start=0):
    """The shape of data as int64, sliced [start:end] with clamping (v15+); always static."""
    dims = np.asarray(data.shape, np.int64)
    return dims[start:end]  # Python slicing clamps and wraps negatives exactly as the spec says


@rule("Shape", since=1)
def shape_v1(cx, data):
    """The shape of data as int64 (v1-v14); always static."""
    return np.asarray(data.shape, np.int64)


@rule("Size", since=1)
def size(cx, data):
    """The number of elements of data, as an int64 scalar; always static."""
    return np.asarray(math.prod(data.shape), np.int64)


def _reshape(cx, data, dims: Sequence[int], allowzero: int):
    if not allowzero:  # 0 copies the input's dim at that position
        if any(d == 0 and i >= len(data.shape) for i, d in enumerate(dims)):
            raise cx.fail(f"shape {tuple(dims)} copies a dim (0) past the input's rank "
                          f"{len(data.shape)}")
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    if sum(d == -1 for d in dims) > 1 or any(d < -1 for d in dims):
        raise cx.fail(f"shape {tuple(dims)} may hold one -1 and no other negative value")
    known = math.prod(d for d in dims if d != -1)
    total = math.prod(data.shape)
    if -1 in dims:
        if known == 0 or total % known:
            raise cx.fail(f"cannot reshape {tuple(data.shape)} to {tuple(dims)}")
        dims = [total // known if d == -1 else d for d in dims]
    elif known != total:
        raise cx.fail(f"cannot reshape {tuple(data.shape)} ({total} elements) to {tuple(dims)}")
    return xp(data).reshape(data, tuple(dims))


@rule("Reshape", since=14, static=("shape",))
def reshape(cx, data, shape, *, allowzero=0):
    """Y = data with the given shape: 0 copies the input dim (unless allowzero), -1 is inferred."""
    return _reshape(cx, data, cx.static_ints(shape), allowzero)


@rule("Reshape", since=5, static=("shape",))
def reshape_v5(cx, data, shape):
    """Y = data with the given shape: 0 copies the input dim, -1 is inferred (v5-v13)."""
    return _reshape(cx, data, cx.static_ints(shape), 0)


@rule("Reshape", since=1)
def reshape_v1(cx, data, *, consumed_inputs=None, shape=None):
    """Y = data with the shape attribute: 0 copies the input dim, -1 is inferred (v1-v4)."""
    if shape is None:
        raise cx.fail("attribute 'shape' is required")
    return _reshape(cx, data, shape, 0)


@rule("Flatten", since=1)
def flatten(cx, x, *, axis=1):
    """Y = X as 2-D (prod(dims[:axis]), prod(dims[axis:])); axis in [-r, r] (negative v11+)."""
    rank = len(x.shape)
    if not -rank <= axis <= rank:
        raise cx.fail(f"axis {axis} is out of range for rank {rank} (valid: {-rank}..{rank})")
    axis = axis + rank if axis < 0 else axis
    return xp(x).reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def _squeeze(cx, data, axes: Sequence[int] | None):
    if axes is None:
        drop = [i for i, d in enumerate(data.shape) if d == 1]
    else:
        drop = axis_indices(cx, axes, len(data.shape))
    wrong = [a for a in drop if data.shape[a] != 1]
    if wrong:
        raise cx.fail(f"cannot squeeze axes {wrong} of shape {tuple(data.shape)}: dims are not 1")
    return xp(data).reshape(data, tuple(d for i, d in enumerate(data.shape) if i not in drop))


@rule("Squeeze", since=13, static=("axes",))
def squeeze(cx, data, axes=None):
    """Y = data without the listed dims of size 1 (all of them when axes is absent) (v13+)."""
    return _squeeze(cx, data, None if axes is None else cx.static_ints(axes))


@rule("Squeeze", since=1)
def squeeze_v1(cx, data, *, axes=None):
    """Y = data without the listed dims of size 1, axes an attribute (v1-v12)."""
    return _squeeze(cx, data, axes)


def _unsqueeze(cx, data, axes: Sequence[int] | None):
    if axes is None:
        raise cx.fail("axes is required")
    rank = len(data.shape) + len(axes)
    new = set(axis_indices(cx, axes, rank))  # axes refer to the output's dims
    dims = iter(data.shape)
    return xp(data).reshape(data, tuple(1 if i in new else next(dims) for i in range(rank)))


@rule("Unsqueeze", since=13, static=("axes",))
def unsqueeze(cx, data, axes):
    """Y = data with dims of size 1 inserted at the output positions listed in axes (v13+)."""
    return _unsqueeze(cx, data, None if axes is None else cx.static_ints(axes))


@rule("Unsqueeze", since=1)
def unsqueeze_v1(cx, data, *, axes=None):
    """Y = data with dims of size 1 inserted at the output positions in the axes attribute (v1-v12)."""
    return _unsqueeze(cx, data, axes)


@rule("Expand", since=8, static=("shape",))
def expand(cx, x, shape):
    """Y = X broadcast with shape, numpy-style in both directions (a 1 in shape keeps X's dim)."""
    dims = cx.static_ints(shape)
    try:
        out = np.broadcast_shapes(tuple(x.shape), dims)
    except ValueError:
        raise cx.fail(f"shape {dims} does not broadcast with input shape {tuple(x.shape)}") from None
    check_size(cx, out, x.dtype)
    return xp(x).broadcast_to(x, out)


@rule("ConstantOfShape", since=9, static=("x",), fold=False)
def constant_of_shape(cx, x, *, value=None):
    """Y = a tensor of shape X filled with value's single element (default float32 0)."""
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    if fill.size != 1:
        raise cx.fail(f"value must hold exactly one element, got {fill.size}")
    dims = cx.static_ints(x)
    if any(d < 0 for d in dims):
        raise cx.fail(f"shape {dims} has a negative dim")
    check_size(cx, dims, fill.dtype)
    if math.prod(dims) <= STATIC_FILL_LIMIT:
        return np.full(dims, fill[0], fill.dtype)
    return jnp.full(dims, fill[0], fill.dtype)


def _arange(cx, start, limit, delta, compute: np.dtype) -> np.ndarray:
    scalars = [np.asarray(v) for v in (start, limit, delta)]
    if any(s.size != 1 for s in scalars):
        raise cx.fail(f"start, limit and delta must be scalars, got shapes "
                      f"{[s.shape for s in scalars]}")
    if compute.kind in "iu":
        s, lim, d = (int(v.reshape(())) for v in scalars)
        if d == 0:
            raise cx.fail("delta must not be 0")
        n = max(-((s - lim) // d), 0)  # ceil((limit - start) / delta), exact for integers
        check_size(cx, [n], np.int64)
        return (s + np.arange(n, dtype=np.int64) * d).astype(compute)
    fs, flim, fd = (v.reshape(()).astype(compute) for v in scalars)
    if fd == 0:
        raise cx.fail("delta must not be 0")
    quotient = float((flim - fs) / fd)
    if not math.isfinite(quotient):
        raise cx.fail(f"start, limit and delta must be finite, got {fs}, {flim}, {fd}")
    n = max(math.ceil(quotient), 0)
    check_size(cx, [n], compute)
    return fs + np.arange(n, dtype=compute) * fd


_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


@rule("Range", since=27, static=("start", "limit", "delta"))
def range_(cx, start, limit, delta, *, stash_type=1):
    """Y[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0) (v27+: float16 and
    bfloat16 computed in stash_type)."""
    dtype = np.dtype(start.dtype)
    if dtype in _LOW_FLOATS:
        compute = to_numpy_dtype(stash_type)
        if compute not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise cx.fail(f"stash_type must be FLOAT (1) or DOUBLE (11), got {stash_type}")
    else:
        compute = np.dtype(np.float64) if is_float(dtype) else dtype
    return _arange(cx, start, limit, delta, compute).astype(dtype)


@rule("Range", since=11, static=("start", "limit", "delta"))
def range_v11(cx, start, limit, delta):
    """Y[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0) (v11-v26)."""
    dtype = np.dtype(start.dtype)
    compute = np.dtype(np.float64) if is_float(dtype) else dtype
    return _arange(cx, start, limit, delta, compute).astype(dtype)


@rule("EyeLike", since=9)
def eye_like(cx, x, *, dtype=None, k=0):
    """Y = ones on diagonal k of a 2-D tensor shaped like X, zeros elsewhere; static."""
    cx.expect_rank("input", x, 2)
    out = np.dtype(x.dtype) if dtype is None else to_numpy_dtype(dtype)
    return np.eye(x.shape[0], x.shape[1], k, dtype=out)
