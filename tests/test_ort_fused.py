"""OrtFusedPass: files saved by onnxruntime's optimizer run as their standard ops would."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla import native
from oxla.lowering.context import Options
from oxla.passes.ort_fused import unfuse_ort_ops

RNG = np.random.default_rng(7)
MS = "com.microsoft"


def _net() -> onnx.ModelProto:
    """Convolutions followed by each activation onnxruntime fuses into FusedConv (one with a
    residual Add before its Relu), a SiLU (its QuickGelu), a HardSwish as torch's opset 13 writes
    it, and a Gemm with Relu (its FusedGemm)."""
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]

    def conv(name: str, x: str, cin: int, cout: int, **attrs) -> onnx.NodeProto:
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32), f"{name}_w"))
        inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32) * 0.1, f"{name}_b"))
        return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], pads=[1, 1, 1, 1], **attrs)

    inits.append(numpy_helper.from_array((RNG.standard_normal((16 * 8 * 8, 10)) * 0.05).astype(np.float32), "fc_w"))
    inits.append(numpy_helper.from_array(RNG.standard_normal(10).astype(np.float32), "fc_b"))
    nodes = [
        conv("a", "x", 3, 16), helper.make_node("Relu", ["a"], ["a_r"]),
        conv("b", "a_r", 16, 16), helper.make_node("Add", ["b", "a_r"], ["b_s"]),
        helper.make_node("Relu", ["b_s"], ["b_r"]),
        conv("c", "b_r", 16, 16), helper.make_node("Clip", ["c", "lo", "hi"], ["c_r"]),
        conv("d", "c_r", 16, 16), helper.make_node("LeakyRelu", ["d"], ["d_r"], alpha=0.1),
        conv("e", "d_r", 16, 16), helper.make_node("HardSigmoid", ["e"], ["e_r"], alpha=0.3, beta=0.4),
        conv("f", "e_r", 16, 16), helper.make_node("Sigmoid", ["f"], ["f_s"]),
        helper.make_node("Mul", ["f", "f_s"], ["f_r"]),
        conv("g", "f_r", 16, 16, strides=[2, 2]), helper.make_node("Tanh", ["g"], ["g_r"]),
        helper.make_node("Flatten", ["g_r"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["fc"]),
        helper.make_node("Relu", ["fc"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _optimized(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """What onnxruntime's optimizer saves at its extended level (its tools' offline setting)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter((n.domain, n.op_type) for n in model.graph.node)


def test_an_onnxruntime_optimized_file_runs_as_its_standard_ops(tmp_path: Path) -> None:
    """Every FusedConv, FusedGemm and QuickGelu onnxruntime wrote becomes standard ops, so the
    layout pass and the native kernels take the convolutions (before, the suite's MobileNetV2
    from such a file ran 5.0x onnxruntime's time); results agree with onnxruntime."""
    model = _net()
    fused = _optimized(model, tmp_path / "optimized.onnx")
    ops = _ops(fused)
    # the residual's Conv stays Conv (its Add between), the SiLU's is a QuickGelu's producer
    assert ops[(MS, "FusedConv")] == 5 and ops[(MS, "FusedGemm")] == 1 and ops[(MS, "QuickGelu")] == 1, ops
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(fused)
    assert unfuse_ort_ops(rewritten) == 7
    assert not [n for n in rewritten.graph.node if n.domain == MS]
    after = _ops(rewritten)
    assert after[("", "Conv")] == 7 and after[("", "Gemm")] == 1
    for op in ("Relu", "Clip", "LeakyRelu", "HardSigmoid", "Sigmoid", "Tanh"):
        assert after[("", op)] >= 1, op
    onnx.checker.check_model(rewritten)
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = oxla.InferenceSession(str(tmp_path / "optimized.onnx"))
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    plan = session.compiled.plan.nodes
    assert not [n for n in plan if n.domain == MS]
    if native.available():  # the convolutions on oxla's kernels, as from the original file
        original = oxla.InferenceSession(model.SerializeToString()).compiled.plan.nodes
        assert collections.Counter((n.domain, n.op_type) for n in plan) \
            == collections.Counter((n.domain, n.op_type) for n in original)
    # without the graph passes the rules compute the fused ops themselves: the same values
    unplanned = oxla.CompiledModel(fused, Options(layout_weights=False))
    assert [n for n in unplanned.plan.nodes if n.domain == MS]
    np.testing.assert_allclose(np.asarray(unplanned({"x": x})["y"]), want, rtol=1e-4, atol=1e-4)


