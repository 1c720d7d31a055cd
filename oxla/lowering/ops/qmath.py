"""Quantized arithmetic shared by the quantized rules: onnxruntime's float32 rounding, exact int32 products.

No rules here. Two facts shape it (measured on XLA:CPU, jax 0.12):
- XLA rewrites `x / broadcast(s)` as `x * (1 / s)` and contracts `a * b + c` into an FMA, so a
  float32 formula written plainly does not round where onnxruntime's kernels round. `div32` and
  `fma32` compute in float64 and round once to float32: the float64 result is close enough to the
  exact one that the float32 rounding is onnxruntime's. A product rounded through float64 is not
  enough against the FMA (LLVM folds it back to a float32 multiply): `mul32` stores it instead.
- XLA:CPU runs an int8 x int8 -> int32 dot, or a channels-last 2-D convolution, 5-10x faster than
  float32 (oneDNN), while an int32 or channels-first int8 convolution falls back to a naive loop
  (100x slower). Integer products therefore go through int8 operands with zero points folded
  in as row/column sums: exact in int32, as onnxruntime accumulates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

F32 = jnp.float32
F64 = jnp.float64
I32 = jnp.int32
Pads = Sequence[tuple[int, int]]


def div32(a, b):
    """a / b correctly rounded to float32 (a float64 quotient is within 2^-52 of the exact one)."""
    return (a.astype(F64) / b.astype(F64)).astype(F32)


def mul32(a, b):
    """a * b in float32, kept apart from a following add (onnxruntime rounds the product first)."""
    y = a.astype(F32) * b.astype(F32)
    if isinstance(y, (np.ndarray, np.generic)):
        return y  # folded at trace time: numpy never fuses
    return lax.optimization_barrier(y)


def fma32(a, b, c):
    """fma(a, b, c) in float32, as onnxruntime's AVX2 kernels compute it (a * b exact in float64)."""
    return (a.astype(F64) * b.astype(F64) + c.astype(F64)).astype(F32)


def int_range(dtype) -> tuple[int, int]:
    info = ml_dtypes.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def saturate(q, zero_point, dtype):
    """MLAS's last step: clamp q to [min - zp, max - zp], round half to even, add zp.

    NaN becomes the lower bound (MAXPS returns its second operand when the first is NaN).
    """
    lo, hi = int_range(dtype)
    zp = 0 if zero_point is None else zero_point.astype(F32)
    low, high = lo - zp, hi - zp
    q = jnp.where(jnp.isnan(q), low, jnp.minimum(jnp.maximum(q, low), high))
    y = jnp.round(q).astype(I32)
    if zero_point is not None:
        y = y + zero_point.astype(I32)
    return y.astype(dtype)


def convert_saturate(v, dtype, zero_point=None):
    """_mm_cvtps_epi32 (half to even; NaN or out of int32 range: INT32_MIN), + zero_point in
    int32, then the saturating packs down to dtype: the kernels that round before they clamp."""
    r = jnp.round(v)
    bad = jnp.isnan(v) | (r >= 2.0**31) | (r < -(2.0**31))
    i = jnp.where(bad, -(2.0**31), r).astype(I32)
    if zero_point is not None:
        i = i + zero_point.astype(I32)
    lo, hi = int_range(dtype)
    return jnp.clip(i, lo, hi).astype(dtype)


def dynamic_quantize(x):
    """(uint8 y, scale, zero point) from x's range including 0: GetQuantizationParameter, then
    MlasQuantizeLinear (all zeros give scale 1)."""
    hi = jnp.maximum(jnp.max(x).astype(F32), 0.0)
    lo = jnp.minimum(jnp.min(x).astype(F32), 0.0)
    scale = jnp.where(hi == lo, jnp.float32(1), div32(hi - lo, jnp.float32(255)))
    zp = jnp.round(jnp.clip(-div32(lo, scale), 0, 255)).astype(jnp.uint8)
    return quantize(x, scale, zp, np.dtype(np.uint8)), scale, zp


def quantize(x, scale, zero_point, dtype):
    """saturate(round(x / scale) + zero_point): MlasQuantizeLinear (float32 division, half to even)."""
    return saturate(div32(x.astype(F32), scale), zero_point, dtype)


def requantize(acc, multiplier, zero_point, dtype):
    """saturate(round(float(acc) * multiplier) + zero_point): MlasRequantizeOutput."""
    return saturate(acc.astype(F32) * multiplier.astype(F32), zero_point, dtype)


def output_scale(a_scale, b_scale, y_scale):
    """a_scale * b_scale / y_scale in float32, in that order (onnxruntime's output_scales)."""
    return div32(mul32(a_scale, b_scale), y_scale)


# --- exact integer products ---------------------------------------------------------------------

