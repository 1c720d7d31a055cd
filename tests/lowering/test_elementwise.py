"""Elementwise rules against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.lowering.util import check_node

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4)).astype(np.float32)
Y = RNG.standard_normal((4,)).astype(np.float32)


@pytest.mark.parametrize("op", ["Abs", "Neg", "Exp", "Sin", "Cos", "Tanh", "Sigmoid", "Relu",
                                "Erf", "Floor", "Ceil", "Round", "Sign", "Softsign", "Softplus"])
def test_unary(op: str) -> None:
    check_node(op, {"x": X})


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
