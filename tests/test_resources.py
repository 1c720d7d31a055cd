"""Resource bombs: a node whose output would exceed the memory limit is refused before allocation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import oxla

GIB = 1 << 30

BOMBS = {
    "ConstantOfShape": """
        g (float[2] x) => (float[1000000, 1000000] y) {
            s = Constant<value = int64[2] {1000000, 1000000}>()
            y = ConstantOfShape<value = float {1.0}>(s)
        }""",
    "Expand": """
        g (float[1] x) => (float[1000000, 1000000] y) {
            s = Constant<value = int64[2] {1000000, 1000000}>()
            y = Expand(x, s)
        }""",
    "Tile": """
        g (float[2] x) => (float[N] y) {
            r = Constant<value = int64[1] {1000000000000}>()
            y = Tile(x, r)
        }""",
    "OneHot": """
        g (int64[2] x) => (float[2, N] y) {
            depth = Constant<value = int64 {1000000000000}>()
            values = Constant<value = float[2] {0.0, 1.0}>()
            y = OneHot(x, depth, values)
        }""",
    "Pad": """
        g (float[2] x) => (float[N] y) {
            p = Constant<value = int64[2] {0, 1000000000000}>()
            y = Pad(x, p)
        }""",
}


@pytest.mark.parametrize("op", sorted(BOMBS))
def test_bomb_is_refused_with_node_shape_and_bytes(op: str) -> None:
    text = '<ir_version: 8, opset_import: ["" : 18]>' + BOMBS[op]
    model = onnx.parser.parse_model(text)
    sess = oxla.InferenceSession(model.SerializeToString(), memory_limit=GIB)
    x = np.array([1, 0], np.int64) if op == "OneHot" else np.ones(1 if op == "Expand" else 2, np.float32)
    with pytest.raises(oxla.ResourceError, match=rf"{op} node .*an output of shape .*would take .*TiB, "
                                                   r"more than the memory limit 1.0 GiB"):
        sess.run(None, {"x": x})


def test_a_value_under_the_limit_runs() -> None:
    model = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 18]>' + """
        g (float[1] x) => (float[1000, 1000] y) {
            s = Constant<value = int64[2] {1000, 1000}>()
            y = Expand(x, s)
        }""")
    sess = oxla.InferenceSession(model.SerializeToString(), memory_limit=8 << 20)
    assert sess.run(None, {"x": np.ones(1, np.float32)})[0].shape == (1000, 1000)
    tight = oxla.InferenceSession(model.SerializeToString(), memory_limit=1 << 20)
    with pytest.raises(oxla.ResourceError, match="3.8 MiB, more than the memory limit 1.0 MiB"):
        tight.run(None, {"x": np.ones(1, np.float32)})
