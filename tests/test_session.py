"""InferenceSession: onnxruntime's calls, feed checking, errors with node context, graph breaks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import oxla
from oxla.errors import InputError, LoweringError

MODEL = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 3] x, float[3] b) => (float[N, 3] y, int64[2] s) {
        r = Relu(x)
        y = Add(r, b)
        s = Shape(y)
    }
""")
X = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
B = np.array([0.5, 0.5, 0.5], np.float32)


def _session() -> oxla.InferenceSession:
    return oxla.InferenceSession(MODEL.SerializeToString())


def test_inputs_outputs_like_onnxruntime() -> None:
    sess = _session()
    assert [(i.name, i.shape, i.type) for i in sess.get_inputs()] == [
        ("x", ["N", 3], "tensor(float)"), ("b", [3], "tensor(float)")]
    assert [o.name for o in sess.get_outputs()] == ["y", "s"]


def test_run_all_and_selected_outputs() -> None:
    sess = _session()
    y, s = sess.run(None, {"x": X, "b": B})
    np.testing.assert_allclose(y, np.maximum(X, 0) + B)
    assert s.tolist() == [2, 3]
    (only_s,) = sess.run(["s"], {"x": X[:1], "b": B})
    assert only_s.tolist() == [1, 3]


def test_symbolic_dims_compile_once_per_shape() -> None:
    sess = _session()
    for n in (1, 2, 1, 2, 5):
        sess.run(None, {"x": np.ones((n, 3), np.float32), "b": B})
    assert sess.compiled.stats.compiles == 3


def test_wrong_feed_name() -> None:
    with pytest.raises(InputError, match=r"unknown input names \['z'\].*\['x', 'b'\]"):
        _session().run(None, {"x": X, "b": B, "z": X})


def test_missing_feed() -> None:
    with pytest.raises(InputError, match=r"missing inputs \['b'\]"):
        _session().run(None, {"x": X})


def test_wrong_dtype() -> None:
    with pytest.raises(InputError, match="input 'x' must have dtype float32, got float64"):
        _session().run(None, {"x": X.astype(np.float64), "b": B})


def test_wrong_shape() -> None:
    with pytest.raises(InputError, match=r"input 'b' must have shape \(3,\), got \(4,\)"):
        _session().run(None, {"x": X, "b": np.ones(4, np.float32)})
    with pytest.raises(InputError, match=r"input 'x' must have shape \('N', 3\), got \(3,\)"):
        _session().run(None, {"x": B, "b": B})


def test_failing_rule_names_node_op_opset_and_shapes() -> None:
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[A, B] x, float[C] y) => (float[A, B] z) { z = Add(x, y) }
    """)
    m.graph.node[0].name = "add1"
    sess = oxla.InferenceSession(m.SerializeToString())
    with pytest.raises(LoweringError, match=r"Add node 'add1' \(ai.onnx v18\): .*shape \(2, 3\) float32, shape \(4,\) float32"):
        sess.run(None, {"x": X, "y": np.ones(4, np.float32)})


def test_data_dependent_shape_breaks_the_graph() -> None:
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[6] x, int64[2] shape) => (float[A, B] y) { r = Relu(x) y = Reshape(r, shape) }
    """)
    sess = oxla.InferenceSession(m.SerializeToString())
    (y,) = sess.run(None, {"x": np.arange(6, dtype=np.float32) - 2, "shape": np.array([3, 2])})
    assert y.shape == (3, 2) and y[0].tolist() == [0, 0]
    (y,) = sess.run(None, {"x": np.arange(6, dtype=np.float32), "shape": np.array([2, 3])})
    assert y.shape == (2, 3)
    assert sess.compiled.stats.host_steps == 2


def test_host_steps_ending_the_graph_take_the_fast_path() -> None:
    """A graph that ends in host steps alone (a classifier's ZipMap; here a Reshape to a fed
    shape) runs them after the first segment on the fast path, with each call's own values."""
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[6] x, int64[2] shape) => (float[A, B] y, float[6] r) { r = Relu(x) y = Reshape(r, shape) }
    """)
    sess = oxla.InferenceSession(m.SerializeToString())
    x = np.arange(6, dtype=np.float32) - 2
    assert sess.compiled.run_fast([x, np.array([3, 2])], host=True) is None  # nothing compiled yet
    sess.run(None, {"x": x, "shape": np.array([3, 2])})
    steps = sess.compiled.stats.host_steps
    outs = sess.compiled.run_fast([x, np.array([2, 3])], host=True)  # the tail's entry
    assert outs is not None
    y, r = outs
    assert y.shape == (2, 3) and y.tolist() == [[0, 0, 0], [1, 2, 3]]
    assert np.asarray(r).tolist() == [0, 0, 0, 1, 2, 3]
    y, r = sess.run(None, {"x": x + 1, "shape": np.array([1, 6])})
    assert y.tolist() == [[0, 0, 1, 2, 3, 4]] and r.tolist() == [0, 0, 1, 2, 3, 4]
    assert sess.compiled.stats.host_steps == steps + 2  # counted as on the general path


def test_a_segment_after_a_host_step_keeps_the_general_path() -> None:
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[6] x, int64[2] shape) => (float[A, B] y) { r = Relu(x) s = Reshape(r, shape) y = Neg(s) }
    """)
    sess = oxla.InferenceSession(m.SerializeToString())
    x = np.arange(6, dtype=np.float32) - 2
    (y,) = sess.run(None, {"x": x, "shape": np.array([3, 2])})
    assert y.tolist() == [[0, 0], [0, -1], [-2, -3]]
    assert sess.compiled.run_fast([x, np.array([3, 2])], host=True) is None


def test_cli_error_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    proc = subprocess.run([sys.executable, "-m", "oxla", "run", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not a valid ONNX protobuf" in proc.stderr and "Traceback" not in proc.stderr


def test_pure_function_is_jittable_and_differentiable() -> None:
    import jax
    import jax.numpy as jnp

    compiled = oxla.compile(MODEL)
    x = jnp.asarray(X)

    def loss(params: dict, x: jax.Array) -> jax.Array:
        return jnp.sum(compiled.fn(params, {"x": x, "b": jnp.asarray(B)})["y"])

    grad = jax.jit(jax.grad(loss, argnums=1))(compiled.params, x)
    np.testing.assert_array_equal(np.asarray(grad), (X > 0).astype(np.float32))


def test_persistent_compilation_cache_is_written(tmp_path: Path) -> None:
    code = (
        "import numpy as np, onnx, oxla, sys\n"
        f"oxla.enable_compilation_cache({str(tmp_path / 'cache')!r})\n"
        "m = onnx.load_from_string(sys.stdin.buffer.read())\n"
        "print(oxla.InferenceSession(m).run(None, {'x': np.ones((2, 3), np.float32),"
        " 'b': np.ones(3, np.float32)})[0].sum())\n"
    )
    for _ in range(2):  # the second process reads what the first wrote
        proc = subprocess.run([sys.executable, "-c", code], input=MODEL.SerializeToString(),
                              capture_output=True, check=True)
        assert float(proc.stdout) == 12.0
    assert any((tmp_path / "cache").iterdir())


def test_feeds_that_are_not_a_dict() -> None:
    with pytest.raises(InputError, match=r"feeds must be a dict .* got list; the model's inputs are \['x', 'b'\]"):
        _session().run(None, [X, B])  # type: ignore[arg-type]
