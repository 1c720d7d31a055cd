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

from oxla.lowering.ops import conv_forms

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


def stored(y):
    """y materialized (an optimization barrier), computed as a matrix when its last axis is short.

    XLA:CPU vectorizes a loop fusion along its output's last axis: an NCHW tensor with W = 14 or 7
    ran 4-5x slower per element than the same fusion over [N * C, H * W] (requantising
    1x1024x14x14: 233 -> 47 us at one thread). The barrier fixes the fusion's output shape. For
    NCHW quantized tensors only: float Mul's barrier stays 4-D (EfficientNet-B0's channels-last
    tensors with 16-40 channels ran 27% slower as [N * H, W * C])."""
    if y.ndim < 3 or y.shape[-1] >= 64:
        return lax.optimization_barrier(y)
    return lax.optimization_barrier(y.reshape(y.shape[0] * y.shape[1], -1)).reshape(y.shape)


def fma32(a, b, c):
    """fma(a, b, c) in float32, as onnxruntime's AVX2 kernels compute it (a * b exact in float64)."""
    return (a.astype(F64) * b.astype(F64) + c.astype(F64)).astype(F32)


def int_range(dtype) -> tuple[int, int]:
    """(min, max) of an integer type, ml_dtypes' 4-bit ones included."""
    info = ml_dtypes.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def _round_clamped(q, rounded: bool):
    """round half to even of q, |q| <= 2^22, as int32, by an add of 1.5 * 2^23 (float32) or
    1.5 * 2^52 (float64) whose sum holds the rounded value in its low mantissa bits.

    XLA:CPU's round does not vectorize in a fused loop (quantize chains of a QDQ ResNet-50 ran 3x
    slower with it). The add is in float32 only when `rounded` says q is not a float32 product:
    LLVM contracts a product feeding an add into an FMA, which rounds the exact product instead
    of the float32 one; an add in float64 of the widened q cannot be contracted that way."""
    if rounded:
        return lax.bitcast_convert_type(q + np.float32(1.5 * 2**23), I32) - np.int32(0x4B400000)
    return lax.bitcast_convert_type(q.astype(F64) + np.float64(1.5 * 2**52), jnp.int64).astype(I32)


def _fast(q, dtype) -> bool:
    """The rounding add applies: a traced float32 q and a target of at most 2^22 values."""
    lo, hi = int_range(dtype)
    return hi - lo < 2**22 and np.dtype(q.dtype) == np.float32 and not isinstance(q, (np.ndarray, np.generic))


def saturate(q, zero_point, dtype, *, rounded: bool = False):
    """MLAS's last step: clamp q to [min - zp, max - zp], round half to even, add zp.

    NaN becomes the lower bound (MAXPS returns its second operand when the first is NaN).
    `rounded`: q is a rounded value, not a float32 product (see _round_clamped).
    """
    lo, hi = int_range(dtype)
    zp = 0 if zero_point is None else zero_point.astype(F32)
    low, high = lo - zp, hi - zp
    if _fast(q, dtype):
        q = jnp.where(q > low, q, low)  # NaN -> low
        y = _round_clamped(jnp.where(q < high, q, high), rounded)
    else:
        q = jnp.where(jnp.isnan(q), low, jnp.minimum(jnp.maximum(q, low), high))
        y = jnp.round(q).astype(I32)
    if zero_point is not None:
        y = y + zero_point.astype(I32)
    return output(y.astype(dtype))


