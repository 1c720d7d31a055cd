"""WinogradPass and oxla.winograd::Conv: which convolutions move, and that they compute the same."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from jax import lax
from onnx import helper, numpy_helper

import oxla
from oxla.lowering.context import Options
from oxla.lowering.ops import winograd
from oxla.passes.winograd import DOMAIN

RNG = np.random.default_rng(0)


def _direct(x: np.ndarray, hwio: np.ndarray) -> np.ndarray:
    """The convolution in float64: the reference both forms are held to."""
    return np.asarray(lax.conv_general_dilated(
        x.astype(np.float64), hwio.astype(np.float64), (1, 1), [(1, 1), (1, 1)],
        dimension_numbers=("NHWC", "HWIO", "NHWC")))


@pytest.mark.parametrize("shape", [(1, 8, 8, 16, 16), (2, 7, 9, 8, 24), (1, 1, 1, 4, 4), (1, 2, 3, 5, 3)])
def test_winograd_conv_matches_the_direct_convolution(shape: tuple[int, ...]) -> None:
    n, h, w, c, m = shape
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    hwio = (RNG.standard_normal((3, 3, c, m)) / np.sqrt(9 * c)).astype(np.float32)
    want = _direct(x, hwio)
    with oxla.x64():
        got = np.asarray(jax.jit(winograd.winograd_conv)(x, winograd.kernel_transform(hwio)))
    assert got.shape == want.shape
    # F(2x2, 3x3) rounds a few more times than the direct sum: a few float32 ulps of the output
    assert np.abs(got - want).max() <= 4e-6 * max(1.0, np.abs(want).max())


def test_kernel_made_back_from_its_transform() -> None:
    hwio = RNG.standard_normal((3, 3, 6, 5)).astype(np.float32)
    back = np.asarray(winograd.kernel(winograd.kernel_transform(hwio)))
    np.testing.assert_allclose(back, hwio, rtol=1e-6, atol=1e-6)


def _model(c: int, m: int, size: int, *, bias: bool = True, auto_pad: str = "") -> onnx.ModelProto:
    w = numpy_helper.from_array((RNG.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "b")
    attrs = {"auto_pad": auto_pad} if auto_pad else {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], kernel_shape=[3, 3], **attrs),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, c, size, size))],
                              [helper.make_empty_tensor_value_info("y")],
                              [w, b] if bias else [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _planned(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return oxla.CompiledModel(copy, Options(layout_weights=True)).model


@pytest.mark.parametrize(("c", "m", "size", "bias", "auto_pad"), [
    (128, 128, 9, True, ""),          # odd image: padded to whole tiles, cropped
    (128, 144, 14, False, "SAME_UPPER"),
    (128, 128, 60, True, ""),         # above MAX_PIXELS: XLA's convolution of the kernel made back
])
def test_pass_and_rule_agree_with_onnxruntime(c: int, m: int, size: int, bias: bool, auto_pad: str) -> None:
    model = _model(c, m, size, bias=bias, auto_pad=auto_pad)
    planned = _planned(model)
    assert [(n.domain, n.op_type) for n in planned.graph.node if n.op_type == "Conv"] == [(DOMAIN, "Conv")]
    assert not {"w", "w__oxla_hwio"} & {t.name for t in planned.graph.initializer}  # the kernel itself goes
    x = RNG.standard_normal((1, c, size, size)).astype(np.float32)
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = oxla.InferenceSession(data).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    # the planned model (its Winograd op a function body over standard ops) runs in onnxruntime
    again = ort.InferenceSession(planned.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(again.run(None, {"x": x})[0], want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("model", [
    _model(64, 128, 9),                                         # too few input channels
    helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 64, 9, 9))],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(np.ones((64, 64, 3, 3), np.float32), "w")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9),  # strided
], ids=["narrow", "strided"])
def test_other_convolutions_stay(model: onnx.ModelProto) -> None:
    assert not any(n.domain == DOMAIN for n in _planned(model).graph.node)


def test_small_images_stay_and_unknown_sizes_go() -> None:
    """A layer shape inference finds at most MAX_SMALL_TILES 2x2 tiles (one 7x7 image: 16) stays
    XLA's convolution; 9x9 (25 tiles), two 7x7 images and symbolic sizes become Winograd."""
    small = _model(128, 128, 7)
    assert not any(n.domain == DOMAIN for n in _planned(small).graph.node)
    x = RNG.standard_normal((1, 128, 7, 7)).astype(np.float32)
    data = small.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(oxla.InferenceSession(data).run(None, {"x": x})[0], want, rtol=1e-4, atol=2e-5)
    symbolic = _model(128, 128, 7)
    dims = symbolic.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "h", "w"
    assert [n.domain for n in _planned(symbolic).graph.node if n.op_type == "Conv"] == [DOMAIN]
    assert [n.domain for n in _planned(_model(128, 128, 9)).graph.node if n.op_type == "Conv"] == [DOMAIN]
    batched = _model(128, 128, 7)  # 2 images of 16 tiles
    batched.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    assert [n.domain for n in _planned(batched).graph.node if n.op_type == "Conv"] == [DOMAIN]


def test_symbolic_image_sizes() -> None:
    # a jax.export of model.fn can leave H and W symbolic: the pixel count is then unknown while
    # tracing, and the rule convolves with the kernel made back from U
    hwio = (RNG.standard_normal((3, 3, 8, 8)) / np.sqrt(72)).astype(np.float32)
    u = winograd.kernel_transform(hwio)
    h, w = jax.export.symbolic_shape("h, w")
    spec = jax.ShapeDtypeStruct((1, h, w, 8), np.float32)
    exported = jax.export.export(jax.jit(lambda x: winograd.convolve(x, u)))(spec)
    for size in ((9, 9), (12, 7)):
        x = RNG.standard_normal((1, *size, 8)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(exported.call(x)), _direct(x, hwio), rtol=1e-5, atol=1e-5)
