"""Resize (v10, v11+) and Upsample: separable resampling with taps computed at trace time."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from oxla.lowering.common import check_size
from oxla.lowering.registry import rule

# tf_half_pixel_for_nn left the spec in v13 but onnxruntime accepts it in every version, and
# tf2onnx writes it for TensorFlow's nearest resizing (tf.image.resize, Keras 2's UpSampling2D)
_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                     "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


@dataclass(frozen=True)
class _Sampling:
    """How one axis is resampled: the attributes of Resize that shape the taps."""

    mode: str                     # nearest | linear | cubic
    coordinates: str              # coordinate_transformation_mode
    nearest: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    sized: bool = False           # the output lengths were given (sizes), not the scales


def _source_coords(how: _Sampling, out_len: int, in_len: int, scale: float, roi: tuple | None):
    """x_original for every output index, per coordinate_transformation_mode.

    In float32, in onnxruntime's order of operations: float64 moves coordinates that land on a
    rounding or border edge (1.5 / 0.6f is 2.5 in float32, 2.4999999 in float64).
    """
    f = np.float32
    y, s, half = np.arange(out_len, dtype=f), f(scale), f(0.5)
    # align_corners and tf_crop_and_resize map onto the fractional output length when scales are
    # given (onnx.reference, the conformance data); onnxruntime uses the integer one
    width = f(out_len) if how.sized else f(scale * in_len)
    mode = how.coordinates
    if mode == "half_pixel":
        return (y + half) / s - half
    if mode == "tf_half_pixel_for_nn":  # TensorFlow's half_pixel_centers for nearest: no -0.5
        return (y + half) / s
    if mode == "pytorch_half_pixel":
        return (y + half) / s - half if out_len > 1 else np.zeros_like(y)
    if mode == "asymmetric":
        return y / s
    if mode == "half_pixel_symmetric":
        offset = f(f(in_len) / f(2) * (f(1) - f(out_len) / f(s * f(in_len))))
        return (np.float64(offset) + (y + 0.5) / np.float64(s) - 0.5).astype(f)
    if mode == "align_corners":
        return np.zeros_like(y) if width == 1 else y * f(in_len - 1) / (width - f(1))
    start, end = (f(v) for v in roi)  # type: ignore[union-attr]  # given for tf_crop_and_resize
    if width == 1:
        return np.full_like(y, 0.5 * (float(start) + float(end)) * (in_len - 1))
    return start * f(in_len - 1) + y * (end - start) * f(in_len - 1) / (width - f(1))


def _nearest_taps(how: _Sampling, x: np.ndarray, scale: float) -> np.ndarray:
    floor = np.floor(x)
    ratio = x - floor
    mode = how.nearest
    if mode == "simple":  # Resize-10 and Upsample (onnxruntime): ceil when downsampling, else floor
        idx = np.ceil(x) if scale < 1 else floor
    elif mode == "round_prefer_floor":
        idx = floor + (ratio > 0.5)
    elif mode == "round_prefer_ceil":
        idx = floor + (ratio >= 0.5)
    elif mode == "floor":
        idx = floor
    else:
        idx = np.ceil(x)
    return idx.astype(np.int64)[:, None]


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances d."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _weights(how: _Sampling, ratio: np.ndarray, scale: float) -> tuple[np.ndarray, int]:
    """Tap weights (out, n) for taps at offsets first..first+n-1 from floor-ish base; and first."""
    if how.antialias and scale < 1:  # the filter is stretched by 1/scale when downsampling
        reach = 1 if how.mode == "linear" else 2
        first = int(np.floor(-reach / scale) + 1)
        d = (np.arange(first, 2 - first)[None, :] - ratio[:, None]) * scale
        w = np.clip(1 - np.abs(d), 0, 1) if how.mode == "linear" else _cubic(d, how.cubic_a)
        return w / w.sum(axis=1, keepdims=True), first
    if how.mode == "linear":
        return np.stack([1 - ratio, ratio], axis=1), 0
    d = np.arange(-1, 3)[None, :] - ratio[:, None]
    return _cubic(d, how.cubic_a), -1


def _axis_taps(how: _Sampling, in_len: int, out_len: int, scale: float, roi: tuple | None):
    """Input indices (out, n), weights (out, n) and the extrapolated outputs (or None) of one axis."""
    x = _source_coords(how, out_len, in_len, scale, roi)
    outside = (x < 0) | (x > in_len - 1) if how.coordinates == "tf_crop_and_resize" else None
    x = x.astype(np.float64)
    if how.mode == "nearest":
        idx = _nearest_taps(how, x, scale)
        return np.clip(idx, 0, in_len - 1), np.ones(idx.shape), outside
    # an integral x is the right tap of the pair before it (ratio 1), as the reference does
    base = np.ceil(x) - 1
    ratio = x - base
    w, first = _weights(how, ratio, scale)
    idx = base.astype(np.int64)[:, None] + first + np.arange(w.shape[1])[None, :]
    if how.exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), w, outside


def _apply_taps(x, axis: int, idx: np.ndarray, w: np.ndarray):
    out, n = idx.shape
    if n == 1:
        return jnp.take(x, idx[:, 0], axis=axis, mode="clip")
    g = jnp.take(x, idx.reshape(-1), axis=axis, mode="clip")
    g = g.reshape((*x.shape[:axis], out, n, *x.shape[axis + 1:]))
    shape = (1,) * axis + (out, n) + (1,) * (x.ndim - axis - 1)
    return jnp.sum(g * jnp.asarray(w, x.dtype).reshape(shape), axis=axis + 1)


def _compute_type(dtype: np.dtype):
    wide = dtype == np.float64 or (np.issubdtype(dtype, np.integer) and dtype.itemsize >= 4)
    return jnp.float64 if wide else jnp.float32


def _saturate(y, dtype: np.dtype):
    """The result in X's type: integers rounded half to even and clamped, floats clamped."""
    info = ml_dtypes.iinfo(dtype) if np.issubdtype(dtype, np.integer) else ml_dtypes.finfo(dtype)
    if np.issubdtype(dtype, np.integer):
        y = jnp.round(y)
    return jnp.clip(y, float(info.min), float(info.max)).astype(dtype)


