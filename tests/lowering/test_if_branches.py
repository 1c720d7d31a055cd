"""If whose branches only make sense for some inputs, or disagree in rank, nested two deep.

The pattern comes from a voice-activity model: one branch per sample rate, each shaping the
samples for its own rate, and TorchScript's `if x.dim() == 2: x = x.unsqueeze(0)` before an
LSTM. With the rate a graph input, the branch not taken must not be run (nor broadcast or stacked
with the other): it would hand the LSTM a rank-5 value.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import oxla
from tests.lowering.test_control_flow import assert_same, check
from tests.lowering.util import node_model, run_onnxruntime

HIDDEN, FEATURES, STEPS = 3, 4, 2
RNG = np.random.default_rng(0)
W = RNG.standard_normal((1, 4 * HIDDEN, FEATURES)).astype(np.float32)
R = RNG.standard_normal((1, 4 * HIDDEN, HIDDEN)).astype(np.float32)


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, TensorProto.INT64, [len(values)] if len(values) > 1 else [], values))


def _out(name: str, rank: int = 3) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"{name}_{i}" for i in range(rank)])


def _lstm_graph(name: str, x: str) -> onnx.GraphProto:
    """A branch that runs the LSTM on outer value `x`; its Y_h is the output."""
    return helper.make_graph(
        [helper.make_node("LSTM", [x, "W", "R"], ["", f"{name}_h"], hidden_size=HIDDEN)],
        name, [], [_out(f"{name}_h")])


def _rank_guard(name: str, x: str) -> list[onnx.NodeProto]:
    """TorchScript's `if x.dim() != 3: x = x.unsqueeze(0)`, then the LSTM, as nested Ifs."""
    unsqueeze = helper.make_graph(
        [_const(f"{name}_zero", [0]), helper.make_node("Unsqueeze", [x, f"{name}_zero"], [f"{name}_u"])],
        f"{name}_unsqueeze", [], [_out(f"{name}_u")])
    keep = helper.make_graph(
        [helper.make_node("Identity", [x], [f"{name}_i"])],
        f"{name}_keep", [], [_out(f"{name}_i")])
    return [
        helper.make_node("Shape", [x], [f"{name}_shape"]),
        helper.make_node("Size", [f"{name}_shape"], [f"{name}_rank"]),
        _const(f"{name}_three", [3]),
        helper.make_node("Equal", [f"{name}_rank", f"{name}_three"], [f"{name}_batched"]),
        helper.make_node("Not", [f"{name}_batched"], [f"{name}_unbatched"]),
        helper.make_node("If", [f"{name}_unbatched"], [f"{name}_x3"], then_branch=unsqueeze,
                         else_branch=keep),
        helper.make_node("If", [f"{name}_batched"], [f"{name}_h"],
                         then_branch=_lstm_graph(f"{name}_run", f"{name}_x3"),
                         else_branch=_lstm_graph(f"{name}_run2", f"{name}_x3")),
    ]


def two_rate_model(x_shape: tuple[int, ...] = (STEPS, 1, FEATURES)) -> onnx.ModelProto:
    """h = LSTM(x) at 16 kHz; at 8 kHz the samples get a leading axis first (the 8 kHz input is
    one rank lower), so for a 16 kHz-shaped x that branch reaches the LSTM with rank 5."""
    fast = helper.make_graph(_rank_guard("fast", "x"), "rate16k", [],
                             [_out("fast_h")])
    slow = helper.make_graph(
        [_const("slow_axes", [0]), helper.make_node("Unsqueeze", ["x", "slow_axes"], ["slow_x"]),
         *_rank_guard("slow", "slow_x")],
        "rate8k", [], [_out("slow_h")])
    nodes = [_const("rate", [16000]), helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["h"], then_branch=fast, else_branch=slow)]
    graph = helper.make_graph(
        nodes, "two_rates",
        [helper.make_tensor_value_info("sr", TensorProto.INT64, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, HIDDEN])],
        [onnx.numpy_helper.from_array(W, "W"), onnx.numpy_helper.from_array(R, "R")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)


X = RNG.standard_normal((STEPS, 1, FEATURES)).astype(np.float32)


def lstm_alone(x: np.ndarray) -> np.ndarray:
    """Y_h of the LSTM on x, from onnxruntime: what the 16 kHz branch must give."""
    model = node_model("LSTM", {"x": x, "W": W, "R": R}, ["y", "h"], opset=16, hidden_size=HIDDEN)
    return run_onnxruntime(model, {"x": x, "W": W, "R": R})[1]


def test_untaken_branch_that_cannot_run_stays_compiled() -> None:
    # The 8 kHz branch fails to trace on these shapes; it becomes a stand-in that would raise,
    # and the 16 kHz branch runs inside one compiled segment (no host step).
    compiled = oxla.compile(two_rate_model())
    assert_same(compiled({"sr": np.array(16000), "x": X})["h"], lstm_alone(X))
    assert compiled.stats.host_steps == 0


def test_taken_branch_that_cannot_run_fails_as_in_onnxruntime() -> None:
    model, feeds = two_rate_model(), {"sr": np.array(8000), "x": X}
    # onnxruntime's shape inference sees the rank-5 LSTM input in the 8 kHz branch already when
    # loading (the real model hides ranks behind more Ifs and fails when the branch runs).
    with pytest.raises(Exception, match="First input tensor must have rank 3"):
        run_onnxruntime(model, feeds)
    with pytest.raises(oxla.ShapeError, match=r"else branch was taken .* input X must have rank 3, "
                                             r"got shape \(1, 1, 2, 1, 4\)"):
        oxla.compile(model)(feeds)


@pytest.mark.parametrize("sr", [8000, 16000])
def test_branches_that_both_run_are_one_lax_cond(sr: int) -> None:
    # An input shaped for 8 kHz (one rank lower) suits both branches: they agree in shape.
    x = X[:, 0, :]
    (h,) = check(two_rate_model(x.shape), {"sr": np.array(sr), "x": x}, host_steps=0)
    assert h.shape == (1, STEPS, HIDDEN)


NESTED_RANKS = """
g (bool a, bool b, float[3] x) => (float[N] y) {
  u = If (a) <then_branch = t () => (float[M] o) {
        o = If (b) <then_branch = tt () => (float[1, 3] p) { z = Constant <value = int64[1] {0}> ()
                                                            p = Unsqueeze(x, z) },
                    else_branch = te () => (float[3] p) { p = Neg(x) }>
      },
      else_branch = e () => (float[K] o) {
        o = If (b) <then_branch = et () => (float[1, 1, 3] p) { z = Constant <value = int64[2] {0, 1}> ()
                                                               p = Unsqueeze(x, z) },
                    else_branch = ee () => (float[3] p) { p = Abs(x) }>
      }>
  s = Shape(u)
  y = Cast <to = 1> (s)
}"""


@pytest.mark.parametrize("a", [True, False])
@pytest.mark.parametrize("b", [True, False])
def test_nested_traced_conds_with_branches_of_different_ranks(a: bool, b: bool) -> None:
    # Both conditions are traced and every level disagrees in rank: the outer If runs on the
    # host, where only the branches taken run; its output keeps exactly that branch's shape.
    (y,) = check(NESTED_RANKS, {"a": np.array(a), "b": np.array(b), "x": np.ones(3, np.float32)},
                 host_steps=1)
    assert y.tolist() == {(True, True): [1, 3], (False, True): [1, 1, 3]}.get((a, b), [3])
