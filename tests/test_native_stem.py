"""oxla's stem kernel (oxla_sstem, `oxla.native::Stem*` ops): image stems read channels first."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla import cpu_client, native, plan
from oxla.lowering.context import Options
from oxla.lowering.ops import native as native_rule
from oxla.passes import native_gemm

from .test_native import _act, _agrees, _model, same_without_kernel

RNG = np.random.default_rng(1)
needs_kernel = pytest.mark.skipif(not native.available(),
                                  reason=f"no native kernel here: {native.unavailable_reason()}")


@pytest.fixture(autouse=True)
def _large_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan as for a model of large kernels: a model of small ones has every depthwise and 1x1
    convolution on oxla's kernels (`small_kernels`, tested in test_native.py)."""
    monkeypatch.setattr(plan, "small_kernels", lambda model: False)


def _reference(x, hwio, b, act, strides, pads, dilations, out_pads=(0, 0, 0, 0)):
    """float64 convolution of channels-first x, channels-last result, then the activation and
    the zero border (top, left, bottom, right)."""
    with jax.enable_x64(True):
        y = np.asarray(jax.lax.conv_general_dilated(
            jnp.asarray(x, jnp.float64), jnp.asarray(hwio, jnp.float64), strides,
            [(pads[0], pads[2]), (pads[1], pads[3])], rhs_dilation=dilations,
            dimension_numbers=("NCHW", "HWIO", "NHWC")))
    y = _act((y + b).astype(np.float32), act, -0.5, 1.5)
    t, left, bottom, right = out_pads
    return np.pad(y, ((0, 0), (t, bottom), (left, right), (0, 0)))


def _call(x, hwio, b, act, threads, strides, pads, dilations, out_pads=(0, 0, 0, 0),
          channels_first=True):
    kh, kw, _, m = hwio.shape
    h, w = x.shape[2:] if channels_first else x.shape[1:3]
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    t, left, bottom, right = out_pads
    out = jax.ShapeDtypeStruct((x.shape[0], t + oh + bottom, left + ow + right, m), jnp.float32)
    i64 = np.int64

    def f(x, wp, b):
        return jax.ffi.ffi_call(native.STEM_TARGET, out)(
            x, wp, b, threads=i64(threads), act=i64(native_rule.ACTIVATIONS[act]),
            lo=np.float32(-0.5), hi=np.float32(1.5), kh=i64(kh), kw=i64(kw), sh=i64(strides[0]),
            sw=i64(strides[1]), dh=i64(dilations[0]), dw=i64(dilations[1]), pt=i64(pads[0]),
            pl=i64(pads[1]), channels_first=i64(channels_first), out_top=i64(t),
            out_left=i64(left), out_bottom=i64(bottom), out_right=i64(right))

    device = cpu_client.inline_device()
    args = [jax.device_put(a, device) for a in (x, native.pack(hwio.reshape(-1, m)), b)]
    return np.asarray(jax.jit(f)(*args))


@needs_kernel
@pytest.mark.parametrize("case", [
    # (N, C, H, W, M, KH, KW, strides, pads (t, l, b, r), dilations, out pads (t, l, b, r))
    (1, 3, 9, 11, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), (0, 0, 0, 0)),   # an RGB stem
    (2, 3, 12, 10, 24, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), (1, 1, 1, 1)),  # batch, a zero border
    (1, 1, 13, 8, 40, 5, 5, (1, 1), (2, 1, 0, 2), (1, 1), (0, 2, 1, 0)),   # masked columns, 2 panels
    (1, 4, 15, 15, 33, 7, 7, (2, 2), (3, 3, 3, 3), (2, 2), (0, 0, 0, 0)),  # dilated, C not 1 or 3
    (1, 2, 6, 6, 8, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1), (0, 0, 0, 0)),     # kernel wider than X
    (1, 3, 3, 3, 5, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), (2, 0, 0, 2)),     # one output pixel
    (1, 3, 40, 37, 64, 3, 3, (2, 1), (1, 1, 1, 1), (1, 1), (0, 0, 0, 0)),  # many tiles and rows
    (1, 3, 20, 31, 64, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), (1, 1, 1, 1)),  # ResNet's stem
    (1, 2, 11, 23, 20, 3, 5, (1, 3), (1, 2, 0, 1), (1, 2), (0, 0, 0, 0)),  # taps over 3 phases
])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_float64(case: tuple, threads: int) -> None:
    n, c, h, w, m, kh, kw, strides, pads, dilations, out_pads = case
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    hwio = RNG.standard_normal((kh, kw, c, m)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    want = _reference(x, hwio, b, "", strides, pads, dilations, out_pads)
    tol = 1e-5 * (kh * kw * c) ** 0.5
    got = _call(x, hwio, b, "", threads, strides, pads, dilations, out_pads)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=tol)
    # the kernel reads a channels-last X as well (attribute channels_first = 0)
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    got = _call(last, hwio, b, "", threads, strides, pads, dilations, out_pads, channels_first=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=tol)


