"""Quantized com.microsoft ops as onnxruntime's CPU kernels compute them: QLinear*, QGemm, ...

Each rule follows the rounding of onnxruntime's x86-64 kernels (MLAS with AVX2/FMA), where
exact agreement is possible: integer products accumulate in int32, and the float32 steps round
where the kernel rounds (see qmath).
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.ops import qmath
from oxla.lowering.ops.elementwise import LOGISTIC_P, LOGISTIC_Q
from oxla.lowering.ops.pool import pool_counts, window
from oxla.lowering.ops.quantize import dequantize_linear, qlinear_conv, quantize_linear
from oxla.lowering.registry import rule

F32 = jnp.float32
I32 = jnp.int32
MS = "com.microsoft"


def _zero_point(zp):
    """A per-tensor zero point as float32 (absent: 0)."""
    return jnp.zeros((), F32) if zp is None else zp.reshape(()).astype(F32)


# --- QLinearAdd / QLinearMul ---------------------------------------------------------------------

def _scalar_side(a_shape, b_shape) -> str:
    """Which operand onnxruntime's broadcast loop hands to the kernel as a scalar: 'a', 'b' or ''.

    The loop walks spans of the innermost non-unit output axis: an input of size 1 there is a
    scalar for every span (a per-channel B over NCHW), otherwise both are vectors.
    """
    if int(np.prod(a_shape)) == 1:
        return "a"
    if int(np.prod(b_shape)) == 1:
        return "b"
    out = np.broadcast_shapes(tuple(a_shape), tuple(b_shape))
    rank = len(out)
    a = (1,) * (rank - len(a_shape)) + tuple(a_shape)
    b = (1,) * (rank - len(b_shape)) + tuple(b_shape)
    for i in reversed(range(rank)):
        if out[i] != 1:
            return "a" if a[i] == 1 else "b" if b[i] == 1 else ""
    return ""


def _check_per_tensor(cx, **params) -> None:
    """onnxruntime's QLinear elementwise kernels take one scale and zero point per tensor."""
    for name, v in params.items():
        if v is not None and int(np.prod(v.shape)) != 1:
            raise cx.fail(f"{name} must be a scalar or a 1-element tensor, got shape {tuple(v.shape)}")


