"""Reduction rules (Reduce*, ArgMax/ArgMin, CumSum/CumProd, TopK) against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from oxla.errors import LoweringError
from tests.lowering.util import check_node

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
POS = (np.abs(X) + 0.1).astype(np.float32)
I32 = RNG.integers(-5, 6, (3, 4)).astype(np.int32)
EMPTY = np.zeros((2, 0, 3), np.float32)

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


def _axes(*a: int) -> np.ndarray:
    return np.array(a, np.int64)


# (id, inputs, attributes)
AXES_CASES = [
    ("axis1", {"x": POS, "axes": _axes(1)}, {}),
    ("negative-axes-no-keepdims", {"x": POS, "axes": _axes(-1, 0)}, {"keepdims": 0}),
]
EMPTY_AXES_CASES = [
    ("absent-axes-reduce-all", {"x": POS}, {}),
    ("empty-axes-reduce-all", {"x": POS, "axes": np.zeros(0, np.int64)}, {"keepdims": 0}),
    ("empty-axes-noop", {"x": POS, "axes": np.zeros(0, np.int64)}, {"noop_with_empty_axes": 1}),
    ("absent-axes-noop", {"x": POS, "axes": None}, {"noop_with_empty_axes": 1}),
]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("case", AXES_CASES, ids=[c[0] for c in AXES_CASES])
def test_reduce_axes_input(op: str, case: tuple) -> None:
    _, inputs, attrs = case
    check_node(op, inputs, rtol=1e-4, **attrs)


# noop_with_empty_axes still applies the elementwise part (square, exp...), as the function bodies do
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceSumSquare", "ReduceLogSumExp"])
@pytest.mark.parametrize("case", EMPTY_AXES_CASES, ids=[c[0] for c in EMPTY_AXES_CASES])
def test_reduce_empty_axes(op: str, case: tuple) -> None:
    _, inputs, attrs = case
    check_node(op, inputs, rtol=1e-4, **attrs)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axes_attribute_v11(op: str) -> None:
    check_node(op, {"x": POS}, opset=11, axes=[-2], keepdims=0, rtol=1e-4)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceL1", "ReduceLogSum"])
def test_reduce_default_axes_v9(op: str) -> None:
    check_node(op, {"x": POS}, opset=9, rtol=1e-4)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"])
def test_reduce_int32_keeps_dtype(op: str) -> None:
    got = check_node(op, {"x": I32, "axes": _axes(0)})
    assert got[0].dtype == np.int32


@pytest.mark.parametrize("op,identity", [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf),
                                         ("ReduceMin", np.inf), ("ReduceL2", 0.0),
                                         ("ReduceLogSum", -np.inf), ("ReduceLogSumExp", -np.inf)])
def test_reduce_empty_set_gives_identity(op: str, identity: float) -> None:
    # onnxruntime's empty reductions differ across ops; the spec and the reference agree
    got = check_node(op, {"x": EMPTY, "axes": _axes(1)}, ort=False)
    assert got[0].shape == (2, 1, 3)
    assert np.all(got[0] == identity)


def test_reduce_max_empty_int_is_type_minimum() -> None:
    got = check_node("ReduceMax", {"x": np.zeros((0, 2), np.int32), "axes": _axes(0)},
                     keepdims=0, ort=False, reference=False)
    assert got[0].tolist() == [np.iinfo(np.int32).min] * 2


def test_reduce_max_bool() -> None:
    b = np.array([[True, False], [False, False]])
    got = check_node("ReduceMax", {"x": b, "axes": _axes(1)}, keepdims=0, ort=False)
    assert got[0].tolist() == [True, False]


def test_reduce_axis_out_of_range() -> None:
    with pytest.raises(LoweringError, match="axis 3 is out of range for rank 3"):
        check_node("ReduceSum", {"x": X, "axes": _axes(3)}, reference=False, ort=False)


# --- ArgMax / ArgMin ------------------------------------------------------------------------

TIES = np.array([[2, 5, 5, 1], [7, 7, 0, 0], [3, 3, 3, 3]], np.float32)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1}, {"axis": -1, "keepdims": 0},
                                   {"axis": 1, "select_last_index": 1},
                                   {"axis": 0, "keepdims": 0, "select_last_index": 1}],
                         ids=["default", "axis1", "neg-axis-no-keepdims", "last-index", "axis0-last"])
def test_arg(op: str, attrs: dict) -> None:
    got = check_node(op, {"x": TIES}, **attrs)
    assert got[0].dtype == np.int64


def test_argmax_ties_first_and_last() -> None:
    first = check_node("ArgMax", {"x": TIES}, axis=1, keepdims=0)[0]
    last = check_node("ArgMax", {"x": TIES}, axis=1, keepdims=0, select_last_index=1)[0]
    assert first.tolist() == [1, 0, 0] and last.tolist() == [2, 1, 3]


def test_argmin_int_v11() -> None:
    check_node("ArgMin", {"x": I32}, opset=11, axis=-2)


# --- CumSum / CumProd -----------------------------------------------------------------------

@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumulative(op: str, exclusive: int, reverse: int, axis: int) -> None:
    check_node(op, {"x": POS[0], "axis": np.array(axis, np.int64)}, exclusive=exclusive,
               reverse=reverse, rtol=1e-5)


def test_cumsum_int32_axis_int32() -> None:
    got = check_node("CumSum", {"x": I32, "axis": np.array(1, np.int32)}, exclusive=1)
    assert got[0].dtype == np.int32
    assert got[0][:, 0].tolist() == [0, 0, 0]


# --- TopK -----------------------------------------------------------------------------------

DUPES = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 5, 5, 4, 0]], np.float32)


@pytest.mark.parametrize("attrs", [{}, {"largest": 0}, {"axis": 0}, {"axis": -1, "largest": 0}],
                         ids=["largest", "smallest", "axis0", "neg-axis-smallest"])
def test_top_k_ties_lower_index_first(attrs: dict) -> None:
    k = 2 if attrs.get("axis", -1) == 0 else 4
    check_node("TopK", {"x": DUPES, "k": np.array([k], np.int64)}, ("values", "indices"), **attrs)


def test_top_k_ties_indices() -> None:
    _, idx = check_node("TopK", {"x": DUPES, "k": np.array([3], np.int64)}, ("values", "indices"))
    assert idx.tolist() == [[0, 2, 5], [2, 3, 4]]


@pytest.mark.parametrize("dtype", [np.int32, np.uint64, np.float64])
def test_top_k_dtypes(dtype: type) -> None:
    x = (DUPES * 2).astype(dtype)
    # onnxruntime has no uint64 TopK kernel
    check_node("TopK", {"x": x, "k": np.array([3], np.int64)}, ("values", "indices"), largest=0,
               ort=dtype != np.uint64)


def test_top_k_v1_attribute() -> None:
    check_node("TopK", {"x": DUPES}, ("values", "indices"), opset=9, k=2)


def test_top_k_k_too_large() -> None:
    with pytest.raises(LoweringError, match=r"K must lie in \[0, 6\]"):
        check_node("TopK", {"x": DUPES, "k": np.array([7], np.int64)}, ("values", "indices"),
                   reference=False, ort=False)