def as_int8(v, zero_point):
    """(v8, offset) with v - zero_point == v8 + offset: v8 int8, offset int32 (None when 0)."""
    if np.dtype(v.dtype) == np.uint8:
        v8 = (v.astype(jnp.int16) - 128).astype(jnp.int8)  # v - 128 fits int8: 128 joins the offset
        shift = 128
    elif np.dtype(v.dtype) == np.int8:
        v8, shift = v, 0
    else:
        raise TypeError(f"expected int8 or uint8, got {v.dtype}")
    if zero_point is None:
        return v8, (jnp.asarray(shift, I32) if shift else None)
    if isinstance(zero_point, (np.ndarray, np.generic)):  # static: skip a zero offset
        offset = shift - np.asarray(zero_point, np.int32)
        return v8, (jnp.asarray(offset) if offset.any() else None)
    return v8, shift - zero_point.astype(I32)


def _offset_matmul(a8, ca, b8, cb):
    """(a8 + ca) @ (b8 + cb) in int32 from one int8 product and row/column sums (ca per row or
    scalar, cb per column or scalar, None for 0)."""
    acc = jnp.matmul(a8, b8, preferred_element_type=I32)
    if cb is not None:
        acc = acc + jnp.sum(a8, axis=-1, keepdims=True, dtype=I32) * cb
    if ca is not None:
        acc = acc + ca * jnp.sum(b8, axis=-2, keepdims=True, dtype=I32)
        if cb is not None:
            acc = acc + a8.shape[-1] * ca * cb
    return acc


def int_matmul(a, b, a_zero_point=None, b_zero_point=None):
    """(a - a_zp) @ (b - b_zp) in int32 with numpy matmul broadcasting; 8-bit a and b.

    a_zp: scalar or per row of a (broadcastable to [..., M, 1]); b_zp: scalar or per column of b
    (broadcastable to [..., 1, N]).
    """
    vec_a, vec_b = a.ndim == 1, b.ndim == 1
    a = a[None] if vec_a else a
    b = b[:, None] if vec_b else b
    a8, ca = as_int8(a, a_zero_point)
    b8, cb = as_int8(b, b_zero_point)
    acc = _offset_matmul(a8, ca, b8, cb)
    if vec_a:
        acc = acc[..., 0, :]
    return acc[..., 0] if vec_b else acc


def _bound(v, zero_point) -> int:
    """The largest |v - zero_point| its type allows (a static zero point narrows it)."""
    lo, hi = int_range(v.dtype)
    if zero_point is None:
        return max(-lo, hi)
    if isinstance(zero_point, (np.ndarray, np.generic)):
        z = np.asarray(zero_point, np.int64)
        return int(max(np.max(np.abs(lo - z)), np.max(np.abs(hi - z))))
    return hi - lo


def _window_sum(a, kernel, strides, dilations):
    """Sum of a (channels last) over the channels and each kernel window: [N, *out, 1]."""
    s = jnp.sum(a, axis=-1, keepdims=True, dtype=I32)
    n = len(kernel)
    return lax.reduce_window(s, np.int32(0), lax.add, (1, *kernel, 1), (1, *strides, 1),
                             [(0, 0)] * (n + 2), window_dilation=(1, *dilations, 1))


def _patches(a8, kernel, strides, dilations):
    """im2col of channels-last a8 (N, *spatial, C) by shifted strided slices: (N, *out, K C),
    taps in row-major kernel order, channels fastest (the order of an HWIO kernel)."""
    out = _out_sizes(a8.shape[1:-1], kernel, strides, dilations)
    cols = []
    for taps in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                      for t, o, s, d in zip(taps, out, strides, dilations))
        cols.append(a8[(slice(None), *index, slice(None))])
    return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)


# im2col + one int8 dot beats XLA's int8 convolution below 32 input channels (16 at 16x16,
# batch 8: 0.15 vs 1.1 ms) and on small images (64 at 2x2: 0.05 vs 0.49 ms); the convolution
# wins on large ones (64 at 56x56: 0.19 vs 0.67 ms)
_IM2COL_BYTES = 1 << 18
_MIN_CONV_CHANNELS = 32


