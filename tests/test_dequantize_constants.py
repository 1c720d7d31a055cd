"""DequantizeConstantsPass: DequantizeLinear of initializers folded at load, bit for bit the rule's."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla.lowering.context import Options
from oxla.passes.dequantize_constants import dequantize, dequantize_constants
from oxla.passes.weight_layout import SUFFIX

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = np.float32
I4, U4 = np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _ints(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == E4M3:
        return rng.standard_normal(shape).astype(F32).astype(dtype)
    info = ml_dtypes.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max), shape, endpoint=True).astype(dtype)


def _scales(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    # odd scales, some tiny: products that round in float32 (and below fp16's normal range)
    return (rng.uniform(0.5, 2.0, shape) * 10.0 ** rng.integers(-9, 2, shape)).astype(dtype)


# id -> (x dtype, scale dtype, x shape, param shape, axis, block_size, output_dtype, zero point)
CASES = {
    "int8-per-tensor": (np.int8, F32, (4, 3, 2), (), 1, 0, 0, True),
    "uint8-per-axis0": (np.uint8, F32, (4, 3, 2), (4,), 0, 0, 0, True),
    "int8-no-zero-point": (np.int8, F32, (4, 3), (3,), 1, 0, 0, False),
    "int16-negative-axis": (np.int16, F32, (2, 5), (5,), -1, 0, 0, True),
    "uint16-fp16-scale": (np.uint16, np.float16, (3, 4), (4,), 1, 0, 0, True),
    "int32-wraps": (np.int32, F32, (6,), (), 1, 0, 0, True),
    "int4-blocked": (I4, F32, (4, 6), (4, 2), 1, 3, 0, True),
    "uint4-blocked-ragged": (U4, F32, (5, 4), (2, 4), 0, 3, 0, True),
    "int8-bf16-scale": (np.int8, BF16, (3, 4), (3,), 0, 0, 0, True),
    "uint8-output-fp16": (np.uint8, F32, (3, 4), (4,), 1, 0, TensorProto.FLOAT16, True),
    "float8-per-tensor": (E4M3, F32, (3, 4), (), 1, 0, 0, False),
}


def _dq_model(xd: np.dtype, sd: np.dtype, shape: tuple[int, ...], pshape: tuple[int, ...], axis: int,
              block: int, out: int, zp: bool) -> onnx.ModelProto:
    """One DequantizeLinear whose inputs are fed: the rule runs traced, inside jit."""
    def info(name: str, dtype: np.dtype, s: tuple[int, ...]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), s)

    names = ["x", "s", "z"] if zp else ["x", "s"]
    inputs = [info("x", xd, shape), info("s", sd, pshape)] + ([info("z", xd, pshape)] if zp else [])
    attrs = {"axis": axis, "block_size": block} | ({"output_dtype": out} if out else {})
    node = helper.make_node("DequantizeLinear", names, ["y"], **attrs)
    y = out or helper.np_dtype_to_tensor_dtype(np.dtype(sd))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", y, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_fold_equals_the_rule_bit_for_bit(case: str) -> None:
    xd, sd, shape, pshape, axis, block, out, zp = CASES[case]
    rng = np.random.default_rng(7)
    x = _ints(rng, np.dtype(xd), shape)
    if xd == np.int32:  # x - zero_point wraps in int32
        x = np.array([2**31 - 1, -2**31, 5, -5, 0, 100], np.int32)
    s = _scales(rng, np.dtype(sd), pshape)
    z = _ints(rng, np.dtype(xd), pshape) if zp else None
    feeds = {"x": x, "s": s} | ({"z": z} if zp else {})
    traced = np.asarray(oxla.compile(_dq_model(xd, sd, shape, pshape, axis, block, out, zp))(feeds)["y"])
    folded = dequantize(x, s, z, axis=axis, block_size=block, output_dtype=out)
    assert folded is not None
    assert folded.dtype == traced.dtype
    assert np.array_equal(folded, traced, equal_nan=True)


def test_fold_refuses_what_the_rule_rejects() -> None:
    x = np.zeros((3, 4), np.int8)
    assert dequantize(x, np.ones(5, F32), None, axis=1) is None  # wrong scale length
    assert dequantize(x, np.ones(2, F32), np.zeros(2, np.uint8), axis=0) is None
    assert dequantize(x, np.ones((3, 2), F32), None, axis=1, block_size=1) is None


def _qdq_conv(transpose: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = rng.integers(-127, 127, (4, 3, 3, 3) if not transpose else (3, 3, 3, 4)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "wq"),
             numpy_helper.from_array(_scales(rng, np.dtype(F32), (4,)), "ws"),
             numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
             numpy_helper.from_array(rng.integers(-999, 999, 4).astype(np.int32), "bq"),
             numpy_helper.from_array(np.float32(0.01), "bs")]
    axis = 3 if transpose else 0
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w0" if transpose else "w"], axis=axis),
             helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"]),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    if transpose:
        nodes.insert(1, helper.make_node("Transpose", ["w0"], ["w"], perm=[3, 2, 0, 1]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("transpose", [False, True], ids=["DQ-Conv", "DQ-Transpose-Conv"])
def test_folded_weights_are_laid_out_and_give_the_same_result(transpose: bool) -> None:
    model = _qdq_conv(transpose)
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(F32)
    plain = oxla.CompiledModel(model)
    laid_out = oxla.CompiledModel(model, Options(layout_weights=True, channels_last=False))
    assert set(laid_out.params) == {"w" + SUFFIX, "b"}  # int8 weights and scales are gone
    assert laid_out.params["w" + SUFFIX].dtype == np.float32
    assert [n.op_type for n in laid_out.plan.nodes] == ["Transpose", "Conv"]  # the layout's own
    assert np.array_equal(np.asarray(laid_out({"x": x})["y"]), np.asarray(plain({"x": x})["y"]))


def test_fold_keeps_fed_initializers_shared_inputs_and_the_budget() -> None:
    model = _qdq_conv()
    model.graph.input.append(helper.make_tensor_value_info("bq", TensorProto.INT32, [4]))
    model.graph.node.append(helper.make_node("Cast", ["wq"], ["wq_f"], to=TensorProto.FLOAT))
    model.graph.output.append(helper.make_tensor_value_info("wq_f", TensorProto.FLOAT, None))
    assert dequantize_constants(model) == 1  # the weight; the bias can be fed at run time
    names = {t.name for t in model.graph.initializer}
    assert {"w", "wq", "bq", "bs"} <= names and not {"ws", "wz"} & names  # wq is still read
    small = _qdq_conv()
    assert dequantize_constants(small, memory_limit=400) == 1  # 432 float bytes: the bias only


@pytest.mark.parametrize("name", ["resnet_half.qdq", "tiny_transformer.qdq", "digits_mlp.qdq16"])
def test_models_agree_with_the_unfolded_graph(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import oxla.plan

    monkeypatch.setattr(oxla.plan, "qdq_conv_to_integer", lambda model: 0)  # the fold alone
    model = onnx.load(os.path.join(HERE, "..", "models", "ort_quant", name + ".onnx"))
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value or 2 for d in t.shape.dim]
        feeds[vi.name] = (rng.integers(0, 50, shape).astype(np.int64) if t.elem_type == TensorProto.INT64
                          else rng.standard_normal(shape).astype(F32))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert dequantize_constants(copy) > 0
    session = oxla.InferenceSession(model.SerializeToString())
    got = session.run(None, feeds)
    want = oxla.compile(model)(feeds)
    for g, w in zip(got, (want[o.name] for o in model.graph.output)):
        assert np.array_equal(np.asarray(g), np.asarray(w))
