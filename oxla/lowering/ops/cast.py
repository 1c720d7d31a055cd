"""Type conversion: Cast, CastLike and BitCast; strings (and float6) convert on the host with numpy."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from onnx import TensorProto

from oxla.dtypes import HOST_ONLY, is_float, to_numpy_dtype
from oxla.lowering.registry import rule

_FLOAT8 = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                          ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz))
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_SMALL_INTS = frozenset(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4,
                                              ml_dtypes.int2, ml_dtypes.uint2))
_HOST = frozenset(to_numpy_dtype(t) for t in HOST_ONLY)
_SUB_BYTE_BITS = {np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4,
                  np.dtype(ml_dtypes.float4_e2m1fn): 4,
                  np.dtype(ml_dtypes.int2): 2, np.dtype(ml_dtypes.uint2): 2}
_ROUND_MODES = ("up", "down", "nearest")


def _target(cx, to) -> np.dtype:
    if to is None:
        raise cx.fail("attribute 'to' is required")
    if isinstance(to, str):  # Cast-1 names the type ("FLOAT"); later versions give its code
        names = dict(TensorProto.DataType.items())
        if to.upper() not in names:
            raise cx.fail(f"unknown type name to='{to}'")
        to = names[to.upper()]
    return to_numpy_dtype(int(to))


def _parse_number(s, to: np.dtype):
    text = s.decode("utf-8") if isinstance(s, bytes) else str(s)
    if to.kind in "iu":
        try:
            return int(text)
        except ValueError:
            return int(float(text))  # "100.5" -> 100, as the spec allows
    return float(text)  # float() reads "INF", "+inf", "-Inf", "NaN" case-insensitively


def _host_cast(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """Casts XLA cannot do: to and from strings, and the float6 types."""
    if x.dtype == to:
        return x
    if to == np.dtype(object):
        return x.astype(np.str_).astype(object)
    if x.dtype == np.dtype(object):
        wide = np.float64 if to.kind not in "iu" else (np.uint64 if to.kind == "u" else np.int64)
        values = [_parse_number(s, to) for s in x.reshape(-1)]
        return np.asarray(values, wide).reshape(x.shape).astype(to)
    return x.astype(to)


def _saturate(x, to: np.dtype):
    """float8 with saturate: out-of-range values and +-inf become +-FLT_MAX, NaN stays NaN."""
    if not is_float(x.dtype) or x.dtype.itemsize < 4:
        x = x.astype(jnp.float32)  # exact for every small float; ints only need a rough value
    info = ml_dtypes.finfo(to)
    return jnp.clip(x, float(info.min), float(info.max)).astype(to)


def _small_int(x, to: np.dtype):
    """float -> int4/uint4/int2/uint2: truncate; out-of-range gives 0 (as ml_dtypes and onnx do)."""
    info = ml_dtypes.iinfo(to)
    t = jnp.trunc(x.astype(jnp.float32))
    return jnp.where((t >= info.min) & (t <= info.max), t, 0).astype(to)


def _e8m0(cx, x, saturate: int, round_mode: str):
    """float -> float8e8m0 (the exponent byte of float32), rounding by round_mode."""
    if round_mode not in _ROUND_MODES:
        raise cx.fail(f"round_mode must be one of {', '.join(_ROUND_MODES)}, got '{round_mode}'")
    bits = lax.bitcast_convert_type(jnp.asarray(x).astype(jnp.float32), jnp.uint32)
    exponent = (bits >> 23) & 0xFF
    if round_mode == "up":
        round_up = (bits & 0x7FFFFF) > 0
    elif round_mode == "nearest":
        guard, rnd, sticky = (bits & 0x400000) > 0, (bits & 0x200000) > 0, (bits & 0x1FFFFF) > 0
        round_up = guard & (rnd | sticky | (exponent > 0))
    else:
        round_up = jnp.zeros(bits.shape, bool)
    if saturate:
        round_up = round_up & (exponent != 0xFE)  # do not round the largest exponent to NaN
    out = jnp.where(exponent == 0xFF, exponent, exponent + round_up.astype(jnp.uint32))
    return lax.bitcast_convert_type(out.astype(jnp.uint8), _E8M0)


def convert(cx, x, to: np.dtype, saturate: int = 1, round_mode: str = "up"):
    """X converted to dtype `to` with ONNX Cast semantics."""
    if x.dtype in _HOST or to in _HOST:
        return _host_cast(np.asarray(cx.static(x, "a string or float6 input to Cast")), to)
    if x.dtype == to:
        return x
    if to in _FLOAT8 and saturate:
        return _saturate(x, to)
    if to == _E8M0:
        return _e8m0(cx, x, saturate, round_mode)
    if to in _SMALL_INTS and is_float(x.dtype):
        return _small_int(x, to)
    return lax.convert_element_type(x, to)


@rule("Cast", since=24)
def cast(cx, x, *, round_mode="up", saturate=1, to=None):
    """Y = X converted to type `to` (v24+: round_mode for float8e8m0; v25 int2, v28 float6)."""
    return convert(cx, x, _target(cx, to), saturate, round_mode)


@rule("Cast", since=19)
def cast_v19(cx, x, *, saturate=1, to=None):
    """Y = X converted to type `to`; saturate applies to float8 targets (v19-v23)."""
    return convert(cx, x, _target(cx, to), saturate)


@rule("Cast", since=1)
def cast_v1(cx, x, *, to=None):
    """Y = X converted to type `to` (v1: a type name; v6-v18: a type code)."""
    return convert(cx, x, _target(cx, to))


@rule("CastLike", since=24)
def cast_like(cx, x, target_type, *, round_mode="up", saturate=1):
    """Y = Cast(X, to=the element type of target_type) (v24+: round_mode)."""
    return convert(cx, x, np.dtype(target_type.dtype), saturate, round_mode)


@rule("CastLike", since=19)
def cast_like_v19(cx, x, target_type, *, saturate=1):
    """Y = Cast(X, to=the element type of target_type, saturate) (v19-v23)."""
    return convert(cx, x, np.dtype(target_type.dtype), saturate)


@rule("CastLike", since=15)
def cast_like_v15(cx, x, target_type):
    """Y = Cast(X, to=the element type of target_type) (v15-v18)."""
    return convert(cx, x, np.dtype(target_type.dtype))


def _bits(dtype: np.dtype) -> int:
    return _SUB_BYTE_BITS.get(dtype, dtype.itemsize * 8)


@rule("BitCast", since=26)
def bit_cast(cx, x, *, to=None):
    """Y = the bits of X reinterpreted as type `to` of the same width, little endian (v26+)."""
    src, dst = np.dtype(x.dtype), _target(cx, to)
    if src == np.dtype(object) or dst == np.dtype(object):
        raise cx.fail("BitCast does not take strings")
    if _bits(src) != _bits(dst):
        raise cx.fail(f"BitCast needs types of the same width, got {src} ({_bits(src)} bits) "
                      f"to {dst} ({_bits(dst)} bits)")
    if src == dst:
        return x
    if src == np.dtype(bool):
        x, src = lax.convert_element_type(x, jnp.uint8), np.dtype(np.uint8)
    if dst == np.dtype(bool):
        return _bitcast(x, src, np.dtype(np.uint8)) != 0
    return _bitcast(x, src, dst)


def _bitcast(x, src: np.dtype, dst: np.dtype):
    if src.kind == "c":  # XLA bitcasts no complex: go through the (real, imag) float pair
        half = jnp.float32 if src.itemsize == 8 else jnp.float64
        return lax.bitcast_convert_type(jnp.stack([jnp.real(x), jnp.imag(x)], -1).astype(half), dst)
    if dst.kind == "c":
        parts = lax.bitcast_convert_type(x, jnp.float32 if dst.itemsize == 8 else jnp.float64)
        return lax.complex(parts[..., 0], parts[..., 1]).astype(dst)
    return lax.bitcast_convert_type(x, dst)
