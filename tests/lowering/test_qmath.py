"""qmath's exact integer products against int64 numpy, on every path they take."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from oxla.executor import x64
from oxla.lowering.ops.qmath import (
    _round_clamped,
    convert_saturate,
    div32,
    int_conv,
    int_matmul,
    requantize,
    saturate,
    stored,
)


@pytest.fixture(autouse=True)
def _x64() -> Iterator[None]:
    """int64 references need 64-bit types: oxla's own scope, never the global JAX setting."""
    with x64():
        yield
RNG = np.random.default_rng(0)


def q(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("types", list(itertools.product([np.uint8, np.int8], repeat=2)),
                         ids=lambda t: f"{t[0].__name__}-{t[1].__name__}")
def test_int_matmul(types: tuple, static: bool) -> None:
    ta, tb = types
    a, b = q(ta, (2, 5, 7)), q(tb, (7, 4))
    za, zb = q(ta, (5, 1)), q(tb, (4,))  # per row of a, per column of b
    want = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)
    if static:  # zero points known at trace time, as small initializers are
        got = jax.jit(lambda a, b: int_matmul(a, b, za, zb))(a, b)
    else:
        got = jax.jit(int_matmul)(a, b, za, zb)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(jax.jit(int_matmul)(a, b), a.astype(np.int64) @ b)
    # b given as (N, K), contracted as it is (QGemm's transB)
    bt = np.ascontiguousarray(b.T)
    if static:
        got = jax.jit(lambda a, bt: int_matmul(a, bt, za, zb, b_transposed=True))(a, bt)
    else:
        got = jax.jit(lambda a, bt, za, zb: int_matmul(a, bt, za, zb, b_transposed=True))(a, bt, za, zb)
    np.testing.assert_array_equal(got, want)


def _reference(x, w, zx, zw, strides, pads, dilations, group):
    xf = x.astype(np.float64) - (0 if zx is None else float(zx))
    wf = w.astype(np.float64)
    if zw is not None:
        wf = wf - zw.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    y = lax.conv_general_dilated(xf, wf, strides, pads, rhs_dilation=dilations, feature_group_count=group)
    return np.asarray(y).astype(np.int64)


# (x type, w type, spatial rank, size, C, M, k, stride, dilation, pad, group): the paths
CONVS = {
    "gemm-dilated-zw": (np.uint8, np.uint8, 2, 36, 32, 8, 3, 1, 2, 2, 1),
    "gemm-strided": (np.uint8, np.int8, 2, 40, 48, 8, 3, 2, 1, 1, 1),
    "gemm": (np.uint8, np.int8, 2, 9, 64, 8, 3, 1, 1, 1, 1),
    "gemm-strided-dilated-zw": (np.uint8, np.uint8, 2, 9, 32, 8, 3, 2, 2, 2, 1),
    "gemm-stem": (np.uint8, np.int8, 2, 20, 3, 8, 7, 2, 1, 3, 1),
    "gemm-pointwise": (np.int8, np.int8, 2, 9, 16, 8, 1, 1, 1, 0, 1),
    "gemm-1d": (np.int8, np.int8, 1, 9, 40, 8, 3, 2, 1, 1, 1),
    "float32-depthwise": (np.uint8, np.int8, 2, 9, 16, 16, 3, 1, 1, 1, 16),
    "float32-depthwise-5x5-strided": (np.uint8, np.int8, 2, 14, 24, 24, 5, 2, 1, 2, 24),
    "float32-depthwise-multiplier-2": (np.int8, np.int8, 2, 11, 8, 16, 3, 1, 1, 1, 8),
    "split-grouped": (np.uint8, np.uint8, 2, 9, 62, 16, 3, 1, 1, 1, 2),
    "float64-grouped": (np.uint8, np.uint8, 2, 9, 50, 4, 13, 1, 1, 6, 2),
    "gemm-3d": (np.uint8, np.uint8, 3, 6, 4, 4, 3, 1, 1, 1, 1),
}


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("case", sorted(CONVS))
def test_int_conv(case: str, static: bool) -> None:
    tx, tw, rank, size, c, m, k, s, d, p, g = CONVS[case]
    x, w = q(tx, (2, c) + (size,) * rank), q(tw, (m, c // g) + (k,) * rank)
    zx, zw = q(tx, ()), q(tw, (m,))
    geometry = ((s,) * rank, [(p, p)] * rank, (d,) * rank, g)
    want = _reference(x, w, zx, zw, *geometry)
    if static:
        got = jax.jit(lambda x, w: int_conv(x, w, zx, zw, *geometry))(x, w)
    else:
        got = jax.jit(lambda x, w, zx, zw: int_conv(x, w, zx, zw, *geometry))(x, w, zx, zw)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, want)


def test_div32_is_the_ieee_quotient() -> None:
    # XLA turns x / broadcast(s) into x * (1 / s), off by one ulp in ~40% of these
    x = RNG.uniform(0, 100, 100_000).astype(np.float32)
    np.testing.assert_array_equal(jax.jit(div32)(x, np.float32(3.7)), x / np.float32(3.7))


# --- rounding and saturation: the vectorized rounding add against numpy -------------------------

def _hard_floats(n: int) -> np.ndarray:
    """Half-integers, their float32 neighbours, values at and past the integer ranges, NaN, +-inf,
    and random values over several magnitudes."""
    halves = np.arange(-70000, 70000, dtype=np.float32) + np.float32(0.5)
    near = np.concatenate([np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, np.float32(-np.inf))])
    special = np.array([np.nan, np.inf, -np.inf, 2.0**22, -(2.0**22), 2.0**23 + 1, 2.0**31, -(2.0**31),
                        3e9, -3e9, 2.0**31 - 128, 0.0, -0.0], np.float32)
    rand = (RNG.standard_normal(n) * RNG.choice([1, 100, 1e4, 1e7], n)).astype(np.float32)
    return np.concatenate([halves, near, special, rand])


