"""Shape rules (Constant, Identity, Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Expand,
ConstantOfShape, Range, EyeLike) against onnx.reference and onnxruntime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla.errors import InvalidModelError, LoweringError
from oxla.lowering.ops.shape import STATIC_FILL_LIMIT
from tests.lowering.util import (
    assert_close,
    check_node,
    node_model,
    run_onnxruntime,
    run_oxla,
    run_reference,
)

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def check_folded(op: str, inputs: dict[str, np.ndarray | None], constants: set[str],
                 outputs: tuple[str, ...] = ("y",), *, ort: bool = True, **attrs: object) -> list:
    """check_node with the named inputs as initializers: their values fold at trace time, the
    rest is traced, and the whole node compiles into one XLA computation (no host step)."""
    model = node_model(op, inputs, outputs, **attrs)
    graph = model.graph
    inputs_left = [i for i in graph.input if i.name not in constants]
    del graph.input[:]
    graph.input.extend(inputs_left)
    graph.initializer.extend(numpy_helper.from_array(inputs[n], n) for n in constants)
    feeds = {n: v for n, v in inputs.items() if n not in constants and v is not None}
    compiled = oxla.compile(model)
    got = [np.asarray(v) for v in compiled(feeds).values()]
    assert compiled.stats.host_steps == 0, compiled.stats.host_nodes
    assert_close(got, run_reference(model, feeds))
    if ort:
        assert_close(got, run_onnxruntime(model, feeds))
    return got


@pytest.mark.parametrize("attrs", [
    {"value": numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3))},
    {"value_float": 0.0},
    {"value_floats": [1.5, -2.0]},
    {"value_int": 0},
    {"value_ints": [3, 4, 5]},
], ids=lambda a: next(iter(a)))
def test_constant(attrs: dict) -> None:
    check_node("Constant", {}, **attrs)


@pytest.mark.parametrize(("attrs", "want"), [
    ({"value_string": "hi"}, np.array("hi", object)),
    ({"value_strings": ["a", "bc"]}, np.array(["a", "bc"], object)),
    ({"sparse_value": helper.make_sparse_tensor(
        numpy_helper.from_array(np.float32([5, 6]), "v"), numpy_helper.from_array(i64(1, 4), "i"),
        [2, 3])}, np.float32([[0, 5, 0], [0, 6, 0]])),
], ids=["value_string", "value_strings", "sparse_value"])
def test_constant_strings_and_sparse(attrs: dict, want: np.ndarray) -> None:
    # onnx.reference returns numpy str_ arrays (oxla: object) and cannot output a sparse constant
    got = run_oxla(node_model("Constant", {}, **attrs), {})[0]
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_constant_needs_one_value() -> None:
    model = node_model("Constant", {}, value_int=1, value_float=2.0)
    with pytest.raises(LoweringError, match="exactly one value attribute, got value_float, value_int"):
        run_oxla(model, {})


def test_identity() -> None:
    check_node("Identity", {"x": X})
    check_node("Identity", {"x": np.array(["a", "b"], object)}, ort=False)


@pytest.mark.parametrize(("start", "end"), [(0, None), (1, None), (-1, None), (0, -1), (1, 2),
                                            (-10, 10), (2, 1)])
def test_shape_start_end(start: int, end: int | None) -> None:
    attrs = {"start": start} | ({} if end is None else {"end": end})
    got = check_node("Shape", {"x": X}, **attrs)
    assert got[0].tolist() == list(X.shape[start:end])


def test_shape_v1_and_size() -> None:
    check_node("Shape", {"x": X}, opset=13)
    check_node("Size", {"x": X})
    check_node("Size", {"x": np.zeros((0, 3), np.float32)})


@pytest.mark.parametrize(("shape", "allowzero"), [
    (i64(4, 6), 0), (i64(-1), 0), (i64(0, -1), 0), (i64(2, 0, 2, 2), 0), (i64(3, 2, 4), 1),
    (i64(1, 1, 24), 0),
], ids=["plain", "flat", "zero-copies", "zero-middle", "allowzero", "extend"])
def test_reshape(shape: np.ndarray, allowzero: int) -> None:
    check_node("Reshape", {"x": X, "shape": shape}, allowzero=allowzero)


def test_reshape_allowzero_keeps_zero_dims() -> None:
    x = np.zeros((0, 3), np.float32)
    got = check_node("Reshape", {"x": x, "shape": i64(3, 0)}, allowzero=1)
    assert got[0].shape == (3, 0)


def test_reshape_v5_and_v1() -> None:
    check_node("Reshape", {"x": X, "shape": i64(0, 12)}, opset=5)
    model = node_model("Reshape", {"x": X}, opset=1, shape=[0, -1])
    assert run_oxla(model, {"x": X})[0].shape == (2, 12)


def test_reshape_error_names_shapes() -> None:
    shape = i64(5, -1)
    model = node_model("Reshape", {"x": X, "shape": shape})
    with pytest.raises(LoweringError, match=r"cannot reshape \(2, 3, 4\) to \(5, -1\)"):
        run_oxla(model, {"x": X, "shape": shape})


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis: int) -> None:
    check_node("Flatten", {"x": X}, axis=axis)


def test_flatten_v1_default() -> None:
    check_node("Flatten", {"x": X}, opset=9)


Y = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)


@pytest.mark.parametrize("axes", [i64(0), i64(-2), i64(0, 2)], ids=["0", "-2", "0,2"])
def test_squeeze(axes: np.ndarray) -> None:
    check_node("Squeeze", {"x": Y, "axes": axes})


def test_squeeze_without_axes_drops_every_one() -> None:
    assert check_node("Squeeze", {"x": Y})[0].shape == (3, 2)


def test_squeeze_v11_attribute() -> None:
    check_node("Squeeze", {"x": Y}, opset=11, axes=[-4])
    check_node("Squeeze", {"x": Y}, opset=11)


def test_squeeze_rejects_dims_other_than_one() -> None:
    model = node_model("Squeeze", {"x": Y}, opset=11, axes=[1])
    with pytest.raises(LoweringError, match=r"cannot squeeze axes \[1\] of shape \(1, 3, 1, 2\)"):
        run_oxla(model, {"x": Y})


@pytest.mark.parametrize("axes", [i64(0), i64(-1), i64(3, 1), i64(0, 4, 2), i64(-5, 1)])
def test_unsqueeze(axes: np.ndarray) -> None:
    check_node("Unsqueeze", {"x": X, "axes": axes})


def test_unsqueeze_v11_attribute_and_scalar() -> None:
    check_node("Unsqueeze", {"x": X}, opset=11, axes=[-1, 0])
    check_node("Unsqueeze", {"x": np.array(2.0, np.float32), "axes": i64(0)})


def test_unsqueeze_rejects_duplicate_axes() -> None:
    axes = i64(1, -4)
    model = node_model("Unsqueeze", {"x": X, "axes": axes})
    with pytest.raises(LoweringError, match="name an axis twice"):
        run_oxla(model, {"x": X, "axes": axes})


@pytest.mark.parametrize("shape", [i64(2, 3, 4), i64(3, 1), i64(2, 1, 1, 4), i64(1)],
                         ids=["same", "smaller-rank", "more-dims", "one"])
def test_expand(shape: np.ndarray) -> None:
    check_node("Expand", {"x": X[:, :1, :], "shape": shape})


def test_expand_error() -> None:
    shape = i64(5, 4)
    model = node_model("Expand", {"x": X, "shape": shape})
    with pytest.raises(LoweringError, match=r"does not broadcast with input shape \(2, 3, 4\)"):
        run_oxla(model, {"x": X, "shape": shape})


@pytest.mark.parametrize("value", [None, np.array([7], np.int32), np.array([0.5], np.float16),
                                   np.array([True])], ids=["default", "int32", "float16", "bool"])
def test_constant_of_shape(value: np.ndarray | None) -> None:
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check_node("ConstantOfShape", {"shape": i64(2, 3)}, **attrs)
    check_node("ConstantOfShape", {"shape": np.zeros(0, np.int64)}, **attrs)


def test_constant_of_shape_large_is_built_by_xla() -> None:
    n = STATIC_FILL_LIMIT + 1
    node = helper.make_node("ConstantOfShape", ["s"], ["y"],
                            value=numpy_helper.from_array(np.array([3], np.int64)))
    shape = helper.make_node("Constant", [], ["s"], value_ints=[n])
    graph = helper.make_graph([shape, node], "g", [], [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    got = oxla.InferenceSession(model.SerializeToString()).run(None, {})[0]
    assert got.shape == (n,) and got.dtype == np.int64 and (got == 3).all()


RANGES = [
    ("int", np.int64, 3, 9, 3), ("int-negative", np.int32, 10, 4, -2), ("int-empty", np.int64, 5, 1, 1),
    ("float", np.float32, 1.0, 2.0, 0.3), ("double-negative", np.float64, 0.5, -1.0, -0.25),
    ("int16", np.int16, -3, 3, 2),
]


@pytest.mark.parametrize(("dtype", "start", "limit", "delta"), [r[1:] for r in RANGES],
                         ids=[r[0] for r in RANGES])
def test_range(dtype: type, start: float, limit: float, delta: float) -> None:
    check_node("Range", {"start": np.array(start, dtype), "limit": np.array(limit, dtype),
                         "delta": np.array(delta, dtype)})


def test_range_low_precision() -> None:
    # ort 1.32 has no Range for bfloat16 and no opset 27; Range takes bfloat16 from opset 27 on
    feeds = {"start": np.array(250, ml_dtypes.bfloat16), "limit": np.array(300, ml_dtypes.bfloat16),
             "delta": np.array(7, ml_dtypes.bfloat16)}
    check_node("Range", feeds, opset=27, ort=False)
    with pytest.raises(InvalidModelError, match=r"Range node \(ai.onnx v11\): input 0 \('start'\) is tensor\(bfloat16\)"):
        run_oxla(node_model("Range", feeds, opset=11), feeds)


def test_range_rejects_zero_delta() -> None:
    feeds = {"start": np.array(1, np.int64), "limit": np.array(5, np.int64),
             "delta": np.array(0, np.int64)}
    with pytest.raises(LoweringError, match="delta must not be 0"):
        run_oxla(node_model("Range", feeds), feeds)


@pytest.mark.parametrize(("shape", "k", "dtype"), [
    ((3, 3), 0, None), ((3, 5), 2, None), ((4, 2), -1, None), ((3, 3), 5, None),
    ((2, 3), 0, TensorProto.INT32), ((3, 3), 1, TensorProto.BOOL),
])
def test_eye_like(shape: tuple[int, int], k: int, dtype: int | None) -> None:
    attrs = {"k": k} | ({} if dtype is None else {"dtype": dtype})
    # ort 1.32 has no bool EyeLike
    check_node("EyeLike", {"x": np.zeros(shape, np.float32)}, ort=dtype != TensorProto.BOOL, **attrs)


def test_shape_feeds_reshape_statically() -> None:
    """Shape -> Reshape folds at trace time: no host step, one compiled segment."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1),
             helper.make_node("Reshape", ["y", "s"], ["z"])]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [12])],
        [helper.make_empty_tensor_value_info("z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    compiled = oxla.compile(model)
    out = compiled({"x": X, "y": np.arange(12, dtype=np.float32)})
    assert np.asarray(out["z"]).shape == (3, 4) and compiled.stats.host_steps == 0


FOLDED = [
    ("Reshape", {"x": X, "shape": i64(0, -1)}, {}),
    ("Squeeze", {"x": Y, "axes": i64(-2)}, {}),
    ("Unsqueeze", {"x": X, "axes": i64(3, 0)}, {}),
    ("Expand", {"x": X[:1], "shape": i64(3, 1, 1, 1)}, {}),
    ("Flatten", {"x": X}, {"axis": -1}),
]


@pytest.mark.parametrize(("op", "inputs", "attrs"), FOLDED, ids=[f[0] for f in FOLDED])
def test_traced_data_with_constant_shapes(op: str, inputs: dict, attrs: dict) -> None:
    check_folded(op, inputs, set(inputs) - {"x"}, **attrs)
