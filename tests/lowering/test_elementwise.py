"""Elementwise rules against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.lowering.util import check_node, node_model, run_onnxruntime, run_oxla

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4)).astype(np.float32)
Y = RNG.standard_normal((4,)).astype(np.float32)


@pytest.mark.parametrize("op", ["Abs", "Neg", "Exp", "Sin", "Cos", "Tanh", "Sigmoid", "Relu",
                                "Erf", "Floor", "Ceil", "Round", "Sign", "Softsign", "Softplus"])
def test_unary(op: str) -> None:
    check_node(op, {"x": X})


def test_float32_sigmoid_is_onnxruntimes() -> None:
    # MLAS's rational logistic: the same float32 as onnxruntime's Sigmoid, ends and NaN included
    x = np.concatenate([np.linspace(-25, 25, 200_001, dtype=np.float32),
                        np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, 88, -88, 1e30])])
    model = node_model("Sigmoid", {"x": x})
    got, want = np.asarray(run_oxla(model, {"x": x})[0]), run_onnxruntime(model, {"x": x})[0]
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert np.count_nonzero(~same) <= 2, x[~same]
    assert np.abs(got - want)[~np.isnan(x)].max() <= 1.2e-7
    exact = 1 / (1 + np.exp(-np.clip(x, -25, 25).astype(np.float64)))
    assert np.nanmax(np.abs(got - exact)) < 3e-7


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_sigmoid_of_other_floats(dtype: type) -> None:
    tol = 1e-3 if dtype == np.float16 else 1e-12  # float16: one ulp (2^-11 relative)
    check_node("Sigmoid", {"x": (X * 6).astype(dtype)}, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Greater", "Less", "Equal"])
def test_binary_broadcast(op: str) -> None:
    check_node(op, {"a": np.abs(X) + 0.5, "b": Y})


def test_integer_div_truncates_toward_zero() -> None:
    got = check_node("Div", {"a": np.array([-7, 7, -7], np.int64), "b": np.array([2, -2, -2], np.int64)})
    assert got[0].tolist() == [-3, -3, 3]


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_sign_rules(fmod: int) -> None:
    a = np.array([-7, 7, -7, 5], np.int32)
    b = np.array([2, -2, -2, 3], np.int32)
    check_node("Mod", {"a": a, "b": b}, fmod=fmod)


def test_variadic_max_broadcasts() -> None:
    check_node("Max", {"a": X, "b": Y, "c": np.float32([0.5]).reshape(1, 1)})


def test_clip_optional_bounds() -> None:
    check_node("Clip", {"x": X, "min": None, "max": np.array(0.3, np.float32)})


@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_leaky_relu_falsy_alpha(alpha: float) -> None:
    check_node("LeakyRelu", {"x": X}, alpha=alpha)


def test_gelu_tanh() -> None:
    check_node("Gelu", {"x": X}, approximate="tanh", rtol=1e-4)
