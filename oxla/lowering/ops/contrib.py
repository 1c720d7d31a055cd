"""com.microsoft fusions that onnxruntime's optimizers write: the GELU family, skip and RMS layer
norms, FusedMatMul, FusedGemm, FusedConv, BiasAdd, EmbedLayerNormalization (contrib v1).

Semantics follow onnxruntime's contrib-op documentation and CPU kernels. 16-bit inputs are
computed in float32 and rounded once, as those kernels (or the Casts onnxruntime inserts around
float-only kernels) do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.common import accum_dtype
from oxla.lowering.ops.conv import conv
from oxla.lowering.ops.elementwise import sigmoid
from oxla.lowering.ops.linalg import HIGHEST
from oxla.lowering.registry import rule

MS = "com.microsoft"


def wide(x):
    """X in the type its statistics and activations are computed in (float32 for 16-bit floats)."""
    return x.astype(accum_dtype(x.dtype))


def _gelu(x):
    """0.5 x (1 + erf(x / sqrt 2)) in x's type."""
    return 0.5 * x * (1 + lax.erf(x * np.asarray(1 / np.sqrt(2), x.dtype)))


def _fast_gelu(x):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) in x's type."""
    alpha = np.asarray(np.sqrt(2 / np.pi), x.dtype)
    return 0.5 * x * (1 + jnp.tanh(x * (alpha + np.asarray(0.044715, x.dtype) * alpha * x * x)))


def _sum_in(x, *terms):
    """X plus the terms that are not None, in the wide type."""
    total = wide(x)
    for t in terms:
        if t is not None:
            total = total + t.astype(total.dtype)
    return total


# --- GELU family and other elementwise fusions ----------------------------------------------


@rule("Gelu", since=1, domain=MS)
def gelu(cx, x):
    """Y = 0.5 X (1 + erf(X / sqrt 2)) (contrib v1)."""
    return _gelu(wide(x)).astype(x.dtype)


@rule("BiasGelu", since=1, domain=MS)
def bias_gelu(cx, a, b):
    """C = Gelu(A + B), B a bias over the last axis (contrib v1)."""
    return _gelu(_sum_in(a, b)).astype(a.dtype)


@rule("FastGelu", since=1, domain=MS)
def fast_gelu(cx, x, bias=None):
    """Y = 0.5 X' (1 + tanh(0.797885 X' + 0.035677 X'^3)), X' = X + bias (contrib v1)."""
    return _fast_gelu(_sum_in(x, bias)).astype(x.dtype)


@rule("QuickGelu", since=1, domain=MS)
def quick_gelu(cx, x, *, alpha=1.702):
    """Y = X sigmoid(alpha X) (contrib v1)."""
    xw = wide(x)
    return (xw * sigmoid(np.asarray(alpha, xw.dtype) * xw)).astype(x.dtype)


@rule("BiasAdd", since=1, domain=MS)
def bias_add(cx, x, bias, skip):
    """Y = X + bias + skip, X and skip (N, S, C), bias (C) (contrib v1; a CUDA kernel in ORT)."""
    cx.expect_rank("X", x, 3)
    return _sum_in(x, bias, skip).astype(x.dtype)


@rule("BiasSplitGelu", since=1, domain=MS)
def bias_split_gelu(cx, x, bias):
    """Y = left * Gelu(right), the halves of the last axis of X + bias (contrib v1; CUDA in ORT)."""
    cx.expect_rank("X", x, 3)
    if x.shape[2] % 2:
        raise cx.fail(f"the last dimension of X must be even, got shape {tuple(x.shape)}")
    total = _sum_in(x, bias)
    left, right = jnp.split(total, 2, axis=2)
    return (left * _gelu(right)).astype(x.dtype)


# --- layer normalizations -------------------------------------------------------------------


def _moments(x, axes):
    """(mean, X - mean, variance) over `axes`, kept, of a wide X: two passes, no cancellation."""
    mean = jnp.mean(x, axis=axes, keepdims=True)
    dev = x - mean
    return mean, dev, jnp.mean(dev * dev, axis=axes, keepdims=True)