def _one(node: onnx.NodeProto, inputs: list, inits: list, out_shape: list[int],
         dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph([node], "one", inputs, [helper.make_tensor_value_info(node.output[0], dtype, out_shape)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def test_what_is_not_as_onnxruntime_writes_it_stays_fused() -> None:
    """An activation with no standard op (ScaledTanh), weights that are not a float32
    initializer, a float16 QuickGelu and a QuickGelu of another alpha (rewritten with its Mul)."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 6)).astype(np.float32), "w")
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4])
    scaled = _one(helper.make_node("FusedGemm", ["a", "w"], ["y"], domain=MS, activation="ScaledTanh",
                                   activation_alpha=1.0, activation_beta=0.5), [a], [w], [2, 6])
    assert unfuse_ort_ops(scaled) == 0
    relu = _one(helper.make_node("FusedGemm", ["a", "w"], ["y"], domain=MS, activation="Relu"), [a], [w], [2, 6])
    assert unfuse_ort_ops(relu) == 1 and [n.op_type for n in relu.graph.node] == ["Gemm", "Relu"]
    fed = _one(helper.make_node("FusedGemm", ["a", "b"], ["y"], domain=MS, activation="Relu"),
               [a, helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 6])], [], [2, 6])
    assert unfuse_ort_ops(fed) == 0  # its weights a feed: its rule
    h = helper.make_tensor_value_info("h", TensorProto.FLOAT16, [2, 4])
    half = _one(helper.make_node("QuickGelu", ["h"], ["y"], domain=MS, alpha=1.0), [h], [], [2, 4], TensorProto.FLOAT16)
    assert unfuse_ort_ops(half) == 0
    gelu = _one(helper.make_node("QuickGelu", ["a"], ["y"], domain=MS, alpha=1.702), [a], [], [2, 4])
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    want = ort.InferenceSession(gelu.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": x})[0]
    assert unfuse_ort_ops(gelu) == 1
    assert [n.op_type for n in gelu.graph.node] == ["Mul", "Sigmoid", "Mul"]
    got = ort.InferenceSession(gelu.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_fused_conv_adds_z_before_its_activation() -> None:
    """FusedConv's fourth input Z: Y = activation(Conv(X, W, B) + Z)."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 5, 5])
    model = _one(helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain=MS, activation="Relu",
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]), [x, z], [w, b], [1, 4, 5, 5])
    feeds = {"x": RNG.standard_normal((1, 2, 5, 5)).astype(np.float32),
             "z": RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert unfuse_ort_ops(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Conv", "Add", "Relu"]
    got = oxla.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [10, 17])
def test_fused_clip_takes_the_bounds_its_opset_reads(opset: int) -> None:
    """Clip's bounds are attributes before opset 11 and inputs from it."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    model = _one(helper.make_node("FusedConv", ["x", "w"], ["y"], domain=MS, activation="Clip",
                                  activation_params=[-0.5, 0.5], kernel_shape=[3, 3]), [x], [w], [1, 4, 3, 3])
    model.opset_import[0].version = opset
    data = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    want = np.asarray(oxla.CompiledModel(model, Options(layout_weights=False))({"x": data})["y"])
    assert unfuse_ort_ops(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Conv", "Clip"]
    onnx.checker.check_model(model)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": data})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.min() >= -0.5 and got.max() <= 0.5 and (got == 0.5).any()


def test_a_file_in_onnxruntimes_blocked_layout_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """ORT_ENABLE_ALL saves convolutions in the blocked layout of the CPU that ran it
    (com.microsoft.nchwc): refused, naming the level to save at instead."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "all.onnx")
    ort.InferenceSession(_net().SerializeToString(), options, providers=["CPUExecutionProvider"])
    if not any(n.domain == "com.microsoft.nchwc" for n in onnx.load(str(tmp_path / "all.onnx")).graph.node):
        pytest.skip("this onnxruntime build saved no NCHWc ops on this CPU")
    with pytest.raises(oxla.UnsupportedOpError, match="ORT_ENABLE_EXTENDED") as caught:
        oxla.InferenceSession(str(tmp_path / "all.onnx"))
    assert "com.microsoft.nchwc::Conv" in str(caught.value)
