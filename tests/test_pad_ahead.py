"""PadAheadPass: a strided depthwise Conv's pads made ahead by its stride-1 producer, outputs unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla import plan
from oxla.passes.channels_last import convs_to_channels_last
from oxla.passes.pad_ahead import DOMAIN, pad_ahead

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _large_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan as for a model of large kernels: a model of small ones has every depthwise and 1x1
    convolution on oxla's kernels (`small_kernels`, tested in test_native.py)."""
    monkeypatch.setattr(plan, "small_kernels", lambda model: False)


def block(act: str | None, pads: list[int], kernel: int = 3, stride: int = 2) -> onnx.ModelProto:
    """X -> 3x3 stem (stride 1) -> 1x1 Conv -> [act] -> depthwise kxk Conv (stride, pads) -> Y."""
    c, m = 4, 8
    inits = [numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32), n) for n, s in
             [("w0", (c, c, 3, 3)), ("b0", (c,)), ("w1", (m, c, 1, 1)), ("b1", (m,)),
              ("w2", (m, 1, kernel, kernel)), ("b2", (m,))]]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["h0"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["h0", "w1", "b1"], ["h1"], kernel_shape=[1, 1])]
    last = "h1"
    if act == "Clip":
        inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
        nodes.append(helper.make_node("Clip", ["h1", "lo", "hi"], ["a"]))
        last = "a"
    elif act in ("SiLU", "SiLU-swapped"):  # x * Sigmoid(x), as torch exports nn.SiLU
        product = ["h1", "s"] if act == "SiLU" else ["s", "h1"]
        nodes += [helper.make_node("Sigmoid", ["h1"], ["s"]), helper.make_node("Mul", product, ["a"])]
        last = "a"
    elif act == "Sigmoid-then-Mul-by-other":  # h0 * Sigmoid(h1) is not SiLU
        nodes += [helper.make_node("Sigmoid", ["h1"], ["s"]), helper.make_node("Mul", ["h1", "h1"], ["a0"]),
                  helper.make_node("Mul", ["a0", "s"], ["a"])]
        last = "a"
    elif act is not None:
        nodes.append(helper.make_node(act, ["h1"], ["a"]))
        last = "a"
    nodes.append(helper.make_node("Conv", [last, "w2", "b2"], ["y"], kernel_shape=[kernel] * 2,
                                  pads=pads, strides=[stride] * 2, group=m))
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, c, 11, 12])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, m, None, None])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _check(model: onnx.ModelProto) -> bool:
    """oxla equals onnxruntime; returns whether the planned model pads ahead."""
    x = RNG.standard_normal((1, 4, 11, 12)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    sess = oxla.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    return any(n.domain == DOMAIN for n in sess._compiled.plan.nodes)


@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "SiLU", "SiLU-swapped", None])
@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 0, 1, 1], [1, 2, 0, 1]])
def test_pads_ahead_agree_with_onnxruntime(act: str | None, pads: list[int]) -> None:
    assert _check(block(act, pads))


@pytest.mark.parametrize("act, kernel, stride", [("HardSwish", 3, 2), ("Relu", 5, 2), ("Relu", 3, 1),
                                                  ("Sigmoid-then-Mul-by-other", 3, 2)])
def test_costly_activations_large_kernels_and_stride_one_are_left(act: str, kernel: int, stride: int) -> None:
    assert not _check(block(act, [kernel // 2] * 4, kernel, stride))


def test_planned_model_runs_in_onnxruntime() -> None:
    model = block("Relu", [1, 1, 1, 1])
    x = RNG.standard_normal((1, 4, 11, 12)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    convs_to_channels_last(model)
    assert pad_ahead(model) == 1
    onnx.checker.check_model(model)
    got = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
