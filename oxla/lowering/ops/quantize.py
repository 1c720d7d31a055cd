"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul, QLinearConv."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from oxla.dtypes import to_numpy_dtype
from oxla.lowering.ops import qmath
from oxla.lowering.ops.conv import conv_window
from oxla.lowering.registry import rule
from oxla.passes.qlinear_conv import DOMAIN as REQUANTIZE

_FLOAT8 = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                          ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz))
_FLOAT4 = frozenset({np.dtype(ml_dtypes.float4_e2m1fn)})
_INTEGER = frozenset(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, ml_dtypes.uint4,
                                           ml_dtypes.int4, ml_dtypes.uint2, ml_dtypes.int2))


def _param(cx, name: str, p, shape: tuple[int, ...], axis: int, block_size: int):
    """A scale or zero point made broadcastable to `shape`: per tensor, per axis, or blocked."""
    if p.ndim == 0 or p.size == 1:
        return p.reshape(())
    rank = len(shape)
    if not -rank <= axis < rank:
        raise cx.fail(f"axis {axis} is out of range for input of rank {rank}")
    axis %= rank
    if not block_size:
        if p.ndim != 1 or p.shape[0] != shape[axis]:
            raise cx.fail(f"{name} of shape {tuple(p.shape)} must be a scalar or 1-D of length "
                          f"{shape[axis]} (axis {axis} of input shape {shape})")
        return p.reshape(tuple(shape[axis] if i == axis else 1 for i in range(rank)))
    if block_size < 0:
        raise cx.fail(f"block_size must be positive, got {block_size}")
    p = jnp.repeat(p, block_size, axis=axis)
    p = lax.slice_in_dim(p, 0, min(shape[axis], p.shape[axis]), axis=axis)
    if tuple(p.shape) != tuple(shape):
        raise cx.fail(f"blocked {name} repeated {block_size} times along axis {axis} has shape "
                      f"{tuple(p.shape)}, expected the input shape {tuple(shape)}")
    return p


def _saturate_round(q, dtype: np.dtype):
    """round half to even, then clamp to the integer range of `dtype`."""
    info = ml_dtypes.iinfo(dtype)
    return jnp.clip(jnp.round(q), info.min, info.max).astype(dtype)


def _to_quantized(cx, q, zp, target: np.dtype, saturate: int):
    """y = saturate(q + zero_point) in the target type; q = x / scale, already in its precision."""
    if target in _INTEGER:
        wide = jnp.float64 if q.dtype == jnp.float64 else jnp.float32  # fp16 cannot hold 65535
        q = jnp.round(q).astype(wide)
        if zp is not None:
            q = q + zp.astype(wide)
        return _saturate_round(q, target)
    if target in _FLOAT8 or target in _FLOAT4:
        q = q.astype(jnp.float32) if q.dtype != jnp.float64 else q
        if zp is not None:
            q = q + zp.astype(q.dtype)
        if saturate and target in _FLOAT8:
            top = float(ml_dtypes.finfo(target).max)
            q = jnp.clip(q, -top, top)  # +-inf saturate to the largest finite value, NaN stays
        # float4 has no infinity: the conversion itself saturates
        return q.astype(target)
    raise cx.fail(f"{target} is not a quantized type")


def _division_type(scale_dtype: np.dtype, precision: int):
    if precision:
        return to_numpy_dtype(precision)
    if scale_dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
        return np.dtype(np.float32)  # a power-of-two scale: x / scale is exact in float32
    return scale_dtype


@rule("QuantizeLinear", since=10)
def quantize_linear(cx, x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                    precision=0, saturate=1):
    """y = saturate(round(x / y_scale) + y_zero_point) (v10 per tensor; v13 axis; v19 float8 and
    saturate; v21 blocks, int4/uint4, output_dtype; v23 float4, precision; v25 int2/uint2)."""
    if y_zero_point is not None:
        target = np.dtype(y_zero_point.dtype)
        if output_dtype and to_numpy_dtype(output_dtype) != target:
            raise cx.fail(f"output_dtype {to_numpy_dtype(output_dtype)} differs from the zero "
                          f"point's type {target}")
    else:
        target = to_numpy_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)
    if target not in _INTEGER | _FLOAT8 | _FLOAT4:
        raise cx.fail(f"cannot quantize to {target}")
    work = _division_type(np.dtype(y_scale.dtype), precision)
    scale = _param(cx, "y_scale", y_scale, x.shape, axis, block_size)
    zp = None
    if y_zero_point is not None:
        zp = _param(cx, "y_zero_point", y_zero_point, x.shape, axis, block_size)
    if target in _INTEGER and not precision and work != np.float64:
        # onnxruntime divides in float32 for float16/bfloat16 inputs and scales too
        return qmath.quantize(x, scale.astype(jnp.float32), zp, target)
    return _to_quantized(cx, x.astype(work) / scale.astype(work), zp, target, saturate)


