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
from oxla.lowering.ops.qmath import div32, int_conv, int_matmul


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
