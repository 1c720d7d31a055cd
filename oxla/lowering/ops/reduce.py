"""Reductions: Reduce* (axes attribute, then axes input), ArgMax/ArgMin, CumSum/CumProd, TopK."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.common import normalize_axes
from oxla.lowering.registry import register_rule, rule


def _lowest(dtype) -> object:
    """The identity of max: -inf, or the least value of an integer / bool type."""
    if dtype == np.bool_:
        return False
    if jnp.issubdtype(dtype, jnp.floating):
        return -np.inf
    return jnp.iinfo(dtype).min


def _highest(dtype) -> object:
    """The identity of min: +inf, or the greatest value of an integer / bool type."""
    if dtype == np.bool_:
        return True
    if jnp.issubdtype(dtype, jnp.floating):
        return np.inf
    return jnp.iinfo(dtype).max


def _max(x, axes, keepdims):
    return jnp.max(x, axis=axes, keepdims=keepdims, initial=_lowest(x.dtype))


def _min(x, axes, keepdims):
    return jnp.min(x, axis=axes, keepdims=keepdims, initial=_highest(x.dtype))


def _sum(x, axes, keepdims):
    return jnp.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _prod(x, axes, keepdims):
    return jnp.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _mean(x, axes, keepdims):
    # integer means truncate back to the input type, as the reference does
    return jnp.mean(x, axis=axes, keepdims=keepdims).astype(x.dtype)


def _l1(x, axes, keepdims):
    return _sum(jnp.abs(x), axes, keepdims)


def _l2(x, axes, keepdims):
    return jnp.sqrt(_sum(x * x, axes, keepdims)).astype(x.dtype)


def _sum_square(x, axes, keepdims):
    return _sum(x * x, axes, keepdims)


def _log_sum(x, axes, keepdims):
    return jnp.log(_sum(x, axes, keepdims))


def _log_sum_exp(x, axes, keepdims):
    m = lax.stop_gradient(_max(x, axes, True))
    m = jnp.where(jnp.isfinite(m), m, jnp.zeros((), x.dtype))  # all -inf (or empty): log(0) = -inf
    out = jnp.log(_sum(jnp.exp(x - m), axes, True)) + m
    return out if keepdims else jnp.squeeze(out, axes)


REDUCTIONS: dict[str, tuple[Callable, str]] = {
    "ReduceSum": (_sum, "sum"),
    "ReduceMean": (_mean, "mean"),
    "ReduceMax": (_max, "max; empty set: -inf or the type's least value"),
    "ReduceMin": (_min, "min; empty set: +inf or the type's greatest value"),
    "ReduceProd": (_prod, "product"),
    "ReduceL1": (_l1, "sum |x|"),
    "ReduceL2": (_l2, "sqrt(sum x^2)"),
    "ReduceSumSquare": (_sum_square, "sum x^2"),
    "ReduceLogSum": (_log_sum, "log(sum x)"),
    "ReduceLogSumExp": (_log_sum_exp, "log(sum exp x)"),
}
AXES_INPUT_SINCE = {"ReduceSum": 13}  # every other Reduce* took axes as an input from v18


def _reduce(cx, f: Callable, data, axes: Sequence[int] | None, keepdims: int, noop: int):
    rank = len(data.shape)
    if not axes:
        # noop_with_empty_axes keeps every axis, but the elementwise part (abs, square...) still applies
        axes = () if noop else tuple(range(rank))
    return f(data, normalize_axes(cx, axes, rank), bool(keepdims))


def _reduce_family() -> None:
    for op, (f, what) in REDUCTIONS.items():
        since = AXES_INPUT_SINCE.get(op, 18)

        def with_attr(cx, data, *, axes=None, keepdims=1, _f=f):
            return _reduce(cx, _f, data, axes, keepdims, 0)

        def with_input(cx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0, _f=f):
            wanted = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
            return _reduce(cx, _f, data, wanted, keepdims, noop_with_empty_axes)

        name = "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")
        with_attr.__name__ = f"{name}_v1"
        with_attr.__doc__ = f"{op}: {what} over the axes attribute (all when absent) (v1-v{since - 1})."
        with_input.__name__ = name
        with_input.__doc__ = (f"{op}: {what} over the axes input; empty axes reduce all unless "
                              f"noop_with_empty_axes (v{since}+).")
        register_rule(op, 1, with_attr)
        register_rule(op, since, with_input, static=("axes",))


_reduce_family()


# --- ArgMax / ArgMin --------------------------------------------------------------------------

def _arg(cx, find: Callable, data, axis: int, keepdims: int, select_last_index: int):
    rank = len(data.shape)
    (ax,) = normalize_axes(cx, (axis,), rank)
    if select_last_index:
        # the last extreme is the first one of the reversed axis
        out = data.shape[ax] - 1 - find(jnp.flip(data, ax), axis=ax, keepdims=bool(keepdims))
    else:
        out = find(data, axis=ax, keepdims=bool(keepdims))
    return out.astype(jnp.int64)


@rule("ArgMax", since=1)
def arg_max(cx, data, *, axis=0, keepdims=1, select_last_index=0):
    """Index of the greatest value along axis, first one on ties unless select_last_index (v1+)."""
    return _arg(cx, jnp.argmax, data, axis, keepdims, select_last_index)


@rule("ArgMin", since=1)
def arg_min(cx, data, *, axis=0, keepdims=1, select_last_index=0):
    """Index of the least value along axis, first one on ties unless select_last_index (v1+)."""
    return _arg(cx, jnp.argmin, data, axis, keepdims, select_last_index)


# --- CumSum / CumProd -------------------------------------------------------------------------

def _scan(cx, scan: Callable, identity: int, x, axis, exclusive: int, reverse: int):
    (ax,) = normalize_axes(cx, cx.static_ints(axis, "input axis"), len(x.shape))
    if exclusive:
        # shift by one toward the scan's end, filling the start with the identity
        pad = [(0, 0)] * len(x.shape)
        pad[ax] = (0, 1) if reverse else (1, 0)
        padded = jnp.pad(x, pad, constant_values=jnp.asarray(identity, x.dtype))
        start = 1 if reverse else 0
        x = lax.slice_in_dim(padded, start, start + x.shape[ax], axis=ax)
    return scan(x, axis=ax, reverse=bool(reverse))


@rule("CumSum", since=11, static=("axis",))
def cum_sum(cx, x, axis, *, exclusive=0, reverse=0):
    """y[i] = sum of x[j] for j <= i along axis (j < i when exclusive; from the end if reverse) (v11+)."""
    return _scan(cx, lax.cumsum, 0, x, axis, exclusive, reverse)


@rule("CumProd", since=26, static=("axis",))
def cum_prod(cx, x, axis, *, exclusive=0, reverse=0):
    """y[i] = product of x[j] for j <= i along axis (j < i when exclusive; from the end if reverse) (v26+)."""
    return _scan(cx, lax.cumprod, 1, x, axis, exclusive, reverse)


# --- TopK -------------------------------------------------------------------------------------

def _top_k(cx, x, k: int, axis: int, largest: int):
    rank = len(x.shape)
    (ax,) = normalize_axes(cx, (axis,), rank)
    if not 0 <= k <= x.shape[ax]:
        raise cx.fail(f"K must lie in [0, {x.shape[ax]}] (the size of axis {axis}), got {k}")
    moved = jnp.moveaxis(x, ax, -1)
    if largest:
        values, indices = lax.top_k(moved, k)  # ties: the lower index comes first
    else:
        # a stable sort keeps equal values in index order, as the spec's tie-break asks
        order = jnp.argsort(moved, axis=-1, stable=True, descending=bool(largest))[..., :k]
        values, indices = jnp.take_along_axis(moved, order, axis=-1), order
    return jnp.moveaxis(values, -1, ax), jnp.moveaxis(indices.astype(jnp.int64), -1, ax)


@rule("TopK", since=10, static=("K",))
def top_k(cx, x, K, *, axis=-1, largest=1, sorted=1):
    """(Values, Indices) of the K largest/smallest along axis, ties by lower index (v10+; v11: largest)."""
    (k,) = cx.static_ints(K, "input K")
    return _top_k(cx, x, k, axis, largest)


@rule("TopK", since=1)
def top_k_v1(cx, x, *, axis=-1, k=None):
    """(Values, Indices) of the k largest along axis, k an attribute (v1-v9)."""
    if k is None:
        raise cx.fail("attribute k is required")
    return _top_k(cx, x, k, axis, 1)
