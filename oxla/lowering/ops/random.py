"""Random ops: RandomNormal, RandomUniform (and *Like), Bernoulli, Multinomial, on jax's PRNG.

A node with a `seed` attribute draws the same values on every run (jax's generator, so not
numpy's values); without one it draws a fresh seed from the host on every run, inside jit too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from oxla.dtypes import FLOAT_TYPES, to_numpy_dtype
from oxla.lowering.common import random_key
from oxla.lowering.registry import rule


def _float_type(cx, dtype: int, like=None) -> np.dtype:
    """The output type: the dtype attribute, else the input's type (the *Like ops)."""
    out = to_numpy_dtype(dtype) if dtype else np.dtype(like.dtype)
    if out not in FLOAT_TYPES or out.itemsize < 2:
        raise cx.fail(f"random values need a float16/bfloat16/float/double output type, got {out}")
    return out


def _shape(cx, shape) -> tuple[int, ...]:
    if shape is None or any(d < 0 for d in shape):
        raise cx.fail(f"the shape attribute must list non-negative dims, got {shape}")
    return tuple(shape)


def _normal(key, shape, dtype, mean: float, scale: float):
    return jax.random.normal(key, shape, dtype) * jnp.asarray(scale, dtype) + jnp.asarray(mean, dtype)


def _uniform(key, shape, dtype, low: float, high: float):
    return jax.random.uniform(key, shape, dtype, minval=low, maxval=high)


@rule("RandomNormal", since=1, fold=False)
def random_normal(cx, *, dtype=1, mean=0.0, scale=1.0, seed=None, shape=None):
    """Y ~ Normal(mean, scale^2) of the given shape (v1+; v22 bfloat16)."""
    return _normal(random_key(seed), _shape(cx, shape), _float_type(cx, dtype), mean, scale)


@rule("RandomUniform", since=1, fold=False)
def random_uniform(cx, *, dtype=1, high=1.0, low=0.0, seed=None, shape=None):
    """Y ~ Uniform[low, high) of the given shape (v1+; v22 bfloat16)."""
    return _uniform(random_key(seed), _shape(cx, shape), _float_type(cx, dtype), low, high)


@rule("RandomNormalLike", since=1, fold=False)
def random_normal_like(cx, input, *, dtype=0, mean=0.0, scale=1.0, seed=None):
    """Y ~ Normal(mean, scale^2) shaped like the input, of its type unless dtype is set (v1+)."""
    return _normal(random_key(seed), input.shape, _float_type(cx, dtype, input), mean, scale)


@rule("RandomUniformLike", since=1, fold=False)
def random_uniform_like(cx, input, *, dtype=0, high=1.0, low=0.0, seed=None):
    """Y ~ Uniform[low, high) shaped like the input, of its type unless dtype is set (v1+)."""
    return _uniform(random_key(seed), input.shape, _float_type(cx, dtype, input), low, high)


@rule("Bernoulli", since=15, fold=False)
def bernoulli(cx, input, *, dtype=0, seed=None):
    """Y[i] = 1 with probability input[i], else 0; of the input's type unless dtype is set (v15+)."""
    out = to_numpy_dtype(dtype) if dtype else np.dtype(input.dtype)
    return jax.random.bernoulli(random_key(seed), input).astype(out)


@rule("Multinomial", since=7, fold=False)
def multinomial(cx, input, *, dtype=6, sample_size=1, seed=None):
    """Y[b, s] ~ Categorical(softmax(input[b])): sample_size class indices per batch row (v7+)."""
    cx.expect_rank("input", input, 2)
    out = to_numpy_dtype(dtype)
    if out not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise cx.fail(f"dtype must be int32 or int64, got {out}")
    if sample_size < 1:
        raise cx.fail(f"sample_size must be positive, got {sample_size}")
    # the input holds unnormalized log-probabilities: jax's logits
    draws = jax.random.categorical(random_key(seed), input, axis=-1,
                                   shape=(sample_size, input.shape[0]))
    return draws.T.astype(out)
