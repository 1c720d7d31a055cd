"""Indexing rules (Gather*, Scatter*, TensorScatter, OneHot, NonZero, Compress, Unique, ReverseSequence)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from oxla.errors import LoweringError, ShapeError
from tests.lowering.util import check_node, run_oxla

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4, 2)).astype(np.float32)
I64 = np.int64


def _i(*rows: object) -> np.ndarray:
    return np.array(rows, I64)


# --- Gather family --------------------------------------------------------------------------

@pytest.mark.parametrize("indices,axis", [
    (_i(0, 2, -1), 0),
    (_i([0, -1], [1, 2]), 1),
    (np.array(1, I64), -1),
    (np.array([[-3]], np.int32), 0),
], ids=["negative", "2d-indices-axis1", "scalar-negative-axis", "int32"])
def test_gather(indices: np.ndarray, axis: int) -> None:
    check_node("Gather", {"x": X, "i": indices}, axis=axis)


def test_gather_v1_int_data() -> None:
    check_node("Gather", {"x": np.arange(12, dtype=np.int32).reshape(3, 4), "i": _i(2, 0)}, opset=9)


def test_gather_constant_index_out_of_range() -> None:
    # indices known at compile time are checked; the Constant makes them static
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, X.shape)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["i"], value=numpy_helper.from_array(_i(1, 3))),
         helper.make_node("Gather", ["x", "i"], ["y"])],
        "g", [x], [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(LoweringError, match=r"indices \[3\] out of range for size 3"):
        run_oxla(model, {"x": X})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis: int) -> None:
    size = X.shape[axis]
    shape = list(X.shape)
    shape[axis] = 5
    idx = RNG.integers(-size, size, shape).astype(I64)
    # the reference compares a negative axis with non-negative dims and refuses the shapes
    check_node("GatherElements", {"x": X, "i": idx}, axis=axis, reference=axis >= 0)


def test_gather_elements_smaller_indices() -> None:
    # the spec lets indices be smaller than data on the other axes; the reference refuses it
    idx = _i([[0, -1]], [[2, 1]])
    check_node("GatherElements", {"x": X, "i": idx}, axis=0, reference=False)


@pytest.mark.parametrize("indices,batch_dims", [
    (_i([0, 1], [2, -1]), 0),
    (_i([[1]], [[0]]), 0),
    (_i([0, 1, 1], [2, 3, 0]), 0),
    (_i([[1], [0]], [[2], [3]], [[0], [-1]]), 1),
    (_i([1, 0], [3, 1], [0, 1]), 1),
], ids=["slices", "rows", "elements", "batch1-slices", "batch1-elements"])
def test_gather_nd(indices: np.ndarray, batch_dims: int) -> None:
    check_node("GatherND", {"x": X, "i": indices}, batch_dims=batch_dims)


def test_gather_nd_batch_dims_mismatch() -> None:
    with pytest.raises(ShapeError, match="must be equal"):
        check_node("GatherND", {"x": X, "i": _i([0], [1])}, batch_dims=1, reference=False, ort=False)


# --- Scatter family -------------------------------------------------------------------------

DATA = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
UPD = np.array([[10, 20, 30], [40, 50, 60]], np.float32)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements(reduction: str, axis: int) -> None:
    idx = _i([0, 2, -1], [1, 0, 2]) if axis == 0 else _i([3, 0, -1], [1, 2, 0])
    check_node("ScatterElements", {"x": DATA, "i": idx, "u": UPD}, axis=axis, reduction=reduction)


def test_scatter_elements_duplicates_accumulate() -> None:
    got = check_node("ScatterElements", {"x": DATA, "i": _i([1, 1]), "u": np.float32([[5, 7]])},
                     axis=1, reduction="add")
    assert got[0][0, 1] == 2 + 5 + 7


def test_scatter_v9() -> None:
    # the reference has no kernel for the deprecated Scatter; onnxruntime still has one
    check_node("Scatter", {"x": DATA, "i": _i([1, 0, 2]), "u": UPD[:1]}, opset=10, axis=0,
               reference=False)


def test_scatter_bad_reduction() -> None:
    with pytest.raises(LoweringError, match="reduction must be one of"):
        check_node("ScatterElements", {"x": DATA, "i": _i([0]), "u": UPD[:1, :1]},
                   reduction="avg", reference=False, ort=False)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_slices(reduction: str) -> None:
    updates = RNG.standard_normal((2, 4, 2)).astype(np.float32)
    check_node("ScatterND", {"x": X, "i": _i([0], [-1]), "u": updates}, reduction=reduction)


def test_scatter_nd_elements_int() -> None:
    data = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    check_node("ScatterND", {"x": data, "i": _i([[0, 1, 2], [1, -1, 0]]),
                             "u": np.array([[100, 200]], np.int32)})


@pytest.mark.parametrize("mode,writes", [("linear", None), ("linear", _i(1, 0)), ("circular", _i(3, 2))])
def test_tensor_scatter(mode: str, writes: np.ndarray | None) -> None:
    cache = np.zeros((2, 3, 4, 2), np.float32)
    update = RNG.standard_normal((2, 3, 2, 2)).astype(np.float32)
    # onnxruntime has no TensorScatter kernel yet
    check_node("TensorScatter", {"past": cache, "update": update, "w": writes}, mode=mode, ort=False)


def test_tensor_scatter_circular_wraps() -> None:
    cache = np.zeros((1, 4), np.float32)
    got = check_node("TensorScatter", {"past": cache, "update": np.float32([[1, 2, 3]]), "w": _i(2)},
                     mode="circular", axis=1, ort=False)
    assert got[0].tolist() == [[3, 0, 1, 2]]


# --- OneHot, NonZero, Compress, Unique ------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_one_hot(axis: int) -> None:
    indices = _i([0, -1, 2], [5, -7, 1])  # 5 and -7 are out of range: all off
    values = np.array([-2, 3], I64)
    # opset 11: onnxruntime has no OneHot-28 kernel; the semantics are the same
    check_node("OneHot", {"i": indices, "d": np.array(4, I64), "v": values}, opset=11, axis=axis)


def test_one_hot_float_indices_and_depth() -> None:
    check_node("OneHot", {"i": np.float32([1.0, 2.0, 0.0]), "d": np.array(3.0, np.float32),
                          "v": np.float32([0.0, 1.0])}, opset=11)


@pytest.mark.parametrize("x", [np.array([[1, 0, 3], [0, 0, 2]], np.int32),
                               np.array([[True, False]]), np.zeros((2, 2), np.float32)],
                         ids=["int", "bool", "none-set"])
def test_non_zero(x: np.ndarray) -> None:
    check_node("NonZero", {"x": x})


@pytest.mark.parametrize("cond,axis", [
    ([True, False, True], 0),
    ([False, True], 1),
    ([False, True, False, True], -1),
    ([True, False, False, True, True], None),
], ids=["axis0", "short-condition", "negative-axis", "flat"])
def test_compress(cond: list, axis: int | None) -> None:
    attrs = {} if axis is None else {"axis": axis}
    check_node("Compress", {"x": X[:, :, 0], "c": np.array(cond)}, **attrs)


def test_compress_condition_too_long() -> None:
    with pytest.raises(LoweringError, match="beyond size 3"):
        check_node("Compress", {"x": X[:, :, 0], "c": np.array([1, 0, 0, 1], bool)}, axis=0,
                   reference=False, ort=False)


UNIQUE_OUT = ("y", "indices", "inverse", "counts")


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_flat(sorted_: int) -> None:
    x = np.array([[2, 1, 1], [3, 4, 3]], np.int64)
    # unsorted, the reference takes from the unflattened input (an IndexError here)
    check_node("Unique", {"x": x}, UNIQUE_OUT, sorted=sorted_, reference=bool(sorted_))


def test_unique_first_occurrence_order() -> None:
    got = check_node("Unique", {"x": np.float32([2, 1, 1, 3, 4, 3])}, UNIQUE_OUT, sorted=0)
    assert [g.tolist() for g in got] == [[2, 1, 3, 4], [0, 1, 3, 4], [0, 1, 1, 2, 3, 2], [1, 2, 2, 1]]


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_unique_axis(axis: int) -> None:
    x = np.array([[[1, 1], [0, 1], [2, 1], [0, 1]], [[1, 1], [0, 1], [2, 1], [0, 1]]], np.float32)
    check_node("Unique", {"x": x}, UNIQUE_OUT, axis=axis)


def test_unique_axis1_unsorted_takes_along_axis() -> None:
    # the reference takes slices along axis 0 here; the spec (and onnxruntime) along axis
    x = np.array([[3, 1, 3, 2], [0, 5, 0, 6]], np.int64)
    got = check_node("Unique", {"x": x}, UNIQUE_OUT, axis=1, sorted=0, reference=False)
    assert got[0].tolist() == [[3, 1, 2], [0, 5, 6]]


# --- ReverseSequence ------------------------------------------------------------------------

@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis: int, time_axis: int) -> None:
    lens = _i(*[1 + i % X.shape[time_axis] for i in range(X.shape[batch_axis])])
    check_node("ReverseSequence", {"x": X, "lens": lens}, batch_axis=batch_axis, time_axis=time_axis)


def test_reverse_sequence_axes_must_be_0_and_1() -> None:
    with pytest.raises(LoweringError, match="must be 0 and 1 in some order, got 2 and 0"):
        check_node("ReverseSequence", {"x": X, "lens": _i(1, 2)}, batch_axis=2, reference=False,
                   ort=False)


def test_one_hot_depth_must_be_positive() -> None:
    with pytest.raises(LoweringError, match="depth must be positive, got 0"):
        check_node("OneHot", {"i": _i(0), "d": np.array(0, I64), "v": _i(0, 1)}, reference=False, ort=False)


def test_non_zero_breaks_the_graph_between_traced_nodes() -> None:
    # Abs runs compiled, NonZero on the host (its shape depends on data), ReduceSum compiled again
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("NonZero", ["a"], ["nz"]),
         helper.make_node("ReduceSum", ["nz"], ["y"], keepdims=0)],
        "g", [x], [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    data = np.array([[0, -1, 2], [3, 0, 0]], np.float32)
    (got,) = run_oxla(model, {"x": data})
    assert got.tolist() == int(np.stack(np.nonzero(data)).sum())


# --- out-of-range indices at run time: an error naming the node, as in onnxruntime -------------

U = RNG.standard_normal((3, 4, 2)).astype(np.float32)
OUT_OF_RANGE = [
    ("Gather", {"x": X, "i": _i(0, 3)}, {}, "Gather node 'n'.*size 3 .*got 3"),
    ("Gather", {"x": X, "i": _i([0, -5])}, {"axis": 1}, "size 4 .*got -5"),
    ("GatherElements", {"x": X, "i": np.full((3, 4, 2), 7, I64)}, {"axis": 1}, "GatherElements.*got 7"),
    ("GatherND", {"x": X, "i": _i([0, 4])}, {}, "GatherND.*size 4 .*got 4"),
    ("ScatterElements", {"x": X, "i": np.full((3, 4, 2), -9, I64), "u": U}, {"axis": 2},
     "ScatterElements.*size 2 .*got -9"),
    ("ScatterND", {"x": X, "i": _i([5]), "u": X[:1]}, {}, "ScatterND.*size 3 .*got 5"),
]


@pytest.mark.parametrize("op,feeds,attrs,message", OUT_OF_RANGE,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(OUT_OF_RANGE)])
def test_runtime_indices_out_of_range_are_an_error(op: str, feeds: dict, attrs: dict, message: str) -> None:
    import onnxruntime as ort

    import oxla
    from tests.lowering.util import node_model

    model = node_model(op, feeds, **attrs)
    model.graph.node[0].name = "n"
    with pytest.raises(Exception, match="out of|invalid ind|Out of range"):  # so does onnxruntime
        ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    sess = oxla.InferenceSession(model.SerializeToString())
    with pytest.raises(oxla.InputError, match=message):
        sess.run(None, feeds)
    good = {k: (np.zeros_like(v) if k == "i" else v) for k, v in feeds.items()}
    sess.run(None, good)  # the same compiled code runs in-range indices
    with pytest.raises(oxla.InputError, match=message):  # and the fast path checks too
        sess.run(None, feeds)
