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