def convert_saturate(v, dtype, zero_point=None, *, rounded: bool = False):
    """_mm_cvtps_epi32 (half to even; NaN or out of int32 range: INT32_MIN), + zero_point in
    int32, then the saturating packs down to dtype: the kernels that round before they clamp.
    `rounded`: v is a rounded value, not a float32 product (see _round_clamped)."""
    lo, hi = int_range(dtype)
    if _fast(v, dtype):
        # clip(round(v) + zp, lo, hi) == round(clip(v, lo - zp, hi - zp)) + zp for integer bounds,
        # unless round(v) + zp leaves int32: |v| >= 2^30 (integral in float32) and NaN go apart
        z = 0 if zero_point is None else zero_point.astype(F32)
        q = jnp.where(v > lo - z, v, lo - z)
        i = _round_clamped(jnp.where(q < hi - z, q, hi - z), rounded)
        if zero_point is None:  # NaN and v < -2^31 clamp low, as INT32_MIN does; v >= 2^31 (INT32_MIN
            # in the kernel) would clamp high
            return output(jnp.where(v >= 2.0**31, np.int32(lo), i).astype(dtype))
        big = ~(jnp.abs(v) < 2.0**30)
        bad = ~(v >= -(2.0**31)) | (v >= 2.0**31)  # NaN too; no float32 lies within 0.5 of 2^31
        j = jnp.where(bad | ~big, -(2.0**31), v).astype(I32)
        i = i + zero_point.astype(I32)
        far = jnp.clip(j + zero_point.astype(I32), lo, hi)  # wraps as the kernel's int32 add does
        return output(jnp.where(big, far, i).astype(dtype))
    r = jnp.round(v)
    bad = jnp.isnan(v) | (r >= 2.0**31) | (r < -(2.0**31))
    i = jnp.where(bad, -(2.0**31), r).astype(I32)
    if zero_point is not None:
        i = i + zero_point.astype(I32)
    return output(jnp.clip(i, lo, hi).astype(dtype))


def output(y):
    """A quantized result stored as computed (large ones): consumers read the bytes instead of
    XLA fusing the float chain that made them into each consumer (a QDQ ResNet-50 recomputed
    requantisations in two fusions and stored dequantized float32 values instead)."""
    return y if isinstance(y, (np.ndarray, np.generic)) or y.size < 1024 else stored(y)


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
    return saturate(div32(x.astype(F32), scale), zero_point, dtype, rounded=True)  # a float64 quotient, rounded


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