def _resample(x, how: _Sampling, out_sizes, scales, rois, extrapolation_value: float = 0.0):
    """Resample every axis whose size, scale or roi is not the identity, one axis at a time."""
    dtype = np.dtype(x.dtype)
    y = x if how.mode == "nearest" else x.astype(_compute_type(dtype))
    for axis, (out_len, scale) in enumerate(zip(out_sizes, scales)):
        roi = None if rois is None else rois[axis]
        if out_len == x.shape[axis] and math.isclose(scale, 1.0) and (roi is None or roi == (0, 1)):
            continue
        idx, w, outside = _axis_taps(how, x.shape[axis], out_len, scale, roi)
        y = _apply_taps(y, axis, idx, w)
        if outside is not None and outside.any():
            mask = outside.reshape((1,) * axis + (-1,) + (1,) * (x.ndim - axis - 1))
            y = jnp.where(mask, jnp.asarray(extrapolation_value, y.dtype), y)
    return y if how.mode == "nearest" else _saturate(y, dtype)


def _check_modes(cx, mode: str, coordinates: str, nearest: str) -> None:
    if mode not in ("nearest", "linear", "cubic"):
        raise cx.fail(f"mode must be 'nearest', 'linear' or 'cubic', got '{mode}'")
    if coordinates not in _COORDINATE_MODES:
        raise cx.fail(f"unknown coordinate_transformation_mode '{coordinates}'")
    if nearest not in _NEAREST_MODES[:-1]:
        raise cx.fail(f"unknown nearest_mode '{nearest}'")


def _axes(cx, axes, rank: int) -> list[int]:
    if axes is None:
        return list(range(rank))
    out = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in out) or len(set(out)) != len(out):
        raise cx.fail(f"axes {tuple(axes)} must be distinct and in [-{rank}, {rank - 1}]")
    return out


