"""Linear algebra: MatMul, Gemm, Einsum, Det, MatMulInteger."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from oxla.lowering.common import check_eager
from oxla.lowering.ops.qmath import int_matmul
from oxla.lowering.registry import rule

# float32 products at full precision: onnx's tolerances assume it (TPU/GPU default to less)
HIGHEST = lax.Precision.HIGHEST


@rule("MatMul", since=1)
def mat_mul(cx, a, b):
    """Y = A @ B as numpy.matmul: 1-D operands promoted and squeezed, batch dims broadcast (v1+)."""
    if not a.shape or not b.shape:
        raise cx.shape_error(f"inputs must have rank >= 1, got shapes {a.shape} and {b.shape}")
    check_eager(cx, jnp.matmul, a, b)  # an outer product of small constants can be huge
    return jnp.matmul(a, b, precision=HIGHEST)


def _gemm(cx, a, b, c, alpha: float, beta: float, trans_a: int, trans_b: int):
    cx.expect_rank("A", a, 2)
    cx.expect_rank("B", b, 2)
    ka, kb = (0 if trans_a else 1), (1 if trans_b else 0)
    if a.shape[ka] != b.shape[kb]:
        op_a = a.shape[::-1] if trans_a else a.shape
        op_b = b.shape[::-1] if trans_b else b.shape
        raise cx.shape_error(f"op(A) {op_a} and op(B) {op_b} do not share the inner dimension")
    check_eager(cx, lambda a, b: lax.dot_general(a, b, (((ka,), (kb,)), ((), ()))), a, b)
    # contract in place: a materialized b.T costs a copy of the weights on every call on CPU
    y = lax.dot_general(a, b, (((ka,), (kb,)), ((), ())), precision=HIGHEST,
                        preferred_element_type=None)
    if alpha != 1.0:
        y = y * jnp.asarray(alpha, y.dtype)
    if c is None:
        return y
    if beta != 1.0:
        c = c * jnp.asarray(beta, c.dtype)
    # C broadcasts unidirectionally to (M, N)
    return y + jnp.broadcast_to(c, y.shape).astype(y.dtype)


@rule("Gemm", since=11)
def gemm(cx, a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """Y = alpha * op(A) @ op(B) + beta * C (v11+: C optional)."""
    return _gemm(cx, a, b, c, alpha, beta, transA, transB)


@rule("Gemm", since=7)
def gemm_v7(cx, a, b, c, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """Y = alpha * op(A) @ op(B) + beta * C, C required and broadcast to (M, N) (v7-v10)."""
    if c is None:
        raise cx.fail("input C is required before opset 11")
    return _gemm(cx, a, b, c, alpha, beta, transA, transB)


@rule("Gemm", since=1)
def gemm_v1(cx, a, b, c, *, alpha=1.0, beta=1.0, broadcast=0, transA=0, transB=0):
    """Y = alpha * op(A) @ op(B) + beta * C, C required; broadcast=1 lets C broadcast (v1-v6)."""
    if c is None:
        raise cx.fail("input C is required before opset 11")
    m, n = a.shape[1 if transA else 0], b.shape[0 if transB else 1]
    if not broadcast and tuple(c.shape) not in ((m, n), ()):
        raise cx.shape_error(f"C has shape {c.shape}, expected ({m}, {n}); set broadcast=1 to broadcast it")
    return _gemm(cx, a, b, c, alpha, beta, transA, transB)


@rule("Einsum", since=12)
def einsum(cx, *inputs, equation=None):
    """Einstein summation over the operands as the equation says (spaces ignored) (v12+)."""
    if equation is None:
        raise cx.fail("attribute equation is required")
    if not inputs:
        raise cx.fail("Einsum needs at least one input")
    spec = equation.replace(" ", "")
    check_eager(cx, lambda *a: jnp.einsum(spec, *a), *inputs, bounded=False)
    out = jnp.einsum(spec, *inputs, precision=HIGHEST)
    return out.astype(inputs[0].dtype)  # the output has the operands' type T


@rule("Det", since=11)
def det(cx, x):
    """Determinant of each square matrix in the last two dims of X, shape [*, M, M] -> [*] (v11+)."""
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise cx.shape_error(f"X must be [*, M, M], got shape {x.shape}")
    return jnp.linalg.det(x)


@rule("MatMulInteger", since=10)
def mat_mul_integer(cx, a, b, a_zero_point=None, b_zero_point=None):
    """Y = (A - a_zero_point) @ (B - b_zero_point) in int32; zero points per tensor, row of A or column of B (v10+)."""
    if a_zero_point is not None and a_zero_point.ndim == 1:
        a_zero_point = a_zero_point.reshape(-1, 1)  # a vector is per row of A; N-D is [..., M, 1]
    # a vector b_zero_point is per column of B; N-D is [..., 1, N]: both broadcast as they are
    return int_matmul(a, b, a_zero_point, b_zero_point)