def _materialized(a, b):
    """The operands of an int8 product, kept out of the fusions around it: XLA otherwise shares
    an int32 convert of them with the row/column sums and multiplies in int32 (512x4608 by 49:
    12 ms instead of 1.7 ms)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a, b
    return lax.optimization_barrier((a, b))


def _offset_matmul(a8, ca, b8, cb, *, transposed: bool = False):
    """(a8 + ca) @ (b8 + cb) in int32 from one int8 product and row/column sums (ca per row or
    scalar, cb per column or scalar, None for 0). `transposed`: b8 is given as (N, K).

    b's column sums are one more row of the same product (a row of ones under a8), and a
    transposed b is contracted as it is: a separate sum converted b to int32 on every call, and
    QGemm's B^T was copied (ResNet-50 QOperator's 2048x1000 classifier: 1.8 + 1.0 ms a call)."""
    a8, b8 = _materialized(a8, b8)

    def product(x):
        if transposed:
            return lax.dot_general(x, b8, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=I32)
        return jnp.matmul(x, b8, preferred_element_type=I32)

    if ca is not None:
        ones = jnp.ones((*a8.shape[:-2], 1, a8.shape[-1]), jnp.int8)
        full = product(jnp.concatenate([a8, ones], axis=-2))
        acc, column_sums = full[..., :-1, :], full[..., -1:, :]
    else:
        acc = product(a8)
    if cb is not None:
        acc = acc + jnp.sum(a8, axis=-1, keepdims=True, dtype=I32) * cb
    if ca is not None:
        acc = acc + ca * column_sums
        if cb is not None:
            acc = acc + a8.shape[-1] * ca * cb
    return acc


def int_matmul(a, b, a_zero_point=None, b_zero_point=None, *, b_transposed: bool = False):
    """(a - a_zp) @ (b - b_zp) in int32 with numpy matmul broadcasting; 8-bit a and b.

    a_zp: scalar or per row of a (broadcastable to [..., M, 1]); b_zp: scalar or per column of b
    (broadcastable to [..., 1, N]). `b_transposed`: b is given 2-D as (N, K).
    """
    vec_a, vec_b = a.ndim == 1, b.ndim == 1 and not b_transposed
    a = a[None] if vec_a else a
    b = b[:, None] if vec_b else b
    a8, ca = as_int8(a, a_zero_point)
    b8, cb = as_int8(b, b_zero_point)
    acc = _offset_matmul(a8, ca, b8, cb, transposed=b_transposed)
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


def _columns(a8, kernel, strides, dilations):
    """im2col of channels-first a8 (N, C, *spatial) by strided slices: (N, C * taps, *out), the
    OIHW order of the kernel (channel, then taps row-major)."""
    out = [(size - (k - 1) * d - 1) // s + 1
           for size, k, s, d in zip(a8.shape[2:], kernel, strides, dilations)]
    cols = []
    for taps in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                      for t, o, s, d in zip(taps, out, strides, dilations))
        cols.append(a8[(slice(None), slice(None), *index)])
    if len(cols) == 1:
        return cols[0], out
    stacked = jnp.stack(cols, axis=2)
    return stacked.reshape(a8.shape[0], -1, *out), out


def _conv_int8(x, w, x_zero_point, w_zero_point, strides, padding: Pads, dilations):
    """A group-1 convolution as one int8 GEMM per image, (M, K) @ (K, out pixels), on columns
    laid out channels first: no transposes of activations or weights, NCHW int32 out.

    (XLA's int8 convolution needs channels-last operands, and the transposes around it made
    XLA pick naive loops: 200 ms for a 64-channel 3x3 at 56x56, 1 ms this way.)
    """
    a8, ca = as_int8(x, x_zero_point)
    b8, cb = as_int8(w, w_zero_point)
    if any(lo or hi for lo, hi in padding):
        # pad with -offset so a padded a8 + offset is 0, i.e. X is padded with its zero point
        fill = jnp.zeros((), jnp.int8) if ca is None else (-ca).astype(jnp.int8)
        a8 = lax.pad(a8, fill, [(0, 0, 0), (0, 0, 0)] + [(lo, hi, 0) for lo, hi in padding])
    cols, out = _columns(a8, w.shape[2:], strides, dilations)
    n, m, k = x.shape[0], w.shape[0], math.prod(w.shape[1:])
    wm, cols = _materialized(b8.reshape(m, k), cols.reshape(n, k, -1))
    if n == 1:
        acc = jnp.matmul(wm, cols[0], preferred_element_type=I32)[None]
    else:  # a batched product (the weights broadcast) beats one over the images side by side
        acc = lax.dot_general(jnp.broadcast_to(wm, (n, m, k)), cols, (((2,), (1,)), ((0,), (0,))),
                              preferred_element_type=I32)
    cm = None if cb is None else cb.reshape(-1, 1)
    if cm is not None:
        acc = acc + cm * jnp.sum(cols, axis=1, keepdims=True, dtype=I32)
    if ca is not None:
        acc = acc + ca * jnp.sum(wm, axis=1, keepdims=True, dtype=I32)
        if cm is not None:
            acc = acc + k * ca * cm
    return acc.reshape(n, m, *out)


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
        # the float conv's fastest form for its class (conv_forms.choose: shifted multiply-adds
        # for depthwise; XLA's grouped convolution is its slowest kernel), exact here because
        # every product and partial sum is an integer the type holds. A QDQ MobileNetV3-small
        # (depthwise 3x3 and 5x5) took 23.8 ms with XLA's grouped convolution
        form = conv_forms.choose(a.shape[2:], b.shape, strides, padding, dilations, groups)
        return form(a, b, strides, padding, dilations, groups)
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
    if group != 1:  # grouped (depthwise) ones: float products, exact (see _conv_float)
        return _conv_float(x, w, x_zero_point, w_zero_point, strides, padding, dilations, group)
    return _conv_int8(x, w, x_zero_point, w_zero_point, strides, padding, dilations)


# Channels-last int8 convolutions (one core, QDQ ResNet-50 shapes): a 1x1 kernel is one GEMM
# over the (strided) pixels; a larger one goes to XLA's convolution (YNNPACK's int8 kernel) from
# 28x28 outputs and 16 channels up (64 channels 3x3 at 56x56: 0.24 ms against 0.70 ms as
# columns), and is one GEMM over im2col columns below (512 channels at 7x7: 0.67 against 1.0 ms;
# a 7x7 stem over 3 channels at 224x224: 1.0 against 4.7 ms).
YNN_MIN_CHANNELS = 16
YNN_MIN_PIXELS = 28 * 28


def int_conv_last(x, w, strides, padding: Pads, dilations):
    """conv(x, w) in int32 for 8-bit x (N, H, W, C) and w (kH, kW, C, M) without zero points,
    channels last: int8 operands (uint8 ones shifted by 128, the shift's share added back from
    the weights' sums), X padded with zeros."""
    a8, ca = as_int8(x, None)
    b8, cb = as_int8(w, None)
    if ca is not None:  # pad with -128 so a padded a8 + 128 is 0
        a8 = lax.pad(a8, jnp.int8(-128), [(0, 0, 0), *[(lo, hi, 0) for lo, hi in padding], (0, 0, 0)])
        padding = [(0, 0)] * len(padding)
    c = w.shape[-2]
    out = [(size + lo + hi - (k - 1) * d - 1) // st + 1
           for size, (lo, hi), k, st, d in zip(a8.shape[1:-1], padding, w.shape[:-2], strides, dilations)]
    if c >= YNN_MIN_CHANNELS and math.prod(out) >= YNN_MIN_PIXELS and math.prod(w.shape[:-2]) > 1:
        acc = lax.conv_general_dilated(a8, b8, tuple(strides), list(padding), rhs_dilation=tuple(dilations),
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                       preferred_element_type=I32)
    else:
        acc = _columns_last_product(a8, b8, strides, padding, dilations)
    k = math.prod(w.shape[:-1])
    if cb is not None:  # (a8 + ca) (b8 + cb) = a8 b8 + cb * sum(a8) + ca * sum(b8) + k ca cb
        ones = jnp.ones((*w.shape[:-1], 1), jnp.int8)
        window = _columns_last_product(a8, ones, strides, padding, dilations)
        acc = acc + cb * window
    if ca is not None:
        acc = acc + ca * jnp.sum(b8, axis=(0, 1, 2), dtype=I32)
        if cb is not None:
            acc = acc + k * ca * cb
    return acc


def _columns_last_product(a8, b8, strides, padding: Pads, dilations):
    """a8 (N, H, W, C) convolved with b8 (kH, kW, C, M) as one int8 GEMM over channels-last im2col
    columns, each tap's C channels in a slot of 4 (zeros in the rest: one aligned 4-byte group per
    tap), int32 (N, oH, oW, M)."""
    if any(lo or hi for lo, hi in padding):
        a8 = lax.pad(a8, jnp.int8(0), [(0, 0, 0), *[(lo, hi, 0) for lo, hi in padding], (0, 0, 0)])
    kernel, c, m = b8.shape[:-2], b8.shape[-2], b8.shape[-1]
    slot = -(-c // 4) * 4
    out = [(size - (k - 1) * d - 1) // s + 1
           for size, k, s, d in zip(a8.shape[1:-1], kernel, strides, dilations)]
    cols = []
    for taps in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                      for t, o, s, d in zip(taps, out, strides, dilations))
        tap = a8[(slice(None), *index, slice(None))]
        cols.append(tap if slot == c else jnp.pad(tap, [(0, 0)] * (tap.ndim - 1) + [(0, slot - c)]))
    n = a8.shape[0]
    columns = jnp.concatenate(cols, axis=-1).reshape(n * math.prod(out), -1)
    wk = b8 if slot == c else jnp.pad(b8, [(0, 0)] * (b8.ndim - 2) + [(0, slot - c), (0, 0)])
    columns, wk = _materialized(columns, wk.reshape(-1, m))
    return jnp.matmul(columns, wk, preferred_element_type=I32).reshape(n, *out, m)