def _skip_norm_inputs(cx, x, skip, gamma, bias):
    """X + skip (+ bias) in the wide type, after checking the shapes the kernels accept."""
    if x.ndim not in (2, 3):
        raise cx.fail(f"input must be 2-D or 3-D, got shape {tuple(x.shape)}")
    hidden = x.shape[-1]
    allowed = {tuple(x.shape)}
    if x.ndim == 3:  # a skip shared over the batch
        allowed |= {(1, *x.shape[1:]), tuple(x.shape[1:])}
    if tuple(skip.shape) not in allowed:
        raise cx.fail(f"skip must have shape {' or '.join(map(str, sorted(allowed)))}, "
                      f"got {tuple(skip.shape)}")
    for name, p in (("gamma", gamma), ("bias", bias)):
        if p is not None and p.shape not in ((hidden,), (1, hidden), (1, 1, hidden)):
            raise cx.fail(f"{name} must have shape ({hidden},), got {tuple(p.shape)}")
    return _sum_in(x, skip, bias)


@rule("SkipLayerNormalization", since=1, domain=MS)
def skip_layer_normalization(cx, x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12):
    """Y = LayerNorm(X + skip + bias) gamma + beta; mean, inv_std_var and the sum (contrib v1)."""
    total = _skip_norm_inputs(cx, x, skip, gamma, bias)
    mean, dev, var = _moments(total, (-1,))
    inv_std = lax.rsqrt(var + np.asarray(epsilon, var.dtype))
    y = dev * inv_std * gamma.reshape(-1).astype(total.dtype)
    if beta is not None:
        y = y + beta.reshape(-1).astype(total.dtype)
    f32 = np.float32  # mean and inv_std_var are float in every variant of the op
    return y.astype(x.dtype), mean.astype(f32), inv_std.astype(f32), total.astype(x.dtype)


@rule("SkipSimplifiedLayerNormalization", since=1, domain=MS)
def skip_simplified_layer_normalization(cx, x, skip, gamma, bias=None, *, epsilon=1e-12):
    """Y = RMSNorm(X + skip + bias) gamma; mean (zeros), inv_std_var and the sum (contrib v1)."""
    total = _skip_norm_inputs(cx, x, skip, gamma, bias)
    inv_std = lax.rsqrt(jnp.mean(total * total, axis=-1, keepdims=True)
                        + np.asarray(epsilon, total.dtype))
    y = total * inv_std * gamma.reshape(-1).astype(total.dtype)
    f32 = np.float32
    # an RMS norm has no mean: onnxruntime's kernel writes zeros there
    return (y.astype(x.dtype), jnp.zeros(inv_std.shape, f32), inv_std.astype(f32),
            total.astype(x.dtype))


def _norm_axes(cx, x, axis: int) -> tuple[int, ...]:
    if not -x.ndim <= axis < x.ndim:
        raise cx.fail(f"axis {axis} is out of range for rank {x.ndim}")
    return tuple(range(axis % x.ndim, x.ndim))


def _stash(cx, stash_type: int) -> np.dtype:
    if stash_type not in (1, 11):
        raise cx.fail(f"stash_type must be 1 (float) or 11 (double), got {stash_type}")
    return np.dtype(np.float32 if stash_type == 1 else np.float64)


