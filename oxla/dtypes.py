"""ONNX element types <-> numpy dtypes (ml_dtypes for the small floats and ints)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

from oxla.errors import InvalidModelError

_ONNX_TO_NUMPY: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.STRING: np.dtype(object),
    TensorProto.BOOL: np.dtype(np.bool_),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.COMPLEX64: np.dtype(np.complex64),
    TensorProto.COMPLEX128: np.dtype(np.complex128),
    TensorProto.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    TensorProto.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    TensorProto.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    TensorProto.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    TensorProto.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    TensorProto.FLOAT8E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    TensorProto.UINT4: np.dtype(ml_dtypes.uint4),
    TensorProto.INT4: np.dtype(ml_dtypes.int4),
    TensorProto.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
    TensorProto.UINT2: np.dtype(ml_dtypes.uint2),
    TensorProto.INT2: np.dtype(ml_dtypes.int2),
}
if hasattr(TensorProto, "FLOAT6E2M3") and hasattr(ml_dtypes, "float6_e2m3fn"):
    _ONNX_TO_NUMPY[TensorProto.FLOAT6E2M3] = np.dtype(ml_dtypes.float6_e2m3fn)
    _ONNX_TO_NUMPY[TensorProto.FLOAT6E3M2] = np.dtype(ml_dtypes.float6_e3m2fn)

_NUMPY_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in _ONNX_TO_NUMPY.items()}

# Element types XLA has no native type for: they are computed on the host with numpy.
HOST_ONLY: frozenset[int] = frozenset({TensorProto.STRING})
if hasattr(TensorProto, "FLOAT6E2M3"):
    HOST_ONLY = HOST_ONLY | {TensorProto.FLOAT6E2M3, TensorProto.FLOAT6E3M2}

FLOAT_TYPES: frozenset[np.dtype] = frozenset(
    np.dtype(t)
    for t in (
        np.float16,
        np.float32,
        np.float64,
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float8_e8m0fnu,
        ml_dtypes.float4_e2m1fn,
    )
)


def to_numpy_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX element type; InvalidModelError for unknown codes."""
    try:
        return _ONNX_TO_NUMPY[elem_type]
    except KeyError:
        raise InvalidModelError(f"unknown ONNX element type {elem_type}") from None


def to_onnx_type(dtype: np.dtype | type) -> int:
    """The ONNX element type of a numpy dtype (object arrays are strings)."""
    dt = np.dtype(dtype)
    if dt.kind in "OUS":
        return TensorProto.STRING
    try:
        return _NUMPY_TO_ONNX[dt]
    except KeyError:
        raise InvalidModelError(f"numpy dtype {dt} has no ONNX element type") from None


def type_name(elem_type: int) -> str:
    """'float32', 'int64', 'string'... for messages."""
    if elem_type == TensorProto.STRING:
        return "string"
    dt = _ONNX_TO_NUMPY.get(elem_type)
    return str(dt) if dt is not None else f"element type {elem_type}"


def is_float(dtype: np.dtype) -> bool:
    """Whether a dtype is a floating-point type (including the ml_dtypes small floats)."""
    return np.dtype(dtype) in FLOAT_TYPES
