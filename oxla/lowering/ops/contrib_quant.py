"""Quantized com.microsoft ops as onnxruntime's CPU kernels compute them: QLinearAdd/Mul, QGemm, ...

Each rule follows the rounding of onnxruntime's x86-64 kernels (MLAS with AVX2/FMA), where
exact agreement is possible: integer products accumulate in int32, and the float32 steps round
where the kernel rounds (see qmath).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from oxla.lowering.ops import qmath
from oxla.lowering.ops.quantize import dequantize_linear, qlinear_conv, quantize_linear
from oxla.lowering.registry import rule

F32 = jnp.float32
I32 = jnp.int32
MS = "com.microsoft"


def _scalar(v, default=0):
    """A per-tensor scale or zero point as a 0-d value (a missing zero point is 0 of its type)."""
    return jnp.asarray(default) if v is None else v.reshape(())


def _zero_point(zp, like):
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
    zc = _zero_point(C_zero_point, A)
    # float(zc) - (rx * zx + ry * zy), as compiled with FMA contraction
    fixed = zc - qmath.fma32(rx, _zero_point(zx, A), qmath.mul32(ry, _zero_point(zy, A)))
    # vector + vector: fma(x, rx, fma(y, ry, fixed)); a scalar y folds into the constant part
    # first, by the same FMA
    v = qmath.fma32(x.astype(F32), rx, qmath.fma32(y.astype(F32), ry, fixed))
    return qmath.convert_saturate(v, np.dtype(A.dtype))


@rule("QLinearMul", since=1, domain=MS)
def qlinear_mul(cx, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """C = quantize(dequantize(A) * dequantize(B)): (A - za) * (B - zb) * (sa * sb / sc) + zc."""
    _check_per_tensor(cx, A_scale=A_scale, A_zero_point=A_zero_point, B_scale=B_scale,
                      B_zero_point=B_zero_point, C_scale=C_scale, C_zero_point=C_zero_point)
    ratio = qmath.output_scale(A_scale.reshape(()), B_scale.reshape(()), C_scale.reshape(()))
    a = A.astype(I32) - (0 if A_zero_point is None else A_zero_point.reshape(()).astype(I32))
    b = B.astype(I32) - (0 if B_zero_point is None else B_zero_point.reshape(()).astype(I32))
    # |a * b| <= 65025 is exact in float32; the zero point is added in float32 before rounding
    v = qmath.mul32((a * b).astype(F32), ratio) + _zero_point(C_zero_point, A)
    return qmath.convert_saturate(v, np.dtype(A.dtype))


# --- QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul ------------------------------------------

@rule("QGemm", since=1, domain=MS)
def qgemm(cx, A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
          y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """Y = alpha * (op(A) - za) @ (op(B) - zb) + C (int32), requantized when y_scale is given."""
    cx.expect_rank("A", A, 2)
    cx.expect_rank("B", B, 2)
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise cx.fail(f"op(A) {a.shape} and op(B) {b.shape} do not share the inner dimension")
    acc = qmath.int_matmul(a, b, a_zero_point.reshape(()), _per_column(b_zero_point))
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
