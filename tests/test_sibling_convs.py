"""SiblingConvPass: Convs over one input merged into one Conv and a Split, outputs unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla.passes.sibling_convs import SUFFIX, merge_sibling_convs

RNG = np.random.default_rng(0)


def heads_model(opset: int) -> onnx.ModelProto:
    """X -> Relu -> four 3x3 Convs (two with biases, one without, one strided) and a 1x1 pair."""
    inits, nodes = [], [helper.make_node("Relu", ["x"], ["h"])]
    specs = [("box", 12, 3, 1, True), ("cls", 24, 3, 1, True), ("obj", 3, 3, 1, False),
             ("down", 8, 3, 2, True), ("p1", 6, 1, 1, True), ("p2", 5, 1, 1, True)]
    for name, m, k, stride, bias in specs:
        inits.append(numpy_helper.from_array(RNG.standard_normal((m, 16, k, k)).astype(np.float32), f"{name}.w"))
        ins = ["h", f"{name}.w"]
        if bias:
            inits.append(numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), f"{name}.b"))
            ins.append(f"{name}.b")
        nodes.append(helper.make_node("Conv", ins, [name], name=name, kernel_shape=[k, k],
                                      pads=[k // 2] * 4, strides=[stride, stride]))
    nodes.append(helper.make_node("Sigmoid", ["cls"], ["cls_p"]))
    outs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["n", "c", "h", "w"])
            for n in ("box", "cls_p", "obj", "down", "p1", "p2")]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, 16, 10, 10])], outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [11, 17])
def test_sibling_convs_merge_and_agree_with_onnxruntime(opset: int) -> None:
    model = heads_model(opset)
    x = RNG.standard_normal((1, 16, 10, 10)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    got = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert merge_sibling_convs(model) == 2  # box, cls, obj as one; the strided and 1x1 ones stay
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 4 and convs[0].name == f"box{SUFFIX}"
    assert not {"box.w", "cls.w", "cls.b"} & {t.name for t in model.graph.initializer}
    onnx.checker.check_model(model)
    merged = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for g, w in zip(merged, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_fed_weights_are_not_merged() -> None:
    model = heads_model(17)
    model.graph.input.extend([helper.make_tensor_value_info("cls.w", onnx.TensorProto.FLOAT, [24, 16, 3, 3])])
    assert merge_sibling_convs(model) == 1  # box and obj only
