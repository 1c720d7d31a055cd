"""Neural-net layers: softmax family, normalizations, LRN, dropout, Swish/SwiGLU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.dtypes import to_numpy_dtype
from oxla.lowering.common import accum_dtype, axis_index, host_seed
from oxla.lowering.ops.elementwise import sigmoid
from oxla.lowering.registry import rule

# --- helpers --------------------------------------------------------------------------------


def _coerced_2d(x, axis: int, f):
    """Apply f(x2d, axis=1) to x flattened to 2-D at `axis`, then restore the shape (v1-v12)."""
    shape = x.shape
    x2 = x.reshape(math.prod(shape[:axis]), math.prod(shape[axis:]))
    return f(x2, 1).reshape(shape)


# Computed in X's type, as the schema's function body (Exp, ReduceSum, Div in T) is.
#
# X passes an optimization barrier first: softmax reads X twice (for the max, and in exp(X - max)),
# and XLA:CPU may fuse X's producer into both readers and compute it twice in different orders.
# Light squeezenet's logits are ~1e10 (float32 ulp 1024): the two copies differed by a few ulps,
# exp(X - max) overflowed to inf and every output was NaN, in some compiles only (the choice of
# fusions varied) and in all of them with YNNPACK fusions off. Computing X once costs one buffer.
def _softmax(x, axis):
    return jax.nn.softmax(lax.optimization_barrier(x), axis=axis)


def _log_softmax(x, axis):
    return jax.nn.log_softmax(lax.optimization_barrier(x), axis=axis)


def _hardmax(x, axis):
    if x.size == 0:
        return x
    first = jnp.argmax(x, axis=axis, keepdims=True)  # ties: the first maximum wins
    return (lax.broadcasted_iota(first.dtype, x.shape, axis) == first).astype(x.dtype)


def _per_channel(p, rank: int):
    """A (C,) parameter shaped to broadcast against (N, C, D1, ..., Dk)."""
    return p.reshape(p.shape + (1,) * (rank - 2)) if p.ndim == 1 else p


# --- softmax family -------------------------------------------------------------------------


@rule("Softmax", since=1)
def softmax_v1(cx, x, *, axis=1):
    """Softmax over the trailing dims from `axis` on, input coerced to 2-D (v1-v12)."""
    return _coerced_2d(x, axis_index(cx, axis, max(x.ndim, 1)), _softmax)


@rule("Softmax", since=13)
def softmax(cx, x, *, axis=-1):
    """Y = exp(X - max) / sum(exp(X - max)) along one axis (v13+)."""
    return _softmax(x, axis_index(cx, axis, max(x.ndim, 1)))


@rule("LogSoftmax", since=1)
def log_softmax_v1(cx, x, *, axis=1):
    """LogSoftmax over the trailing dims from `axis` on, input coerced to 2-D (v1-v12)."""
    return _coerced_2d(x, axis_index(cx, axis, max(x.ndim, 1)), _log_softmax)


@rule("LogSoftmax", since=13)
def log_softmax(cx, x, *, axis=-1):
    """Y = X - max - log(sum(exp(X - max))) along one axis (v13+)."""
    return _log_softmax(x, axis_index(cx, axis, max(x.ndim, 1)))


@rule("Hardmax", since=1)
def hardmax_v1(cx, x, *, axis=1):
    """One-hot of the first maximum over the trailing dims from `axis`, coerced to 2-D (v1-v12)."""
    return _coerced_2d(x, axis_index(cx, axis, max(x.ndim, 1)), _hardmax)


@rule("Hardmax", since=13)
def hardmax(cx, x, *, axis=-1):
    """One-hot of the first maximum along one axis (v13+)."""
    return _hardmax(x, axis_index(cx, axis, max(x.ndim, 1)))


# --- batch normalization --------------------------------------------------------------------


def _bn_inference(x, scale, b, mean, var, epsilon):
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B, with the stored statistics."""
    wide = accum_dtype(x.dtype)
    rank = x.ndim
    a = scale.astype(wide) * lax.rsqrt(var.astype(wide) + jnp.asarray(epsilon, wide))
    shift = b.astype(wide) - mean.astype(wide) * a
    return (x.astype(wide) * _per_channel(a, rank) + _per_channel(shift, rank)).astype(x.dtype)


