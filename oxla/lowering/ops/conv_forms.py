"""Forms of a grouped convolution that XLA:CPU compiles well, and the measured rule choosing one.

XLA:CPU's own grouped convolution (`feature_group_count > 1`) is its slowest kernel: a 3x3
depthwise conv over 96 channels at 56x56 runs ~35x slower than the same sum written as shifted
multiply-adds, which XLA fuses into one loop. Every form here takes ONNX's layouts, X (N, C, *S)
and W (M, C/group, *K), with padding already resolved to (begin, end) per spatial axis, and
computes what `lax.conv_general_dilated` does; `benchmarks/conv.py` measures them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

Pads = Sequence[tuple[int, int]]

# Beyond this many terms per output XLA stops vectorizing a loop with a select per term (5x5
# depthwise: scalar code, 6x slower): pad X once instead.  Measured by benchmarks/conv.py.
FUSED_PAD_TERMS = 9
# Up to this many terms per output (C/group * prod(K)) the fused multiply-adds beat every
# dot-based form when the flat form applies (stride 1, same size): won at 72 (8 channels per
# group, 3x3), lost at 108. Otherwise (strided, padded X): won at 25 (5x5 depthwise, stride 2),
# lost at 72 (stride 2, 8 per group). Past them one native convolution per group wins, or for
# 1x1 kernels one batched dot.
FLAT_TAPS_TERMS = 72
GRID_TAPS_TERMS = 25
# A dense channels-last 3x3 (or smaller) convolution whose im2col buffer (output pixels x C x
# prod(K)) has at most this many elements runs as one dot (`dot_last`): 1.3-3x faster than XLA's
# own convolution on the small shapes of ResNet-small, 3x slower at 56x56x64 (1.8M elements);
# a 7x7 stem (49 slices to concatenate) was not faster. 1x1 kernels always (X is the operand).
# ResNet-50's shapes (benchmarks/conv.py --only ResNet-50, one thread) agree: XLA's own wins its
# 3x3 convs at 56x56x64 and 28x28x128 (1.11-1.25x onnxruntime vs 1.31-1.78x as a dot), the dot at
# 14x14x256 and 7x7x512 (1.12-1.60x vs 1.40-2.80x). Both run on XLA:CPU's YNNPACK fusions, whose
# dots are 1.4-2.9x onnxruntime's MLAS on the 7x7/14x14 shapes; compiled without them
# (compiler option xla_cpu_experimental_ynn_fusion_type="") XLA's own conv wins every ResNet-50
# shape (0.72-1.22x) and this rule would want re-measuring.
IM2COL_ELEMENTS = 1 << 19
# An image stem (a dense kernel over at most STEM_CHANNELS input channels) with at most
# STEM_TAPS_TERMS terms per output (input channels x prod(K)) runs as fused multiply-adds along
# the output channels (`stem_taps_last`) at any size: XLA's own convolution handles 3 channels
# poorly, and so did the im2col dot before (its columns took 0.65 ms of MobileNetV3-small's 2.5).
# One thread, channels-last output from an NCHW input, ms: 3->16 3x3/2 at 224: 0.22 against 0.54
# as the dot (onnxruntime 0.20); 3->32 0.47 / 0.69 (0.35); 3->32 at 320 0.82 / 1.26 (0.70); 3->64
# 0.64 / 0.70 (0.56); 1->32 3x3/1 at 128 0.16 / 0.29 (0.29); 3->16 5x5/2 0.53 against 1.08 for
# XLA's convolution (0.35). A 7x7 stem (147 terms) lost: 3->64 at 224 5.96 against 2.31 for XLA's
# convolution (1.77). In the suite's models, one thread, both orders in one process:
# MobileNetV3-small 2.81 -> 2.39 and 2.74 -> 2.43 ms, the detector 6.98 -> 6.46 and 6.88 -> 6.53,
# EfficientNet-B0 15.32 -> 15.10 and 15.02 -> 14.83.
STEM_CHANNELS = 4
STEM_TAPS_TERMS = 100
# The stem's sum is materialized (an optimization barrier): as a loop of multiply-adds XLA fused it
# into readers that read each value several times and recomputed it per read. The tf2onnx CNN
# (stem, ReLU, MaxPool, Tile upsampling, linear and nearest Resize, 8x8 images at batch 4) ran
# one fusion that recomputed the stem per output: 0.82 -> 0.13 ms with the barrier (onnxruntime
# 0.12). Sessions with and without it, onnxruntime's blocks interleaved: the Paddle resize model
# (a 4-channel Conv) 0.856, the shipped mobilenet_small 0.911 and resnet_small 0.982 (batch 1); with
# native stems off, where every stem takes this form, MobileNetV3-small 1.012, the detector 0.944.
STEM_BARRIER = True
# `taps_last` sums all of a depthwise kernel's taps in one loop over (pixel, channel): per pixel it
# reads prod(K) windows and weight rows of C channels each. Past this many bytes (about the L1
# data cache, 48 KiB here) they no longer stay cached from one pixel to the next, and one loop per
# group of kernel rows (partial sums through memory) ran faster: 5x5 over 960 channels at 7x7
# 2.06x -> 1.55x onnxruntime, 3x3 over 960 1.20x -> 1.03x; 576 channels (3x3, 41 KiB) kept one loop.
TAPS_L1_BYTES = 48 << 10

Form = Callable[..., Any]


def accumulator(dtype: Any) -> Any:
    """The dtype sums are accumulated in: float32 for the half types (as XLA's conv does)."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return dtype


def native(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
           group: int) -> Any:
    """XLA's own convolution, channels first."""
    spec = tuple(range(x.ndim))
    return lax.conv_general_dilated(
        x, w, tuple(strides), list(padding), rhs_dilation=tuple(dilations),
        dimension_numbers=lax.ConvDimensionNumbers(spec, spec, spec), feature_group_count=group)


def out_sizes(sizes: Sequence[int], padding: Pads, kernel: Sequence[int],
              strides: Sequence[int], dilations: Sequence[int]) -> tuple[int, ...]:
    """Output spatial sizes of a convolution."""
    return tuple((size + lo + hi - (k - 1) * d - 1) // s + 1
                 for size, (lo, hi), k, s, d in zip(sizes, padding, kernel, strides, dilations))


def pad(x: Any, padding: Pads, *, last: bool = False) -> Any:
    """X zero-padded on its spatial axes: X (N, C, *S), or (N, *S, C) if last."""
    spatial = [(lo, hi, 0) for lo, hi in padding]
    config = [(0, 0, 0), *spatial, (0, 0, 0)] if last else [(0, 0, 0), (0, 0, 0), *spatial]
    return lax.pad(x, jnp.zeros((), x.dtype), config)


def window(x: Any, tap: Sequence[int], out: Sequence[int], strides: Sequence[int],
           padding: Pads, dilations: Sequence[int], *, last: bool = False) -> Any | None:
    """What kernel tap `tap` multiplies: x's strided window, zero-padded to the output's shape.

    None when the tap reads only padding. The pad fuses into the consumer's loop (a select per
    element) instead of materializing a padded copy of x. X is (N, C, *S), or (N, *S, C) if last.
    """
    first_axis = 1 if last else 2
    starts, limits = [0] * x.ndim, list(x.shape)
    pads = [(0, 0, 0)] * x.ndim
    step = [1] * x.ndim
    for i, (t, d, s, (lo, _), o) in enumerate(zip(tap, dilations, strides, padding, out)):
        axis, size = first_axis + i, x.shape[first_axis + i]
        first = t * d - lo  # the x index output 0 reads; outputs before o_min read padding
        o_min = -(first // s) if first < 0 else 0
        o_max = min(o - 1, (size - 1 - first) // s)
        if o_max < o_min:
            return None
        starts[axis], limits[axis], step[axis] = o_min * s + first, o_max * s + first + 1, s
        pads[axis] = (o_min, o - 1 - o_max, 0)
    cut = lax.slice(x, starts, limits, step)
    return lax.pad(cut, jnp.zeros((), x.dtype), pads)


def _grouped(x: Any, w: Any, group: int) -> tuple[Any, Any, Any]:
    """X and W cast to the accumulator, W as (G, M/G, C/G, *K), and the accumulator dtype."""
    acc = accumulator(x.dtype)
    m, cg = w.shape[:2]
    return x.astype(acc), w.astype(acc).reshape((group, m // group, cg, *w.shape[2:])), acc


def _multiply_add(y: Any, win: Any, wg: Any, tap: tuple[int, ...]) -> Any:
    """y (N, G, M/G, *O) + sum over c of win[:, :, c] (N, G, C/G, *O) * W[g, m, c, tap]."""
    ones = (1,) * (win.ndim - 3)
    for i in range(wg.shape[2]):
        wt = wg[(slice(None), slice(None), i, *tap)].reshape((*wg.shape[:2], *ones))
        term = win[:, :, i, None] * wt
        y = term if y is None else y + term
    return y


def taps(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
         group: int) -> Any:
    """Y as a sum of C/group * prod(K) broadcast multiply-adds over shifted windows of X.

    XLA fuses the whole sum into one vectorized loop over Y: no dot buffer, no dot. Each
    output reads C/group * prod(K) inputs, so this suits depthwise and narrow groups.
    """
    n = x.shape[0]
    m, cg = w.shape[:2]
    kernel = tuple(w.shape[2:])
    xa, wg, acc = _grouped(x, w, group)
    out = out_sizes(x.shape[2:], padding, kernel, strides, dilations)
    if cg * math.prod(kernel) > FUSED_PAD_TERMS:
        xa, padding = pad(xa, padding), [(0, 0)] * len(kernel)
    y = None
    for tap in itertools.product(*[range(k) for k in kernel]):
        win = window(xa, tap, out, strides, padding, dilations)
        if win is not None:
            y = _multiply_add(y, win.reshape((n, group, cg, *out)), wg, tap)
    if y is None:  # every tap reads padding only
        y = jnp.zeros((n, group, m // group, *out), acc)
    return y.reshape((n, m, *out)).astype(x.dtype)


def flat_fits(sizes: Sequence[int], padding: Pads, kernel: Sequence[int],
              strides: Sequence[int], dilations: Sequence[int]) -> bool:
    """Whether `taps_flat` applies: stride 1, and every axis but the first keeps its size."""
    out = out_sizes(sizes, padding, kernel, strides, dilations)
    return all(s == 1 for s in strides) and tuple(out[1:]) == tuple(sizes[1:])


def _inner_mask(sizes: Sequence[int], rows: int, taps: Sequence[int], padding: Pads,
                dilations: Sequence[int]) -> np.ndarray:
    """Over the flat output grid, whether inner-axis tap `taps` reads inside X (not padding)."""
    grid = np.indices(tuple(sizes[1:])).reshape(len(sizes) - 1, math.prod(sizes[1:]))
    ok = np.ones(grid.shape[1], bool)
    for g, t, size, (lo, _), d in zip(grid, taps, sizes[1:], padding[1:], dilations[1:]):
        ok &= (g + t * d - lo >= 0) & (g + t * d - lo < size)
    return np.tile(ok, rows)


def taps_flat(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
              group: int) -> Any:
    """`taps` over the flattened spatial axes: one long vectorized loop (no short-row tails).

    Needs `flat_fits`. Tap (i, j...) reads X's flat, zero-padded copy at a fixed offset; reads
    that wrap into a neighbouring row are masked, one mask per inner-axis offset.
    """
    n, sizes = x.shape[0], tuple(x.shape[2:])
    m, cg = w.shape[:2]
    kernel = tuple(w.shape[2:])
    xa, wg, acc = _grouped(x, w, group)
    inner = math.prod(sizes[1:])
    rows = out_sizes(sizes, padding, kernel, strides, dilations)[0]
    span = rows * inner
    place = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]  # flat stride of each axis
    front = sum(lo * p for (lo, _), p in zip(padding, place))
    reach = sum((k - 1) * d * p for k, d, p in zip(kernel, dilations, place))
    back = max(0, span + reach - front - math.prod(sizes))
    flat = lax.pad(xa.reshape((n, x.shape[1], math.prod(sizes))), jnp.zeros((), acc),
                   [(0, 0, 0), (0, 0, 0), (front, back, 0)])
    y = jnp.zeros((n, group, m // group, span), acc)
    for inner_tap in itertools.product(*[range(k) for k in kernel[1:]]):
        part: Any = None
        for i in range(kernel[0]):
            tap = (i, *inner_tap)
            at = sum(t * d * p for t, d, p in zip(tap, dilations, place))
            win = lax.slice_in_dim(flat, at, at + span, axis=2).reshape((n, group, cg, span))
            part = _multiply_add(part, win, wg, tap)
        mask = _inner_mask(sizes, rows, inner_tap, padding, dilations)
        y = y + (part if mask.all() else jnp.where(mask, part, 0))
    return y.reshape((n, m, rows, *sizes[1:])).astype(x.dtype)


def dot(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
           group: int) -> Any:
    """Per group, the kernel taps' windows stacked (im2col) and contracted in one batched dot.

    With a 1x1 kernel nothing is stacked: Y = W @ X per image, where XLA:CPU's native conv
    copies X to channels-last and back.
    """
    n = x.shape[0]
    m, cg = w.shape[:2]
    kernel = tuple(w.shape[2:])
    out = out_sizes(x.shape[2:], padding, kernel, strides, dilations)
    xp = pad(x, padding)
    nopad = [(0, 0)] * len(kernel)
    wins: list[Any] = [window(xp, tap, out, strides, nopad, dilations)
                       for tap in itertools.product(*[range(k) for k in kernel])]
    # cols (N, C, K, *O) -> (N, G, Cg*K, P); W (M, Cg, *K) -> (G, M/G, Cg*K): same (c, k) order
    cols = jnp.stack(wins, axis=2).reshape((n, group, cg * math.prod(kernel), math.prod(out)))
    wg = w.reshape((group, m // group, cg * math.prod(kernel)))
    acc = accumulator(x.dtype)
    if n == group == 1:
        # a plain (M, K) x (K, P) product keeps X and Y in place; the batched form made XLA copy
        # X to (P, K) and Y back
        y = lax.dot_general(wg[0], cols[0, 0], (((1,), (0,)), ((), ())), preferred_element_type=acc)
    else:
        y = jnp.einsum("gmk,ngkp->ngmp", wg, cols, preferred_element_type=acc)
    return y.reshape((n, m, *out)).astype(x.dtype)


def split(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
          group: int) -> Any:
    """One dense native convolution per group, concatenated."""
    cg, mg = x.shape[1] // group, w.shape[0] // group
    ys = [native(x[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg], strides, padding, dilations, 1)
          for g in range(group)]
    return jnp.concatenate(ys, axis=1)


# --- channels last: X (N, *S, C), Y (N, *O, M); W stays (M, C/group, *K) -----------------------

def _last_spec(nd: int) -> lax.ConvDimensionNumbers:
    last = (0, nd + 1, *range(1, nd + 1))  # batch, feature, spatial... as positions in (N, *S, C)
    return lax.ConvDimensionNumbers(last, tuple(range(nd + 2)), last)


def native_last(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
                group: int) -> Any:
    """XLA's own convolution on channels-last X and Y (what XLA:CPU computes in: no copies)."""
    return lax.conv_general_dilated(
        x, w, tuple(strides), list(padding), rhs_dilation=tuple(dilations),
        dimension_numbers=_last_spec(x.ndim - 2), feature_group_count=group)


def taps_last(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
              group: int) -> Any:
    """`taps` on channels-last X for one input channel per group (depthwise, any multiplier).

    Each tap is one multiply-add of a shifted window of X by a per-channel weight row, and the
    fused loop runs along the contiguous channel axis. The taps are summed in two interleaved
    chains; when one output pixel's taps and weights outgrow the L1 cache they are summed in
    groups of kernel rows, one loop each (see `TAPS_L1_BYTES`).
    """
    n, sizes = x.shape[0], tuple(x.shape[1:-1])
    m, kernel = w.shape[0], tuple(w.shape[2:])
    acc = accumulator(x.dtype)
    # W as (*K, M): each tap's row contiguous (and, for a kernel stored HWIO, W's own layout)
    nd = len(kernel)
    xa, mult = x.astype(acc), m // group
    wa = jnp.transpose(w.astype(acc), (*range(2, nd + 2), 1, 0)).reshape((*kernel, m))
    out = out_sizes(sizes, padding, kernel, strides, dilations)
    # padded once: with a select per tap fused into the loop, stride 1 ran 3-14x slower alone
    # (one thread, CPU time); strided 3x3 ran 0.35x alone but 1.35x inside MobileNet-small, where
    # the pad fuses into the producer's loop instead of being a pass of its own
    padded = any(lo or hi for lo, hi in padding)
    xa, padding = pad(xa, padding, last=True), [(0, 0)] * nd
    if padded:
        # the padded X is stored: else XLA reads the centre tap from the unpadded X (the slice of
        # the pad is X itself) and fuses X's producer into this loop, computing it a second time
        # (the detector's stem, 27 multiply-adds a pixel, inside its first depthwise loop: 0.71
        # against 0.43 ms); the detector at one thread 5.69 -> 5.27 and 5.81 -> 5.54 ms (both
        # orders), MobileNetV3-small and EfficientNet-B0 1-2% faster. Not for an X already padded
        # (PadAheadPass): its ZeroBorder is meant to fuse into this loop.
        xa = lax.optimization_barrier(xa)
    row_bytes = 2 * math.prod(kernel[1:]) * m * np.dtype(acc).itemsize
    rows = max(1, TAPS_L1_BYTES // row_bytes) if row_bytes * kernel[0] > TAPS_L1_BYTES else kernel[0]
    y: Any = None
    for first in range(0, kernel[0], rows):
        terms = []
        for tap in itertools.product(range(first, min(first + rows, kernel[0])),
                                     *[range(k) for k in kernel[1:]]):
            win = window(xa, tap, out, strides, padding, dilations, last=True)
            if win is None:
                continue
            if mult > 1:  # output channel j reads input channel j // mult; channels stay innermost
                win = jnp.broadcast_to(win[..., None], (*win.shape, mult)).reshape(
                    (*win.shape[:-1], m))
            terms.append(win * wa[tap])
        if y is not None and terms:
            y = lax.optimization_barrier(y)  # one loop per row group: see TAPS_L1_BYTES
        y = _chains(terms, y)
    if y is None:  # every tap reads padding only
        return jnp.zeros((n, *out, m), x.dtype)
    return y.astype(x.dtype)


def stem_taps_last(x: Any, w: Any, strides: Sequence[int], padding: Pads,
                   dilations: Sequence[int], group: int) -> Any:
    """A dense channels-last convolution over a few input channels (an image stem) as fused
    multiply-adds: one term per (tap, input channel), X's element times W's row of output
    channels, so the loop runs along the output channels (see `STEM_TAPS_TERMS`)."""
    kernel = tuple(w.shape[2:])
    nd, c = len(kernel), x.shape[-1]
    acc = accumulator(x.dtype)
    out = out_sizes(x.shape[1:-1], padding, kernel, strides, dilations)
    xp = pad(x.astype(acc), padding, last=True)
    wa = w.astype(acc)
    terms: list[Any] = []
    for tap in itertools.product(*[range(k) for k in kernel]):
        win = window(xp, tap, out, strides, [(0, 0)] * nd, dilations, last=True)
        if win is not None:
            terms.extend(win[..., i:i + 1] * wa[(slice(None), i, *tap)] for i in range(c))
    if not terms:
        return jnp.zeros((x.shape[0], *out, w.shape[0]), x.dtype)
    y = _chains(terms, None).astype(x.dtype)
    return lax.optimization_barrier(y) if STEM_BARRIER else y


def _chains(terms: list[Any], y: Any) -> Any:
    """y + the sum of terms, added in two interleaved chains: each output's adds form two
    dependency chains instead of one (5x5 depthwise 1.5x -> 1.35x onnxruntime alone)."""
    if not terms:
        return y
    if y is not None:
        terms = [y, *terms]
    even, odd = terms[0], terms[1] if len(terms) > 1 else None
    for i, t in enumerate(terms[2:]):
        if i % 2:
            odd = odd + t
        else:
            even = even + t
    return even if odd is None else even + odd


# XLA:CPU's own dot (Eigen's, where YNNPACK's fusions leave it the dots) sums a last partial
# block of up to 8 columns in another order than the others on AVX2 (a column tail of N mod 16 in
# 1..8; measured for N = 17..1024). Channels that should be equal then differ in the last bit, and
# light squeezenet's 1000 logits of ~9.5e9 (one ulp: 1024) went from onnxruntime's uniform softmax
# (0.001 each) to 0.124 in its last eight classes. W is padded only where that adds at most
# 1 / PAD_COST of its columns (24 -> 32 channels would be a third more work).
COLUMN_BLOCK = 16
PAD_COST = 50


def dot_last(x: Any, w: Any, strides: Sequence[int], padding: Pads, dilations: Sequence[int],
             group: int) -> Any:
    """`dense_dot_last` per group (channel slices of X and W), the results concatenated."""
    if group == 1:
        return dense_dot_last(x, w, strides, padding, dilations, 1)
    cg, mg = x.shape[-1] // group, w.shape[0] // group
    ys = [dense_dot_last(x[..., g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg], strides, padding,
                         dilations, 1) for g in range(group)]
    return jnp.concatenate(ys, axis=-1)


def dense_dot_last(x: Any, w: Any, strides: Sequence[int], padding: Pads,
                   dilations: Sequence[int], group: int) -> Any:
    """A dense channels-last convolution as one dot: the taps' windows of X side by side on the
    channel axis (im2col, (N, *O, K*C)) times W as (K*C, M), which for a kernel stored HWIO is
    W's own layout. With many output channels W gets zero columns up to a multiple of
    COLUMN_BLOCK (sliced off the product): see there."""
    n, c, m = x.shape[0], x.shape[-1], w.shape[0]
    kernel = tuple(w.shape[2:])
    nd, kk = len(kernel), math.prod(kernel)
    out = out_sizes(x.shape[1:-1], padding, kernel, strides, dilations)
    acc = accumulator(x.dtype)
    xp = pad(x, padding, last=True)
    wins: list[Any] = [window(xp, tap, out, strides, [(0, 0)] * nd, dilations, last=True)
                       for tap in itertools.product(*[range(k) for k in kernel])]
    cols = wins[0] if kk == 1 else jnp.concatenate(wins, axis=-1)
    wk = jnp.transpose(w, (*range(2, nd + 2), 1, 0)).reshape((kk * c, m))
    extra = -m % COLUMN_BLOCK
    if extra * PAD_COST > m:  # at most 1 / PAD_COST more columns
        extra = 0
    if extra:
        wk = jnp.pad(wk, ((0, 0), (0, extra)))
    y = lax.dot_general(cols.reshape((-1, kk * c)), wk, (((1,), (0,)), ((), ())),
                        preferred_element_type=acc)
    if extra:
        y = y[:, :m]
    return y.reshape((n, *out, m)).astype(x.dtype)


def choose_last(sizes: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                padding: Pads, dilations: Sequence[int], group: int) -> Form:
    """The form of a channels-last convolution: taps for image stems and depthwise, a dot for 1x1
    and small dense kernels, XLA's own for other dense ones, and otherwise the channels-first
    form `choose` picks, between two transposes."""
    if group == 1:
        kk = math.prod(w_shape[2:])
        out = out_sizes(sizes, padding, w_shape[2:], strides, dilations)
        if w_shape[1] <= STEM_CHANNELS and w_shape[1] * kk <= STEM_TAPS_TERMS and 0 not in out:
            return stem_taps_last
        small = kk <= 9 and math.prod(out) * kk * w_shape[1] <= IM2COL_ELEMENTS
        return dot_last if (kk == 1 or small) and 0 not in out else native_last
    if w_shape[1] == 1 and math.prod(w_shape[2:]) <= GRID_TAPS_TERMS:
        return taps_last
    if math.prod(w_shape[2:]) == 1 and 0 not in out_sizes(sizes, padding, w_shape[2:], strides,
                                                          dilations):
        return dot_last  # one dot per group: ShuffleNet's 1x1 g3 2.5x onnxruntime, 3.5x via NCHW
    first = choose(sizes, w_shape, strides, padding, dilations, group)

    def via_channels_first(x: Any, w: Any, strides: Sequence[int], padding: Pads,
                           dilations: Sequence[int], group: int) -> Any:
        y = first(jnp.moveaxis(x, -1, 1), w, strides, padding, dilations, group)
        return jnp.moveaxis(y, 1, -1)

    via_channels_first.__name__ = f"{first.__name__}_via_channels_first"
    return via_channels_first


def choose(sizes: Sequence[int], w_shape: Sequence[int], strides: Sequence[int], padding: Pads,
           dilations: Sequence[int], group: int) -> Form:
    """The form of a convolution that ran fastest for its class (benchmarks/conv.py)."""
    kernel = tuple(w_shape[2:])
    pointwise = math.prod(kernel) == 1
    if group == 1:
        # the 1x1-as-dot form (1.1-3x faster in benchmarks/conv.py) gave NaN inside the jitted
        # light squeezenet of the conformance suite while each of its convolutions alone agrees;
        # until that is understood, dense convolutions stay XLA's
        return native
    terms = w_shape[1] * math.prod(kernel)
    if terms <= FUSED_PAD_TERMS:
        return taps
    if terms <= FLAT_TAPS_TERMS and flat_fits(sizes, padding, kernel, strides, dilations):
        return taps_flat
    if terms <= GRID_TAPS_TERMS:
        return taps
    return dot if pointwise else split


# --- ConvTranspose with kernel == stride ---------------------------------------------------------

def transposed_fits(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                    padding: Pads) -> bool:
    """Whether `transposed_dot` applies: kernel == stride and no dilation (pads are a crop)."""
    return (tuple(kernel) == tuple(strides) and all(d == 1 for d in dilations)
            and all(lo >= 0 and hi >= 0 for lo, hi in padding))


def transposed_dot(x: Any, w: Any, group: int, *, last: bool = False) -> Any:
    """A transposed convolution whose kernel equals its stride, before pads: one dot.

    Each input pixel's channels times W, (C, M/group * prod(K)) per group, give that pixel's own
    K block of output pixels (blocks never overlap), which a transpose puts in place (depth to
    space). The lhs-dilated convolution computes the same with prod(K) times the multiplies, all
    but one of them by inserted zeros. X (N, C, *S), W (C, M/group, *K) -> Y (N, M, *(S*K)); with
    `last`, X (N, *S, C) -> Y (N, *(S*K), M).
    """
    n, mg = x.shape[0], w.shape[1]
    kernel, cg = tuple(w.shape[2:]), w.shape[0] // group
    nd, kk = len(kernel), math.prod(kernel)
    sizes = tuple(x.shape[1:-1] if last else x.shape[2:])
    acc = accumulator(x.dtype)
    dims: tuple[Any, Any]
    if last:
        # W as (G, C/G, *K, M/G): each pixel's block comes out (*K, M/G), channels innermost
        wg = jnp.transpose(w.reshape((group, cg, mg, kk)), (0, 1, 3, 2)).reshape((group, cg, -1))
        xg = x.reshape((-1, group, cg))
        dims = (((2,), (1,)), ((1,), (0,)))  # -> (G, N*prod(S), prod(K)*M/G)
        y = lax.dot_general(xg, wg, dims, preferred_element_type=acc)
        y = y.reshape((group, n, *sizes, *kernel, mg))
        # (G, N, s1..sn, k1..kn, M/G) -> (N, s1, k1, ..., sn, kn, G, M/G)
        order = (1, *itertools.chain(*[(2 + i, 2 + nd + i) for i in range(nd)]), 0, 2 + 2 * nd)
        out = (n, *[s * k for s, k in zip(sizes, kernel)], group * mg)
    else:
        wg = w.reshape((group, cg, mg * kk))
        xg = x.reshape((n, group, cg, math.prod(sizes)))
        dims = (((1,), (2,)), ((0,), (1,)))  # -> (G, M/G * prod(K), N, prod(S))
        y = lax.dot_general(wg, xg, dims, preferred_element_type=acc)
        y = y.reshape((group, mg, *kernel, n, *sizes))
        # (G, M/G, k1..kn, N, s1..sn) -> (N, G, M/G, s1, k1, ..., sn, kn)
        order = (2 + nd, 0, 1, *itertools.chain(*[(3 + nd + i, 2 + i) for i in range(nd)]))
        out = (n, group * mg, *[s * k for s, k in zip(sizes, kernel)])
    return jnp.transpose(y, order).reshape(out).astype(x.dtype)


def crop(y: Any, padding: Pads, extra: Sequence[int], *, last: bool = False) -> Any:
    """A full transposed-convolution output with `extra` zeros appended (output_padding) and
    (begin, end) `padding` cut off, per spatial axis."""
    if all(e == 0 for e in extra) and all(p == (0, 0) for p in padding):
        return y
    spatial = [(-lo, e - hi, 0) for (lo, hi), e in zip(padding, extra)]
    config = [(0, 0, 0), *spatial, (0, 0, 0)] if last else [(0, 0, 0), (0, 0, 0), *spatial]
    return lax.pad(y, jnp.zeros((), y.dtype), config)
