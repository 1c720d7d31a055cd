"""oxla.backend: the module-level onnx.backend.base.Backend calls."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from oxla import backend


def test_run_node() -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    (c,) = backend.run_node(node, [a, b])
    np.testing.assert_array_equal(c, a + b)


def test_prepare_and_run_model_positional_and_named() -> None:
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[2] x, float[2] y) => (float[2] z) { z = Mul(x, y) }""")
    x, y = np.array([1, 2], np.float32), np.array([3, 4], np.float32)
    assert backend.run_model(model, [x, y])[0].tolist() == [3, 8]
    assert backend.prepare(model).run({"y": y, "x": x})[0].tolist() == [3, 8]


def test_supports_device() -> None:
    assert backend.supports_device("CPU")
    assert isinstance(backend.supports_device("CUDA"), bool)


def test_rep_run_checks_feeds_as_the_session_does() -> None:
    import oxla

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[2, 3] a, float[2, 3] b) => (float[2, 3] y) { y = Add(a, b) }
    """)
    rep = backend.prepare(model)
    a = np.ones((2, 3), np.float32)
    assert rep.run([a, a])[0].tolist() == (a + a).tolist()
    with pytest.raises(oxla.InputError, match="dtype float"):
        rep.run([a.astype(np.float64), a])
    with pytest.raises(oxla.InputError, match=r"shape \(2, 3\)"):
        rep.run([np.ones((5, 3), np.float32), a])
    with pytest.raises(oxla.InputError, match="3 inputs given, the model takes 2"):
        rep.run([a, a, a])
