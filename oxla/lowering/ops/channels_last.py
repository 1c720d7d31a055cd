"""Channels-last twins of the layout-sensitive ops ChannelsLastPass moves (domain oxla.channels_last).

Each takes X as (N, H, W, C) and returns Y channels last, with the attributes and the
geometry of its ONNX op; W, scale, bias and statistics keep their ONNX shapes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.common import accum_dtype, xp
from oxla.lowering.ops import conv_forms
from oxla.lowering.ops.conv import conv_integer as conv_integer_first
from oxla.lowering.ops.conv import conv_transpose as conv_transpose_first
from oxla.lowering.ops.conv import conv_window, transpose_window
from oxla.lowering.ops.pool import average_pool as average_pool_first
from oxla.lowering.ops.pool import pool_counts, wide, window
from oxla.lowering.ops.qmath import int_conv_last
from oxla.lowering.registry import rule
from oxla.passes.channels_last import DOMAIN
from oxla.passes.pad_ahead import DOMAIN as PAD_AHEAD


def _first(x):
    """X's shape and dtype as channels first, for the shared geometry checks."""
    if x.ndim < 3:
        return x
    return jax.ShapeDtypeStruct((x.shape[0], x.shape[-1], *x.shape[1:-1]), x.dtype)


@rule("Conv", since=1, domain=DOMAIN)
def conv(cx, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    """Conv with X and Y channels last."""
    s, padding, d = conv_window(cx, _first(x), w, auto_pad=auto_pad, dilations=dilations,
                                group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    form = conv_forms.choose_last(x.shape[1:-1], w.shape, s, padding, d, group)
    y = form(x, w, s, padding, d, group)
    return y if b is None else y + b.astype(y.dtype)


@rule("ConvTranspose", since=1, domain=DOMAIN)
def conv_transpose(cx, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    """ConvTranspose with X and Y channels last: kernel == stride as one dot (the pass moves no
    other), anything else the channels-first rule between two transposes."""
    attrs = {"auto_pad": auto_pad, "dilations": dilations, "group": group,
             "kernel_shape": kernel_shape, "output_padding": output_padding,
             "output_shape": output_shape, "pads": pads, "strides": strides}
    s, d, op, padding = transpose_window(cx, _first(x), w, **attrs)
    if not conv_forms.transposed_fits(w.shape[2:], s, d, padding):
        y = conv_transpose_first(cx, jnp.moveaxis(x, -1, 1), w, b, **attrs)
        return jnp.moveaxis(y, 1, -1)
    y = conv_forms.crop(conv_forms.transposed_dot(x, w, group, last=True), padding, op, last=True)
    return y if b is None else y + b.astype(y.dtype)


@rule("MaxPool", since=1, domain=DOMAIN)
def max_pool(cx, x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
             pads=None, storage_order=0, strides=None):
    """MaxPool (Y only) with X and Y channels last.

    Y is materialized (an optimization barrier): XLA:CPU fused the strided slices' maxima into a
    following transpose to channels first (a graph output) as a loop 6x slower than the two
    apart (55x55x64 from 111x111, 3x3/2, in jax.jit: 1.71 against 0.29 ms)."""
    win = window(cx, _first(x), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return lax.optimization_barrier(win.max(x, last=True))


@rule("AveragePool", since=1, domain=DOMAIN)
def average_pool(cx, x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    """AveragePool with X and Y channels last: window sums as strided slices (Window.sum), each
    divided by its count; a large window takes the channels-first rule between transposes (a
    channels-last reduce_window is what XLA:CPU got wrong; see oxla.passes.channels_last)."""
    win = window(cx, _first(x), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xs = wide(x)
    sums = win.sum(xs, last=True)
    if sums is None:
        y = average_pool_first(cx, jnp.moveaxis(x, -1, 1), auto_pad=auto_pad, ceil_mode=ceil_mode,
                               count_include_pad=count_include_pad, dilations=dilations,
                               kernel_shape=kernel_shape, pads=pads, strides=strides)
        return jnp.moveaxis(y, 1, -1)
    counts = pool_counts(win, count_include_pad).reshape((1, *win.out, 1))
    return lax.optimization_barrier((sums / counts.astype(xs.dtype)).astype(x.dtype))  # as MaxPool


@rule("GlobalAveragePool", since=1, domain=DOMAIN)
def global_average_pool(cx, x):
    """GlobalAveragePool with X and Y channels last: the mean over axes 1..n, kept.

    float32 sums are a dot of a row of ones with X as (pixels, channels): XLA:CPU rewrites a
    large reduction over the pixel axes into a reduce_window of 32x32 blocks and a second
    reduce, and its reduce_window kernel is slow (in EfficientNet-B0's squeeze-excite blocks
    0.8 ms of kernel time at one thread). EfficientNet-B0 at one thread 12.89 -> 11.47 and 13.34
    -> 12.21 ms (both orders in one process), MobileNetV3-small 2.17 -> 2.04 and 2.15 -> 2.06."""
    if x.dtype == jnp.float32:
        n, c, hw = x.shape[0], x.shape[-1], math.prod(x.shape[1:-1])
        rows = x.reshape(n, hw, c)
        s = lax.dot_general(jnp.ones((n, 1, hw), x.dtype), rows, (((2,), (1,)), ((0,), (0,))))
        return (s / np.float32(hw)).reshape((n,) + (1,) * (x.ndim - 2) + (c,))
    return jnp.mean(wide(x), axis=tuple(range(1, x.ndim - 1)), keepdims=True).astype(x.dtype)


@rule("GlobalMaxPool", since=1, domain=DOMAIN)
def global_max_pool(cx, x):
    """GlobalMaxPool with X and Y channels last: the max over axes 1..n, kept."""
    return jnp.max(x, axis=tuple(range(1, x.ndim - 1)), keepdims=True)


@rule("BatchNormalization", since=1, domain=DOMAIN)
def batch_normalization(cx, x, scale, b, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0):
    """Inference BatchNormalization with X and Y channels last (the pass moves no other)."""
    del momentum, training_mode  # the pass moves inference nodes only
    acc = accum_dtype(x.dtype)
    a = scale.astype(acc) * lax.rsqrt(input_var.astype(acc) + jnp.asarray(epsilon, acc))
    shift = b.astype(acc) - input_mean.astype(acc) * a
    return (x.astype(acc) * a + shift).astype(x.dtype)


@rule("ToLast", since=1, domain=DOMAIN)
def to_last(cx, x):
    """Y = X with leading 1s up to rank 4, then (N, C, H, W) -> (N, H, W, C): a broadcast operand
    of a channels-last elementwise op."""
    if x.ndim > 4:
        raise cx.fail(f"input must have rank <= 4, got shape {tuple(x.shape)}")
    full = x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))
    return xp(full).transpose(full, (0, 2, 3, 1))


@rule("ZeroBorder", since=1, domain=PAD_AHEAD)
def zero_border(cx, x, *, pads=None):
    """X with its outer positions zeroed: `pads` (Pad's layout, begins then ends) per axis."""
    pads = list(pads or [0] * (2 * x.ndim))
    keep = None
    for axis, (lo, hi) in enumerate(zip(pads[:x.ndim], pads[x.ndim:])):
        if lo or hi:
            shape = [1] * x.ndim
            shape[axis] = x.shape[axis]
            i = lax.broadcasted_iota(jnp.int32, shape, axis)
            inside = (i >= lo) & (i < x.shape[axis] - hi)
            keep = inside if keep is None else keep & inside
    return x if keep is None else jnp.where(keep, x, jnp.zeros((), x.dtype))


@rule("ConvInteger", since=1, domain=DOMAIN)
def conv_integer(cx, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET",
                 dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ConvInteger with X and Y channels last and W as (kH, kW, C, M); zero points, which the
    pass does not move, and groups take the channels-first rule between transposes."""
    w_first = jax.ShapeDtypeStruct((w.shape[-1], w.shape[-2], *w.shape[:-2]), w.dtype)
    s, padding, d = conv_window(cx, _first(x), w_first, auto_pad=auto_pad, dilations=dilations,
                                group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    if x_zero_point is not None or w_zero_point is not None or group != 1 or x.ndim != 4:
        y = conv_integer_first(cx, jnp.moveaxis(x, -1, 1), jnp.transpose(w, (3, 2, 0, 1)),
                               x_zero_point, w_zero_point, auto_pad=auto_pad, dilations=dilations,
                               group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
        return jnp.moveaxis(y, 1, -1)
    return int_conv_last(x, w, s, padding, d)
