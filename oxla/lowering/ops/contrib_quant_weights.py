"""Weight-only quantized com.microsoft ops: MatMulNBits (2/4/8-bit blockwise) and GatherBlockQuantized."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from oxla.lowering.registry import rule

F32 = jnp.float32
I32 = jnp.int32
MS = "com.microsoft"
_INT4 = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


def _unpack(packed, bits: int):
    """uint8 [..., L] holding 8/bits values each (lowest bits first) -> int32 [..., L * 8/bits]."""
    per = 8 // bits
    shifts = jnp.arange(per, dtype=I32) * bits
    v = (packed.astype(I32)[..., None] >> shifts) & ((1 << bits) - 1)
    return v.reshape((*packed.shape[:-1], packed.shape[-1] * per))


def _dequantize_blocks(q, scale, zero_point):
    """float32((q - zp)) * scale, rounded once as onnxruntime's dequantization loops do."""
    return (q - zero_point).astype(F32) * scale.astype(F32)


@rule("MatMulNBits", since=1, domain=MS)
def mat_mul_nbits(cx, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K=None, N=None,
                  accuracy_level=0, bits=4, block_size=None, weight_prepacked=0):
    """Y = A @ dequantize(B).T + bias, B (N, K) quantized in blocks of K: (q - zp) * scale with
    zp packed like B (uint8) or in A's type, 2^(bits - 1) when absent."""
    if K is None or N is None or block_size is None:
        raise cx.fail("attributes K, N and block_size are required")
    if bits not in (2, 4, 8) or weight_prepacked:
        raise cx.fail(f"bits must be 2, 4 or 8 and B not prepacked, got bits={bits}, "
                      f"weight_prepacked={weight_prepacked}")
    if g_idx is not None:
        raise cx.fail("g_idx (act-order group indices) is not supported")
    blocks = -(-K // block_size)
    if tuple(B.shape) != (N, blocks, block_size * bits // 8):
        raise cx.fail(f"B must have shape (N, k_blocks, blob) = {(N, blocks, block_size * bits // 8)}, "
                      f"got {tuple(B.shape)}")
    q = _unpack(B, bits)  # (N, blocks, block_size)
    scale = scales.reshape(N, blocks, 1)
    if zero_points is None:
        zp = jnp.asarray(1 << (bits - 1), I32)
    elif np.dtype(zero_points.dtype) == np.uint8:
        zp = _unpack(zero_points.reshape(N, -1), bits)[:, :blocks, None]
    else:  # a float zero point in A's type: (q - zp) * scale in float
        zp = zero_points.reshape(N, blocks, 1).astype(F32)
        q = q.astype(F32)
    w = _dequantize_blocks(q, scale, zp).reshape(N, blocks * block_size)[:, :K]
    y = jnp.matmul(A.astype(F32), w.T, precision=lax.Precision.HIGHEST)
    if bias is not None:
        y = y + bias.astype(F32)
    return y.astype(A.dtype)


def _expand_blocks(p, axis: int, block_size: int, size: int):
    """A per-block parameter repeated block_size times along axis, cut to size."""
    return lax.slice_in_dim(jnp.repeat(p, block_size, axis=axis), 0, size, axis=axis)


@rule("GatherBlockQuantized", since=1, domain=MS)
def gather_block_quantized(cx, data, indices, scales, zero_points=None, *, bits=4, block_size=128,
                           gather_axis=0, quantize_axis=1):
    """Y = Gather(dequantize(data), indices, gather_axis), data quantized in blocks along
    quantize_axis; out-of-range indices give zeros, as in onnxruntime."""
    rank = data.ndim
    g, qa = gather_axis % rank, quantize_axis % rank
    dtype = np.dtype(data.dtype)
    if dtype == np.uint8:
        if bits not in (2, 4, 8) or g != 0 or qa != rank - 1:
            raise cx.fail("uint8 data needs bits 2, 4 or 8, gather_axis 0 and quantize_axis last")
        q = _unpack(data, bits) if bits < 8 else data.astype(I32)
        default_zp = 1 << (bits - 1)
    elif dtype in _INT4:
        q, default_zp = data.astype(I32), 0
    else:
        raise cx.fail(f"data of type {dtype} is not supported (uint8, int4, uint4)")
    size = q.shape[qa]
    if scales.ndim != rank or scales.shape[qa] != -(-size // block_size):
        raise cx.fail(f"scales of shape {tuple(scales.shape)} do not match data {tuple(q.shape)} "
                      f"in blocks of {block_size} along axis {qa}")
    if zero_points is None:
        zp = jnp.asarray(default_zp, I32)
    elif dtype == np.uint8 and bits < 8:
        zp = lax.slice_in_dim(_unpack(zero_points, bits), 0, scales.shape[qa], axis=qa)
    else:
        zp = zero_points.astype(I32)
    if zero_points is not None:
        zp = _expand_blocks(zp, qa, block_size, size)
    scale = _expand_blocks(scales, qa, block_size, size)
    values = _dequantize_blocks(q, scale, zp).astype(scales.dtype)
    n = values.shape[g]
    index = indices.astype(jnp.int64)
    index = jnp.where(index < 0, index + n, index)  # still negative or too large: filled with 0
    return jnp.take(values, index, axis=g, mode="fill", fill_value=0)
