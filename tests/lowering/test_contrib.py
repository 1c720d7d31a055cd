"""com.microsoft fusion rules (and ORT's default-domain norms) against onnxruntime, the oracle.

onnx's reference evaluator does not know these ops. BiasAdd and BiasSplitGelu have only CUDA
kernels in onnxruntime: they are checked against their documented formula in numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

from oxla.dtypes import to_onnx_type
from oxla.errors import LoweringError
from oxla.lowering.registry import all_rules
from tests.lowering.util import assert_close, node_model, run_onnxruntime, run_oxla

MS = "com.microsoft"
RNG = np.random.default_rng(0)
F16 = dict(rtol=1e-3, atol=1e-3)  # one float16 ulp: both sides round one float32 result


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def check_ms(op: str, inputs: dict[str, np.ndarray | None], outputs: tuple[str, ...] = ("y",), *,
             domain: str = MS, opset: int | None = None, rtol: float = 1e-5, atol: float = 1e-6,
             output_types: dict[str, Any] | None = None, **attrs: Any) -> list[Any]:
    """Run a one-node model with oxla and onnxruntime and compare every output.

    output_types declares outputs whose type onnxruntime cannot infer (a free type parameter).
    """
    model = node_model(op, inputs, outputs, opset=opset, domain=domain, **attrs)
    named = [o for o in model.graph.output if o.name]  # "" leaves an optional output out
    for o in named:
        if output_types and o.name in output_types:
            o.type.tensor_type.elem_type = to_onnx_type(np.dtype(output_types[o.name]))
    del model.graph.output[:]
    model.graph.output.extend(named)
    got = run_oxla(model, inputs)
    assert_close(got, run_onnxruntime(model, inputs), rtol, atol)
    return got


def tol(dtype: Any) -> dict[str, float]:
    return F16 if dtype == np.float16 else dict(rtol=1e-5, atol=1e-5)


DTYPES = [np.float32, np.float16]
DT_IDS = ["f32", "f16"]


# --- GELU family ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_gelu_family(dtype: Any) -> None:
    x, bias = rand(2, 3, 8, dtype=dtype) * 3, rand(8, dtype=dtype)
    check_ms("Gelu", {"x": x}, **tol(dtype))
    check_ms("BiasGelu", {"a": x, "b": bias}, **tol(dtype))
    check_ms("FastGelu", {"x": x}, **tol(dtype))
    check_ms("FastGelu", {"x": x, "bias": bias}, **tol(dtype))
    check_ms("QuickGelu", {"x": x}, **tol(dtype))
    check_ms("QuickGelu", {"x": x}, alpha=0.5, **tol(dtype))


def test_bias_add_and_bias_split_gelu_match_their_formulas() -> None:
    # onnxruntime has only CUDA kernels for these two: the documented formula is the oracle
    x, bias, skip = rand(2, 4, 6), rand(6), rand(2, 4, 6)
    (y,) = run_oxla(node_model("BiasAdd", {"x": x, "b": bias, "s": skip}, domain=MS),
                    {"x": x, "b": bias, "s": skip})
    np.testing.assert_allclose(y, x + bias + skip, rtol=1e-6)
    (y,) = run_oxla(node_model("BiasSplitGelu", {"x": x, "b": bias}, domain=MS), {"x": x, "b": bias})
    left, right = np.split((x + bias).astype(np.float64), 2, axis=-1)
    from scipy.special import erf
    want = left * 0.5 * right * (1 + erf(right / np.sqrt(2)))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


# --- layer normalizations -------------------------------------------------------------------

SLN_OUTS = ("y", "mean", "inv_std_var", "sum")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("skip_shape", [(2, 3, 16), (1, 3, 16), (3, 16)], ids=["full", "1SH", "SH"])
def test_skip_layer_normalization_all_outputs(dtype: Any, skip_shape: tuple[int, ...]) -> None:
    x, skip = rand(2, 3, 16, dtype=dtype), rand(*skip_shape, dtype=dtype)
    gamma, beta, bias = rand(16, dtype=dtype), rand(16, dtype=dtype), rand(16, dtype=dtype)
    check_ms("SkipLayerNormalization", {"x": x, "skip": skip, "gamma": gamma, "beta": beta,
                                        "bias": bias}, SLN_OUTS, epsilon=1e-5, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_skip_layer_normalization_optional_inputs_absent(dtype: Any) -> None:
    x, skip, gamma = rand(2, 3, 16, dtype=dtype), rand(2, 3, 16, dtype=dtype), rand(16, dtype=dtype)
    check_ms("SkipLayerNormalization", {"x": x, "skip": skip, "gamma": gamma}, **tol(dtype))
    check_ms("SkipLayerNormalization", {"x": x, "skip": skip, "gamma": gamma, "beta": None,
                                        "bias": rand(16, dtype=dtype)}, ("y", "", "", "sum"),
             **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_skip_simplified_layer_normalization(dtype: Any) -> None:
    x, skip, gamma = rand(2, 3, 16, dtype=dtype), rand(2, 3, 16, dtype=dtype), rand(16, dtype=dtype)
    check_ms("SkipSimplifiedLayerNormalization", {"x": x, "skip": skip, "gamma": gamma,
                                                  "bias": rand(16, dtype=dtype)}, SLN_OUTS,
             **tol(dtype))
    check_ms("SkipSimplifiedLayerNormalization", {"x": x[0], "skip": skip[0], "gamma": gamma},
             epsilon=1e-6, **tol(dtype))


@pytest.mark.parametrize("x_dtype, scale_dtype", [(np.float32, np.float32), (np.float16, np.float16),
                                                  (np.float32, np.float16)],
                         ids=["f32", "f16", "f32-f16"])
def test_simplified_layer_normalization(x_dtype: Any, scale_dtype: Any) -> None:
    x, scale = rand(2, 3, 16, dtype=x_dtype), rand(16, dtype=scale_dtype)
    check_ms("SimplifiedLayerNormalization", {"x": x, "scale": scale}, ("y", "inv_std_var"),
             domain="", opset=14, **tol(np.float16 if np.float16 in (x_dtype, scale_dtype) else x_dtype))
    check_ms("SimplifiedLayerNormalization", {"x": x, "scale": rand(3, 16, dtype=scale_dtype)},
             domain="", opset=14, axis=-2, epsilon=1e-3,
             **tol(np.float16 if np.float16 in (x_dtype, scale_dtype) else x_dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("opset", [14, 16])
def test_layer_normalization_below_opset_17(dtype: Any, opset: int) -> None:
    x, scale, b = rand(2, 3, 16, dtype=dtype), rand(16, dtype=dtype), rand(16, dtype=dtype)
    check_ms("LayerNormalization", {"x": x, "scale": scale, "b": b}, ("y", "mean", "inv_std"),
             domain="", opset=opset, **tol(dtype))
    check_ms("LayerNormalization", {"x": x, "scale": rand(3, 16, dtype=dtype)}, domain="",
             opset=opset, axis=1, epsilon=1e-3, **tol(dtype))


# --- FusedMatMul, FusedGemm, FusedConv ------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("a_shape, b_shape, attrs", [
    ((2, 3, 4), (4, 5), {}),
    ((2, 4, 3), (2, 5, 4), {"transA": 1, "transB": 1, "alpha": 0.25}),
    ((2, 3, 4, 5), (3, 4, 5, 6), {"transBatchA": 1}),
    ((2, 3, 4, 5), (6, 2, 3, 5), {"transBatchB": 1, "transB": 1, "alpha": 2.0}),
    ((5, 3, 4, 2), (3, 4, 5, 6), {"transBatchA": 1, "transA": 1}),
    ((3, 4), (4,), {"alpha": 0.0}),
], ids=["plain", "trans-alpha", "transBatchA", "transBatchB-transB", "transBatchA-transA", "vector"])
def test_fused_mat_mul(dtype: Any, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                       attrs: dict[str, Any]) -> None:
    check_ms("FusedMatMul", {"a": rand(*a_shape, dtype=dtype), "b": rand(*b_shape, dtype=dtype)},
             **attrs, **tol(dtype))


def test_fused_mat_mul_trans_batch_needs_equal_ranks() -> None:
    a, b = rand(4, 5), rand(3, 5, 6)
    with pytest.raises(LoweringError, match="transBatchA / transBatchB need inputs of one rank"):
        run_oxla(node_model("FusedMatMul", {"a": a, "b": b}, domain=MS, transBatchA=1), {"a": a, "b": b})


@pytest.mark.parametrize("activation, kwargs", [
    ("Relu", {}), ("Tanh", {}), ("Sigmoid", {}), ("Softplus", {}), ("Softsign", {}),
    ("LeakyRelu", {"activation_alpha": 0.2}), ("Elu", {"activation_alpha": 0.5}),
    ("ThresholdedRelu", {"activation_alpha": 0.1}),
    ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
    ("ScaledTanh", {"activation_alpha": 1.5, "activation_beta": 0.5}),
    ("ParametricSoftplus", {"activation_alpha": 1.5, "activation_beta": 0.5}),
    ("Selu", {"activation_alpha": 1.6, "activation_gamma": 1.1}),
])
def test_fused_gemm_activations(activation: str, kwargs: dict[str, Any]) -> None:
    a, b, c = rand(3, 4), rand(5, 4), rand(5)
    check_ms("FusedGemm", {"a": a, "b": b, "c": c}, activation=activation, transB=1, alpha=0.5,
             beta=2.0, **kwargs)


def test_fused_gemm_activation_needs_its_parameters() -> None:
    a, b = rand(3, 4), rand(4, 5)
    with pytest.raises(LoweringError, match="activation HardSigmoid needs activation_alpha and "
                                            "activation_beta"):
        run_oxla(node_model("FusedGemm", {"a": a, "b": b}, domain=MS, activation="HardSigmoid"),
                 {"a": a, "b": b})


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("activation, params, z", [
    ("Relu", None, False), ("Tanh", None, True), ("Sigmoid", None, False),
    ("LeakyRelu", [0.1], True), ("Clip", [-0.5, 0.7], False), ("HardSigmoid", [0.3, 0.4], True),
    (None, None, True),
], ids=["relu", "tanh-z", "sigmoid", "leaky-z", "clip", "hardsigmoid-z", "identity-z"])
def test_fused_conv(dtype: Any, activation: str | None, params: list[float] | None, z: bool) -> None:
    x, w, b = rand(1, 4, 7, 7, dtype=dtype), rand(6, 2, 3, 3, dtype=dtype), rand(6, dtype=dtype)
    attrs: dict[str, Any] = {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2]}
    if activation is not None:
        attrs["activation"] = activation
    if params is not None:
        attrs["activation_params"] = params
    inputs = {"x": x, "w": w, "b": b, "z": rand(1, 6, 4, 7, dtype=dtype) if z else None}
    check_ms("FusedConv", inputs, rtol=1e-3 if dtype == np.float16 else 1e-5, atol=2e-3, **attrs)


def test_fused_conv_activation_params_count() -> None:
    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3)
    with pytest.raises(LoweringError, match="activation Clip takes 2 activation_params, got 1"):
        run_oxla(node_model("FusedConv", {"x": x, "w": w}, domain=MS, activation="Clip",
                            activation_params=[0.0]), {"x": x, "w": w})


# --- EmbedLayerNormalization ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("segments, mask, positions", [
    (True, True, False), (False, False, False), (True, False, True), (False, True, "1S"),
], ids=["segment-mask", "bare", "position_ids", "position_ids-1S"])
def test_embed_layer_normalization(dtype: Any, segments: bool, mask: bool, positions: Any) -> None:
    batch, seq, hidden = 2, 5, 16
    ids = RNG.integers(0, 11, (batch, seq)).astype(np.int32)
    mask_v = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    pos = RNG.integers(0, 8, (1 if positions == "1S" else batch, seq)).astype(np.int32)
    inputs = {
        "input_ids": ids,
        "segment_ids": RNG.integers(0, 2, (batch, seq)).astype(np.int32) if segments else None,
        "word_embedding": rand(11, hidden, dtype=dtype),
        "position_embedding": rand(8, hidden, dtype=dtype),
        "segment_embedding": rand(2, hidden, dtype=dtype) if segments else None,
        "gamma": rand(hidden, dtype=dtype), "beta": rand(hidden, dtype=dtype),
        "mask": mask_v if mask else None,
        "position_ids": pos if positions else None,
    }
    while inputs[next(reversed(inputs))] is None:
        inputs.popitem()
    check_ms("EmbedLayerNormalization", inputs, ("y", "mask_index", "embedding_sum"),
             epsilon=1e-5, **tol(dtype))


# --- registry -------------------------------------------------------------------------------


def _ort_schema_defaults() -> dict[tuple[str, str, int], dict[str, Any]]:
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    found: dict[tuple[str, str, int], dict[str, Any]] = {}
    for s in C.get_all_operator_schema():
        attrs = {}
        for a in s.attributes.values():
            proto = onnx.AttributeProto()
            proto.ParseFromString(a._default_value)
            attrs[a.name] = onnx.helper.get_attribute_value(proto) if proto.type else None
        found[(s.domain, s.name, s.since_version)] = attrs
    return found


def test_contrib_rule_attributes_match_onnxruntime_schemas() -> None:
    schemas = _ort_schema_defaults()
    ort_default_domain = {("", "SimplifiedLayerNormalization", 1), ("", "LayerNormalization", 1)}
    rules = [r for r in all_rules()
             if r.domain == MS or (r.domain, r.op_type, r.since) in ort_default_domain]
    assert len(rules) >= 12
    for r in rules:
        want = schemas[(r.domain, r.op_type, 1)]
        assert set(r.attrs) == set(want), f"{r.op_type}: {set(r.attrs) ^ set(want)}"
        for name, default in want.items():
            if default is None:
                continue
            got = r.attrs[name]
            if isinstance(default, bytes):
                assert got == default.decode(), f"{r.op_type}.{name}: {got} != {default!r}"
            else:
                assert got == pytest.approx(default, rel=1e-6), f"{r.op_type}.{name}: {got} != {default}"
