"""Sequence and optional rules against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import oxla
from tests.lowering.test_control_flow import assert_same, check, parse

A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = -np.arange(6, dtype=np.float32).reshape(2, 3)
C = np.ones((1, 3), np.float32)


def seq_ops(body: str, outputs: str = "float[N, 3] y", extra: str = "") -> str:
    """A model that builds s = [a, b, c] and then runs `body`."""
    return f"""
    g (float[2, 3] a, float[2, 3] b, float[1, 3] c{extra}) => ({outputs}) {{
      s = SequenceConstruct(a, b, c)
      {body}
    }}"""


FEEDS = {"a": A, "b": B, "c": C}


@pytest.mark.parametrize("pos", [0, 2, -1, -3])
def test_sequence_at(pos: int) -> None:
    text = seq_ops(f"p = Constant <value = int64 {{{pos}}}> ()\n y = SequenceAt(s, p)")
    (y,) = check(text, FEEDS, host_steps=0, reference=True)
    assert_same(y, [A, B, C][pos])


def test_sequence_at_runtime_position_into_equal_shapes() -> None:
    text = """
    g (float[2, 3] a, float[2, 3] b, int64 p) => (float[2, 3] y) {
      s = SequenceConstruct(a, b)
      y = SequenceAt(s, p)
    }"""
    for pos, want in [(1, B), (-2, A)]:
        (y,) = check(text, {"a": A, "b": B, "p": np.array(pos)}, host_steps=0, reference=True)
        assert_same(y, want)


def test_sequence_at_runtime_position_into_mixed_shapes_breaks_the_graph() -> None:
    text = seq_ops("y = SequenceAt(s, p)", extra=", int64 p")
    (y,) = check(text, {**FEEDS, "p": np.array(2)}, host_steps=1, reference=True)
    assert_same(y, C)


@pytest.mark.parametrize("pos", [None, 0, 1, 3, -1])
def test_sequence_insert(pos: int | None) -> None:
    if pos is None:
        body = "t = SequenceInsert(s, a)"
    else:
        body = f"p = Constant <value = int64 {{{pos}}}> ()\n t = SequenceInsert(s, a, p)"
    text = seq_ops(body + "\n y = ConcatFromSequence <axis = 0> (t)")
    items = [A, B, C]
    items.insert(len(items) if pos is None else pos, A)
    # onnx.reference inserts at the front when position equals the length.
    (y,) = check(text, FEEDS, host_steps=0, reference=pos != 3)
    assert_same(y, np.concatenate(items))


@pytest.mark.parametrize("pos", [None, 0, -2])
def test_sequence_erase_and_length(pos: int | None) -> None:
    if pos is None:
        body = "t = SequenceErase(s)"
    else:
        body = f"p = Constant <value = int64 {{{pos}}}> ()\n t = SequenceErase(s, p)"
    text = seq_ops(body + "\n y = ConcatFromSequence <axis = 0> (t)\n n = SequenceLength(t)",
                   outputs="float[N, 3] y, int64 n")
    items = [A, B, C]
    del items[-1 if pos is None else pos]
    y, n = check(text, FEEDS, host_steps=0, reference=True)
    assert_same(y, np.concatenate(items))
    assert int(n) == 2


def test_sequence_empty_then_insert() -> None:
    text = """
    g (float[2, 3] a) => (seq(float[2, 3]) y, int64 n) {
      e = SequenceEmpty <dtype = 1> ()
      n = SequenceLength(e)
      y = SequenceInsert(e, a)
    }"""
    y, n = check(text, {"a": A}, host_steps=0, reference=True)
    assert_same(y, [A])
    assert int(n) == 0


@pytest.mark.parametrize("attrs", ["axis = 0", "axis = 1, new_axis = 1", "axis = -1, new_axis = 1"])
def test_concat_from_sequence(attrs: str) -> None:
    text = f"""
    g (float[2, 3] a, float[2, 3] b) => (float[N, M, K] y) {{
      s = SequenceConstruct(a, b)
      y = ConcatFromSequence <{attrs}> (s)
    }}"""
    if "new_axis" not in attrs:
        text = text.replace("float[N, M, K] y", "float[N, M] y")
    check(text, {"a": A, "b": B}, host_steps=0, reference=True)


@pytest.mark.parametrize("split, attrs", [
    (None, "axis = 1"),
    (None, "axis = -1, keepdims = 0"),
    (np.array(2), "axis = 1"),           # chunks of 2, the last one shorter
    (np.array([1, 2]), "axis = 1"),
    (np.array([2, 0]), "axis = 0"),      # an empty part
])
def test_split_to_sequence(split: np.ndarray | None, attrs: str) -> None:
    split_def = "" if split is None else (
        "sp = Constant <value = int64" + ("" if split.ndim == 0 else f"[{split.size}]")
        + " {" + ", ".join(str(v) for v in split.reshape(-1)) + "}> ()")
    text = f"""
    g (float[2, 3] a) => (seq(float) y, int64 n) {{
      {split_def}
      y = SplitToSequence <{attrs}> (a{", sp" if split is not None else ""})
      n = SequenceLength(y)
    }}"""
    check(text, {"a": A}, host_steps=0, reference=True)


OPTIONALS = """
g (float[2, 3] a) => (bool has_t, float[2, 3] t, bool has_s, seq(float[2, 3]) s, bool has_e) {
  ot = Optional(a)
  has_t = OptionalHasElement(ot)
  t = OptionalGetElement(ot)
  sq = SequenceConstruct(a, a)
  os = Optional(sq)
  has_s = OptionalHasElement(os)
  s = OptionalGetElement(os)
  oe = EmptyOptional()
  has_e = OptionalHasElement(oe)
}"""


def with_empty_optionals(text: str) -> onnx.ModelProto:
    """Parse `text`, replacing each `x = EmptyOptional()` by an Optional of float tensor type
    (the text format cannot spell a type attribute)."""
    model = parse(text, opset=18)
    for i, node in enumerate(model.graph.node):
        if node.op_type == "EmptyOptional":
            empty = helper.make_node("Optional", [], list(node.output),
                                     type=helper.make_tensor_type_proto(TensorProto.FLOAT, None))
            model.graph.node[i].CopyFrom(empty)
    return model


def test_optionals() -> None:
    model = with_empty_optionals(OPTIONALS)
    # onnx.reference wraps what OptionalGetElement returns in a list and calls the empty one full.
    has_t, t, has_s, s, has_e = check(model, {"a": A}, host_steps=0)
    assert bool(has_t) and bool(has_s) and not bool(has_e)
    assert_same(t, A)
    assert_same(s, [A, A])


def test_optional_has_element_without_input_is_false() -> None:
    text = 'g (float[2, 3] a) => (bool h) {\n  h = OptionalHasElement("")\n}'
    (h,) = check(text, {"a": A}, host_steps=0, opset=18, reference=True)
    assert not bool(h)


def test_sequence_map_runs_its_function_body() -> None:
    text = """
    g (seq(float[N]) s, float[N] x) => (seq(float[N]) y) {
      y = SequenceMap (s, x) <body = b (float[N] e, float[N] v) => (float[N] o) { o = Add(e, v) }>
    }"""
    items = [np.arange(3, dtype=np.float32), np.ones(3, np.float32)]
    x = np.full(3, 2.0, np.float32)
    (y,) = check(text, {"s": items, "x": x}, host_steps=0, reference=True)
    assert_same(y, [items[0] + x, items[1] + x])


def _run(text: str, feeds: dict) -> dict:
    return oxla.compile(with_empty_optionals(text))(feeds)


def test_sequence_at_out_of_range_is_an_error() -> None:
    text = seq_ops("p = Constant <value = int64 {3}> ()\n y = SequenceAt(s, p)")
    with pytest.raises(oxla.LoweringError, match=r"position 3 is out of range .* \(accepted: -3..2\)"):
        _run(text, FEEDS)


def test_get_element_of_empty_optional_is_an_error() -> None:
    text = """
    g (float[2, 3] a) => (float[2, 3] y) {
      e = EmptyOptional()
      y = OptionalGetElement(e)
    }"""
    with pytest.raises(oxla.LoweringError, match="the optional input is empty"):
        _run(text, {"a": A})


def test_split_that_does_not_sum_to_the_axis_is_an_error() -> None:
    text = """
    g (float[2, 3] a) => (seq(float) y) {
      sp = Constant <value = int64[2] {1, 1}> ()
      y = SplitToSequence <axis = 1> (a, sp)
    }"""
    with pytest.raises(oxla.LoweringError, match=r"split \[1, 1\] sums to 2, the axis has length 3"):
        _run(text, {"a": A})