def _bn_training(x, scale, b, mean, var, epsilon, momentum, spatial=1):
    """Y from the batch's statistics; running = stored * momentum + batch * (1 - momentum)."""
    axes = tuple(i for i in range(x.ndim) if i != 1) if spatial else (0,)
    wide = accum_dtype(x.dtype)
    xw = x.astype(wide)
    batch_mean = jnp.mean(xw, axis=axes)
    batch_var = jnp.var(xw, axis=axes)  # the population variance, as onnx and torch use here
    y = _bn_inference(x, scale, b, batch_mean, batch_var, epsilon)
    m = jnp.asarray(momentum, wide)
    running_mean = (mean.astype(wide) * m + batch_mean * (1 - m)).astype(mean.dtype)
    running_var = (var.astype(wide) * m + batch_var * (1 - m)).astype(var.dtype)
    return y, running_mean, running_var, batch_mean.astype(mean.dtype), batch_var.astype(var.dtype)


def _bn_legacy(cx, x, scale, b, mean, var, epsilon, momentum, spatial):
    # Before v14 the extra outputs (running and saved statistics) exist only in training.
    if cx.num_outputs > 1:
        return _bn_training(x, scale, b, mean, var, epsilon, momentum, spatial)
    return _bn_inference(x, scale, b, mean, var, epsilon)


@rule("BatchNormalization", since=1)
def batch_normalization_v1(cx, x, scale, b, mean, var, *, consumed_inputs=None, epsilon=1e-5,
                           is_test=0, momentum=0.9, spatial=1):
    """BatchNorm v1-v6: is_test selects inference; spatial=0 normalizes per activation."""
    # consumed_inputs (v1) is a legacy in-place hint with no effect on the result
    if is_test:
        return _bn_inference(x, scale, b, mean, var, epsilon)
    return _bn_legacy(cx, x, scale, b, mean, var, epsilon, momentum, spatial)


@rule("BatchNormalization", since=7)
def batch_normalization_v7(cx, x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1):
    """BatchNorm v7-v8: training outputs when named; spatial=0 normalizes per activation."""
    return _bn_legacy(cx, x, scale, b, mean, var, epsilon, momentum, spatial)


@rule("BatchNormalization", since=9)
def batch_normalization_v9(cx, x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9):
    """BatchNorm v9-v13: per channel; inference with stored statistics unless more outputs."""
    return _bn_legacy(cx, x, scale, b, mean, var, epsilon, momentum, 1)


@rule("BatchNormalization", since=14)
def batch_normalization(cx, x, scale, b, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0):
    """BatchNorm v14+: training_mode=1 also returns running_mean and running_var."""
    if training_mode:
        return _bn_training(x, scale, b, input_mean, input_var, epsilon, momentum)[:3]
    y = _bn_inference(x, scale, b, input_mean, input_var, epsilon)
    return y if cx.num_outputs == 1 else (y, input_mean, input_var)


# --- instance, layer, group, RMS and mean-variance normalization ----------------------------


def _normalize(x, axes, epsilon, dtype):
    """(X - mean) / sqrt(var + epsilon) over `axes`, computed in `dtype`; with mean and 1/std."""
    xw = x.astype(dtype)
    mean = jnp.mean(xw, axis=axes, keepdims=True)
    dev = xw - mean
    inv_std = lax.rsqrt(jnp.mean(dev * dev, axis=axes, keepdims=True) + jnp.asarray(epsilon, dtype))
    return dev * inv_std, mean, inv_std


def _stash_dtype(cx, stash_type: int) -> np.dtype:
    dtype = to_numpy_dtype(stash_type)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise cx.fail(f"stash_type must be a floating-point type, got {dtype}")
    return dtype


@rule("InstanceNormalization", since=1)
def instance_normalization(cx, x, scale, b, *, consumed_inputs=None, epsilon=1e-5):
    """Y = scale * (X - mean) / sqrt(var + epsilon) + B, statistics per (N, C) (v1+)."""
    # consumed_inputs (v1) is a legacy in-place hint with no effect on the result
    norm, _, _ = _normalize(x, tuple(range(2, x.ndim)), epsilon, accum_dtype(x.dtype))
    rank = x.ndim
    y = norm * _per_channel(scale.astype(norm.dtype), rank) + _per_channel(b.astype(norm.dtype), rank)
    return y.astype(x.dtype)


