"""Pooling (N-D, channels first): Max/Average/Lp, global pools, MaxUnpool, MaxRoiPool, RoiAlign."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.common import check_size
from oxla.lowering.ops.conv import SAME, explicit_pads, spatial_ints, window_pads
from oxla.lowering.registry import rule


@dataclass(frozen=True)
class Window:
    """Where a pooling window goes: per spatial axis kernel, stride, dilation, pads, output size.

    `pads` are the model's (explicit or auto_pad) pads; `extra` is what ceil_mode adds at the end
    so that the last window fits, which no pooling ever counts as padding.
    """

    sizes: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    extra: tuple[int, ...]
    out: tuple[int, ...]

    def padding(self) -> list[tuple[int, int]]:
        """Padding of every axis for lax.reduce_window (batch and channel unpadded)."""
        return [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(self.pads, self.extra)]

    def reduce(self, x, init, op, *, last: bool = False):
        """reduce_window over the spatial axes: X (N, C, *S), or (N, *S, C) if last."""
        if last:
            if 0 in self.out:
                return jnp.zeros((x.shape[0], *self.out, x.shape[-1]), x.dtype)
            pads = self.padding()
            return lax.reduce_window(x, np.asarray(init, x.dtype), op, (1, *self.kernel, 1),
                                     (1, *self.strides, 1), [pads[0], *pads[2:], pads[1]],
                                     window_dilation=(1, *self.dilations, 1))
        if 0 in self.out:
            return jnp.zeros(x.shape[:2] + self.out, x.dtype)
        # a numpy init value stays a literal: a traced one makes reduce_window non-differentiable
        return lax.reduce_window(x, np.asarray(init, x.dtype), op, (1, 1, *self.kernel),
                                 (1, 1, *self.strides), self.padding(),
                                 window_dilation=(1, 1, *self.dilations))

    def max(self, x, *, last: bool = False):
        """Max of each window: X (N, C, *S), or (N, *S, C) if last. Small windows take running
        maxima of strided slices, one spatial axis at a time (exact: max does not depend on
        order); XLA:CPU runs them 2x (two threads) to 6x (one) faster than its reduce_window,
        e.g. ResNet's 3x3/2 pool of 64x112x112; channels last, ShuffleNetV2's 3x3/2 pool of
        112x112x24 0.45 -> 0.20 ms at one thread (ShuffleNetV2 4.70 -> 4.28 and 4.56 -> 4.21 ms,
        both orders)."""
        if sum(self.kernel) > _MAX_SLICES or 0 in self.out:
            return self.reduce(x, lowest(x.dtype), lax.max, last=last)
        return _window_max(x, self, last)

    def sum(self, x, *, last: bool = False):
        """Sum of each window (zero padding) as running sums of strided slices, one spatial axis
        at a time, when the window is small (else None). Channels last it replaces a
        reduce_window that XLA:CPU's YNNPACK fusions got wrong inside light densenet121
        (see oxla.passes.channels_last)."""
        if sum(self.kernel) > _MAX_SLICES or 0 in self.out:
            return None
        return _window_slices(x, self, last, np.zeros((), x.dtype), lax.add)

    def taps(self, axis: int) -> np.ndarray:
        """Input position of every (output cell, kernel tap) on one axis: (out, kernel)."""
        o = np.arange(self.out[axis])[:, None] * self.strides[axis]
        return o + np.arange(self.kernel[axis])[None, :] * self.dilations[axis] - self.pads[axis][0]


_MAX_SLICES = 32  # beyond this many slices in all, reduce_window (large windows are rare)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _window_max(x, win: Window, last: bool):
    """Window.max as strided slices; its derivatives are reduce_window's (the first maximum of a
    window takes the gradient), so training sees the same MaxPool either way."""
    return _window_slices(x, win, last, np.asarray(lowest(x.dtype), x.dtype), lax.max)


def _window_slices(x, win: Window, last: bool, low: Any, op: Any):
    """`op` (max, add) over each window: X padded with `low`, then strided slices combined one
    spatial axis at a time."""
    first = 1 if last else 2
    config = [(0, 0, 0)] * x.ndim
    for axis, ((lo, hi), e) in enumerate(zip(win.pads, win.extra)):
        config[first + axis] = (lo, hi + e, 0)
    # padded once on every axis: padding the first axis's maxima again for the next one made XLA
    # materialize them (channels last 112x112x24, 3x3/2: 0.36 against 0.20 ms at one thread)
    y: Any = lax.pad(x, low, config)
    for axis, (k, s, d, o) in enumerate(zip(win.kernel, win.strides, win.dilations, win.out)):
        a = first + axis
        best: Any = None
        for tap in range(k):
            start, limit, step = [0] * y.ndim, list(y.shape), [1] * y.ndim
            start[a], limit[a], step[a] = tap * d, tap * d + (o - 1) * s + 1, s
            part = lax.slice(y, start, limit, step)
            best = part if best is None else op(best, part)
        y = best
    return y


@_window_max.defjvp
def _window_max_jvp(win: Window, last: bool, primals, tangents):
    (x,), (t,) = primals, tangents
    _, dy = jax.jvp(lambda v: win.reduce(v, lowest(v.dtype), lax.max, last=last), (x,), (t,))
    return _window_max(x, win, last), dy


def window(cx, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode=0) -> Window:
    """The geometry of ONNX pooling: out = floor or ceil((in + pads - span) / stride) + 1."""
    if x.ndim < 3:
        raise cx.shape_error(f"input X must have rank >= 3 (N, C, spatial...), got shape {tuple(x.shape)}")
    n = x.ndim - 2
    if kernel_shape is None or len(kernel_shape) != n:
        raise cx.fail(f"kernel_shape must have {n} values (one per spatial axis), got "
                      f"{None if kernel_shape is None else list(kernel_shape)}")
    k = tuple(int(v) for v in kernel_shape)
    s = spatial_ints(cx, "strides", strides, n, 1)
    d = spatial_ints(cx, "dilations", dilations, n, 1)
    sizes = tuple(x.shape[2:])
    padding = window_pads(cx, auto_pad, pads, sizes, k, s, d)
    if auto_pad in ("NOTSET", "") and any(lo >= ki or hi >= ki for ki, (lo, hi) in zip(k, padding)):
        # a window wholly in the padding reads no input (the maximum of nothing, an average over
        # no elements); onnxruntime refuses such pads as well, and huge ones would size a huge
        # output from a few bytes of attributes
        raise cx.fail(f"pads {[lo for lo, _ in padding] + [hi for _, hi in padding]} must be "
                      f"smaller than kernel_shape {list(k)} on every spatial axis (a window wholly "
                      "in the padding reads no input)")
    out, extra = [], []
    for axis, (size, ki, si, di, (lo, hi)) in enumerate(zip(sizes, k, s, d, padding)):
        span = (ki - 1) * di + 1
        room = size + lo + hi - span
        o = room // si + 1
        if ceil_mode and auto_pad not in SAME:
            o = -(-room // si) + 1
            if (o - 1) * si >= size + lo:  # a last window starting in the end padding is dropped
                o -= 1
        if o < 0:  # (0: a window one larger than the padded input; no output, as in onnxruntime)
            raise cx.fail(f"the window ({span} wide on spatial axis {axis}, kernel_shape {list(k)}, "
                          f"dilations {list(d)}) is larger than the padded input ({size + lo + hi}): "
                          f"the output size would be {o}; check kernel_shape, pads, strides and "
                          "dilations")
        out.append(o)
        extra.append(max((o - 1) * si + span - (size + lo + hi), 0))
    return Window(sizes, k, s, d, tuple(padding), tuple(extra), tuple(out))


def lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def wide(x):
    """Half-precision floats accumulate in float32."""
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


# --- MaxPool ------------------------------------------------------------------------------------

def _max_with_indices(x, win: Window, storage_order: int):
    """Max and ONNX's flattened argmax over (N, C, *spatial); column-major spatial if asked."""
    n = len(win.sizes)
    full = win.out + win.kernel
    # per axis, the input position of every (out..., kernel...) pair
    taps = []
    for axis in range(n):
        shape = [1] * (2 * n)
        shape[axis], shape[n + axis] = win.out[axis], win.kernel[axis]
        taps.append(np.broadcast_to(win.taps(axis).reshape(shape), full))
    padded = [t + lo for t, (lo, _) in zip(taps, win.pads)]
    padded_sizes = [size + lo + hi + e for size, (lo, hi), e in zip(win.sizes, win.pads, win.extra)]
    cells = math.prod(win.out)
    gather = np.ravel_multi_index(padded, padded_sizes).reshape(cells, -1)
    inside = [np.clip(t, 0, size - 1) for t, size in zip(taps, win.sizes)]
    source = np.ravel_multi_index(inside, win.sizes, order="F" if storage_order else "C")
    source = source.reshape(cells, -1)
    xp = lax.pad(x, jnp.asarray(lowest(x.dtype), x.dtype), [(a, b, 0) for a, b in win.padding()])
    vals = xp.reshape((*x.shape[:2], -1))[:, :, gather]
    best = jnp.argmax(vals, axis=-1)  # the first maximum in window order, as ONNX runtimes pick
    y = jnp.max(vals, axis=-1).reshape(x.shape[:2] + win.out)
    index = jnp.asarray(source)[jnp.arange(cells)[None, None, :], best]
    plane = jnp.arange(x.shape[0] * x.shape[1], dtype=jnp.int64).reshape((*x.shape[:2], 1))
    index = index.astype(jnp.int64) + plane * math.prod(win.sizes)
    return y, index.reshape(x.shape[:2] + win.out)