def _saturate_reference(q: np.ndarray, zp: int, dtype: type) -> np.ndarray:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    low, high = np.float32(lo - zp), np.float32(hi - zp)
    c = np.where(np.isnan(q), low, np.minimum(np.maximum(q, low), high))
    return (np.round(c).astype(np.int64) + zp).astype(dtype)


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("rounded", [True, False])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_saturate_rounds_half_to_even_and_clamps(dtype: type, rounded: bool, static: bool) -> None:
    q = _hard_floats(50_000)
    zp = np.array(np.iinfo(dtype).min // 3 + 7, dtype)
    if static:
        got = jax.jit(lambda q: saturate(q, zp, np.dtype(dtype), rounded=rounded))(q)
    else:
        got = jax.jit(lambda q, z: saturate(q, z, np.dtype(dtype), rounded=rounded))(q, zp)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, _saturate_reference(q, int(zp), dtype))


def test_requantize_rounds_the_float32_product() -> None:
    # products whose float32 rounding is a half-integer while the exact product is not: an FMA
    # of the product and the rounding add would round the exact product instead
    acc = RNG.integers(-(2**20), 2**20, 400_000).astype(np.int32)
    m = RNG.uniform(0.001, 0.01, 400_000).astype(np.float32)
    exact = acc.astype(np.float64) * m.astype(np.float64)
    p = acc.astype(np.float32) * m
    ties = (p - np.floor(p) == 0.5) & (exact != p)
    assert ties.sum() > 20
    a, mm = acc[ties], m[ties]
    # the rounding add straight on the product: in float32, XLA contracts it with the product
    # (about half of these ties came out wrong on jax 0.12); widened to float64 it cannot
    got = jax.jit(lambda a, m: _round_clamped(a.astype(jnp.float32) * m, rounded=False))(a, mm)
    np.testing.assert_array_equal(got, np.round(a.astype(np.float32) * mm).astype(np.int32))
    want = _saturate_reference(a.astype(np.float32) * mm, 3, np.uint8)
    got = jax.jit(lambda a, m: requantize(a, m, np.uint8(3), np.dtype(np.uint8)))(a, mm)
    np.testing.assert_array_equal(got, want)
    # the same values well inside the range: the rounding itself decides
    want = _saturate_reference(a.astype(np.float32) * mm, 0, np.int16)
    got = jax.jit(lambda a, m: requantize(a, m, np.int16(0), np.dtype(np.int16)))(a, mm)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("zp", [None, 5, -5])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_convert_saturate(dtype: type, zp: int | None) -> None:
    v = _hard_floats(20_000)
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    with np.errstate(invalid="ignore"):
        r = np.round(v.astype(np.float64))
        bad = np.isnan(v) | (r >= 2.0**31) | (r < -(2.0**31))
        i = np.where(bad, -(2**31), r).astype(np.int64)
    if zp is not None:
        i = (i + zp + 2**31) % 2**32 - 2**31  # int32 wrap-around, as the kernel adds
    want = np.clip(i, lo, hi).astype(dtype)
    z = None if zp is None else np.array(zp, np.int32)
    got = jax.jit(lambda v: convert_saturate(v, np.dtype(dtype), z, rounded=True))(v)
    np.testing.assert_array_equal(got, want)


def test_stored_keeps_values_and_shape() -> None:
    x = RNG.standard_normal((2, 8, 7, 7)).astype(np.float32)
    got = jax.jit(lambda x: stored(x * 2) + 1)(x)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, x * 2 + 1)