@needs_kernel
@pytest.mark.parametrize("act", ["", "Relu", "Clip", "Silu", "HardSwish"])
def test_epilogues(act: str) -> None:
    x = RNG.standard_normal((1, 3, 17, 19)).astype(np.float32)
    hwio = (RNG.standard_normal((3, 3, 3, 20)) / 4).astype(np.float32)
    b = RNG.standard_normal(20).astype(np.float32)
    for threads in (1, 2):
        got = _call(x, hwio, b, act, threads, (2, 2), (1, 1, 1, 1), (1, 1), (1, 0, 1, 1))
        want = _reference(x, hwio, b, act, (2, 2), (1, 1, 1, 1), (1, 1), (1, 0, 1, 1))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _stem_net(size: int = 32, act: str = "HardSwish", share: bool = False,
              normalize: bool = False, channels: int = 3) -> onnx.ModelProto:
    """An RGB stem (3x3 stride 2, bias), its activation, then a padded strided depthwise Conv
    (the stem writes its pads); `share`: the activation is also an output (the pads stay the
    depthwise Conv's); `normalize`: the image is normalized before the stem."""
    inits = [numpy_helper.from_array((RNG.standard_normal((16, channels, 3, 3)) / 5).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32), "b"),
             numpy_helper.from_array((RNG.standard_normal((16, 1, 3, 3)) / 3).astype(np.float32), "dw"),
             numpy_helper.from_array(np.float32(0.5), "half"),
             numpy_helper.from_array(np.float32(-1.0), "lo"), numpy_helper.from_array(np.float32(2.0), "hi")]
    image = "x"
    nodes = []
    if normalize:
        nodes.append(helper.make_node("Sub", ["x", "half"], ["x_n"]))
        image = "x_n"
    nodes.append(helper.make_node("Conv", [image, "w", "b"], ["s"], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Clip", ["s", "lo", "hi"], ["a"]) if act == "Clip"
                 else helper.make_node(act, ["s"], ["a"]))
    nodes.append(helper.make_node("Conv", ["a", "dw"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1], group=16))
    half, quarter = size // 2, size // 4
    outputs = {"y": (1, 16, quarter, quarter)}
    if share:
        outputs["a"] = (1, 16, half, half)
    return _model(nodes, (1, channels, size, size), outputs, inits)


def _planned(model: onnx.ModelProto, threads: int = 2) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return oxla.CompiledModel(copy, Options(layout_weights=True, native_threads=threads,
                                            native_stems=True)).model


def _node(planned: onnx.ModelProto, op: str) -> onnx.NodeProto:
    return next(n for n in planned.graph.node if n.op_type == op)


@needs_kernel
@pytest.mark.parametrize("act", ["Relu", "HardSwish", "Clip"])
def test_pass_reads_the_image_and_writes_the_next_pads(monkeypatch: pytest.MonkeyPatch, act: str) -> None:
    monkeypatch.setattr(native_gemm, "STEM_MIN_FLOPS", 0.0)
    model = _stem_net(act=act)
    planned = _planned(model)
    stem = _node(planned, "Stem" + act)
    assert stem.input[0] == "x"  # the image itself: its transpose is gone
    assert not [n for n in planned.graph.node if n.op_type == "Transpose" and n.input[0] == "x"]
    attrs = {a.name: list(a.ints) for a in stem.attribute}
    assert attrs["out_pads"] == [0, 1, 1, 0, 0, 1, 1, 0]
    dw = next(n for n in planned.graph.node if n.op_type == "Conv" and n.input[0] == stem.output[0])
    assert {a.name: list(a.ints) for a in dw.attribute if a.name == "pads"} == {"pads": [0, 0, 0, 0]}
    _agrees(model, planned, RNG.standard_normal((1, 3, 32, 32)).astype(np.float32))


def _stem_pool_net(act: str) -> onnx.ModelProto:
    """ResNet's entry: a 3-channel stem (3x3 stride 2 here), its activation, a 3x3/2 MaxPool
    padded by 1, then a 1x1 Conv."""
    inits = [numpy_helper.from_array((RNG.standard_normal((16, 3, 3, 3)) / 5).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32), "b"),
             numpy_helper.from_array((RNG.standard_normal((8, 16, 1, 1)) / 3).astype(np.float32), "pw")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["s"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node(act, ["s"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "pw"], ["y"], kernel_shape=[1, 1])]
    return _model(nodes, (1, 3, 32, 32), {"y": (1, 8, 8, 8)}, inits)


@needs_kernel
@pytest.mark.parametrize(("act", "border"), [("Relu", True), ("HardSwish", False)])
def test_relu_stem_writes_the_max_pools_border(monkeypatch: pytest.MonkeyPatch, act: str,
                                               border: bool) -> None:
    """After a ReLU zeros pad a MaxPool as -inf does: the stem writes the pool's border and the
    pool pads nothing. Not after an activation that goes below zero."""
    monkeypatch.setattr(native_gemm, "STEM_MIN_FLOPS", 0.0)
    model = _stem_pool_net(act)
    planned = _planned(model)
    stem = _node(planned, "Stem" + act)
    pool = _node(planned, "MaxPool")
    pads = {a.name: list(a.ints) for a in stem.attribute}["out_pads"]
    assert pads == ([0, 1, 1, 0, 0, 1, 1, 0] if border else [0] * 8)
    assert {a.name: list(a.ints) for a in pool.attribute}["pads"] == ([0] * 4 if border else [1] * 4)
    image = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32) - 2.0  # many negative sums
    _agrees(model, planned, image)


