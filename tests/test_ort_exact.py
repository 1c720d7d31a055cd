"""tests/ort_exact.py: the uint8 form of a model is the same model to onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tests.ort_exact import reference, uint8_weights


def _qlinear_conv(w: np.ndarray) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
             numpy_helper.from_array(np.array(128, np.uint8), "xz"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.2, np.float32), "ys"),
             numpy_helper.from_array(np.array(7, np.uint8), "yz")]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], pads=[1] * 4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_uint8_form_agrees_where_onnxruntime_cannot_saturate() -> None:
    """Weights in [-64, 63]: no pair of products leaves int16, so onnxruntime is exact on the
    model as given as well; the uint8 form gives the same bytes."""
    rng = np.random.default_rng(3)
    model = _qlinear_conv(rng.integers(-64, 64, (8, 16, 3, 3)).astype(np.int8))
    x = rng.integers(0, 256, (1, 16, 8, 8)).astype(np.uint8)
    shifted = reference(model, force=True)
    node = shifted.graph.node[0]
    types = {t.name: t.data_type for t in shifted.graph.initializer}
    assert types[node.input[3]] == types[node.input[5]] == TensorProto.UINT8
    np.testing.assert_array_equal(_run(shifted, x), _run(model, x))


def test_int8_activations_and_uint8_weights_stay() -> None:
    """Only uint8 x int8 products saturate; other forms are left as they are."""
    model = _qlinear_conv(np.ones((8, 16, 3, 3), np.int8))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT8
    assert uint8_weights(model) == 0