@rule("DequantizeLinear", since=10)
def dequantize_linear(cx, x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    """y = (x - x_zero_point) * x_scale (v10 per tensor; v13 axis; v19 float8; v21 blocks and
    int4/uint4; v23 float4 and output_dtype; v24 float8e8m0 scales; v25 int2/uint2)."""
    out = to_numpy_dtype(output_dtype) if output_dtype else np.dtype(x_scale.dtype)
    if out == np.dtype(ml_dtypes.float8_e8m0fnu):
        raise cx.fail("the output type cannot be float8e8m0; set output_dtype")
    wide = jnp.float64 if out == np.float64 else jnp.float32  # products of fp16 values are exact in fp32
    if np.dtype(x.dtype) == np.int32:
        # int32 (a com.microsoft type) subtracts in int32 first, wrapping as onnxruntime's does
        # (float32 cannot hold every int32); the float32 product is then stored, so that XLA
        # cannot contract it with a later Add into an FMA
        sub, work = jnp.int32, wide
    else:
        # (x - zp) * scale is exact in float64 for every other input type (at most 17 by 24
        # bits), so its float32 rounding is the float32 product, and a converted product is not
        # an LLVM float multiply that could be contracted with a later Add. Stored float32
        # products instead: DQ + DQ + Add + QuantizeLinear over 1x256x56x56 took 552 us, 357 us
        # this way (one thread).
        sub = work = jnp.float64 if wide == jnp.float32 else wide
    dx = x.astype(sub)
    if x_zero_point is not None:
        if np.dtype(x_zero_point.dtype) != np.dtype(x.dtype):
            raise cx.fail(f"x_zero_point has type {x_zero_point.dtype}, x has {x.dtype}")
        dx = dx - _param(cx, "x_zero_point", x_zero_point, x.shape, axis, block_size).astype(sub)
    y = dx.astype(work) * _param(cx, "x_scale", x_scale, x.shape, axis, block_size).astype(work)
    if work == jnp.float32 and not isinstance(y, (np.ndarray, np.generic)):
        y = qmath.stored(y)
    return y.astype(wide).astype(out)


@rule("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(cx, x):
    """uint8 y, y_scale = (max(0, x) - min(0, x)) / 255, y_zero_point = round(-min / scale) (v11+)."""
    y, scale, zp = qmath.dynamic_quantize(x)
    return y, scale.astype(x.dtype), zp


def _row_param(p):
    """A per-row scale or zero point of matrix a: 1-D [M] becomes [M, 1] to broadcast over K."""
    if p is None or p.ndim != 1:
        return p
    return p.reshape(()) if p.size == 1 else p.reshape((p.shape[0], 1))


def _qlinear_matmul_float8(cx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                           y_zero_point):
    """The float8 form: products of dequantized values, summed in float32."""
    def centered(v, zp):
        out = v.astype(jnp.float32)
        return out if zp is None else out - zp.astype(jnp.float32)

    acc = jnp.matmul(centered(a, _row_param(a_zero_point)), centered(b, b_zero_point),
                     precision=lax.Precision.HIGHEST)
    multiplier = _row_param(a_scale) * b_scale / y_scale
    target = np.dtype(y_zero_point.dtype if y_zero_point is not None else a.dtype)
    return _to_quantized(cx, acc * multiplier.astype(jnp.float32), y_zero_point, target, 1)


@rule("QLinearMatMul", since=10)
def qlinear_matmul(cx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """y = qmath.quantize((a - a_zp) @ (b - b_zp) * (a_scale * b_scale / y_scale)) (v10 8-bit ints;
    v21 float8 inputs and float16/bfloat16 scales)."""
    if a.ndim < 1 or b.ndim < 1:
        raise cx.fail("inputs must have rank >= 1")
    if np.dtype(a.dtype) in _FLOAT8 or np.dtype(b.dtype) in _FLOAT8:
        return _qlinear_matmul_float8(cx, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                                      y_scale, y_zero_point)
    # int32 accumulation, then MlasRequantizeOutput with a_scale * b_scale / y_scale in float32
    acc = qmath.int_matmul(a, b, _row_param(a_zero_point), b_zero_point)
    multiplier = qmath.output_scale(_row_param(a_scale), b_scale, y_scale)
    return qmath.requantize(acc, multiplier, y_zero_point, np.dtype(y_zero_point.dtype))


def _per_channel(p, rank: int):
    """A scalar, or a 1-D per-output-channel value reshaped to (M, 1, ...) of the given rank."""
    if p is None or p.ndim == 0 or p.size == 1:
        return None if p is None else p.reshape(())
    return p.reshape((-1,) + (1,) * (rank - 1))


@rule("QLinearConv", since=10)
def qlinear_conv(cx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                 strides=None):
    """y = qmath.quantize(conv(x - x_zp, w - w_zp) + B, x_scale * w_scale / y_scale) (v10+)."""
    s, padding, d = conv_window(cx, x, w, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides)
    acc = qmath.int_conv(x, w, x_zero_point.reshape(()), w_zero_point, s, padding, d, group)
    n = x.ndim - 2
    if B is not None:
        acc = acc + B.astype(jnp.int32).reshape((-1,) + (1,) * n)
    multiplier = qmath.output_scale(x_scale.reshape(()), _per_channel(w_scale, n + 1), y_scale.reshape(()))
    return qmath.requantize(acc, multiplier, y_zero_point.reshape(()), np.dtype(y_zero_point.dtype))


@rule("Requantize", since=1, domain=REQUANTIZE)
def requantize(cx, acc, multiplier, zero_point):
    """y = saturate(round(float32(acc) * multiplier) + zero_point), multiplier float32 and
    broadcast against acc, zero_point a scalar of the 8-bit result type (QLinearConvCenteringPass):
    MlasRequantizeOutput in one loop."""
    if np.size(zero_point) != 1:
        raise cx.fail(f"zero_point must be a scalar, got shape {tuple(zero_point.shape)}")
    return qmath.requantize(acc, multiplier, zero_point.reshape(()), np.dtype(zero_point.dtype))