@needs_kernel
def test_shared_output_keeps_its_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "STEM_MIN_FLOPS", 0.0)
    model = _stem_net(share=True)
    planned = _planned(model)
    stem = _node(planned, "StemHardSwish")
    assert {a.name: list(a.ints) for a in stem.attribute}["out_pads"] == [0] * 8
    _agrees(model, planned, RNG.standard_normal((1, 3, 32, 32)).astype(np.float32))


@needs_kernel
def test_what_stays_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    def stems(model: onnx.ModelProto) -> list[str]:
        return [n.op_type for n in _planned(model).graph.node if n.op_type.startswith("Stem")]

    assert stems(_stem_net(size=32)) == []   # 2 x 256 x 27 x 16 flops: under STEM_MIN_FLOPS
    assert stems(_stem_net(size=224)) == ["StemHardSwish"]
    monkeypatch.setattr(native_gemm, "STEM_MIN_FLOPS", 0.0)
    wide = _stem_net(channels=5)  # more than STEM_CHANNELS: a convolution, not a stem
    assert stems(wide) == []
    _agrees(wide, _planned(wide), RNG.standard_normal((1, 5, 32, 32)).astype(np.float32))
    monkeypatch.setattr(native_gemm, "STEMS", False)
    assert stems(_stem_net()) == []


@needs_kernel
def test_normalized_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """ChannelsLastPass transposes after a normalization of the image (elementwise, channels
    first): the stem reads the normalized image."""
    monkeypatch.setattr(native_gemm, "STEM_MIN_FLOPS", 0.0)
    model = _stem_net(normalize=True)
    planned = _planned(model)
    assert _node(planned, "StemHardSwish").input[0] == "x_n"
    _agrees(model, planned, RNG.standard_normal((1, 3, 32, 32)).astype(np.float32))


@needs_kernel
@pytest.mark.parametrize("threads", [0, 1])
def test_sessions_use_it_on_any_core_count(threads: int) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    model = _stem_net(size=224)
    session = oxla.InferenceSession(model.SerializeToString(), options)
    assert [n for n in session.compiled.plan.nodes if n.op_type == "StemHardSwish"]
    x = RNG.standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)


@needs_kernel
def test_rule_without_the_kernel_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "STEM_MIN_FLOPS", 0.0)
    same_without_kernel(monkeypatch, _stem_net(), RNG.standard_normal((1, 3, 32, 32)).astype(np.float32),
                        "StemHardSwish")


@needs_kernel
def test_wrong_channel_count_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planned model fed an image of other channels than its stem reads fails naming the node."""
    monkeypatch.setattr(native_gemm, "STEM_MIN_FLOPS", 0.0)
    planned = _planned(_stem_net())
    del planned.functions[:]  # the rule, not the function body
    planned.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 4
    with pytest.raises(oxla.OxlaError, match="StemHardSwish.*channels"):
        oxla.CompiledModel(planned)({"x": RNG.standard_normal((1, 4, 32, 32)).astype(np.float32)})
