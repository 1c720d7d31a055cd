"""QLinearConvCenteringPass: QLinearConv with constant symmetric weights, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla.lowering.context import Options
from oxla.passes.qlinear_conv import qlinear_conv_centered
from tests.ort_exact import reference


def _model(*, x_dtype: type = np.uint8, y_dtype: type = np.uint8, w_dtype: type = np.int8,
           per_channel: bool = True, bias: bool = True, pads: int = 1, strides: int = 1,
           opset: int = 21) -> onnx.ModelProto:
    """x (quantized) -> QLinearConv(constant w, scales, zero points, B) -> y (quantized)."""
    rng = np.random.default_rng(11)
    c, m = 5, 6
    lo, hi = (-127, 128) if w_dtype == np.int8 else (0, 256)
    w = rng.integers(lo, hi, (m, c, 3, 3)).astype(w_dtype)
    wz = np.zeros(m if per_channel else (), w_dtype) if w_dtype == np.int8 else np.full((), 120, w_dtype)
    ws = rng.uniform(0.001, 0.02, m if per_channel else ()).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0.043, np.float32), "xs"),
             numpy_helper.from_array(np.array(137 if x_dtype == np.uint8 else -9, x_dtype), "xz"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(wz, "wz"),
             numpy_helper.from_array(np.array(0.021, np.float32), "ys"),
             numpy_helper.from_array(np.array(3 if y_dtype == np.uint8 else -4, y_dtype), "yz")]
    inputs = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits.append(numpy_helper.from_array(rng.integers(-5000, 5000, m).astype(np.int32), "b"))
        inputs.append("b")
    node = helper.make_node("QLinearConv", inputs, ["y"], pads=[pads] * 4, strides=[strides] * 2)
    xt = helper.np_dtype_to_tensor_dtype(np.dtype(x_dtype))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", xt, [2, c, 9, 9])],
                              [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(y_dtype)), None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


FORMS = {
    "uint8-x-per-channel-bias-pads": {},
    "int8-x-int8-y": {"x_dtype": np.int8, "y_dtype": np.int8},
    "per-tensor-no-bias-no-pads-strided": {"per_channel": False, "bias": False, "pads": 0, "strides": 2},
}


def _x(model: onnx.ModelProto) -> np.ndarray:
    dtype = helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    info = np.iinfo(dtype)
    return np.random.default_rng(12).integers(info.min, int(info.max) + 1, (2, 5, 9, 9)).astype(dtype)


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_centered_qlinear_conv_is_the_rule_bit_for_bit(form: str) -> None:
    model = _model(**FORMS[form])
    x = _x(model)
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    ops = [n.op_type for n in session.plan.nodes]
    assert "QLinearConv" not in ops and "ConvInteger" in ops
    got = np.asarray(session({"x": x})["y"])
    rule = np.asarray(oxla.CompiledModel(_model(**FORMS[form]))({"x": x})["y"])  # no load passes
    np.testing.assert_array_equal(got, rule)
    want = ort.InferenceSession(reference(_model(**FORMS[form])).SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("form", [{"w_dtype": np.uint8}, {"opset": 12}], ids=["uint8-weights-zero-point", "opset-12"])
def test_other_forms_stay_qlinear_conv(form: dict) -> None:
    model = _model(**form)
    assert qlinear_conv_centered(model) == 0
    assert [n.op_type for n in model.graph.node] == ["QLinearConv"]


def test_unread_scales_and_zero_points_are_dropped() -> None:
    model = _model()
    assert qlinear_conv_centered(model) == 1
    names = {t.name for t in model.graph.initializer}
    assert {"w", "yz"} <= names and not {"xs", "xz", "ws", "wz", "ys", "b"} & names  # folded
