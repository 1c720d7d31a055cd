"""Gradient (first and higher order, intermediate xs, zs, errors) and the optimizer rules against
onnx.reference on cases the conformance suite lacks (T > 0, several tensors, float64)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import oxla
from oxla.errors import LoweringError
from tests.lowering.util import check_node

HEADER = '<ir_version: 8, opset_import: ["" : 17, "ai.onnx.preview.training" : 1]>'
TRAINING = "ai.onnx.preview.training"


def _run(text: str, **feeds: np.ndarray) -> list[np.ndarray]:
    model = onnx.parser.parse_model(HEADER + text)
    return oxla.InferenceSession(model).run(None, feeds)


X = np.array([0.5, -1.0, 2.0], np.float32)
W = np.array([1.5, 2.0, -0.5], np.float32)


def test_gradient_of_cube_and_its_second_derivative() -> None:
    d1, d2 = _run("""
        g (float[3] x) => (float[3] d1, float[3] d2) {
            xx = Mul(x, x)
            y = Mul(xx, x)
            d1 = ai.onnx.preview.training.Gradient <xs = ["x"], y = "y"> (x)
            d2 = ai.onnx.preview.training.Gradient <xs = ["x"], y = "d1"> (x)
        }""", x=X)
    np.testing.assert_allclose(d1, 3 * X**2, rtol=1e-6)
    np.testing.assert_allclose(d2, 6 * X, rtol=1e-6)


def test_mixed_second_derivatives_of_two_variables() -> None:
    # f = x * x * w: df/dx = 2xw, df/dw = x^2; d(df/dw)/dx = 2x, d(df/dw)/dw = 0
    dx, dw, dwx, dww = _run("""
        g (float[3] x, float[3] w) => (float[3] dx, float[3] dw, float[3] dwx, float[3] dww) {
            xx = Mul(x, x)
            f = Mul(xx, w)
            dx, dw = ai.onnx.preview.training.Gradient <xs = ["x", "w"], y = "f"> (x, w)
            dwx, dww = ai.onnx.preview.training.Gradient <xs = ["x", "w"], y = "dw"> (x, w)
        }""", x=X, w=W)
    np.testing.assert_allclose(dx, 2 * X * W, rtol=1e-6)
    np.testing.assert_allclose(dw, X**2, rtol=1e-6)
    np.testing.assert_allclose(dwx, 2 * X, rtol=1e-6)
    np.testing.assert_allclose(dww, 0 * X)


def test_gradient_at_the_point_its_inputs_give_and_zs_constant() -> None:
    # The spec's H example: dY/dH at H = h1 (fed to Gradient), not at the H the graph computed.
    dh, dz = _run("""
        g (float[3] w, float[3] x, float[3] z, float[3] h1) => (float[3] dh, float[3] dz) {
            h = Mul(w, x)
            y = Mul(h, z)
            dh, dz = ai.onnx.preview.training.Gradient <xs = ["h", "z"], y = "y"> (h1, z)
        }""", w=W, x=X, z=X + 1, h1=np.array([7.0, 8.0, 9.0], np.float32))
    np.testing.assert_allclose(dh, X + 1)
    np.testing.assert_allclose(dz, [7.0, 8.0, 9.0])
    (dx,) = _run("""
        g (float[3] x, float[3] z) => (float[3] dx) {
            y = Mul(x, z)
            s = ReduceSum <keepdims = 0> (y)
            dx = ai.onnx.preview.training.Gradient <xs = ["x"], zs = ["z"], y = "s"> (x, z)
        }""", x=X, z=W)
    np.testing.assert_allclose(dx, W)


def test_non_scalar_y_is_summed_and_outputs_are_optional() -> None:
    (dw,) = _run("""
        g (float[3] x, float[3] w) => (float[3] dw) {
            y = Mul(x, w)
            , dw = ai.onnx.preview.training.Gradient <xs = ["x", "w"], y = "y"> (x, w)
        }""", x=X, w=W)
    np.testing.assert_allclose(dw, X)


@pytest.mark.parametrize(("body", "message"), [
    ("""h = Mul(w, x)
        y = Mul(h, h)
        d1, d2 = ai.onnx.preview.training.Gradient <xs = ["w", "h"], y = "y"> (w, h)""",
     r"'h' \(in xs/zs\) is an intermediate value computed from \['w'\]"),
    ("""c = Cast <to = 7> (x)
        y = Mul(w, x)
        d1 = ai.onnx.preview.training.Gradient <xs = ["c"], y = "y"> (c)""",
     "xs 'c' is not differentiable"),
    ("""y = Mul(w, x)
        d1 = ai.onnx.preview.training.Gradient <xs = ["nowhere"], y = "y"> (x)""",
     r"xs/zs names \['nowhere'\] are neither computed"),
    ("""y = Mul(w, x)
        d1 = ai.onnx.preview.training.Gradient <xs = ["w"], y = "missing"> (w)""",
     "y 'missing' is not computed by any node"),
    ("""y = Mul(w, x)
        d1 = ai.onnx.preview.training.Gradient <xs = ["w"], y = "y"> (w, x)""",
     r"one input per name in xs and zs \(1 \+ 0\), got 2"),
])
def test_gradient_errors(body: str, message: str) -> None:
    text = f"g (float[3] x, float[3] w) => (float[3] d1) {{ {body} }}"
    with pytest.raises(LoweringError, match=message):
        _run(text, x=X, w=W)


RNG = np.random.default_rng(0)


def _tensors(n: int, dtype: type, positive: bool = False) -> list[np.ndarray]:
    shapes = [(3,), (2, 2), (1,)][:n]
    return [np.abs(RNG.standard_normal(s)).astype(dtype) if positive else RNG.standard_normal(s).astype(dtype)
            for s in shapes]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t", [0, 3])
def test_adagrad_several_tensors(dtype: type, t: int) -> None:
    xs, gs, hs = _tensors(3, dtype), _tensors(3, dtype), _tensors(3, dtype, positive=True)
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(t, np.int64)}
    feeds |= {f"{k}{i}": v for k, vs in (("X", xs), ("G", gs), ("H", hs)) for i, v in enumerate(vs)}
    outs = [f"{k}{i}_new" for k in "XH" for i in range(3)]
    check_node("Adagrad", feeds, outs, domain=TRAINING, ort=False, decay_factor=0.1,
               epsilon=1e-5, norm_coefficient=0.01)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 5])
def test_momentum_several_tensors(mode: str, t: int) -> None:
    xs, gs, vs = _tensors(3, np.float32), _tensors(3, np.float32), _tensors(3, np.float32)
    feeds = {"R": np.array(0.05, np.float32), "T": np.array(t, np.int64)}
    feeds |= {f"{k}{i}": v for k, arr in (("X", xs), ("G", gs), ("V", vs)) for i, v in enumerate(arr)}
    outs = [f"{k}{i}_new" for k in "XV" for i in range(3)]
    check_node("Momentum", feeds, outs, domain=TRAINING, ort=False, alpha=0.9, beta=0.3,
               mode=mode, norm_coefficient=0.01)


@pytest.mark.parametrize("t", [0, 1, 7])
def test_adam_several_tensors(t: int) -> None:
    xs, gs, vs, hs = (_tensors(3, np.float32), _tensors(3, np.float32), _tensors(3, np.float32),
                      _tensors(3, np.float32, positive=True))
    feeds = {"R": np.array(0.01, np.float32), "T": np.array(t, np.int64)}
    feeds |= {f"{k}{i}": v for k, arr in (("X", xs), ("G", gs), ("V", vs), ("H", hs)) for i, v in enumerate(arr)}
    outs = [f"{k}{i}_new" for k in "XVH" for i in range(3)]
    check_node("Adam", feeds, outs, domain=TRAINING, ort=False, alpha=0.8, beta=0.9, epsilon=1e-4,
               norm_coefficient=0.01, norm_coefficient_post=0.001)


def test_optimizer_input_count_is_checked() -> None:
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(0, np.int64), "X": X, "G": X}
    with pytest.raises(LoweringError, match=r"3 tensors \(X, G, H\) per optimized tensor, got 2"):
        check_node("Adagrad", feeds, ["X_new", "H_new"], domain=TRAINING, ort=False)