@rule("MaxPool", since=1)
def max_pool(cx, x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
             pads=None, storage_order=0, strides=None):
    """Y = max of each window, Indices = its flat input index (v1+; Indices v8+, dilations v10+)."""
    win = window(cx, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if cx.output_used(1):
        if 0 in win.out:
            return win.reduce(x, 0, lax.max), jnp.zeros(x.shape[:2] + win.out, jnp.int64)
        return _max_with_indices(x, win, storage_order)
    return win.max(x)


# --- AveragePool and LpPool ---------------------------------------------------------------------

def pool_counts(win: Window, count_include_pad: int) -> np.ndarray:
    """How many elements each window averages: real ones, or real and explicit-pad ones."""
    total = np.ones(win.out, np.int64)
    for axis, (size, (lo, hi)) in enumerate(zip(win.sizes, win.pads)):
        taps = win.taps(axis)
        first, stop = (-lo, size + hi) if count_include_pad else (0, size)
        per_axis = ((taps >= first) & (taps < stop)).sum(axis=1)
        total = total * per_axis.reshape((-1,) + (1,) * (len(win.out) - axis - 1))
    return total


@rule("AveragePool", since=1)
def average_pool(cx, x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    """Y = mean of each window, pads counted if count_include_pad (v1+; ceil_mode v10+)."""
    win = window(cx, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xs = wide(x)
    sums = win.reduce(xs, 0, lax.add)
    return (sums / jnp.asarray(pool_counts(win, count_include_pad), xs.dtype)).astype(x.dtype)


def _lp(x, p, reduce):
    xs = wide(x)
    if p == 1:
        return reduce(jnp.abs(xs)).astype(x.dtype)
    if p == 2:
        return jnp.sqrt(reduce(xs * xs)).astype(x.dtype)
    return jnp.power(reduce(jnp.abs(xs) ** p), jnp.asarray(1.0 / p, xs.dtype)).astype(x.dtype)


@rule("LpPool", since=1)
def lp_pool(cx, x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
            pads=None, strides=None):
    """Y = (sum of |X|^p over each window)^(1/p) (v1: float p; v2+: int p; v18+: ceil_mode)."""
    win = window(cx, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return _lp(x, p, lambda v: win.reduce(v, 0, lax.add))


# --- global pools -------------------------------------------------------------------------------

def _spatial_axes(cx, x) -> tuple[int, ...]:
    if x.ndim < 3:
        raise cx.shape_error(f"input X must have rank >= 3 (N, C, spatial...), got shape {tuple(x.shape)}")
    return tuple(range(2, x.ndim))


@rule("GlobalAveragePool", since=1)
def global_average_pool(cx, x):
    """Y = mean of X over every spatial axis, kept as size-1 axes (v1+)."""
    return jnp.mean(wide(x), axis=_spatial_axes(cx, x), keepdims=True).astype(x.dtype)


@rule("GlobalMaxPool", since=1)
def global_max_pool(cx, x):
    """Y = max of X over every spatial axis, kept as size-1 axes (v1+)."""
    return jnp.max(x, axis=_spatial_axes(cx, x), keepdims=True)


@rule("GlobalLpPool", since=1)
def global_lp_pool(cx, x, *, p=2):
    """Y = (sum of |X|^p over every spatial axis)^(1/p), kept as size-1 axes (v1: float p)."""
    axes = _spatial_axes(cx, x)
    return _lp(x, p, lambda v: jnp.sum(v, axis=axes, keepdims=True))


# --- MaxUnpool ----------------------------------------------------------------------------------

@rule("MaxUnpool", since=9, static=("output_shape",))
def max_unpool(cx, x, i, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    """Y = zeros with X scattered to the flat indices I of MaxPool's input (v9+)."""
    if x.ndim < 3 or tuple(i.shape) != tuple(x.shape):
        raise cx.shape_error(f"X must have rank >= 3 and I the shape of X; got X {tuple(x.shape)}, "
                      f"I {tuple(i.shape)}")
    n = x.ndim - 2
    if kernel_shape is None or len(kernel_shape) != n:
        raise cx.fail(f"kernel_shape must have {n} values (one per spatial axis)")
    s = spatial_ints(cx, "strides", strides, n, 1)
    padding = explicit_pads(cx, pads, n)
    inferred = x.shape[:2] + tuple((size - 1) * si - lo - hi + k for size, si, (lo, hi), k
                                   in zip(x.shape[2:], s, padding, kernel_shape))
    check_size(cx, inferred, x.dtype)
    y = jnp.zeros(math.prod(inferred), x.dtype).at[i.reshape(-1)].set(x.reshape(-1), mode="drop")
    y = y.reshape(inferred)
    if output_shape is None:
        return y
    want = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
    if len(want) != x.ndim:
        raise cx.fail(f"output_shape must have {x.ndim} values, got {list(want)}")
    # as in the conformance case, the indices address the inferred shape and output_shape pads
    # (or crops) it at the end; onnxruntime reads them as indices into output_shape instead
    check_size(cx, want, x.dtype)
    y = y[tuple(slice(0, min(a, b)) for a, b in zip(inferred, want))]
    return jnp.pad(y, [(0, max(b - a, 0)) for a, b in zip(inferred, want)])


# --- MaxRoiPool ---------------------------------------------------------------------------------

def _round_half_away(v):
    return jnp.sign(v) * jnp.floor(jnp.abs(v) + 0.5)  # C round(), as Caffe's RoI pooling uses


def _bin_masks(start, end, bins: int, size: int):
    """(R, bins, size): which input rows each of the bins of each roi [start, end] covers."""
    extent = jnp.maximum(end - start + 1, 1).astype(jnp.float32)
    step = extent[:, None] / bins
    b = jnp.arange(bins, dtype=jnp.float32)[None, :]
    lo = jnp.clip(jnp.floor(b * step).astype(jnp.int32) + start[:, None], 0, size)
    hi = jnp.clip(jnp.ceil((b + 1) * step).astype(jnp.int32) + start[:, None], 0, size)
    pos = jnp.arange(size)[None, None, :]
    return (pos >= lo[:, :, None]) & (pos < hi[:, :, None])


@rule("MaxRoiPool", since=1)
def max_roi_pool(cx, x, rois, *, pooled_shape=None, spatial_scale=1.0):
    """Y[r] = max of X[batch_r] over each of pooled_shape bins of roi r's box (v1+)."""
    cx.expect_rank("X", x, 4)
    if pooled_shape is None or len(pooled_shape) != 2 or rois.ndim != 2 or rois.shape[1] != 5:
        raise cx.fail(f"pooled_shape must be (height, width) and rois (R, 5) [batch, x1, y1, x2, "
                      f"y2]; got pooled_shape {pooled_shape}, rois shape {tuple(rois.shape)}")
    ph, pw = (int(v) for v in pooled_shape)
    height, width = x.shape[2:]
    box = _round_half_away(rois[:, 1:] * jnp.asarray(spatial_scale, rois.dtype)).astype(jnp.int32)
    rows = _bin_masks(box[:, 1], box[:, 3], ph, height)            # (R, ph, H)
    cols = _bin_masks(box[:, 0], box[:, 2], pw, width)             # (R, pw, W)
    xb = x[rois[:, 0].astype(jnp.int32)]                            # (R, C, H, W)
    low = jnp.asarray(-jnp.inf, x.dtype)
    by_col = jnp.max(jnp.where(cols[:, None, None], xb[:, :, :, None, :], low), axis=-1)
    y = jnp.max(jnp.where(rows[:, None, :, None, :], by_col.swapaxes(2, 3)[:, :, None], low), -1)
    empty = ~rows.any(-1)[:, :, None] | ~cols.any(-1)[:, None, :]  # (R, ph, pw)
    return jnp.where(empty[:, None], jnp.zeros((), x.dtype), y)     # an empty bin is 0


# --- RoiAlign -----------------------------------------------------------------------------------

def _roi_samples(start, extent, bins: int, grid, most: int, size: int):
    """Bilinear taps along one axis: rows (R, bins, most, 2) and weights, 0 for unused samples."""
    step = extent / bins
    b = jnp.arange(bins, dtype=start.dtype)[None, :, None]
    g = jnp.arange(most, dtype=start.dtype)[None, None, :]
    grid = grid.astype(start.dtype)[:, None, None]
    pos = start[:, None, None] + b * step[:, None, None] + (g + 0.5) * step[:, None, None] / grid
    used = (g < grid) & (pos >= -1.0) & (pos <= size)  # samples beyond a pixel outside count 0
    pos = jnp.maximum(pos, 0)
    low = jnp.floor(pos)
    edge = low >= size - 1
    low = jnp.where(edge, size - 1, low)
    pos = jnp.where(edge, low, pos)
    high = jnp.where(edge, low, low + 1)
    frac = pos - low
    rows = jnp.stack([low, high], -1).astype(jnp.int32)
    weights = jnp.stack([1 - frac, frac], -1) * used[..., None]
    return rows, weights


def _roi_box(xp, rois, dtype, spatial_scale: float, half_pixel: bool):
    """Each roi's start corner and (width, height) in input pixels, with numpy or jax.numpy."""
    box = xp.asarray(rois).astype(dtype) * xp.asarray(spatial_scale, dtype)
    box = box - xp.asarray(0.5 if half_pixel else 0.0, dtype)
    extent = box[:, 2:] - box[:, :2]
    if not half_pixel:  # output_half_pixel keeps the legacy minimum roi size of one pixel
        extent = xp.maximum(extent, xp.asarray(1.0, dtype))
    return box[:, :2], extent


def _roi_grid(cx, rois, bins, sampling_ratio: int, dtype, scale: float, half_pixel: bool):
    """Samples per bin along (x, y) for each roi, and the most any roi takes."""
    if sampling_ratio > 0:
        return jnp.full((rois.shape[0], 2), sampling_ratio, jnp.int32), (sampling_ratio,) * 2
    # adaptive: ceil(roi size / bins) samples, so the rois fix the shapes: they must be known
    known = cx.static(rois, "rois (sampling_ratio=0 sizes the sampling grid from them)")
    _, extent = _roi_box(np, known, dtype, scale, half_pixel)
    grid = np.maximum(np.ceil(extent / np.asarray(bins, dtype)), 0).astype(np.int32)
    return jnp.asarray(grid), tuple(int(v) for v in grid.max(0, initial=1))


def _roi_align(cx, x, rois, batch_indices, half_pixel: bool, mode: str, output_height: int,
               output_width: int, sampling_ratio: int, spatial_scale: float):
    cx.expect_rank("X", x, 4)
    if rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != rois.shape[:1]:
        raise cx.fail(f"rois must be (R, 4) [x1, y1, x2, y2] and batch_indices (R,); got "
                      f"{tuple(rois.shape)} and {tuple(batch_indices.shape)}")
    if mode not in ("avg", "max"):
        raise cx.fail(f"mode must be 'avg' or 'max', got '{mode}'")
    height, width = x.shape[2:]
    box, extent = _roi_box(jnp, rois, x.dtype, spatial_scale, half_pixel)  # (R, [x, y])
    bins = (output_width, output_height)
    grid, most = _roi_grid(cx, rois, bins, sampling_ratio, x.dtype, spatial_scale, half_pixel)
    xs, wx = _roi_samples(box[:, 0], extent[:, 0], output_width, grid[:, 0], most[0], width)
    ys, wy = _roi_samples(box[:, 1], extent[:, 1], output_height, grid[:, 1], most[1], height)
    xb = x[batch_indices.astype(jnp.int32)]                            # (R, C, H, W)
    if mode == "avg":
        count = jnp.maximum(grid[:, 0] * grid[:, 1], 1).astype(x.dtype)
        y = jnp.einsum("rph,rqw,rchw->rcpq", _interpolation(ys, wy, height),
                       _interpolation(xs, wx, width), xb)
        return y / count[:, None, None, None]
    return _roi_max(xb, ys, wy, xs, wx, grid, most, bins)


def _interpolation(rows, weights, size: int):
    """(R, bins, size) matrix: the summed weight each bin gives each input row."""
    onehot = rows[..., None] == jnp.arange(size)                       # (R, bins, G, 2, size)
    return jnp.sum(onehot * weights[..., None], axis=(2, 3)).astype(weights.dtype)


def _roi_max(xb, ys, wy, xs, wx, grid, most, bins):
    """Max mode: the largest weighted corner of each sample (what ONNX runtimes compute)."""
    r, c = xb.shape[:2]
    vals = jnp.take_along_axis(xb, ys.reshape(r, 1, -1, 1), axis=2)
    vals = jnp.take_along_axis(vals, xs.reshape(r, 1, 1, -1), axis=3)  # (R, C, Y, X)
    vals = vals * wy.reshape(r, 1, -1, 1) * wx.reshape(r, 1, 1, -1)
    vals = vals.reshape(r, c, bins[1], most[1], 2, bins[0], most[0], 2)
    best = jnp.max(vals, axis=(4, 7)).transpose(0, 1, 2, 4, 3, 5)     # (R, C, ph, pw, gy, gx)
    used = ((jnp.arange(most[1])[None, :, None] < grid[:, 1, None, None])
            & (jnp.arange(most[0])[None, None, :] < grid[:, 0, None, None]))  # (R, gy, gx)
    best = jnp.where(used[:, None, None, None], best, -jnp.inf).max(axis=(4, 5))
    none = ~used.any(axis=(1, 2))[:, None, None, None]                 # a roi with no samples
    return jnp.where(none, jnp.zeros((), xb.dtype), best)


@rule("RoiAlign", since=16)
def roi_align(cx, x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel",
              mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """Y[r] = avg or max of bilinear samples of X[batch_r] in each output bin of roi r (v16+)."""
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise cx.fail("coordinate_transformation_mode must be 'half_pixel' or 'output_half_pixel', "
                      f"got '{coordinate_transformation_mode}'")
    return _roi_align(cx, x, rois, batch_indices, coordinate_transformation_mode == "half_pixel",
                      mode, output_height, output_width, sampling_ratio, spatial_scale)


@rule("RoiAlign", since=10)
def roi_align_v10(cx, x, rois, batch_indices, *, mode="avg", output_height=1, output_width=1,
                  sampling_ratio=0, spatial_scale=1.0):
    """RoiAlign without the half-pixel shift (v10-v15: output_half_pixel semantics)."""
    return _roi_align(cx, x, rois, batch_indices, False, mode, output_height, output_width,
                      sampling_ratio, spatial_scale)
