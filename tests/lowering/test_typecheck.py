"""Node input types against the op schema's type constraints (oxla/lowering/typecheck.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import oxla
from oxla.errors import InvalidModelError, NodeRef
from oxla.lowering.typecheck import check_input_types


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], out_type: int,
           out_shape: list[int], opset: int = 23) -> bytes:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", out_type, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


# Where over a float6 initializer aborted the process inside XLA (literal.cc: "Unhandled primitive
# type F6E2M3FN"); Add of int2 wrapped silently; the fuzzing test's dtype swaps make such models.
@pytest.mark.parametrize(("elem", "op"), [(TensorProto.FLOAT6E2M3, "Where"), (TensorProto.FLOAT6E3M2, "Add"),
                                          (TensorProto.INT2, "Add"), (TensorProto.FLOAT8E8M0, "Mul")])
def test_a_type_the_op_does_not_take_is_an_invalid_model(elem: int, op: str) -> None:
    values = [0, 1, 1, 0] if elem == TensorProto.INT2 else [0.5, 1.0, 1.5, 2.0]
    w = helper.make_tensor("w", elem, [4], values)
    if op == "Where":
        nodes = [helper.make_node("Greater", ["x", "x"], ["c"]), helper.make_node("Where", ["c", "w", "w"], ["y"])]
    else:
        nodes = [helper.make_node(op, ["w", "w"], ["y"])]
    sess = oxla.InferenceSession(_model(nodes, [w], elem, [4]))
    with pytest.raises(InvalidModelError, match=rf"{op} node \(ai.onnx v23\): input \d \('\w+'\) is tensor\("):
        sess.run(None, {"x": np.zeros(4, np.float32)})


def test_two_inputs_of_one_type_parameter_must_agree() -> None:
    w = helper.make_tensor("w", TensorProto.DOUBLE, [4], [1.0, 2.0, 3.0, 4.0])
    sess = oxla.InferenceSession(_model([helper.make_node("Add", ["x", "w"], ["y"])], [w], TensorProto.FLOAT, [4]))
    with pytest.raises(InvalidModelError, match=r"input 1 \('B'\) is tensor\(double\) but input 'A' is "
                                                r"tensor\(float\); both are type T"):
        sess.run(None, {"x": np.zeros(4, np.float32)})


def test_types_the_op_takes_run() -> None:
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    sess = oxla.InferenceSession(_model([helper.make_node("Add", ["x", "w"], ["y"])], [w], TensorProto.FLOAT, [4]))
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones(4, np.float32)})[0], [2, 3, 4, 5])
    # Cast takes float6 from opset 28 on, and a variadic heterogeneous input (Loop's, If's) is free
    ref = NodeRef("c", "Cast", "", 28)
    check_input_types(ref, [np.zeros(2, ml_dtypes.float6_e2m3fn)])
    with pytest.raises(InvalidModelError):
        check_input_types(NodeRef("c", "Cast", "", 23), [np.zeros(2, ml_dtypes.float6_e2m3fn)])
    check_input_types(NodeRef("l", "Loop", "", 21),
                      [np.int64(3), np.bool_(True), np.zeros(2, np.float32), np.zeros(2, np.int64)])
    # no onnx schema (com.microsoft): not checked here
    check_input_types(NodeRef("m", "FusedMatMul", "com.microsoft", 1), [np.zeros(2, ml_dtypes.int2)])
