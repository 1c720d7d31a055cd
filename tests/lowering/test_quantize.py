"""Quantization rules against onnx.reference and onnxruntime (and hand-computed values)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from oxla.errors import InvalidModelError, LoweringError
from tests.lowering.util import check_node, node_model, run_oxla

RNG = np.random.default_rng(0)
X = (RNG.standard_normal((2, 3, 4)) * 20).astype(np.float32)
S3 = np.array([0.5, 1.0, 2.0], np.float32)
OPSET = 25  # the newest opset onnxruntime 1.32 implements for these ops


def check(op: str, feeds: dict, *args: object, **kwargs: object) -> list:
    kwargs.setdefault("opset", OPSET)
    return check_node(op, feeds, *args, **kwargs)


def f32(*v: float) -> np.ndarray:
    return np.array(v, np.float32)


def test_quantize_rounds_half_to_even_and_saturates() -> None:
    x = f32(0.5, 1.5, 2.5, -0.5, -1.5, 300, -300)
    got = check("QuantizeLinear", {"x": x, "s": np.array(1, np.float32), "zp": np.array(0, np.int8)})
    assert got[0].tolist() == [0, 2, 2, 0, -2, 127, -128]


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 25])
def test_quantize_per_tensor_uint8(opset: int) -> None:
    check("QuantizeLinear", {"x": X, "s": np.array(0.3, np.float32), "zp": np.array(128, np.uint8)}, opset=opset)


def test_quantize_without_zero_point_is_uint8() -> None:
    got = check("QuantizeLinear", {"x": np.abs(X), "s": np.array(0.7, np.float32), "zp": None})
    assert got[0].dtype == np.uint8


@pytest.mark.parametrize("axis", [1, -2])
def test_quantize_per_axis(axis: int) -> None:
    zp = np.array([-3, 0, 5], np.int8)
    check("QuantizeLinear", {"x": X, "s": S3, "zp": zp}, axis=axis)


@pytest.mark.parametrize("target", [np.int16, np.uint16])
def test_quantize_16_bit(target: type) -> None:
    check("QuantizeLinear", {"x": X * 1000, "s": np.array(0.25, np.float32), "zp": np.array(7, target)})


def test_quantize_output_dtype_without_zero_point() -> None:
    got = check("QuantizeLinear", {"x": X, "s": np.array(0.5, np.float32), "zp": None},
                     output_dtype=TensorProto.INT8)
    assert got[0].dtype == np.int8


def test_quantize_blocked_int4() -> None:
    x = RNG.standard_normal((3, 5)).astype(np.float32) * 4
    scale = np.abs(RNG.standard_normal((3, 3))).astype(np.float32) + 0.5
    zp = np.zeros((3, 3), ml_dtypes.int4)
    # onnxruntime's Python binding cannot take int4 arrays as inputs
    check("QuantizeLinear", {"x": x, "s": scale, "zp": zp}, ort=False, axis=1, block_size=2)


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("target", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2])
def test_quantize_float8_saturate(saturate: int, target: int) -> None:
    x = f32(0.3, -1.7, 500, -1e5, 1e6, np.inf)
    # onnxruntime's Python binding returns float8 outputs only as raw bytes
    got = check("QuantizeLinear", {"x": x, "s": np.array(1, np.float32), "zp": None}, ort=False,
                     output_dtype=target, saturate=saturate)
    top = float(ml_dtypes.finfo(got[0].dtype).max)
    big = got[0].astype(np.float32)[2:]
    assert np.all(np.abs(big[big == big]) <= top) if saturate else not np.all(np.isfinite(big))


def test_quantize_precision_attribute() -> None:
    x = f32(1.0, 2.0, 3.0, 1000.0)
    check("QuantizeLinear", {"x": x, "s": np.array(0.1, np.float16), "zp": np.array(0, np.int16)}, ort=False,
               opset=23, precision=TensorProto.FLOAT)


def test_quantize_errors() -> None:
    bad_axis = node_model("QuantizeLinear", {"x": X, "s": S3}, axis=3)
    with pytest.raises(LoweringError, match="axis 3 is out of range"):
        run_oxla(bad_axis, {"x": X, "s": S3})
    bad_len = {"x": X, "s": f32(1, 2)}
    with pytest.raises(LoweringError, match="must be a scalar or 1-D of length 3"):
        run_oxla(node_model("QuantizeLinear", bad_len, axis=1), bad_len)
    both = {"x": X, "s": np.array(1, np.float32), "zp": np.array(0, np.uint8)}
    with pytest.raises(LoweringError, match="differs from the zero point's type"):
        run_oxla(node_model("QuantizeLinear", both, output_dtype=TensorProto.INT8), both)


@pytest.mark.parametrize("opset", [10, 13, 21])
def test_dequantize_per_tensor(opset: int) -> None:
    x = RNG.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    feeds = {"x": x, "s": np.array(0.1, np.float32), "zp": np.array(-5, np.int8)}
    # onnx.reference implements DequantizeLinear from opset 19 only
    check("DequantizeLinear", feeds, opset=opset, reference=opset >= 19)


def test_dequantize_per_axis_negative() -> None:
    x = RNG.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    check("DequantizeLinear", {"x": x, "s": S3, "zp": np.array([1, 2, 3], np.uint8)}, axis=-2)


def test_dequantize_int32_without_zero_point() -> None:
    x = np.array([-1000, 0, 123456], np.int32)
    check("DequantizeLinear", {"x": x, "s": np.array(0.5, np.float32), "zp": None})


def test_dequantize_blocked() -> None:
    x = RNG.integers(-128, 128, (2, 6)).astype(np.int8)
    scale = f32(1, 2, 3, 4, 5, 6).reshape(2, 3)
    check("DequantizeLinear", {"x": x, "s": scale, "zp": None}, axis=1, block_size=2)


def test_dequantize_float8_to_float16_scale_type() -> None:
    x = f32(0.5, -3, 448).astype(ml_dtypes.float8_e4m3fn)
    got = check("DequantizeLinear", {"x": x, "s": np.array(2, np.float16), "zp": None}, ort=False)
    assert got[0].dtype == np.float16 and got[0].tolist() == [1.0, -6.0, 896.0]


def test_dequantize_output_dtype() -> None:
    x = RNG.integers(0, 256, (4,)).astype(np.uint8)
    got = check("DequantizeLinear", {"x": x, "s": np.array(0.5, np.float32), "zp": np.array(3, np.uint8)},
                     ort=False, opset=23, output_dtype=TensorProto.FLOAT16)
    assert got[0].dtype == np.float16


def test_dequantize_zero_point_type_must_match() -> None:
    feeds = {"x": np.array([1, 2], np.uint8), "s": np.array(1, np.float32), "zp": np.array(0, np.int8)}
    with pytest.raises(InvalidModelError, match=r"\('x_zero_point'\) is tensor\(int8\) but input 'x' is tensor\(uint8\)"):
        run_oxla(node_model("DequantizeLinear", feeds), feeds)


@pytest.mark.parametrize("x", [X, np.abs(X) + 1, -np.abs(X)], ids=["mixed", "positive", "negative"])
def test_dynamic_quantize_linear(x: np.ndarray) -> None:
    check("DynamicQuantizeLinear", {"x": x}, ("y", "scale", "zp"))


def test_dynamic_quantize_linear_all_zeros() -> None:
    # the formula divides by a zero range there: onnxruntime takes scale 1 (onnx.reference 1/255)
    got = check("DynamicQuantizeLinear", {"x": np.zeros(3, np.float32)}, ("y", "scale", "zp"),
                reference=False)
    assert got[0].tolist() == [0, 0, 0] and got[1] == 1 and got[2] == 0


def _qmm_inputs(dtype: type, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> dict:
    lo, hi = (0, 256) if dtype is np.uint8 else (-128, 128)
    return {"a": RNG.integers(lo, hi, shape_a).astype(dtype), "sa": np.array(0.02, np.float32),
            "za": np.array(3, dtype), "b": RNG.integers(lo, hi, shape_b).astype(dtype),
            "sb": np.array(0.03, np.float32), "zb": np.array(1, dtype), "sy": np.array(0.5, np.float32),
            "zy": np.array(10, dtype)}


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shapes", [((3, 5), (5, 4)), ((2, 3, 5), (2, 5, 4))], ids=["2d", "3d"])
def test_qlinear_matmul(dtype: type, shapes: tuple) -> None:
    check("QLinearMatMul", _qmm_inputs(dtype, *shapes))


def test_qlinear_matmul_per_row_and_column() -> None:
    feeds = _qmm_inputs(np.uint8, (3, 5), (5, 4))
    feeds["sa"], feeds["za"] = f32(0.01, 0.02, 0.03), np.array([1, 2, 3], np.uint8)
    feeds["sb"], feeds["zb"] = f32(0.1, 0.2, 0.3, 0.4), np.array([0, 1, 2, 3], np.uint8)
    got = check("QLinearMatMul", feeds, reference=False, ort=False)[0]
    a = feeds["a"].astype(np.float64) - feeds["za"][:, None]
    b = feeds["b"].astype(np.float64) - feeds["zb"]
    want = (a @ b) * feeds["sa"][:, None] * feeds["sb"] / feeds["sy"] + 10
    # oxla requantizes in float32 as onnxruntime's kernel does; this float64 reference can land on
    # the other side of a rounding tie: one quantization step at most
    np.testing.assert_allclose(got, np.clip(np.rint(want), 0, 255), atol=1)


# weights stay within +-60: onnxruntime's u8 x s8 kernels saturate pairwise int16 sums beyond that
QCONV = {"x": RNG.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8), "sx": np.array(0.05, np.float32),
         "zx": np.array(120, np.uint8), "w": RNG.integers(-60, 60, (6, 2, 3, 3)).astype(np.int8),
         "sw": f32(0.01, 0.02, 0.03, 0.01, 0.02, 0.03), "zw": np.zeros(6, np.int8),
         "sy": np.array(0.2, np.float32), "zy": np.array(100, np.uint8), "B": RNG.integers(-500, 500, 6).astype(np.int32)}


@pytest.mark.parametrize("attrs", [{"group": 2, "pads": (1, 1, 1, 1)},
                                   {"group": 2, "strides": (2, 2), "auto_pad": "SAME_UPPER"},
                                   {"group": 2, "dilations": (2, 2)}],
                         ids=["pads", "same_upper", "dilations"])
def test_qlinear_conv(attrs: dict) -> None:
    check("QLinearConv", QCONV, **attrs)


def test_qlinear_conv_no_bias_per_tensor() -> None:
    feeds = {**QCONV, "sw": np.array(0.02, np.float32), "zw": np.array(0, np.int8), "B": None,
             "w": QCONV["w"].reshape(3, 4, 3, 3)}
    check("QLinearConv", feeds)


def test_dequantized_sum_rounds_each_product() -> None:
    # DQ(a) + DQ(b) in float32 as onnxruntime computes it: each product rounded, then the sum.
    # An FMA of one product with the other term (what XLA:CPU makes of a float32 multiply and
    # add) differs in about a quarter of these elements.
    import onnx
    from onnx import helper, numpy_helper

    import oxla

    shape = [1, 64, 56, 56]
    rng = np.random.default_rng(3)
    a, b = (rng.integers(0, 256, shape).astype(np.uint8) for _ in range(2))
    sa, sb, za, zb = np.float32(0.0312345), np.float32(0.0171717), np.uint8(7), np.uint8(130)
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v), n) for v, n in ((sa, "sa"), (za, "za"), (sb, "sb"), (zb, "zb"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.UINT8, shape) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    got = oxla.InferenceSession(model.SerializeToString()).run(None, {"a": a, "b": b})[0]
    want = (a.astype(np.float32) - np.float32(za)) * sa + (b.astype(np.float32) - np.float32(zb)) * sb
    np.testing.assert_array_equal(got, want)
    assert onnx.checker.check_model(model) is None