def _conv_int8(x, w, x_zero_point, w_zero_point, strides, padding: Pads, dilations):
    """Channels-last int8 convolution (group 1) with the zero points folded in; int32 NCHW out."""
    n = x.ndim - 2
    a8, ca = as_int8(x, x_zero_point)
    b8, cb = as_int8(w, w_zero_point)
    if any(lo or hi for lo, hi in padding):
        # pad with -offset so a padded a8 + offset is 0, i.e. X is padded with its zero point
        fill = jnp.zeros((), jnp.int8) if ca is None else (-ca).astype(jnp.int8)
        a8 = lax.pad(a8, fill, [(0, 0, 0), (0, 0, 0)] + [(lo, hi, 0) for lo, hi in padding])
    a8 = jnp.moveaxis(a8, 1, -1)
    b8 = jnp.transpose(b8, (*range(2, n + 2), 1, 0))  # HWIO
    kernel, k = w.shape[2:], math.prod(w.shape[1:])
    rows = x.shape[0] * math.prod(_out_sizes(a8.shape[1:-1], kernel, strides, dilations))
    cm = None if cb is None else cb.reshape(-1)
    if x.shape[1] < _MIN_CONV_CHANNELS or rows * k <= _IM2COL_BYTES:
        acc = _offset_matmul(_patches(a8, kernel, strides, dilations), ca, b8.reshape(k, -1), cm)
        return jnp.moveaxis(acc, -1, 1)
    spec = (0, n + 1, *range(1, n + 1))
    dims = lax.ConvDimensionNumbers(spec, (n + 1, n, *range(n)), spec)
    acc = lax.conv_general_dilated(a8, b8, strides, [(0, 0)] * n, rhs_dilation=dilations,
                                   dimension_numbers=dims, preferred_element_type=I32)
    if cm is not None:
        acc = acc + _window_sum(a8, kernel, strides, dilations) * cm
    if ca is not None:
        acc = acc + ca * jnp.sum(b8, axis=tuple(range(n + 1)), dtype=I32)
        if cm is not None:
            acc = acc + k * ca * cm
    return jnp.moveaxis(acc, -1, 1)


def _out_sizes(spatial, kernel, strides, dilations) -> list[int]:
    return [(size - (k - 1) * d - 1) // s + 1 for size, k, s, d in zip(spatial, kernel, strides, dilations)]


def _per_channel(zero_point, rank: int):
    """A scalar or per-output-channel zero point broadcastable to (M, C, k...)."""
    z = jnp.asarray(zero_point)
    return z.reshape(()) if z.size == 1 else z.reshape((-1,) + (1,) * (rank - 1))


def _split_weights(wi, group: int):
    """Integer weights (M, C/g, k...) as (hi, lo) 4-bit halves, w = 16 hi + lo, stacked per group
    on the output axis: (2M, C/g, k...), group g's hi filters then its lo filters."""
    m = wi.shape[0]
    hi, lo = wi >> 4, wi & 15
    both = jnp.stack([hi.reshape(group, m // group, *wi.shape[1:]),
                      lo.reshape(group, m // group, *wi.shape[1:])], axis=1)
    return both.reshape(2 * m, *wi.shape[1:])


def _conv_float(x, w, x_zero_point, w_zero_point, strides, padding: Pads, dilations, group):
    """Centered operands in float32 when every partial sum is an exact integer there (|sum| of
    products < 2^24), else with the weights split in 4-bit halves (two float32 products), else
    float64; int32 out."""
    k = math.prod(w.shape[1:])
    bx, bw = _bound(x, x_zero_point), _bound(w, w_zero_point)
    xf = x.astype(F32)
    if x_zero_point is not None:
        xf = xf - jnp.asarray(x_zero_point).astype(F32).reshape(())
    wi = w.astype(I32)
    if w_zero_point is not None:
        wi = wi - _per_channel(w_zero_point, w.ndim).astype(I32)

    def conv(a, b, groups=group):
        return lax.conv_general_dilated(a, b, strides, list(padding), rhs_dilation=dilations,
                                        feature_group_count=groups, precision=lax.Precision.HIGHEST)
    if k * bx * bw < 2**24:
        return conv(xf, wi.astype(F32)).astype(I32)
    if k * bx * 16 < 2**24:
        y = conv(xf, _split_weights(wi, group).astype(F32)).astype(I32)
        n, m, spatial = y.shape[0], w.shape[0], y.shape[2:]
        y = y.reshape(n, group, 2, m // group, *spatial)
        return (16 * y[:, :, 0] + y[:, :, 1]).reshape(n, m, *spatial)
    return conv(xf.astype(F64), wi.astype(F64)).astype(I32)


def int_conv(x, w, x_zero_point, w_zero_point, strides, padding: Pads, dilations, group: int):
    """conv(x - x_zp, w - w_zp) in int32, NCHW / (M, C/group, k...), X padded with x_zp."""
    strides, dilations = tuple(strides), tuple(dilations)
    n = x.ndim - 2
    if group != 1 or n > 2:  # grouped int8 convolutions are slow in XLA (19 ms vs 4 ms float32)
        return _conv_float(x, w, x_zero_point, w_zero_point, strides, padding, dilations, group)
    if n == 1:  # XLA's int8 kernels are 2-D: a unit axis in front
        acc = _conv_int8(x[:, :, None], w[:, :, None], x_zero_point, w_zero_point, (1, *strides),
                         [(0, 0), *padding], (1, *dilations))
        return acc[:, :, 0]
    return _conv_int8(x, w, x_zero_point, w_zero_point, strides, padding, dilations)
