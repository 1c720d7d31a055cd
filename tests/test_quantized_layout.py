"""Quantized convolution nets channels last: ConvInteger's twin, QDQ groups as onnxruntime fuses them.

- ChannelsLastPass moves ConvInteger (without zero points), Pad, QuantizeLinear and
  DequantizeLinear; `oxla.channels_last::ConvInteger` picks a GEMM, XLA's int8 convolution or
  im2col columns by shape, each exact in int32.
- QDQConvToIntegerPass writes DequantizeLinear -> Conv -> QuantizeLinear as the QLinearConv
  onnxruntime's QDQ fusion runs, and quantized_max_pools pools the 8-bit values.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla.lowering.context import Options
from oxla.passes import channels_last
from oxla.passes.qdq_conv import quantized_max_pools
from tests.ort_exact import reference


def _conv_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dilation: int) -> np.ndarray:
    """conv(x, w) in int64, NCHW / OIHW, zero padding."""
    xp = np.pad(x.astype(np.int64), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    m, _, kh, kw = w.shape
    oh = (xp.shape[2] - (kh - 1) * dilation - 1) // stride + 1
    ow = (xp.shape[3] - (kw - 1) * dilation - 1) // stride + 1
    y = np.zeros((x.shape[0], m, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i * dilation:i * dilation + (oh - 1) * stride + 1:stride,
                     j * dilation:j * dilation + (ow - 1) * stride + 1:stride]
            y += np.einsum("nchw,mc->nmhw", win, w[:, :, i, j].astype(np.int64))
    return y


def _conv_integer_net(x_dtype: type, c: int, m: int, k: int, stride: int, pad: int,
                      dilation: int, n: int = 1, w_dtype: type = np.int8) -> tuple[onnx.ModelProto, np.ndarray]:
    """x -> ConvInteger(x, W) -> Relu-free Cast to float: a ConvInteger between channels-last ops."""
    rng = np.random.default_rng(c * 100 + k)
    info = np.iinfo(w_dtype)
    w = rng.integers(info.min, info.max + 1, (m, c, k, k)).astype(w_dtype)
    nodes = [helper.make_node("ConvInteger", ["x", "w"], ["acc"], pads=[pad] * 4, strides=[stride] * 2,
                              dilations=[dilation] * 2),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    elem = TensorProto.UINT8 if x_dtype == np.uint8 else TensorProto.INT8
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [n, c, 30, 30])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), w


SHAPES = {  # (x dtype, C, M, kernel, stride, pad, dilation, batch): which form each takes
    "1x1-gemm": (np.int8, 32, 24, 1, 1, 0, 1, 1),
    "1x1-strided-gemm": (np.int8, 32, 24, 1, 2, 0, 1, 1),
    "3x3-xla-convolution": (np.int8, 32, 16, 3, 1, 1, 1, 1),
    "3x3-strided-columns": (np.int8, 32, 16, 3, 2, 1, 1, 1),
    "3x3-dilated": (np.int8, 16, 8, 3, 1, 2, 2, 1),
    "uint8-x-shifted": (np.uint8, 32, 16, 3, 1, 1, 1, 1),
    "batch-3-convolution": (np.int8, 32, 16, 3, 1, 1, 1, 3),
    "batch-3-columns": (np.uint8, 32, 16, 3, 2, 1, 1, 3),
}
UINT8_WEIGHTS = {"uint8-w-convolution": (np.uint8, 32, 16, 3, 1, 1, 1, 2),
                 "uint8-w-columns": (np.int8, 32, 16, 3, 2, 1, 1, 1)}


@pytest.mark.parametrize("shape", [*SHAPES, *UINT8_WEIGHTS])
def test_conv_integer_channels_last_is_exact(shape: str) -> None:
    """Exact against an int64 convolution; uint8 weights (shifted like x, their share added back
    as window sums of x) too."""
    x_dtype, c, m, k, stride, pad, dilation, n = {**SHAPES, **UINT8_WEIGHTS}[shape]
    w_dtype = np.uint8 if shape in UINT8_WEIGHTS else np.int8
    model, w = _conv_integer_net(x_dtype, c, m, k, stride, pad, dilation, n, w_dtype)
    info = np.iinfo(x_dtype)
    x = np.random.default_rng(1).integers(info.min, info.max + 1, (n, c, 30, 30)).astype(x_dtype)
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    assert [(n.domain, n.op_type) for n in session.plan.nodes if "Conv" in n.op_type] \
        == [(channels_last.DOMAIN, "ConvInteger")]
    got = np.asarray(session({"x": x})["y"])
    np.testing.assert_array_equal(got, _conv_reference(x, w, stride, pad, dilation).astype(np.float32))


def test_conv_integer_stem_stays_channels_first() -> None:
    """Fewer than 16 input channels: the columns are cheaper channels first (the pass leaves it)."""
    model, w = _conv_integer_net(np.int8, 3, 16, 7, 2, 3, 1)
    x = np.random.default_rng(2).integers(-128, 128, (1, 3, 30, 30)).astype(np.int8)
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    assert [(n.domain, n.op_type) for n in session.plan.nodes if "Conv" in n.op_type] == [("", "ConvInteger")]
    np.testing.assert_array_equal(np.asarray(session({"x": x})["y"]),
                                  _conv_reference(x, w, 2, 3, 1).astype(np.float32))


def _qdq_block() -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv(DQ(w), DQ(int32 b)) -> Q -> DQ -> MaxPool -> Q -> DQ -> Conv 1x1 -> Q
    -> DQ -> y: per-tensor activations, per-channel weights, biases scaled x_scale * w_scale."""
    rng = np.random.default_rng(7)
    inits, nodes = [], [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"])]
    scales = [np.float32(0.031), np.float32(0.047), np.float32(0.052)]
    for i, s in enumerate(scales):
        inits += [numpy_helper.from_array(np.array(s, np.float32), f"s{i}"),
                  numpy_helper.from_array(np.array(120 + 3 * i, np.uint8), f"z{i}")]
    x_in = "q0"
    for i, (c, m, k) in enumerate([(16, 32, 3), (32, 24, 1)]):
        w = rng.integers(-127, 128, (m, c, k, k)).astype(np.int8)
        ws = rng.uniform(0.002, 0.01, m).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(ws, f"ws{i}"),
                  numpy_helper.from_array(np.zeros(m, np.int8), f"wz{i}"),
                  numpy_helper.from_array(rng.integers(-5000, 5000, m).astype(np.int32), f"b{i}"),
                  numpy_helper.from_array((scales[i] * ws).astype(np.float32), f"bs{i}"),
                  numpy_helper.from_array(np.zeros(m, np.int32), f"bz{i}")]
        nodes += [helper.make_node("DequantizeLinear", [x_in, f"s{i}", f"z{i}"], [f"xd{i}"]),
                  helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"], [f"wd{i}"], axis=0),
                  helper.make_node("DequantizeLinear", [f"b{i}", f"bs{i}", f"bz{i}"], [f"bd{i}"], axis=0),
                  helper.make_node("Conv", [f"xd{i}", f"wd{i}", f"bd{i}"], [f"c{i}"], pads=[k // 2] * 4),
                  helper.make_node("QuantizeLinear", [f"c{i}", f"s{i + 1}", f"z{i + 1}"], [f"q{i + 1}"])]
        x_in = f"q{i + 1}"
        if i == 0:
            nodes += [helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["pd"]),
                      helper.make_node("MaxPool", ["pd"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                                       pads=[1, 1, 1, 1]),
                      helper.make_node("QuantizeLinear", ["p", "s1", "z1"], ["pq"])]
            x_in = "pq"
    nodes.append(helper.make_node("DequantizeLinear", [x_in, "s2", "z2"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 48, 48])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_qdq_block_runs_as_onnxruntime_fuses_it() -> None:
    """Both convolutions as QLinearConv (int32 bias, one float32 requantisation), the pool on
    8-bit values, channels last: onnxruntime's default level (its QDQ fusions) bit for bit."""
    model = _qdq_block()
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    ops = [(n.domain, n.op_type) for n in session.plan.nodes]
    assert ("", "Conv") not in ops and ops.count((channels_last.DOMAIN, "ConvInteger")) == 2
    assert ops.count(("", "DequantizeLinear")) == 1  # only the output's: the pool reads uint8
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    fused = ort.InferenceSession(reference(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
    for seed in range(6):  # the float graph's roundings differ on about 1 value in 10^4 here
        x = (np.random.default_rng(seed).standard_normal((1, 16, 48, 48)) * 2).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(session({"x": x})["y"]), fused.run(None, {"x": x})[0])


def test_quantized_max_pool_needs_the_same_parameters() -> None:
    """A pool between different scales keeps its float form; the same ones pool the bytes."""
    model = _qdq_block()
    assert quantized_max_pools(model) == 1
    other = _qdq_block()
    pool_q = next(n for n in other.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "p")
    pool_q.input[1] = "s2"
    assert quantized_max_pools(other) == 0



def test_quantized_max_pool_keeps_a_negative_scale_in_float() -> None:
    """With a negative scale dequantization reverses the order (the pool's max is the bytes'
    min): the float pool stays, and oxla agrees with onnxruntime's graph as written."""
    model = _qdq_block()
    for t in model.graph.initializer:
        if t.name == "s1":
            t.CopyFrom(numpy_helper.from_array(np.array(-0.047, np.float32), "s1"))
    assert quantized_max_pools(onnx.ModelProto.FromString(model.SerializeToString())) == 0
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = (np.random.default_rng(4).standard_normal((1, 16, 48, 48)) * 2).astype(np.float32)
    got = np.asarray(oxla.CompiledModel(model, Options(layout_weights=True))({"x": x})["y"])
    np.testing.assert_array_equal(got, want.run(None, {"x": x})[0])


def test_qoperator_residual_adds_stay_channels_last() -> None:
    """onnxruntime's QLinearAdd after channels-last convolutions reads and writes channels last
    (no Transpose around each residual add); the file still agrees exactly (test_ort_quant_models)."""
    import os

    from oxla.plan import prepare

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "ort_quant",
                        "resnet_half.qop.onnx")
    model = onnx.load(path)
    prepare(model, Options(layout_weights=True))
    adds = [n for n in model.graph.node if n.op_type == "QLinearAdd"]
    after = [n for n in adds if any(i.endswith(channels_last.SUFFIX) for i in n.input)]
    assert len(after) == 4 and all(n.input[0].endswith(channels_last.SUFFIX)
                                   and n.input[3].endswith(channels_last.SUFFIX) for n in after)
    assert sum(n.op_type == "Transpose" for n in model.graph.node) <= 3


def test_planned_quantized_model_runs_in_onnxruntime() -> None:
    """The planned QDQ block (channels-last ConvInteger, oxla.quantized::Requantize) carries ONNX
    function bodies: onnxruntime runs it and gets oxla's bytes."""
    model = _qdq_block()
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    planned = session.model
    domains = {n.domain for n in planned.graph.node}
    assert {channels_last.DOMAIN, "oxla.quantized"} <= domains
    again = ort.InferenceSession(planned.SerializeToString(), providers=["CPUExecutionProvider"])
    x = (np.random.default_rng(9).standard_normal((1, 16, 48, 48)) * 2).astype(np.float32)
    np.testing.assert_array_equal(again.run(None, {"x": x})[0], np.asarray(session({"x": x})["y"]))


def _qdq_add() -> onnx.ModelProto:
    """uint8 a, b -> DQ -> Add -> Q -> y, scales 0.1, 0.1 and 0.2: sums land on ties, where the
    float graph (onnxruntime's basic level) and its fused QLinearAdd round apart (26333 of the
    65536 pairs)."""
    inits = []
    for name, s, z in (("a", 0.1, 131), ("b", 0.1, 117), ("y", 0.2, 125)):
        inits += [numpy_helper.from_array(np.array(s, np.float32), f"s{name}"),
                  numpy_helper.from_array(np.array(z, np.uint8), f"z{name}")]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["ad"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bd"]),
             helper.make_node("Add", ["ad", "bd"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.UINT8, [256, 256])
                                           for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_qdq_add_runs_as_qlinear_add() -> None:
    """A quantized residual Add is com.microsoft QLinearAdd, as onnxruntime's QDQ fusion makes
    it: its default level bit for bit, over every pair of uint8 values."""
    model = _qdq_add()
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    ops = [(n.domain, n.op_type) for n in session.plan.nodes]
    assert ops == [("com.microsoft", "QLinearAdd")]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    fused = ort.InferenceSession(reference(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
    a, b = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8), indexing="ij")
    np.testing.assert_array_equal(np.asarray(session({"a": a, "b": b})["y"]), fused.run(None, {"a": a, "b": b})[0])
