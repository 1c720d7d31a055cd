"""RNN, GRU and LSTM against onnxruntime (and onnx.reference where it implements the feature)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import oxla
from tests.lowering.util import check_node, node_model

RNG = np.random.default_rng(0)
T, BATCH, INPUT, H = 4, 3, 2, 5
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
TOL = {"rtol": 1e-4, "atol": 1e-5}


def w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.5).astype(np.float32)


X = w(T, BATCH, INPUT)


def inputs(op: str, dirs: int = 1, *, full: bool = True, layout: int = 0) -> dict[str, np.ndarray | None]:
    """X, W, R and (when full) B, initial states and peepholes for a layer of `dirs` directions."""
    g = GATES[op]
    state = (BATCH, dirs, H) if layout else (dirs, BATCH, H)
    feeds: dict[str, np.ndarray | None] = {
        "X": np.swapaxes(X, 0, 1).copy() if layout else X,
        "W": w(dirs, g * H, INPUT), "R": w(dirs, g * H, H),
        "B": w(dirs, 2 * g * H) if full else None, "sequence_lens": None,
        "initial_h": w(*state) if full else None,
    }
    if op == "LSTM":
        feeds["initial_c"] = w(*state) if full else None
        feeds["P"] = w(dirs, 3 * H) if full else None
    return feeds


def outputs(op: str) -> list[str]:
    return ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction, dirs", [("reverse", 1), ("bidirectional", 2)])
def test_directions(op: str, direction: str, dirs: int) -> None:
    check_node(op, inputs(op, dirs), outputs(op), hidden_size=H, direction=direction, **TOL)


@pytest.mark.parametrize("op", list(GATES))
def test_forward_without_optional_inputs(op: str) -> None:
    check_node(op, inputs(op, full=False), outputs(op), hidden_size=H, **TOL)


@pytest.mark.parametrize("op", list(GATES))
def test_sequence_lens(op: str) -> None:
    # Steps past each length output zeros and keep the state; length 0 ends in zero states.
    # Bidirectional: the backward pass starts at each sequence's own last step.
    feeds = {**inputs(op, 2), "sequence_lens": np.array([4, 0, 2], np.int32)}
    # onnx.reference ignores sequence_lens.
    check_node(op, feeds, outputs(op), reference=False, hidden_size=H, direction="bidirectional",
               **TOL)


@pytest.mark.parametrize("op", list(GATES))
def test_clip(op: str) -> None:
    # onnx.reference ignores clip.
    check_node(op, inputs(op), outputs(op), reference=False, hidden_size=H, clip=0.3, **TOL)


@pytest.mark.parametrize("op", list(GATES))
def test_layout_batch_first(op: str) -> None:
    # onnxruntime rejects layout=1.
    check_node(op, inputs(op, layout=1), outputs(op), ort=False, hidden_size=H, layout=1, **TOL)


def test_gru_linear_before_reset() -> None:
    check_node("GRU", inputs("GRU"), outputs("GRU"), hidden_size=H, linear_before_reset=1, **TOL)


def test_lstm_input_forget() -> None:
    # onnx.reference ignores input_forget.
    check_node("LSTM", inputs("LSTM"), outputs("LSTM"), reference=False, hidden_size=H,
               input_forget=1, **TOL)


@pytest.mark.parametrize("op, attrs", [
    ("RNN", {"activations": ["Relu", "Sigmoid"], "direction": "bidirectional"}),
    ("GRU", {"activations": ["HardSigmoid", "LeakyRelu"], "activation_alpha": [0.3, 0.2],
             "activation_beta": [0.4]}),
    ("LSTM", {"activations": ["Sigmoid", "Affine", "ScaledTanh"], "activation_alpha": [0.5, 0.7],
              "activation_beta": [0.1, 1.5]}),
    ("LSTM", {"activations": ["HardSigmoid", "Elu", "Softsign"]}),
])
def test_activations(op: str, attrs: dict) -> None:
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    # onnx.reference ignores activations.
    check_node(op, inputs(op, dirs), outputs(op), reference=False, hidden_size=H, **attrs, **TOL)


def test_lstm_at_opset9() -> None:
    check_node("LSTM", inputs("LSTM"), outputs("LSTM"), opset=9, hidden_size=H, **TOL)


def test_lstm_gradient_matches_finite_differences() -> None:
    feeds = inputs("LSTM", full=False)
    model = node_model("LSTM", feeds, ["Y", "Y_h", "Y_c"], hidden_size=H)
    compiled = oxla.compile(model)
    x = {"X": X, "W": feeds["W"], "R": feeds["R"]}

    @jax.jit
    def loss(w_in: jax.Array) -> jax.Array:
        return compiled.fn(compiled.params, {**x, "W": w_in})["Y"].sum()

    grad = np.asarray(jax.grad(loss)(feeds["W"]))
    eps, index = 1e-2, (0, 3, 1)
    bump = np.zeros_like(feeds["W"])
    bump[index] = eps
    numeric = (loss(feeds["W"] + bump) - loss(feeds["W"] - bump)) / (2 * eps)
    np.testing.assert_allclose(grad[index], numeric, rtol=1e-2)


def _long(op: str) -> dict[str, np.ndarray | None]:
    """16 steps of batch 4: R is laid out transposed before the time loop (steps * batch >= 64)."""
    g = GATES[op]
    return {"X": w(16, 4, INPUT), "W": w(2, g * H, INPUT), "R": w(2, g * H, H),
            "B": w(2, 2 * g * H)}


@pytest.mark.parametrize("op, attrs", [("RNN", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}),
                                       ("LSTM", {})])
def test_long_batched_sequences(op: str, attrs: dict) -> None:
    check_node(op, _long(op), ["Y", "Y_h"], hidden_size=H, direction="bidirectional", **attrs, **TOL)


@pytest.mark.parametrize("op, attrs", [("RNN", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}),
                                       ("LSTM", {})])
@pytest.mark.parametrize("full", [True, False])
def test_batch_of_one(op: str, attrs: dict, full: bool) -> None:
    # batch 1 takes the matrix-vector form R h of the recurrent product
    g = GATES[op]
    feeds: dict[str, np.ndarray | None] = {"X": w(6, 1, INPUT), "W": w(2, g * H, INPUT),
                                           "R": w(2, g * H, H), "B": w(2, 2 * g * H) if full else None}
    if full:
        feeds.update(sequence_lens=None, initial_h=w(2, 1, H))
        if op == "LSTM":
            feeds.update(initial_c=w(2, 1, H), P=w(2, 3 * H))
    check_node(op, feeds, outputs(op), hidden_size=H, direction="bidirectional", **attrs, **TOL)


def test_gru_gradient_with_transposed_recurrent_weights() -> None:
    # float64 throughout: central differences in float32 would not resolve 1e-5
    feeds = {k: np.asarray(v, np.float64) for k, v in _long("GRU").items() if v is not None}
    model = node_model("GRU", feeds, ["Y"], hidden_size=H, direction="bidirectional")
    compiled = oxla.compile(model)

    @jax.jit
    def loss(r: jax.Array) -> jax.Array:
        return compiled.fn(compiled.params, {**feeds, "R": r})["Y"].sum()

    r = feeds["R"]
    with oxla.x64():  # float64 arrays into the user's own jit need 64-bit types there too
        grad = np.asarray(jax.grad(loss)(r))
        eps, index = 1e-4, (1, 7, 2)
        bump = np.zeros_like(r)
        bump[index] = eps
        numeric = (loss(r + bump) - loss(r - bump)) / (2 * eps)
    np.testing.assert_allclose(grad[index], numeric, rtol=1e-5)


def test_wrong_direction_count_is_an_error() -> None:
    feeds = inputs("GRU", dirs=1)
    model = node_model("GRU", feeds, outputs("GRU"), hidden_size=H, direction="bidirectional")
    with pytest.raises(oxla.LoweringError, match="direction 'bidirectional' needs 2 weight sets in W, got 1"):
        oxla.compile(model)(feeds)


def test_unknown_activation_is_an_error() -> None:
    feeds = inputs("RNN")
    model = node_model("RNN", feeds, outputs("RNN"), hidden_size=H, activations=["Gelu"])
    with pytest.raises(oxla.LoweringError, match="unknown activation 'Gelu'"):
        oxla.compile(model)(feeds)
