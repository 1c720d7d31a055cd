"""Map ops (ZipMap, DictVectorizer, CastMap) against onnxruntime; maps are Python dicts."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import oxla


def _model(node, inputs, outputs):  # type: ignore[no-untyped-def]
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8)


def _both(model, feeds):  # type: ignore[no-untyped-def]
    data = model.SerializeToString()
    got = oxla.InferenceSession(data).run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


def test_zip_map_string_labels() -> None:
    node = helper.make_node("ZipMap", ["x"], ["z"], domain="ai.onnx.ml", classlabels_strings=["a", "b"])
    out = helper.make_value_info("z", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    model = _model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])], [out])
    x = np.array([[0.25, 0.75], [0.5, 0.5]], np.float32)
    (got,), (want,) = _both(model, {"x": x})
    assert got == want == [{"a": 0.25, "b": 0.75}, {"a": 0.5, "b": 0.5}]


def test_dict_vectorizer() -> None:
    node = helper.make_node("DictVectorizer", ["x"], ["y"], domain="ai.onnx.ml",
                            string_vocabulary=["a", "b", "c"])
    inp = helper.make_value_info("x", helper.make_map_type_proto(
        TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    model = _model(node, [inp], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    (got,), (want,) = _both(model, {"x": {"c": 3.0, "a": 1.0}})
    np.testing.assert_array_equal(got.reshape(-1), want.reshape(-1))
    assert got.reshape(-1).tolist() == [1.0, 0.0, 3.0]


def test_cast_map_sparse() -> None:
    node = helper.make_node("CastMap", ["x"], ["y"], domain="ai.onnx.ml", map_form="SPARSE", max_map=4)
    inp = helper.make_value_info("x", helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    model = _model(node, [inp], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    (got,), (want,) = _both(model, {"x": {3: 2.5, 1: 1.5}})
    np.testing.assert_array_equal(got, want)
    assert got.tolist() == [[0.0, 1.5, 0.0, 2.5]]
