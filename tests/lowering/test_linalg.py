"""Linear-algebra rules (MatMul, Gemm, Einsum, Det, MatMulInteger) against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from oxla.errors import ShapeError
from tests.lowering.util import check_node

RNG = np.random.default_rng(0)


def _f(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("a,b", [
    ((3,), (3,)), ((3,), (2, 3, 4)), ((2, 3), (3, 4)), ((2, 3, 4), (4,)),
    ((2, 1, 3, 4), (5, 4, 2)), ((2, 3, 4), (2, 4, 5)),
], ids=["1d-1d", "1d-3d", "2d", "3d-1d", "broadcast-batch", "batched"])
def test_matmul_shapes(a: tuple, b: tuple) -> None:
    check_node("MatMul", {"a": _f(*a), "b": _f(*b)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_matmul_dtypes(dtype: type) -> None:
    a = RNG.integers(-4, 5, (3, 4)).astype(dtype)
    b = RNG.integers(-4, 5, (4, 2)).astype(dtype)
    got = check_node("MatMul", {"a": a, "b": b})
    assert got[0].dtype == dtype


def test_matmul_float32_precision() -> None:
    # large inner dimension: a reduced-precision product would miss the 1e-5 tolerance
    check_node("MatMul", {"a": _f(8, 512), "b": _f(512, 8)}, rtol=1e-5, atol=1e-4)


def test_matmul_scalar_refused() -> None:
    with pytest.raises(ShapeError, match="rank >= 1"):
        check_node("MatMul", {"a": np.float32(2).reshape(()), "b": _f(3)}, reference=False, ort=False)


A, B = _f(3, 4), _f(4, 5)

GEMM_CASES = [
    ("no-bias", {"a": A, "b": B, "c": None}, {}),
    ("matrix-bias", {"a": A, "b": B, "c": _f(3, 5)}, {}),
    ("row-bias", {"a": A, "b": B, "c": _f(5)}, {}),
    ("column-bias", {"a": A, "b": B, "c": _f(3, 1)}, {}),
    ("scalar-bias", {"a": A, "b": B, "c": _f(1)}, {}),
    ("transA-transB", {"a": A.T.copy(), "b": B.T.copy(), "c": _f(5)}, {"transA": 1, "transB": 1}),
    ("alpha-beta", {"a": A, "b": B, "c": _f(3, 5)}, {"alpha": 0.5, "beta": -2.0}),
    ("zero-alpha-beta", {"a": A, "b": B, "c": _f(3, 5)}, {"alpha": 0.0, "beta": 0.0}),
]


@pytest.mark.parametrize("case", GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_gemm(case: tuple) -> None:
    _, inputs, attrs = case
    check_node("Gemm", inputs, rtol=1e-5, atol=1e-5, **attrs)


@pytest.mark.parametrize("opset", [9, 7])
def test_gemm_v7_broadcast_bias(opset: int) -> None:
    check_node("Gemm", {"a": A, "b": B, "c": _f(5)}, opset=opset, beta=0.5, rtol=1e-5, atol=1e-5)


def test_gemm_v6_broadcast_attribute() -> None:
    # onnxruntime has no Gemm kernel before opset 7
    check_node("Gemm", {"a": A, "b": B, "c": _f(5)}, opset=6, broadcast=1, ort=False, rtol=1e-5, atol=1e-5)


def test_gemm_v6_needs_broadcast_for_vector_bias() -> None:
    with pytest.raises(ShapeError, match="set broadcast=1"):
        check_node("Gemm", {"a": A, "b": B, "c": _f(5)}, opset=6, reference=False, ort=False)


def test_gemm_int32() -> None:
    a = RNG.integers(-4, 5, (2, 3)).astype(np.int32)
    b = RNG.integers(-4, 5, (3, 2)).astype(np.int32)
    got = check_node("Gemm", {"a": a, "b": b, "c": np.array([1, 2], np.int32)}, ort=False)
    assert got[0].dtype == np.int32


def test_gemm_rank_error() -> None:
    with pytest.raises(ShapeError, match="input A must have rank 2"):
        check_node("Gemm", {"a": _f(2, 3, 4), "b": B}, reference=False, ort=False)


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij, bjk -> bik", [(2, 2, 3), (2, 3, 4)]),
    ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("i,i", [(5,), (5,)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("ba,ac", [(3, 2), (2, 4)]),
    ("Ab,bC->AC", [(2, 3), (3, 2)]),
], ids=["matmul", "batch-spaces", "transpose", "sum", "inner-implicit", "ellipsis-diagonal",
        "implicit-sorted-output", "uppercase"])
def test_einsum(equation: str, shapes: list) -> None:
    inputs = {f"x{i}": _f(*s, dtype=np.float64) for i, s in enumerate(shapes)}
    check_node("Einsum", inputs, equation=equation)


def test_einsum_int32() -> None:
    a = RNG.integers(-3, 4, (2, 3)).astype(np.int32)
    got = check_node("Einsum", {"a": a, "b": a}, equation="ij,ij->i")
    assert got[0].dtype == np.int32


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1)])
def test_det(shape: tuple) -> None:
    check_node("Det", {"x": _f(*shape)}, rtol=1e-4, atol=1e-5)


def test_det_not_square() -> None:
    with pytest.raises(ShapeError, match=r"X must be \[\*, M, M\]"):
        check_node("Det", {"x": _f(2, 3)}, reference=False, ort=False)


U8A = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
U8B = RNG.integers(0, 255, (4, 2)).astype(np.uint8)
I8B = RNG.integers(-128, 127, (4, 2)).astype(np.int8)

MMI_CASES = [
    ("no-zero-points", {"a": U8A, "b": U8B}),
    ("scalar-zero-points", {"a": U8A, "b": U8B, "az": np.array(12, np.uint8), "bz": np.array(200, np.uint8)}),
    ("per-column-b", {"a": U8A, "b": I8B, "az": None, "bz": np.array([-3, 5], np.int8)}),
    ("batched", {"a": RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8), "b": U8B,
                 "az": np.array(7, np.uint8)}),
]


@pytest.mark.parametrize("case", MMI_CASES, ids=[c[0] for c in MMI_CASES])
def test_matmul_integer(case: tuple) -> None:
    got = check_node("MatMulInteger", case[1])
    assert got[0].dtype == np.int32


@pytest.mark.parametrize("a,az,bz", [
    (U8A, np.array([1, 2, 3], np.uint8), np.array([4, 5], np.uint8)),
    (U8A[None].repeat(2, 0), np.arange(6, dtype=np.uint8).reshape(2, 3, 1), np.array(9, np.uint8)),
], ids=["2d-vectors", "nd-per-row"])
def test_matmul_integer_per_row_zero_points(a: np.ndarray, az: np.ndarray, bz: np.ndarray) -> None:
    # neither oracle takes per-row zero points of A (onnxruntime refuses, the reference misaligns them)
    got = check_node("MatMulInteger", {"a": a, "b": U8B, "az": az, "bz": bz}, reference=False, ort=False)
    rows = az.astype(np.int32).reshape(az.shape + (1,) * (az.ndim == 1))
    want = (a.astype(np.int32) - rows) @ (U8B.astype(np.int32) - bz.astype(np.int32))
    np.testing.assert_array_equal(got[0], want)
