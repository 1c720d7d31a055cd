"""Shape ops: Constant, Identity, Shape, Size, Reshape and friends; shapes fold at trace time."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from oxla.lowering.registry import rule


@rule("Constant", since=1)
def constant(cx, *, sparse_value=None, value=None, value_float=None, value_floats=None,
             value_int=None, value_ints=None, value_string=None, value_strings=None):
    """Y = the one attribute given (v1: value; v11: sparse_value; v12+: value_* scalars, lists)."""
    if value is not None:
        return np.asarray(value)
    if sparse_value is not None:
        return np.asarray(sparse_value)
    if value_float is not None:
        return np.asarray(value_float, np.float32)
    if value_floats is not None:
        return np.asarray(value_floats, np.float32)
    if value_int is not None:
        return np.asarray(value_int, np.int64)
    if value_ints is not None:
        return np.asarray(value_ints, np.int64)
    if value_string is not None:
        return np.asarray(value_string, object)
    if value_strings is not None:
        return np.asarray(value_strings, object)
    raise cx.fail("Constant needs exactly one value attribute")


@rule("Identity", since=1)
def identity(cx, x):
    """Y = X (tensors, sequences and optionals alike)."""
    return x


@rule("Shape", since=15)
def shape(cx, data, *, end=None, start=0):
    """The shape of data as int64, sliced [start:end] (v15+), always static."""
    dims = np.asarray(data.shape, np.int64)
    return dims[start:end] if end is not None else dims[start:]


@rule("Shape", since=1)
def shape_v1(cx, data):
    """The shape of data as int64 (v1-v14)."""
    return np.asarray(data.shape, np.int64)


@rule("Size", since=1)
def size(cx, data):
    """The number of elements of data, as an int64 scalar."""
    return np.asarray(int(np.prod(data.shape)), np.int64)


@rule("Reshape", since=5, static=("shape",))
def reshape(cx, data, shape, *, allowzero=0):
    """Y = data with the given shape: 0 copies the input dim (unless allowzero), -1 is inferred."""
    dims = [int(d) for d in np.asarray(shape).reshape(-1)]
    if not allowzero:
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return jnp.reshape(data, dims)