@rule("SimplifiedLayerNormalization", since=1)
def simplified_layer_normalization(cx, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Y = X / sqrt(mean(X^2) + epsilon) scale over dims axis..; inv_std_var (ORT's, ai.onnx v1)."""
    # onnxruntime registers this op in the default domain; its optimizer writes it for RMSNorm
    axes, stash = _norm_axes(cx, x, axis), _stash(cx, stash_type)
    xw = x.astype(stash)
    inv_std = lax.rsqrt(jnp.mean(xw * xw, axis=axes, keepdims=True) + np.asarray(epsilon, stash))
    y = xw * inv_std * scale.astype(stash)
    return y.astype(scale.dtype), inv_std


# --- matrix products and convolutions with a fused activation -------------------------------


def _batch_transposed(x):
    """[d0, d1, ..., dn-2, dn-1] -> [d1, ..., dn-2, d0, dn-1] (FusedMatMul's transBatch)."""
    return jnp.moveaxis(x, 0, x.ndim - 2)


@rule("FusedMatMul", since=1, domain=MS)
def fused_mat_mul(cx, a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """Y = alpha op(A) @ op(B): transBatch moves dim 0 before the matrix dims, trans swaps them."""
    if (transBatchA or transBatchB) and not (a.ndim == b.ndim and a.ndim >= 3):
        raise cx.fail(f"transBatchA / transBatchB need inputs of one rank >= 3, got shapes "
                      f"{tuple(a.shape)} and {tuple(b.shape)}")
    if transBatchA:
        a = _batch_transposed(a)
    if transBatchB:
        b = _batch_transposed(b)
    if transA and a.ndim >= 2:
        a = jnp.swapaxes(a, -1, -2)
    if transB and b.ndim >= 2:
        b = jnp.swapaxes(b, -1, -2)
    acc = accum_dtype(a.dtype)
    y = jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=acc)
    return (y * np.asarray(alpha, acc)).astype(a.dtype)


def _mlas_activation(cx, y, activation, params):
    """The activations onnxruntime fuses into FusedConv, with their activation_params."""
    counts = {"Identity": 0, "Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2,
              "HardSigmoid": 2}
    if activation not in counts:
        raise cx.fail(f"activation must be one of {', '.join(counts)}, got '{activation}'")
    p = tuple(params or ())
    if len(p) != counts[activation]:
        raise cx.fail(f"activation {activation} takes {counts[activation]} activation_params, "
                      f"got {len(p)}")
    c = [np.asarray(v, y.dtype) for v in p]
    if activation == "Relu":
        return jnp.maximum(y, 0)
    if activation == "Tanh":
        return jnp.tanh(y)
    if activation == "Sigmoid":
        return sigmoid(y)
    if activation == "LeakyRelu":
        return jnp.where(y >= 0, y, c[0] * y)
    if activation == "Clip":
        return jnp.clip(y, c[0], c[1])
    if activation == "HardSigmoid":
        return jnp.clip(c[0] * y + c[1], 0, 1)
    return y


@rule("FusedConv", since=1, domain=MS)
def fused_conv(cx, x, w, b=None, z=None, *, activation=None, activation_params=None,
               auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
               strides=None):
    """Y = activation(Conv(X, W) + B + Z) (contrib v1)."""
    xw = wide(x)
    y = conv(cx, xw, w.astype(xw.dtype), None if b is None else b.astype(xw.dtype),
             auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
             pads=pads, strides=strides)
    if z is not None:
        y = y + z.astype(y.dtype)
    return _mlas_activation(cx, y, activation or "Identity", activation_params).astype(x.dtype)


# name -> (the activation_* attributes onnxruntime requires, f(y, alpha, beta, gamma))
_GEMM_ACTIVATIONS = {
    "Relu": ((), lambda y, a, b, g: jnp.maximum(y, 0)),
    "Tanh": ((), lambda y, a, b, g: jnp.tanh(y)),
    "Sigmoid": ((), lambda y, a, b, g: sigmoid(y)),
    "Softplus": ((), lambda y, a, b, g: jax.nn.softplus(y)),
    "Softsign": ((), lambda y, a, b, g: y / (1 + jnp.abs(y))),
    "LeakyRelu": (("alpha",), lambda y, a, b, g: jnp.where(y >= 0, y, a * y)),
    "Elu": (("alpha",), lambda y, a, b, g: jnp.where(y >= 0, y, a * jnp.expm1(y))),
    "ThresholdedRelu": (("alpha",), lambda y, a, b, g: jnp.where(y > a, y, 0)),
    "HardSigmoid": (("alpha", "beta"), lambda y, a, b, g: jnp.clip(a * y + b, 0, 1)),
    "ScaledTanh": (("alpha", "beta"), lambda y, a, b, g: a * jnp.tanh(b * y)),
    "ParametricSoftplus": (("alpha", "beta"), lambda y, a, b, g: a * jax.nn.softplus(b * y)),
    "Selu": (("alpha", "gamma"), lambda y, a, b, g: g * jnp.where(y > 0, y, a * jnp.expm1(y))),
}


def _gemm_activation(cx, y, activation, alpha, beta, gamma):
    """The activations onnxruntime fuses into FusedGemm, with activation_alpha/beta/gamma."""
    if activation not in _GEMM_ACTIVATIONS:
        raise cx.fail(f"activation must be one of {', '.join(_GEMM_ACTIVATIONS)}, got '{activation}'")
    needs, f = _GEMM_ACTIVATIONS[activation]
    given = {"alpha": alpha, "beta": beta, "gamma": gamma}
    missing = [f"activation_{n}" for n in needs if given[n] is None]
    if missing:
        raise cx.fail(f"activation {activation} needs {' and '.join(missing)}")
    a, b, g = (np.asarray(0.0 if v is None else v, y.dtype) for v in (alpha, beta, gamma))
    return f(y, a, b, g)


@rule("FusedGemm", since=1, domain=MS)
def fused_gemm(cx, a, b, c=None, *, activation=None, activation_alpha=None, activation_beta=None,
               activation_gamma=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    """Y = activation(alpha op(A) @ op(B) + beta C) (contrib v1)."""
    cx.expect_rank("A", a, 2)
    cx.expect_rank("B", b, 2)
    acc = accum_dtype(a.dtype)
    ka, kb = (0 if transA else 1), (1 if transB else 0)
    y = lax.dot_general(a, b, (((ka,), (kb,)), ((), ())), precision=HIGHEST,
                        preferred_element_type=acc) * np.asarray(alpha, acc)
    if c is not None:
        y = y + np.asarray(beta, acc) * jnp.broadcast_to(c.astype(acc), y.shape)
    if activation is None:
        raise cx.fail("the activation attribute is required")
    return _gemm_activation(cx, y, activation, activation_alpha, activation_beta,
                            activation_gamma).astype(a.dtype)


# --- EmbedLayerNormalization ----------------------------------------------------------------


def _embedding_sum(cx, input_ids, segment_ids, word_embedding, position_embedding,
                   segment_embedding, position_ids):
    """word[ids] + position[position_ids or 0..S-1] (+ segment[segment_ids]), in the wide type."""
    cx.expect_rank("input_ids", input_ids, 2)
    seq = input_ids.shape[1]
    total = wide(jnp.take(word_embedding, input_ids, axis=0))
    if position_ids is None:
        positions = position_embedding[:seq][None]
    else:
        positions = jnp.take(position_embedding, position_ids, axis=0)
    total = total + positions.astype(total.dtype)
    if (segment_ids is None) != (segment_embedding is None):
        raise cx.fail("segment_ids and segment_embedding must be given together")
    if segment_ids is not None:
        total = total + jnp.take(segment_embedding, segment_ids, axis=0).astype(total.dtype)
    return total


@rule("EmbedLayerNormalization", since=1, domain=MS)
def embed_layer_normalization(cx, input_ids, segment_ids, word_embedding, position_embedding,
                              segment_embedding, gamma, beta, mask=None, position_ids=None, *,
                              epsilon=1e-12, mask_index_type=None):
    """Y = LayerNorm(word + position + segment embeddings); mask_index = ones per row (contrib v1)."""
    # mask_index_type only steers onnxruntime's shape inference; the kernel ignores it
    total = _embedding_sum(cx, input_ids, segment_ids, word_embedding, position_embedding,
                           segment_embedding, position_ids)
    _, dev, var = _moments(total, (-1,))
    y = dev * lax.rsqrt(var + np.asarray(epsilon, var.dtype)) * gamma.astype(total.dtype)
    y = y + beta.astype(total.dtype)
    batch = input_ids.shape[0]
    if mask is None:
        mask_index = jnp.zeros((batch,), jnp.int32)
    else:  # the number of ones in each row: the valid length of a right-padded sequence
        mask_index = jnp.sum(mask == 1, axis=1, dtype=jnp.int32)
    dtype = word_embedding.dtype
    return y.astype(dtype), mask_index, total.astype(dtype)
