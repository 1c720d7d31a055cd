"""QDQConvToIntegerPass: DequantizeLinear -> Conv groups run as ConvInteger with one scale product."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla.lowering.context import Options
from oxla.passes.qdq_conv import qdq_conv_to_integer

F32 = np.float32


def _model(*, w_dtype: type = np.int8, x_dtype: type = np.uint8, per_channel_zp: bool = False,
           group: int = 1, bias: bool = True, scale_dtype: type = F32, pads: int = 1,
           w_axis: int = 0) -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> Conv(DQ(w), DQ(b)) -> QuantizeLinear -> DQ -> y."""
    rng = np.random.default_rng(5)
    c, m = 4, 6 if group == 1 else 4
    lo, hi = (-127, 127) if w_dtype == np.int8 else (0, 255)
    w = rng.integers(lo, hi, (m, c // group, 3, 3)).astype(w_dtype)
    wz = (rng.integers(lo // 8, hi // 8, m) if per_channel_zp else np.zeros(m, np.int64)).astype(w_dtype)
    if not per_channel_zp:
        wz = wz[:1].reshape(()) if w_dtype == np.int8 else np.array(128, w_dtype)
    x_zp = np.array(131 if x_dtype == np.uint8 else -3, x_dtype)  # padding must be with the zero point
    inits = [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(wz, "wz"),
             numpy_helper.from_array(rng.uniform(0.001, 0.01, m).astype(scale_dtype), "ws"),
             numpy_helper.from_array(np.array(0.037, scale_dtype), "xs"),
             numpy_helper.from_array(x_zp, "xz"),
             numpy_helper.from_array(np.array(0.05, F32), "ys"),
             numpy_helper.from_array(np.array(128, np.uint8), "yz")]
    conv_in = ["xd", "w"]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=w_axis)]
    if bias:
        inits += [numpy_helper.from_array(rng.integers(-3000, 3000, m).astype(np.int32), "bq"),
                  numpy_helper.from_array((0.037 * rng.uniform(0.001, 0.01, m)).astype(F32), "bs")]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"], axis=0))
        conv_in.append("b")
    nodes += [helper.make_node("Conv", conv_in, ["c"], pads=[pads] * 4, group=group),
              helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
              helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
              helper.make_node("Identity", ["c"], ["conv"])]
    out_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", out_type, [2, 4, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("conv", out_type, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


FORMS = {
    "int8-weights-uint8-x": {},
    "per-channel-zero-points": {"per_channel_zp": True},
    "uint8-weights-int8-x": {"w_dtype": np.uint8, "x_dtype": np.int8},
    "depthwise": {"group": 4},
    "no-bias-no-pads": {"bias": False, "pads": 0},
}


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_rewritten_conv_agrees_with_the_float_graph(form: str) -> None:
    model = _model(**FORMS[form])
    x = (np.random.default_rng(6).standard_normal((2, 4, 7, 7)) * 3).astype(F32)
    written = oxla.CompiledModel(model)({"x": x})  # no load passes: the float convolution
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    ops = [n.op_type for n in session.plan.nodes]
    assert "ConvInteger" in ops and "Conv" not in ops
    got = session({"x": x})
    # the same real value rounded differently: float32 ulps before the next QuantizeLinear
    np.testing.assert_allclose(np.asarray(got["conv"]), np.asarray(written["conv"]), rtol=1e-5, atol=1e-6)
    steps = np.abs(np.asarray(got["y"]) - np.asarray(written["y"])) / F32(0.05)
    assert steps.max() <= 1.0 + 1e-6 and np.mean(steps > 0.5) < 0.01


@pytest.mark.parametrize("form", [{"scale_dtype": np.float16}, {"w_axis": 1}],
                         ids=["float16-scales", "weights-quantized-on-axis-1"])
def test_other_forms_stay_float_convolutions(form: dict) -> None:
    model = _model(**form)
    assert qdq_conv_to_integer(model) == 0
    assert "Conv" in [n.op_type for n in model.graph.node]


def test_weights_that_can_be_fed_stay_float_convolutions() -> None:
    model = _model()
    model.graph.input.append(helper.make_tensor_value_info("wq", TensorProto.INT8, [6, 4, 3, 3]))
    assert qdq_conv_to_integer(model) == 0


def test_unused_quantized_weights_are_dropped() -> None:
    model = _model()
    assert qdq_conv_to_integer(model) == 1
    names = {t.name for t in model.graph.initializer}
    # the centered form reads no weight zero point: wz goes with the weights' DequantizeLinear
    assert {"wq", "xz"} <= names and not {"ws", "bq", "bs", "wz"} & names
    assert [n.op_type for n in model.graph.node].count("DequantizeLinear") == 1  # y's


CENTERED = {
    "uint8-x-padded": ({}, ["Pad", "Cast", "Sub", "Cast", "ConvInteger", "Add"]),
    "uint8-x-unpadded": ({"pads": 0, "bias": False}, ["Cast", "Sub", "Cast", "ConvInteger", "Add"]),
    "int8-x-int8-weights": ({"x_dtype": np.int8}, ["Pad", "ConvInteger", "Add"]),
}


@pytest.mark.parametrize("form", CENTERED, ids=list(CENTERED))
def test_centered_form_equals_the_zero_point_form(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Symmetric weights: ConvInteger on x shifted to int8 and padded with the zero point, plus
    the weights' row sums folded at load, is bit for bit ConvInteger with zero points."""
    kwargs, ops = CENTERED[form]
    model = _model(**kwargs)
    x = (np.random.default_rng(7).standard_normal((2, 4, 7, 7)) * 3).astype(F32)
    session = oxla.CompiledModel(model, Options(layout_weights=True))
    plan = [n.op_type for n in session.plan.nodes]
    start = plan.index(ops[0], plan.index("QuantizeLinear") + 1)
    assert plan[start:start + len(ops)] == ops
    conv = next(n for n in session.plan.nodes if n.op_type == "ConvInteger")
    assert len(conv.input) == 2 and not any(a.name == "pads" for a in conv.attribute)
    got = session({"x": x})
    monkeypatch.setattr("oxla.passes.qdq_conv.centered_conv", lambda *args: None)
    zero_points = oxla.CompiledModel(_model(**kwargs), Options(layout_weights=True))
    assert len(next(n for n in zero_points.plan.nodes if n.op_type == "ConvInteger").input) == 4
    want = zero_points({"x": x})
    for name in ("conv", "y"):
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))


def test_old_opsets_keep_the_zero_point_form() -> None:
    model = _model()
    model.opset_import[0].version = 12
    assert qdq_conv_to_integer(model) == 1
    conv = next(n for n in model.graph.node if n.op_type == "ConvInteger")
    assert len(conv.input) == 4


@pytest.mark.parametrize("form", ["int8-weights-uint8-x", "uint8-weights-int8-x", "no-bias-no-pads"])
def test_scale_product_goes_through_float32_then_float64(form: str) -> None:
    """acc -> float32 -> float64, times the float64 scale, back to float32: the float32 product."""
    session = oxla.CompiledModel(_model(**FORMS[form]), Options(layout_weights=True))
    casts = [a.i for n in session.plan.nodes if n.op_type == "Cast" for a in n.attribute]
    run = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT]
    assert any(casts[i:i + 3] == run for i in range(len(casts))), casts


def test_float64_scale_product_equals_the_float32_product_for_every_int32() -> None:
    """The identity the passes rely on, over the whole int32 range (above 2^24 the cast to
    float32 rounds acc first, as float32 arithmetic does; a direct int32 -> float64 would not)."""
    rng = np.random.default_rng(9)
    acc = np.concatenate([rng.integers(-2**31, 2**31, 200_000), rng.integers(-2**25, 2**25, 200_000),
                          np.array([2**24 + 1, -(2**24 + 3), 2**31 - 1, -2**31])]).astype(np.int32)
    scale = (np.abs(rng.standard_normal(acc.size)) * 1e-3).astype(F32)
    want = acc.astype(F32) * scale
    got = (acc.astype(F32).astype(np.float64) * scale.astype(np.float64)).astype(F32)
    np.testing.assert_array_equal(got, want)
    direct = (acc.astype(np.float64) * scale.astype(np.float64)).astype(F32)
    assert (direct != want).any()  # why the float32 step is there