@rule("QLinearAdd", since=1, domain=MS)
def qlinear_add(cx, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """C = quantize(dequantize(A) + dequantize(B)) with numpy broadcasting (MlasQLinearAdd, AVX2)."""
    _check_per_tensor(cx, A_scale=A_scale, A_zero_point=A_zero_point, B_scale=B_scale,
                      B_zero_point=B_zero_point, C_scale=C_scale, C_zero_point=C_zero_point)
    side = _scalar_side(A.shape, B.shape)
    # the kernel takes its scalar operand second: onnxruntime swaps A and B when A is the scalar
    (x, sx, zx), (y, sy, zy) = ((B, B_scale, B_zero_point), (A, A_scale, A_zero_point)) \
        if side == "a" else ((A, A_scale, A_zero_point), (B, B_scale, B_zero_point))
    sc = C_scale.reshape(())
    rx, ry = qmath.div32(sx.reshape(()), sc), qmath.div32(sy.reshape(()), sc)
    zc = _zero_point(C_zero_point)
    # float(zc) - (rx * zx + ry * zy), as compiled with FMA contraction
    fixed = zc - qmath.fma32(rx, _zero_point(zx), qmath.mul32(ry, _zero_point(zy)))
    # vector + vector: fma(x, rx, fma(y, ry, fixed)); a scalar y folds into the constant part
    # first, by the same FMA
    v = qmath.fma32(x.astype(F32), rx, qmath.fma32(y.astype(F32), ry, fixed))
    return qmath.convert_saturate(v, np.dtype(A.dtype), rounded=True)


@rule("QLinearMul", since=1, domain=MS)
def qlinear_mul(cx, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """C = quantize(dequantize(A) * dequantize(B)): (A - za) * (B - zb) * (sa * sb / sc) + zc."""
    _check_per_tensor(cx, A_scale=A_scale, A_zero_point=A_zero_point, B_scale=B_scale,
                      B_zero_point=B_zero_point, C_scale=C_scale, C_zero_point=C_zero_point)
    ratio = qmath.output_scale(A_scale.reshape(()), B_scale.reshape(()), C_scale.reshape(()))
    a = A.astype(I32) - (0 if A_zero_point is None else A_zero_point.reshape(()).astype(I32))
    b = B.astype(I32) - (0 if B_zero_point is None else B_zero_point.reshape(()).astype(I32))
    # |a * b| <= 65025 is exact in float32; the zero point is added in float32 before rounding
    v = qmath.mul32((a * b).astype(F32), ratio) + _zero_point(C_zero_point)
    return qmath.convert_saturate(v, np.dtype(A.dtype), rounded=True)


# --- QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul ------------------------------------------

@rule("QGemm", since=1, domain=MS)
def qgemm(cx, A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
          y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """Y = alpha * (op(A) - za) @ (op(B) - zb) + C (int32), requantized when y_scale is given."""
    cx.expect_rank("A", A, 2)
    cx.expect_rank("B", B, 2)
    a = A.T if transA else A
    k_b = B.shape[1] if transB else B.shape[0]
    if a.shape[1] != k_b:
        raise cx.fail(f"op(A) {a.shape} and op(B) {B.T.shape if transB else B.shape} do not share "
                      "the inner dimension")
    # B^T is contracted as it is (not copied): transB=1 is what quantizers write for Linear layers
    acc = qmath.int_matmul(a, B, a_zero_point.reshape(()), _per_column(b_zero_point),
                           b_transposed=bool(transB))
    if C is not None:
        acc = acc + jnp.broadcast_to(C.astype(I32), acc.shape)
    # alpha * a_scale * b_scale[n], then / y_scale: onnxruntime's ComputeOutputScale
    scale = qmath.mul32(qmath.mul32(jnp.asarray(alpha, F32), a_scale.reshape(())),
                        _per_column(b_scale))
    if y_scale is not None:
        scale = qmath.div32(scale, y_scale.reshape(()))
    if y_zero_point is None:
        return qmath.mul32(acc.astype(F32), scale)
    return qmath.requantize(acc, scale, y_zero_point.reshape(()), np.dtype(y_zero_point.dtype))


def _per_column(v):
    """A scalar, or a per-column [N] scale or zero point of B."""
    return v.reshape(()) if v.size == 1 else v.reshape(-1)


def _integer_to_float(a, a_zero_point, b, b_zero_point, scale, bias):
    """float(int32 (a - za) @ (b - zb)) * scale [+ bias]: MLAS's scale-bias output processor."""
    acc = qmath.int_matmul(a, b, a_zero_point, b_zero_point)
    y = qmath.mul32(acc.astype(F32), scale)
    return y if bias is None else y + bias.astype(F32)


@rule("MatMulIntegerToFloat", since=1, domain=MS)
def mat_mul_integer_to_float(cx, A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None,
                             bias=None):
    """Y = (A - a_zp) @ (B - b_zp) * (a_scale * b_scale) + bias, int32 products."""
    _check_per_tensor(cx, a_scale=a_scale, a_zero_point=a_zero_point)
    scale = qmath.mul32(a_scale.reshape(()), _per_column(b_scale))
    zb = None if b_zero_point is None else _per_column(b_zero_point)
    za = None if a_zero_point is None else a_zero_point.reshape(())
    y = _integer_to_float(A, za, B, zb, scale, bias)
    return y.astype(a_scale.dtype)


@rule("DynamicQuantizeMatMul", since=1, domain=MS)
def dynamic_quantize_matmul(cx, A, B, b_scale, b_zero_point=None, bias=None):
    """Y = MatMulIntegerToFloat(DynamicQuantizeLinear(A), B): A quantized to uint8 per tensor."""
    a, a_scale, a_zp = qmath.dynamic_quantize(A)
    zb = None if b_zero_point is None else _per_column(b_zero_point)
    return _integer_to_float(a, a_zp, B, zb, qmath.mul32(a_scale, _per_column(b_scale)), bias)


# --- the com.microsoft forms of standard ops ----------------------------------------------------

@rule("QuantizeLinear", since=1, domain=MS)
def quantize_linear_ms(cx, x, y_scale, y_zero_point=None, *, axis=1):
    """QuantizeLinear with 16-bit and 4-bit targets (the quantizer's UseQDQContribOps form)."""
    return quantize_linear(cx, x, y_scale, y_zero_point, axis=axis)


@rule("DequantizeLinear", since=1, domain=MS)
def dequantize_linear_ms(cx, x, x_scale, x_zero_point=None, *, axis=1):
    """DequantizeLinear of 8/16/32-bit and 4-bit integers (UseQDQContribOps form)."""
    return dequantize_linear(cx, x, x_scale, x_zero_point, axis=axis)


@rule("QLinearConv", since=1, domain=MS)
def qlinear_conv_ms(cx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                    B=None, *, auto_pad="NOTSET", channels_last=0, dilations=None, group=1,
                    kernel_shape=None, pads=None, strides=None):
    """QLinearConv with channels_last: X and Y as (N, D1.., C) when set."""
    if channels_last:
        x = jnp.moveaxis(x, -1, 1)
    y = qlinear_conv(cx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                     y_zero_point, B, auto_pad=auto_pad, dilations=dilations, group=group,
                     kernel_shape=kernel_shape, pads=pads, strides=strides)
    return jnp.moveaxis(y, 1, -1) if channels_last else y


# --- QLinearSoftmax ------------------------------------------------------------------------------

def _softmax_table(x_scale, reduce_len: int, signed: bool):
    """The 256 float32 values exp((i - 255 + shift) * x_scale) onnxruntime computes in double.

    shift keeps the sum of reduce_len of them below FLT_MAX (5 bits spare); a signed table
    is stored rotated by 128 (index uint8(i - 128)).
    """
    limit = np.float32(np.finfo(np.float32).max) / np.float32(reduce_len)
    bits = max(0.0, float(np.log(np.float64(limit))) - 5.0)
    scale = x_scale.reshape(()).astype(jnp.float64)
    shift = bits / scale
    i = jnp.arange(256, dtype=jnp.float64)
    table = jnp.exp((i - 255 + shift) * scale).astype(F32)
    return jnp.roll(table, -128) if signed else table


def _lane_sum(e):
    """The row sums of MLAS's AVX-512 kernel: 16 float32 lanes over whole 32-element chunks,
    a shuffle tree across the lanes, then the rest one by one."""
    d = e.shape[-1]
    whole = d // 32 * 32
    lanes = jnp.zeros((*e.shape[:-1], 16), F32)
    if whole:
        chunks = jnp.moveaxis(e[..., :whole].reshape((*e.shape[:-1], whole // 16, 16)), -2, 0)
        lanes = lax.scan(lambda acc, v: (acc + v, None), lanes, chunks)[0]
    b = lanes.reshape((*e.shape[:-1], 4, 4))
    u = (b[..., 0, :] + b[..., 1, :]) + (b[..., 2, :] + b[..., 3, :])
    total = (u[..., 0] + u[..., 1]) + (u[..., 2] + u[..., 3])
    for i in range(whole, d):  # the tail, in order
        total = total + e[..., i]
    return total[..., None]


def _softmax_rows(x, x_scale, y_scale, y_zero_point):
    """Softmax along the last axis of 8-bit x, as MlasComputeQSoftmax does it row by row."""
    signed = np.dtype(x.dtype) == np.int8
    table = _softmax_table(x_scale, x.shape[-1], signed)
    xmax = jnp.max(x, axis=-1, keepdims=True).astype(I32)
    if signed:  # uint8(127 - xmax + x) indexes the rotated table
        index = (127 - xmax + x.astype(I32)) & 255
    else:  # the table shifted so that the row's max lands on entry 255
        index = 255 - xmax + x.astype(I32)
    e = table[index]
    ys = jnp.floor(qmath.div32(jnp.float32(1), y_scale.reshape(())))
    scale = qmath.mul32(qmath.div32(jnp.float32(1), _lane_sum(e)), ys)
    v = qmath.fma32(e, scale, _zero_point(y_zero_point))
    return qmath.convert_saturate(v, np.dtype(x.dtype), rounded=True)


@rule("QLinearSoftmax", since=1, domain=MS)
def qlinear_softmax(cx, X, X_scale, x_zero_point, y_scale, y_zero_point, *, axis=-1, opset=None):
    """Y = quantize(Softmax(dequantize(X))) by a 256-entry exp table and floor(1 / y_scale)
    (the input zero point cancels out); opset < 13 normalizes over the flattened axes >= axis."""
    if opset is None:
        raise cx.fail("attribute opset is required")
    rank = X.ndim
    if not -rank <= axis < rank:
        raise cx.fail(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if opset < 13:
        rows = X.reshape((*X.shape[:axis], -1))
        return _softmax_rows(rows, X_scale, y_scale, y_zero_point).reshape(X.shape)
    moved = jnp.moveaxis(X, axis, -1)
    return jnp.moveaxis(_softmax_rows(moved, X_scale, y_scale, y_zero_point), -1, axis)


# --- table-driven ops: QLinearSigmoid, QLinearLeakyRelu, QLinearConcat -----------------------------

def _lookup(x, x_scale, x_zero_point, y_scale, y_zero_point, fn):
    """y = table[x]: the 256 values quantize(fn(dequantize(v))), as QlinearBuildLookupTable does."""
    dtype = np.dtype(x.dtype)
    values = jnp.arange(256, dtype=I32).astype(dtype).astype(I32)  # T(i) for each byte i
    zx = 0 if x_zero_point is None else x_zero_point.reshape(()).astype(I32)
    dequantized = qmath.mul32(x_scale.reshape(()), (values - zx).astype(F32))
    zy = None if y_zero_point is None else y_zero_point.reshape(())
    table = qmath.quantize(fn(dequantized), y_scale.reshape(()), zy, dtype)
    return table[x.astype(I32) & 255]


def _logistic(v):
    """MlasComputeLogistic (FMA3 kernel): Eigen's rational approximation on [-18, 18], its
    multiply-adds fused explicitly (a table's 256 values must be onnxruntime's, bit for bit)."""
    c = [np.float32(a) for a in (*LOGISTIC_P, *LOGISTIC_Q)]
    x = jnp.minimum(jnp.maximum(v, np.float32(-18)), np.float32(18))
    x2 = qmath.mul32(x, x)
    p = qmath.fma32(x2, c[0], c[1])
    for a in c[2:5]:
        p = qmath.fma32(p, x2, a)
    p = qmath.mul32(p, x)
    q = qmath.fma32(x2, c[5], c[6])
    for b in c[7:11]:
        q = qmath.fma32(q, x2, b)
    return jnp.clip(qmath.div32(p, q) + np.float32(0.5), 0, 1)


@rule("QLinearSigmoid", since=1, domain=MS)
def qlinear_sigmoid(cx, X, X_scale, X_zero_point, Y_scale, Y_zero_point=None):
    """Y = quantize(Sigmoid(dequantize(X))) through a 256-entry table (MLAS's logistic)."""
    _check_per_tensor(cx, X_scale=X_scale, X_zero_point=X_zero_point, Y_scale=Y_scale,
                      Y_zero_point=Y_zero_point)
    return _lookup(X, X_scale, X_zero_point, Y_scale, Y_zero_point, _logistic)


@rule("QLinearLeakyRelu", since=1, domain=MS)
def qlinear_leaky_relu(cx, X, X_scale, X_zero_point, Y_scale, Y_zero_point=None, *, alpha=0.01):
    """Y = quantize(LeakyRelu(dequantize(X), alpha)) through a 256-entry table."""
    _check_per_tensor(cx, X_scale=X_scale, X_zero_point=X_zero_point, Y_scale=Y_scale,
                      Y_zero_point=Y_zero_point)
    a = np.float32(alpha)
    return _lookup(X, X_scale, X_zero_point, Y_scale, Y_zero_point,
                   lambda v: jnp.where(v >= 0, v, qmath.mul32(a, v)))


@rule("QLinearConcat", since=1, domain=MS)
def qlinear_concat(cx, Y_scale, Y_zero_point, *inputs, axis=None):
    """Y = Concat of the (X, X_scale, X_zero_point) triples, each requantized to Y's scale."""
    if axis is None:
        raise cx.fail("attribute axis is required")
    if not inputs or len(inputs) % 3:
        raise cx.fail(f"inputs after Y_scale and Y_zero_point must be (tensor, scale, zero point) "
                      f"triples, got {len(inputs)} inputs")
    parts = [_lookup(x, s, z, Y_scale, Y_zero_point, lambda v: v)
             for x, s, z in zip(inputs[0::3], inputs[1::3], inputs[2::3])]
    return jnp.concatenate(parts, axis=axis)


# --- QLinearAveragePool, QLinearGlobalAveragePool ----------------------------------------------

@rule("QLinearAveragePool", since=1, domain=MS)
def qlinear_average_pool(cx, X, x_scale, x_zero_point, y_scale, y_zero_point=None, *,
                         auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0,
                         kernel_shape=None, pads=None, strides=None):
    """Y = quantize(AveragePool(dequantize(X))): float32 window sums in row-major tap order."""
    x = jnp.moveaxis(X, -1, 1) if channels_last else X
    win = window(cx, x, kernel_shape, strides, None, pads, auto_pad, ceil_mode)
    zx = 0 if x_zero_point is None else x_zero_point.reshape(()).astype(I32)
    v = qmath.mul32(x_scale.reshape(()), (x.astype(I32) - zx).astype(F32))
    v = lax.pad(v, np.float32(0), [(0, 0, 0), (0, 0, 0)] + [(lo, hi + e, 0) for (lo, hi), e in
                                                           zip(win.pads, win.extra)])
    total = jnp.zeros(x.shape[:2] + win.out, F32)
    for taps in itertools.product(*(range(k) for k in win.kernel)):
        # padding adds 0.0: the kernel skips those taps, and x + 0.0 is x
        index = tuple(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(taps, win.out, win.strides))
        total = total + v[(slice(None), slice(None), *index)]
    if count_include_pad:
        counts = np.full(win.out, math.prod(win.kernel), np.float32)
    else:
        counts = pool_counts(win, 0).astype(np.float32)
    y = qmath.div32(qmath.div32(total, jnp.asarray(counts)), y_scale.reshape(()))
    y = qmath.convert_saturate(y + _zero_point(y_zero_point), np.dtype(X.dtype), rounded=True)
    return jnp.moveaxis(y, 1, -1) if channels_last else y


@rule("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(cx, X, x_scale, x_zero_point, y_scale, y_zero_point, *,
                                channels_last=0):
    """Y = requantize(sum(X - x_zp), x_scale / (y_scale * image size)) over all spatial axes."""
    if X.ndim < 3:
        raise cx.fail(f"X must have rank >= 3, got shape {tuple(X.shape)}")
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    size = math.prod(X.shape[a] for a in axes)
    acc = jnp.sum(X.astype(I32), axis=axes, keepdims=True, dtype=I32)
    acc = acc - x_zero_point.reshape(()).astype(I32) * size
    scale = qmath.div32(x_scale.reshape(()), qmath.mul32(y_scale.reshape(()), np.float32(size)))
    return qmath.requantize(acc, scale, y_zero_point.reshape(()), np.dtype(X.dtype))
