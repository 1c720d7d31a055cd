"""Conv, ConvTranspose, ConvInteger, DeformConv, Col2Im against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from oxla.errors import LoweringError
from tests.lowering.util import check_node

RNG = np.random.default_rng(0)


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


X2 = rand(2, 4, 7, 6)
W2 = rand(6, 4, 3, 3)

CONV = {
    "2d-bias-pads": ({"x": X2, "w": W2, "b": rand(6)}, {"pads": [1, 0, 2, 1]}),
    "2d-no-bias-strides": ({"x": X2, "w": W2, "b": None}, {"strides": [2, 3]}),
    "1d-dilations": ({"x": rand(1, 3, 11), "w": rand(2, 3, 3)}, {"dilations": [2], "pads": [1, 2]}),
    "3d": ({"x": rand(1, 2, 4, 5, 6), "w": rand(3, 2, 2, 3, 2)}, {"strides": [1, 2, 1]}),
    "groups": ({"x": X2, "w": rand(6, 2, 3, 3)}, {"group": 2}),
    "depthwise": ({"x": X2, "w": rand(8, 1, 3, 3)}, {"group": 4, "pads": [1, 1, 1, 1]}),
    "same-upper": ({"x": X2, "w": W2}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same-lower": ({"x": X2, "w": W2}, {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "valid": ({"x": X2, "w": W2}, {"auto_pad": "VALID", "kernel_shape": [3, 3]}),
}


@pytest.mark.parametrize("case", CONV, ids=lambda c: f"Conv-{c}")
def test_conv(case: str) -> None:
    inputs, attrs = CONV[case]
    check_node("Conv", inputs, rtol=1e-4, atol=1e-5, **attrs)


# Shapes that send Conv down each form conv_forms.choose picks from; the id names the form.
FORM_CASES = {
    "taps-depthwise-3x3": ({"x": rand(2, 6, 9, 8), "w": rand(6, 1, 3, 3), "b": rand(6)},
                           {"group": 6, "pads": [1, 1, 1, 1]}),
    "taps-depthwise-multiplier-strides": ({"x": rand(1, 3, 9, 10), "w": rand(6, 1, 3, 3)},
                                          {"group": 3, "strides": [2, 3], "pads": [0, 1, 2, 1]}),
    "taps-depthwise-dilations-same-lower": ({"x": rand(1, 4, 9, 8), "w": rand(4, 1, 2, 3)},
                                            {"group": 4, "dilations": [2, 2], "auto_pad": "SAME_LOWER"}),
    "taps-depthwise-valid": ({"x": rand(1, 4, 7, 8), "w": rand(4, 1, 3, 3)},
                             {"group": 4, "auto_pad": "VALID", "strides": [2, 2]}),
    "taps-depthwise-5x5-stride2": ({"x": rand(2, 4, 11, 9), "w": rand(4, 1, 5, 5), "b": rand(4)},
                                   {"group": 4, "strides": [2, 2], "pads": [2, 2, 2, 2]}),
    "taps_flat-depthwise-5x5-same-upper": ({"x": rand(2, 5, 8, 7), "w": rand(5, 1, 5, 5), "b": rand(5)},
                                           {"group": 5, "auto_pad": "SAME_UPPER"}),
    "taps_flat-groups-4-per-group": ({"x": rand(1, 8, 6, 7), "w": rand(4, 4, 3, 3)},
                                     {"group": 2, "pads": [1, 1, 1, 1], "dilations": [1, 1]}),
    "taps_flat-dilated-rows-only-pad": ({"x": rand(1, 4, 9, 6), "w": rand(4, 2, 3, 3)},
                                        {"group": 2, "dilations": [2, 1], "pads": [0, 1, 0, 1]}),
    "taps-1d-depthwise": ({"x": rand(2, 3, 12), "w": rand(6, 1, 3)}, {"group": 3, "pads": [1, 2]}),
    "taps_flat-1d-groups": ({"x": rand(2, 8, 12), "w": rand(4, 4, 3)}, {"group": 2, "pads": [1, 1]}),
    "taps-3d-depthwise": ({"x": rand(1, 3, 5, 6, 4), "w": rand(3, 1, 2, 3, 2)},
                          {"group": 3, "strides": [1, 2, 1], "pads": [1, 0, 1, 0, 1, 0]}),
    "taps_flat-3d-depthwise-same": ({"x": rand(1, 2, 4, 5, 6), "w": rand(2, 1, 3, 3, 3)},
                                    {"group": 2, "pads": [1, 1, 1, 1, 1, 1]}),
    "split-groups-16-per-group": ({"x": rand(1, 32, 6, 5), "w": rand(6, 16, 3, 3), "b": rand(6)},
                                  {"group": 2, "strides": [2, 1], "pads": [1, 1, 1, 1]}),
    "dot-grouped-1x1": ({"x": rand(2, 160, 4, 3), "w": rand(6, 80, 1, 1)}, {"group": 2}),
    "native-dense-1x1": ({"x": rand(2, 5, 4, 3), "w": rand(7, 5, 1, 1), "b": rand(7)}, {}),
    "native-dense-1x1-strides-pads": ({"x": rand(1, 5, 7, 6), "w": rand(3, 5, 1, 1)},
                                   {"strides": [2, 3], "pads": [1, 0, 0, 2]}),
    "native-dense-1x1-3d": ({"x": rand(1, 4, 3, 2, 5), "w": rand(2, 4, 1, 1, 1)}, {}),
}


def _chosen(inputs: dict, attrs: dict) -> str:
    from oxla.lowering.ops import conv_forms
    from oxla.lowering.ops.conv import window_pads

    x, w = inputs["x"], inputs["w"]
    n = x.ndim - 2
    s, d = attrs.get("strides", [1] * n), attrs.get("dilations", [1] * n)
    pads = window_pads(None, attrs.get("auto_pad", "NOTSET"), attrs.get("pads"), x.shape[2:],
                       w.shape[2:], s, d)
    return conv_forms.choose(x.shape[2:], w.shape, s, pads, d, attrs.get("group", 1)).__name__


@pytest.mark.parametrize("case", FORM_CASES, ids=lambda c: f"Conv-{c}")
def test_conv_forms(case: str) -> None:
    inputs, attrs = FORM_CASES[case]
    assert _chosen(inputs, attrs) == case.split("-")[0]
    # onnxruntime refuses dilations with SAME_* auto_pad; onnx.reference computes them
    ort = not (attrs.get("auto_pad", "").startswith("SAME") and "dilations" in attrs)
    check_node("Conv", inputs, ort=ort, rtol=1e-4, atol=1e-4, **attrs)


@pytest.mark.parametrize("kernel", [False, True])
def test_conv_depthwise_weights_stored_by_the_session(kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # sessions store W as HWIO behind a Transpose (WeightLayoutPass): XLA's forms read it through
    # it; with the native depthwise kernel (a channel multiplier of 2 here) NativeGemmPass reads it
    import onnxruntime as ort
    from onnx import numpy_helper

    import oxla
    from oxla.passes import native_gemm
    from oxla.passes.weight_layout import SUFFIX
    from tests.lowering.util import node_model

    if not kernel:
        monkeypatch.setattr(native_gemm, "DEPTHWISE", False)
    x, w, b = rand(2, 8, 10, 10), rand(16, 1, 5, 5), rand(16)
    model = node_model("Conv", {"x": x}, group=8, pads=[2, 2, 2, 2])
    model.graph.node[0].input.extend(["w", "b"])
    model.graph.initializer.extend([numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    data = model.SerializeToString()
    sess = oxla.InferenceSession(data)
    # (a model this small has its weights compiled in as constants: plan.SMALL_WEIGHTS)
    native = any(n.op_type.startswith("Depthwise") for n in sess.compiled.plan.nodes)
    assert native or "w" + SUFFIX in sess.compiled.constants
    assert not native or kernel
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16", np.float64])
@pytest.mark.parametrize("case", ["taps-depthwise-3x3", "taps_flat-depthwise-5x5-same-upper",
                                  "native-dense-1x1", "split-groups-16-per-group"])
def test_conv_forms_dtypes(case: str, dtype: object) -> None:
    # onnxruntime's CPU Conv has no float64/bfloat16 kernels: compare with float64 numpy maths
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)  # type: ignore[call-overload]
    inputs, attrs = FORM_CASES[case]
    typed = {k: None if v is None else v.astype(dt) for k, v in inputs.items()}
    wide = {k: None if v is None else v.astype(np.float64) for k, v in typed.items()}
    got = check_node("Conv", typed, ort=False, reference=False, **attrs)[0]
    want = check_node("Conv", wide, ort=False, reference=True, rtol=1e-10, atol=1e-10, **attrs)[0]
    assert got.dtype == dt
    tol = 1e-10 if dt == np.float64 else 2e-2
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * np.abs(want).max())


def test_conv_float64() -> None:
    # onnxruntime's CPU provider has no float64 Conv
    x, w = rand(1, 2, 5, 5, dtype=np.float64), rand(2, 2, 2, 2, dtype=np.float64)
    got = check_node("Conv", {"x": x, "w": w}, ort=False, rtol=1e-12, atol=1e-12)
    assert got[0].dtype == np.float64


def test_conv_opset9_same_upper() -> None:
    check_node("Conv", {"x": X2, "w": W2}, opset=9, auto_pad="SAME_UPPER", rtol=1e-4, atol=1e-5)


def test_conv_channel_mismatch_message() -> None:
    with pytest.raises(LoweringError, match=r"X has 4 channels and W has shape \(6, 3, 3, 3\)"):
        check_node("Conv", {"x": X2, "w": rand(6, 3, 3, 3)})


XT = rand(1, 4, 3, 4)
CONV_TRANSPOSE = {
    "strides-pads-output-padding": ({"x": XT, "w": rand(4, 3, 3, 3), "b": rand(3)},
                                    {"strides": [3, 2], "pads": [1, 0, 1, 2],
                                     "output_padding": [1, 1]}),
    "output-shape": ({"x": rand(1, 4, 3, 3), "w": rand(4, 2, 3, 3)},
                     {"strides": [3, 2], "output_shape": [10, 8]}),
    "same-upper": ({"x": XT, "w": rand(4, 2, 3, 3)}, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same-lower": ({"x": XT, "w": rand(4, 2, 3, 3)}, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "1d": ({"x": rand(2, 3, 5), "w": rand(3, 2, 3)}, {"strides": [2]}),
    "3d": ({"x": rand(1, 2, 3, 3, 2), "w": rand(2, 2, 2, 3, 2)}, {"pads": [0, 1, 0, 0, 1, 1]}),
}


@pytest.mark.parametrize("case", CONV_TRANSPOSE, ids=lambda c: f"ConvTranspose-{c}")
def test_conv_transpose(case: str) -> None:
    inputs, attrs = CONV_TRANSPOSE[case]
    check_node("ConvTranspose", inputs, rtol=1e-4, atol=1e-5, **attrs)


@pytest.mark.parametrize("case", ["group-dilations", "output-shape-crops"])
def test_conv_transpose_against_onnxruntime(case: str) -> None:
    # onnx.reference mixes up the groups' weights and fails when output_shape crops the output
    if case == "group-dilations":
        inputs = {"x": XT, "w": rand(4, 2, 2, 3), "b": rand(4)}
        attrs: dict = {"group": 2, "dilations": [2, 1]}
    else:
        inputs = {"x": XT, "w": rand(4, 2, 3, 3)}
        attrs = {"strides": [3, 2], "output_shape": [10, 8]}
    check_node("ConvTranspose", inputs, reference=False, rtol=1e-4, atol=1e-5, **attrs)


# kernel == stride, no dilation: conv_forms.transposed_dot (one dot, then depth to space)
TRANSPOSED_DOT = {
    "2x2-s2-bias": ({"x": rand(2, 5, 3, 7), "w": rand(5, 3, 2, 2), "b": rand(3)}, {"strides": [2, 2]}),
    "4x4-s4": ({"x": rand(1, 3, 5, 2), "w": rand(3, 4, 4, 4)}, {"strides": [4, 4]}),
    "3x2-s3x2-pads": ({"x": XT, "w": rand(4, 3, 3, 2), "b": rand(3)},
                      {"strides": [3, 2], "pads": [1, 0, 2, 1]}),
    "output-padding": ({"x": XT, "w": rand(4, 2, 2, 2)},
                       {"strides": [2, 2], "output_padding": [1, 0], "pads": [0, 1, 0, 0]}),
    "same-upper": ({"x": XT, "w": rand(4, 2, 2, 2)}, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "1d": ({"x": rand(2, 3, 5), "w": rand(3, 2, 3)}, {"strides": [3]}),
    "3d": ({"x": rand(1, 2, 3, 2, 2), "w": rand(2, 3, 2, 1, 2), "b": rand(3)},
           {"strides": [2, 1, 2]}),
    "1x1-s1": ({"x": XT, "w": rand(4, 5, 1, 1)}, {}),
}


@pytest.mark.parametrize("case", TRANSPOSED_DOT, ids=lambda c: f"ConvTranspose-dot-{c}")
def test_conv_transpose_as_dot(case: str) -> None:
    inputs, attrs = TRANSPOSED_DOT[case]
    check_node("ConvTranspose", inputs, rtol=1e-4, atol=1e-5, **attrs)


TRANSPOSED_DOT_ORT = {  # onnx.reference mixes up the groups' weights and fails on a cropping
    # output_shape: onnxruntime only
    "group-2-pads": ({"x": rand(2, 8, 3, 5), "w": rand(8, 3, 2, 2), "b": rand(6)},
                     {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1]}),
    "depthwise": ({"x": rand(1, 4, 3, 5), "w": rand(4, 1, 2, 2)}, {"group": 4, "strides": [2, 2]}),
    "output-shape": ({"x": XT, "w": rand(4, 2, 2, 2), "b": rand(2)},
                     {"strides": [2, 2], "output_shape": [5, 8]}),
}


@pytest.mark.parametrize("case", TRANSPOSED_DOT_ORT, ids=lambda c: f"ConvTranspose-dot-{c}")
def test_conv_transpose_as_dot_against_onnxruntime(case: str) -> None:
    inputs, attrs = TRANSPOSED_DOT_ORT[case]
    check_node("ConvTranspose", inputs, reference=False, rtol=1e-4, atol=1e-5, **attrs)


def test_conv_transpose_opset10_same_upper_pads_the_end() -> None:
    # both onnxruntime and onnx.reference use v11's split for v1-v10 as well
    check_node("ConvTranspose", {"x": XT, "w": rand(4, 2, 3, 3)}, opset=10, strides=[2, 2],
               auto_pad="SAME_UPPER", rtol=1e-4, atol=1e-5)


XU = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
WI = RNG.integers(-100, 100, (3, 2, 3, 3)).astype(np.int8)


@pytest.mark.parametrize("zero_points", ["none", "scalar", "x-only"])
def test_conv_integer(zero_points: str) -> None:
    xz = None if zero_points == "none" else np.array(7, np.uint8)
    wz = np.array(3, np.int8) if zero_points == "scalar" else None
    got = check_node("ConvInteger", {"x": XU, "w": WI, "x_zero_point": xz, "w_zero_point": wz},
                     pads=[1, 1, 1, 1])
    assert got[0].dtype == np.int32


@pytest.mark.parametrize("kernel", [3, 1])
def test_conv_integer_depthwise_and_pointwise(kernel: int) -> None:
    # the int32 sums go through the same forms as Conv (taps for depthwise, dot for 1x1)
    x = RNG.integers(0, 255, (1, 4, 6, 5)).astype(np.uint8)
    wu = RNG.integers(0, 255, (4, 4 if kernel == 1 else 1, kernel, kernel)).astype(np.uint8)
    attrs = {"group": 1 if kernel == 1 else 4, "pads": [kernel // 2] * 4}
    got = check_node("ConvInteger", {"x": x, "w": wu, "x_zero_point": np.array(3, np.uint8),
                                     "w_zero_point": np.array(7, np.uint8)}, **attrs)
    assert got[0].dtype == np.int32


def test_conv_integer_per_channel_w_zero_point() -> None:
    wu = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    wz = np.array([1, 128, 255], np.uint8)
    # onnxruntime's ConvInteger takes a scalar w_zero_point only
    check_node("ConvInteger", {"x": XU, "w": wu, "x_zero_point": np.array(9, np.uint8),
                               "w_zero_point": wz}, ort=False)


def _deform_inputs(offset_group: int, mask: bool, out: tuple[int, int]) -> dict:
    return {"x": rand(1, 4, 5, 6), "w": rand(2, 2, 2, 3),
            "offset": rand(1, offset_group * 12, *out) * 1.5, "b": rand(2),
            "mask": RNG.uniform(size=(1, offset_group * 6, *out)).astype(np.float32)
            if mask else None}


@pytest.mark.parametrize("case", ["plain", "mask-offset-groups"])
def test_deform_conv(case: str) -> None:
    if case == "plain":
        inputs = _deform_inputs(1, False, (4, 4))
        attrs: dict = {"group": 2}
    else:
        inputs = _deform_inputs(2, True, (3, 2))
        attrs = {"group": 2, "offset_group": 2, "strides": [2, 2], "pads": [1, 0, 1, 1],
                 "dilations": [1, 2]}
    check_node("DeformConv", inputs, rtol=1e-4, atol=1e-5, **attrs)


@pytest.mark.parametrize("case", ["2d", "3d"])
def test_col2im(case: str) -> None:
    if case == "2d":  # image 5x6, block 2x3, pads, strides, dilations -> 3 x 2 blocks
        inputs = {"x": rand(2, 3 * 6, 6), "image_shape": np.array([5, 6], np.int64),
                  "block_shape": np.array([2, 3], np.int64)}
        attrs = {"pads": [1, 0, 0, 1], "strides": [2, 2], "dilations": [1, 2]}
    else:
        inputs = {"x": rand(1, 2 * 8, 2 * 3 * 1), "image_shape": np.array([3, 4, 3], np.int64),
                  "block_shape": np.array([2, 2, 2], np.int64)}
        attrs = {"strides": [1, 1, 2]}
    check_node("Col2Im", inputs, **attrs)