@rule("LayerNormalization", since=1)
def layer_normalization_v1(cx, x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """LayerNorm below opset 17: onnxruntime's own registration, which its optimizer writes."""
    # not an ONNX op before v17 (onnx.checker rejects it); onnxruntime's kernel computes every
    # step, scale and bias included, in stash_type and gives Y the type of Scale
    a = axis_index(cx, axis, max(x.ndim, 1))
    norm, mean, inv_std = _normalize(x, tuple(range(a, x.ndim)), epsilon, _stash_dtype(cx, stash_type))
    y = norm * scale.astype(norm.dtype)
    if b is not None:
        y = y + b.astype(norm.dtype)
    return y.astype(scale.dtype), mean, inv_std


@rule("LayerNormalization", since=17)
def layer_normalization(cx, x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Y = (X - mean) / sqrt(var + eps) * Scale + B over dims axis..; Mean, InvStdDev (v17+)."""
    a = axis_index(cx, axis, max(x.ndim, 1))
    axes, dtype = tuple(range(a, x.ndim)), _stash_dtype(cx, stash_type)
    xu = x.astype(dtype)
    # one pass, var = E[x^2] - E[x]^2 as the schema's body computes it: 1.5x faster than two
    mean = jnp.mean(xu, axis=axes, keepdims=True)
    var = jnp.maximum(jnp.mean(xu * xu, axis=axes, keepdims=True) - mean * mean, 0)
    inv_std = lax.rsqrt(var + jnp.asarray(epsilon, dtype))
    y = ((xu - mean) * inv_std).astype(x.dtype) * scale  # the body scales in X's type
    if b is not None:
        y = y + b
    return y, mean, inv_std


def _group_normalized(cx, x, num_groups, epsilon, dtype):
    """X normalized per (N, group), shaped (N, num_groups, C/num_groups * D1 * ... * Dk)."""
    if num_groups is None or num_groups <= 0 or x.ndim < 2 or x.shape[1] % num_groups:
        raise cx.fail(f"num_groups ({num_groups}) must divide the channel count of X, "
                      f"got shape {tuple(x.shape)}")
    grouped = x.reshape(x.shape[0], num_groups, math.prod(x.shape[1:]) // num_groups)
    return _normalize(grouped, (2,), epsilon, dtype)[0]


@rule("GroupNormalization", since=18)
def group_normalization_v18(cx, x, scale, bias, *, epsilon=1e-5, num_groups=None):
    """GroupNorm v18-v20: scale and bias have one value per group, not per channel."""
    norm = _group_normalized(cx, x, num_groups, epsilon, x.dtype)
    y = norm * scale.reshape(1, -1, 1).astype(x.dtype) + bias.reshape(1, -1, 1).astype(x.dtype)
    return y.reshape(x.shape)


@rule("GroupNormalization", since=21)
def group_normalization(cx, x, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    """GroupNorm v21+: statistics per group in stash_type; scale and bias per channel."""
    norm = _group_normalized(cx, x, num_groups, epsilon, _stash_dtype(cx, stash_type))
    norm = norm.reshape(x.shape[0], x.shape[1], -1).astype(x.dtype)
    y = norm * scale.reshape(1, -1, 1).astype(x.dtype) + bias.reshape(1, -1, 1).astype(x.dtype)
    return y.reshape(x.shape)


@rule("RMSNormalization", since=23)
def rms_normalization(cx, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Y = X / sqrt(mean(X^2 over dims axis..) + epsilon) * scale (v23+)."""
    a = axis_index(cx, axis, max(x.ndim, 1))
    dtype = _stash_dtype(cx, stash_type)
    xw = x.astype(dtype)
    ms = jnp.mean(xw * xw, axis=tuple(range(a, x.ndim)), keepdims=True)
    norm = (xw * lax.rsqrt(ms + jnp.asarray(epsilon, dtype))).astype(x.dtype)
    return (norm * scale).astype(scale.dtype)


@rule("MeanVarianceNormalization", since=9)
def mean_variance_normalization(cx, x, *, axes=(0, 2, 3)):
    """Y = (X - mean) / (sqrt(var) + 1e-9) over `axes` (v9+; the schema body's epsilon)."""
    rank = x.ndim
    dims = tuple(sorted({axis_index(cx, a, max(rank, 1)) for a in axes}))
    xw = x.astype(accum_dtype(x.dtype))
    mean = jnp.mean(xw, axis=dims, keepdims=True)
    std = jnp.sqrt(jnp.mean(jnp.square(xw - mean), axis=dims, keepdims=True))
    return ((xw - mean) / (std + jnp.asarray(1e-9, xw.dtype))).astype(x.dtype)


@rule("LpNormalization", since=1)
def lp_normalization(cx, x, *, axis=-1, p=2):
    """Y = X / ||X||_p along `axis`, p in {1, 2}; a zero norm gives 0 (v1+)."""
    a = axis_index(cx, axis, max(x.ndim, 1))
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=a, keepdims=True)
    elif p == 2:
        norm = jnp.sqrt(jnp.sum(x * x, axis=a, keepdims=True))
    else:
        raise cx.fail(f"p must be 1 or 2, got {p}")
    zero = norm == 0
    return jnp.where(zero, jnp.zeros((), x.dtype), x / jnp.where(zero, jnp.ones((), x.dtype), norm))


# --- LRN, activations -----------------------------------------------------------------------


@rule("LRN", since=1)
def lrn(cx, x, *, alpha=0.0001, beta=0.75, bias=1.0, size=None):
    """Y = X / (bias + alpha / size * sum of X^2 over `size` neighbouring channels) ^ beta."""
    if size is None or size < 1:
        raise cx.fail(f"size must be a positive integer, got {size}")
    if x.ndim < 3:
        raise cx.shape_error(f"X must have shape (N, C, D1, ...), got {tuple(x.shape)}")
    wide = accum_dtype(x.dtype)
    sq = jnp.square(x.astype(wide))
    lo, hi = (size - 1) // 2, size // 2  # floor((size-1)/2) before, ceil((size-1)/2) after
    window = (1, size) + (1,) * (x.ndim - 2)
    pads = ((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2)
    sums = lax.reduce_window(sq, jnp.asarray(0, wide), lax.add, window, (1,) * x.ndim, pads)
    denom = (bias + (alpha / size) * sums) ** beta
    return (x.astype(wide) / denom).astype(x.dtype)


@rule("Swish", since=24)
def swish(cx, x, *, alpha=1.0):
    """Y = X * sigmoid(alpha * X) (v24+)."""
    return x * sigmoid(jnp.asarray(alpha, x.dtype) * x)


@rule("SwiGLU", since=28)
def swiglu(cx, a, b, *, alpha=1.0):
    """Y = A * sigmoid(alpha * A) * B; A and B have one shape, no broadcasting (v28+)."""
    if a.shape != b.shape:
        raise cx.shape_error(f"A and B must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    return a * sigmoid(jnp.asarray(alpha, a.dtype) * a) * b


# --- dropout --------------------------------------------------------------------------------


def _dropout(x, ratio, training, seed, mask_dtype):
    """Y = X * keep / (1 - ratio), keep ~ Bernoulli(1 - ratio) where training, else Y = X.

    A real PRNG (jax threefry): the kept positions cannot match another runtime's generator,
    only the distribution does. A seed gives one mask on every run; without one, every run of
    the compiled function draws a fresh seed from the host.
    """
    if training is False:
        return x, jnp.ones(x.shape, mask_dtype)
    if seed is None:  # a side-effecting callback: runs on every call, never folded
        seed = host_seed()
    key = jax.random.key(seed)
    r = jnp.asarray(ratio, jnp.float32)
    keep = jax.random.bernoulli(key, 1 - r, x.shape)
    if training is not True:  # a traced training_mode: select at run time
        keep = keep | ~jnp.asarray(training, bool)
        r = jnp.where(jnp.asarray(training, bool), r, 0)
    scaled = x * (1 / (1 - r)).astype(x.dtype)
    return jnp.where(keep, scaled, jnp.zeros((), x.dtype)), keep.astype(mask_dtype)


@rule("Dropout", since=1, fold=False)
def dropout_v1(cx, x, *, consumed_inputs=None, is_test=0, ratio=0.5):
    """Dropout v1-v6: identity unless is_test=0 and the model is compiled for training."""
    # consumed_inputs (v1) is a legacy in-place hint with no effect on the result
    training = not is_test and cx.options.training
    return _dropout(x, ratio, training, None, x.dtype)


@rule("Dropout", since=7, fold=False)
def dropout_v7(cx, x, *, ratio=0.5):
    """Dropout v7-v9: identity unless compiled for training; the mask has X's type."""
    return _dropout(x, ratio, cx.options.training, None, x.dtype)


@rule("Dropout", since=10, fold=False)
def dropout_v10(cx, x, *, ratio=0.5):
    """Dropout v10-v11: identity unless compiled for training; the mask is boolean."""
    return _dropout(x, ratio, cx.options.training, None, np.bool_)


@rule("Dropout", since=12, fold=False)
def dropout(cx, x, ratio=None, training_mode=None, *, seed=None):
    """Dropout v12+: ratio and training_mode are inputs (defaults 0.5 and false); seed attribute."""
    if training_mode is None:
        training = False
    elif cx.is_static(training_mode):
        training = bool(np.asarray(training_mode))
    else:
        training = training_mode
    return _dropout(x, 0.5 if ratio is None else ratio, training, seed, np.bool_)
