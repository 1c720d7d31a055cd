"""Elementwise ops at opsets 1-6: `broadcast`/`axis` attributes and the unused consumed_inputs.

Before opset 7, binary ops broadcast only when asked (broadcast=1), and then B's shape lines up
with A's dims starting at `axis` (default: the trailing dims), not numpy-style.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import jax.numpy as jnp
from jax import lax

from oxla.lowering.ops import elementwise as ew
from oxla.lowering.registry import register_rule, rule


def _legacy_broadcast(cx, a, b, axis, broadcast):
    if not broadcast:
        if tuple(a.shape) != tuple(b.shape):
            raise cx.shape_error(f"shapes {tuple(a.shape)} and {tuple(b.shape)} differ and broadcast=0")
        return b
    start = len(a.shape) - len(b.shape) if axis is None else axis % max(len(a.shape), 1)
    if b.size == 1:
        return jnp.reshape(b, ())
    if tuple(a.shape[start:start + len(b.shape)]) != tuple(b.shape):
        if (axis is None or len(b.shape) == len(a.shape)) and _numpy_broadcastable(a.shape, b.shape):
            return b  # exporters (PyTorch's) emit broadcast=1 with numpy-style size-1 dims
        raise cx.shape_error(f"B of shape {tuple(b.shape)} does not line up with A {tuple(a.shape)} at axis {start}")
    return jnp.reshape(b, (1,) * start + tuple(b.shape) + (1,) * (len(a.shape) - start - len(b.shape)))


def _numpy_broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(b) <= len(a) and all(y in (1, x) for x, y in zip(a[len(a) - len(b):], b))


def _binary(table: dict[str, Callable]) -> None:
    for op, f in table.items():
        def lower(cx, a, b, *, axis=None, broadcast=0, consumed_inputs=None, _f=f):
            return _f(a, _legacy_broadcast(cx, a, b, axis, broadcast))
        lower.__name__ = f"{op.lower()}_v1"
        lower.__doc__ = f"{op}(A, B) with the opset-1 broadcast/axis attributes (v1-v6)."
        register_rule(op, 1, lower)


def _int_aware_div(a, b):
    return lax.div(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else jnp.divide(a, b)


_binary({"Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "Div": _int_aware_div,
         "Equal": jnp.equal, "Less": jnp.less, "Greater": jnp.greater, "And": jnp.logical_and,
         "Or": jnp.logical_or, "Xor": jnp.logical_xor, "Pow": lambda a, b: jnp.power(a, b.astype(a.dtype))})


def _unary(table: dict[str, Callable]) -> None:
    for op, f in table.items():
        def lower(cx, x, *, consumed_inputs=None, _f=f):
            return _f(x)
        lower.__name__ = f"{op.lower()}_v1"
        lower.__doc__ = f"{op}(X) (v1-v5: consumed_inputs is a legacy hint, ignored)."
        register_rule(op, 1, lower)


_unary({"Abs": jnp.abs, "Neg": jnp.negative, "Exp": jnp.exp, "Log": jnp.log, "Sqrt": jnp.sqrt,
        "Reciprocal": jnp.reciprocal, "Floor": jnp.floor, "Ceil": jnp.ceil,
        "Relu": lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)), "Sigmoid": lax.logistic,
        "Tanh": jnp.tanh})


@rule("LeakyRelu", since=1)
def leaky_relu_v1(cx, x, *, alpha=0.009999999776482582, consumed_inputs=None):
    """LeakyRelu (v1-v5: consumed_inputs ignored)."""
    return ew.leaky_relu(cx, x, alpha=alpha)


@rule("Elu", since=1)
def elu_v1(cx, x, *, alpha=1.0, consumed_inputs=None):
    """Elu (v1-v5: consumed_inputs ignored)."""
    return ew.elu(cx, x, alpha=alpha)


@rule("Selu", since=1)
def selu_v1(cx, x, *, alpha=1.673200011253357, consumed_inputs=None, gamma=1.0506999492645264):
    """Selu (v1-v5: v1's defaults are the rounded constants of its schema)."""
    return ew.selu(cx, x, alpha=alpha, gamma=gamma)


@rule("HardSigmoid", since=1)
def hard_sigmoid_v1(cx, x, *, alpha=0.20000000298023224, beta=0.5, consumed_inputs=None):
    """HardSigmoid (v1-v5: consumed_inputs ignored)."""
    return ew.hard_sigmoid(cx, x, alpha=alpha, beta=beta)


def _variadic(op: str, f: Callable, mean: bool = False) -> None:
    def lower(cx, *data, consumed_inputs=None):
        out = reduce(f, data)
        return out / jnp.asarray(len(data), out.dtype) if mean else out
    lower.__name__ = f"{op.lower()}_v1"
    lower.__doc__ = f"{op} of inputs of equal shape (v1-v7)."
    register_rule(op, 1, lower)


_variadic("Sum", jnp.add)
_variadic("Max", jnp.maximum)
_variadic("Min", jnp.minimum)
_variadic("Mean", jnp.add, mean=True)


@rule("Clip", since=1)
def clip_v1(cx, x, *, consumed_inputs=None, max=None, min=None):
    """Clip with optional attribute bounds (v1-v5)."""
    return ew.clip(cx, x, min, max)


@rule("PRelu", since=1)
def prelu_v1(cx, x, slope, *, consumed_inputs=None):
    """PRelu (v1-v6): a 1-D slope of length C is per channel (axis 1), as Caffe and PyTorch mean it."""
    if slope.ndim == 1 and slope.size > 1 and x.ndim >= 2 and slope.shape[0] == x.shape[1]:
        slope = jnp.reshape(slope, (slope.shape[0],) + (1,) * (x.ndim - 2))
    return jnp.where(x >= 0, x, slope.astype(x.dtype) * x)
