"""Runtime values: static (numpy, known while tracing) or traced (jax); sequences are lists."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from onnx import TypeProto, helper

from oxla.dtypes import to_onnx_type

# A value is a tensor (np.ndarray: static; jax.Array or tracer: traced), a sequence (list of
# tensors), a map (dict, ai.onnx.ml only, always static on the host), or None (an absent
# optional input or an empty optional).
Value = Any


def is_static(value: Value) -> bool:
    """Known while tracing: numpy arrays, None, and sequences of static values."""
    if value is None or isinstance(value, np.ndarray | np.generic | dict):
        return True
    if isinstance(value, list):
        return all(is_static(v) for v in value)
    return False


def is_concrete(value: Value) -> bool:
    """Has a concrete value now (static, or a jax array that is not a tracer)."""
    if isinstance(value, list):
        return all(is_concrete(v) for v in value)
    return is_static(value) or (isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer))


def to_static(value: Value) -> Value:
    """Turn a concrete result into numpy (recursively for sequences and tuples)."""
    if value is None or isinstance(value, np.ndarray | dict):
        return value
    if isinstance(value, list):
        return [to_static(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_static(v) for v in value)
    return np.asarray(value)


def signature(value: Value) -> Any:
    """A hashable description (shapes and dtypes) used as a compile-cache key."""
    if value is None:
        return None
    if isinstance(value, list):
        return ("seq", tuple(signature(v) for v in value))
    return (tuple(value.shape), str(value.dtype))


def type_proto(value: Value) -> TypeProto:
    """The ONNX TypeProto of a runtime value (for context-dependent function bodies)."""
    if value is None:
        return TypeProto()
    if isinstance(value, list):
        elem = type_proto(value[0]) if value else helper.make_tensor_type_proto(1, None)
        return helper.make_sequence_type_proto(elem)
    return helper.make_tensor_type_proto(to_onnx_type(value.dtype), list(value.shape))


def to_host(value: Value) -> Value:
    """A result as the caller gets it: numpy arrays, lists for sequences, dicts for maps."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, list | tuple):
        return [to_host(v) for v in value]
    return np.asarray(value)