def _geometry(cx, shape, axes, scales, sizes, policy: str):
    """Output sizes and per-axis scales (float) from either scales or sizes."""
    rank = len(shape)
    full_scales = [1.0] * rank
    out = list(shape)
    given = scales if scales is not None else sizes
    if given is None or len(given) != len(axes):
        raise cx.fail(f"exactly one of scales and sizes must be given, with {len(axes)} values")
    if scales is not None:
        if not all(math.isfinite(float(s)) and float(s) > 0 for s in scales):
            raise cx.fail(f"scales must be positive and finite, got {[float(s) for s in scales]}")
        for a, s in zip(axes, scales):
            full_scales[a] = float(s)
            out[a] = int(float(s) * shape[a])  # floor; the roi does not enter, as in onnxruntime
        return out, full_scales
    if any(int(n) < 0 for n in sizes):
        raise cx.fail(f"sizes must not be negative, got {[int(n) for n in sizes]}")
    for a, n in zip(axes, sizes):
        out[a], full_scales[a] = int(n), int(n) / shape[a]
    if policy != "stretch":
        if policy not in ("not_larger", "not_smaller"):
            raise cx.fail(f"unknown keep_aspect_ratio_policy '{policy}'")
        ratios = [full_scales[a] for a in axes]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        for a in axes:
            full_scales[a] = scale
            out[a] = int(scale * shape[a] + 0.5)  # round half up
    return out, full_scales


def _rois(cx, roi, axes, rank: int):
    """Per-axis (start, end) of the region of interest; identity on axes not resized."""
    values = np.asarray(cx.static(roi, "roi"), np.float64).reshape(-1) if roi is not None else ()
    if len(values) != 2 * len(axes):
        raise cx.fail(f"roi must have {2 * len(axes)} values for tf_crop_and_resize, got {len(values)}")
    out = [(0.0, 1.0)] * rank
    for i, a in enumerate(axes):
        out[a] = (float(values[i]), float(values[i + len(axes)]))
    return out


def _present(value):
    """An optional scales/sizes input: None when absent or empty (v11 passes empty tensors)."""
    return None if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)


@rule("Resize", since=11, static=("scales", "sizes"))
def resize(cx, X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """Y[y] = sum_k w_k(x_original(y)) X[tap_k] per axis (v11 coordinate modes, cubic, roi; v13
    optional inputs; v18 axes, antialias, keep_aspect_ratio_policy; v19 half_pixel_symmetric)."""
    _check_modes(cx, mode, coordinate_transformation_mode, nearest_mode)
    if antialias and mode == "nearest":
        raise cx.fail("antialias applies to linear and cubic modes only")
    axes = _axes(cx, axes, X.ndim)
    scales, sizes = _present(scales), _present(sizes)
    if scales is not None and sizes is not None:
        raise cx.fail("only one of scales and sizes may be given")
    out_sizes, full_scales = _geometry(cx, X.shape, axes, scales, sizes, keep_aspect_ratio_policy)
    rois = None
    if coordinate_transformation_mode == "tf_crop_and_resize":
        rois = _rois(cx, roi, axes, X.ndim)
    how = _Sampling(mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
                    bool(exclude_outside), bool(antialias), sizes is not None)
    check_size(cx, out_sizes, X.dtype)
    return _resample(X, how, out_sizes, full_scales, rois, extrapolation_value)


def _upsample(cx, x, scales, mode: str):
    """Resize-10 and Upsample: asymmetric coordinates, output size floor(in * scale)."""
    if mode not in ("nearest", "linear"):
        raise cx.fail(f"mode must be 'nearest' or 'linear', got '{mode}'")
    scales = [float(s) for s in np.asarray(scales).reshape(-1)]
    if len(scales) != x.ndim:
        raise cx.fail(f"scales must have {x.ndim} values (one per axis), got {len(scales)}")
    if not all(s > 0 and math.isfinite(s) for s in scales):
        raise cx.fail(f"scales must be positive and finite, got {scales}")
    out = [int(s * n) for s, n in zip(scales, x.shape)]
    check_size(cx, out, x.dtype)
    return _resample(x, _Sampling(mode, "asymmetric", "simple"), out, scales, None)


@rule("Resize", since=10, static=("scales",))
def resize_v10(cx, X, scales, *, mode="nearest"):
    """Y = X resampled by scales with asymmetric coordinates (v10: Upsample's semantics)."""
    return _upsample(cx, X, scales, mode)


@rule("Upsample", since=9, static=("scales",))
def upsample(cx, X, scales, *, mode="nearest"):
    """Y = X resampled by the scales input, asymmetric coordinates (v9-v10, deprecated in v10)."""
    return _upsample(cx, X, scales, mode)


@rule("Upsample", since=7)
def upsample_v7(cx, X, *, mode="nearest", scales=None):
    """Y = X resampled by the scales attribute, asymmetric coordinates (v7-v8)."""
    if scales is None:
        raise cx.fail("the scales attribute is required")
    return _upsample(cx, X, scales, mode)
