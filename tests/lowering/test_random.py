"""Random rules: shapes, types, ranges, statistics, seeding (values cannot match numpy's)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import oxla
from oxla.errors import LoweringError
from tests.lowering.util import node_model, run_oxla

OPSET = 21
X = np.zeros((3, 4), np.float16)


def run(op: str, feeds: dict | None = None, **attrs: object) -> np.ndarray:
    feeds = feeds or {}
    return run_oxla(node_model(op, feeds, opset=OPSET, **attrs), feeds)[0]


def test_random_normal_statistics() -> None:
    y = run("RandomNormal", shape=(200, 100), mean=3.0, scale=2.0)
    assert y.shape == (200, 100) and y.dtype == np.float32
    assert abs(y.mean() - 3.0) < 0.1 and abs(y.std() - 2.0) < 0.1


def test_random_uniform_range_and_dtype() -> None:
    y = run("RandomUniform", shape=(1000,), low=-2.0, high=-1.0, dtype=TensorProto.DOUBLE)
    assert y.dtype == np.float64 and y.min() >= -2.0 and y.max() < -1.0
    assert abs(y.mean() + 1.5) < 0.05


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_like_ops_take_the_input_shape_and_type(op: str) -> None:
    y = run(op, {"x": X})
    assert y.shape == X.shape and y.dtype == np.float16
    assert run(op, {"x": X}, dtype=TensorProto.FLOAT).dtype == np.float32


def test_like_op_needs_a_float_type() -> None:
    with pytest.raises(LoweringError, match="need a float16/bfloat16/float/double output type"):
        run("RandomUniformLike", {"x": np.zeros(3, np.int64)})


def test_seed_repeats_values_across_runs_and_sessions() -> None:
    model = node_model("RandomNormal", {}, opset=OPSET, shape=(5,), seed=7.0)
    first = run_oxla(model, {})[0]
    sess = oxla.InferenceSession(model.SerializeToString())
    np.testing.assert_array_equal(sess.run(None, {})[0], first)
    np.testing.assert_array_equal(sess.run(None, {})[0], first)


def test_without_seed_every_run_and_node_draws_anew() -> None:
    nodes = [helper.make_node("RandomUniform", [], [name], shape=(8,)) for name in ("a", "b")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, (8,)) for n in ("a", "b")]
    graph = helper.make_graph(nodes, "two_draws", [], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    sess = oxla.InferenceSession(model.SerializeToString())
    a1, b1 = sess.run(None, {})
    a2, _ = sess.run(None, {})
    assert not np.array_equal(a1, b1) and not np.array_equal(a1, a2)


def test_bernoulli_extremes_and_dtype() -> None:
    p = np.array([0.0, 1.0, 0.0, 1.0], np.float32)
    assert run("Bernoulli", {"p": p}).tolist() == [0, 1, 0, 1]
    y = run("Bernoulli", {"p": p}, dtype=TensorProto.BOOL, seed=1.0)
    assert y.dtype == np.bool_ and y.tolist() == [False, True, False, True]


def test_bernoulli_frequency() -> None:
    y = run("Bernoulli", {"p": np.full(4000, 0.25, np.float64)})
    assert y.dtype == np.float64 and abs(y.mean() - 0.25) < 0.03


def test_multinomial_shape_type_and_certain_class() -> None:
    logits = np.log(np.array([[1e-9, 1.0, 1e-9], [0.5, 0.5, 1e-12]], np.float32))
    y = run("Multinomial", {"x": logits}, sample_size=50, dtype=TensorProto.INT64)
    assert y.shape == (2, 50) and y.dtype == np.int64
    assert (y[0] == 1).all() and set(y[1].tolist()) <= {0, 1}
    assert run("Multinomial", {"x": logits}).dtype == np.int32

