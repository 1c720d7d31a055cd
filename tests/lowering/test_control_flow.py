"""If, Loop and Scan against onnxruntime, and which of them break the graph (host steps)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper

import oxla
from tests.lowering.util import assert_close, run_onnxruntime, run_reference

HEADER = '<ir_version: 8, opset_import: ["" : {opset}]>\n'


def parse(text: str, opset: int = 17) -> onnx.ModelProto:
    return onnx.parser.parse_model(HEADER.format(opset=opset) + text)


def check(text: str | onnx.ModelProto, feeds: dict[str, Any], *, host_steps: int, opset: int = 17,
          reference: bool = False, ort: bool = True) -> list[Any]:
    """Run a model (or its text) with oxla and onnxruntime; check how many nodes ran on the host.

    onnx.reference is off by default: its Loop never iterates when the cond input is left out.
    """
    model = parse(text, opset) if isinstance(text, str) else text
    onnx.checker.check_model(model)
    compiled = oxla.compile(model)
    result = compiled(feeds)
    got = [result[o.name] for o in model.graph.output]
    if ort:
        assert_same(got, run_onnxruntime(model, feeds))
    if reference:
        assert_same(got, run_reference(model, feeds))
    assert compiled.stats.host_steps == host_steps, compiled.stats
    return got


def assert_same(got: Any, want: Any) -> None:
    """assert_close for values that may be sequences (lists) or empty optionals (None)."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"got {got}, want {want}"
        for g, w in zip(got, want):
            assert_same(g, w)
    elif want is None:
        assert got is None, f"got {got}, want an empty optional"
    else:
        assert_close([got], [want])


X3 = np.array([-1.0, 2.0, -3.0], np.float32)

IF_SAME_SHAPES = """
g (bool c, float[3] x) => (float[3] y) {
  y = If (c) <then_branch = t () => (float[3] o) { o = Neg(x) },
              else_branch = e () => (float[3] o) { o = Abs(x) }>
}"""


@pytest.mark.parametrize("cond", [True, False])
def test_if_traced_cond_is_lax_cond(cond: bool) -> None:
    check(IF_SAME_SHAPES, {"c": np.array(cond), "x": X3}, host_steps=0, reference=True)


def test_if_static_cond_runs_one_branch_on_traced_values() -> None:
    text = """
    g (float[3] x) => (float[N] y) {
      c = Constant <value = bool {0}> ()
      y = If (c) <then_branch = t () => (float[3] o) { o = Neg(x) },
                  else_branch = e () => (float[6] o) { o = Concat <axis = 0> (x, x) }>
    }"""
    (y,) = check(text, {"x": X3}, host_steps=0, reference=True)
    assert y.shape == (6,)


def test_if_branches_of_different_shapes_break_the_graph() -> None:
    text = """
    g (bool c, float[3] x) => (float[N] y) {
      y = If (c) <then_branch = t () => (float[3] o) { o = Neg(x) },
                  else_branch = e () => (float[6] o) { o = Concat <axis = 0> (x, x) }>
    }"""
    for cond, size in [(True, 3), (False, 6)]:
        (y,) = check(text, {"c": np.array(cond), "x": X3}, host_steps=1, reference=True)
        assert y.shape == (size,)


def test_if_sequence_outputs() -> None:
    text = """
    g (bool c, float[3] x) => (seq(float[3]) y) {
      y = If (c) <then_branch = t () => (seq(float[3]) o) { o = SequenceConstruct(x, x) },
                  else_branch = e () => (seq(float[3]) o) { n = Neg(x)
                                                            o = SequenceConstruct(x, n) }>
    }"""
    (y,) = check(text, {"c": np.array(False), "x": X3}, host_steps=0)
    assert_same(y, [X3, -X3])


LOOP_TRACED_M = """
g (int64 m, float[3] x) => (float[3] y) {
  y = Loop (m, "", x) <body = b (int64 i, bool c, float[3] acc) => (bool co, float[3] acc2) {
     co = Identity(c)
     acc2 = Add(acc, x)
  }>
}"""


@pytest.mark.parametrize("trips", [0, 1, 4])
def test_loop_traced_trip_count_is_a_while_loop(trips: int) -> None:
    (y,) = check(LOOP_TRACED_M, {"m": np.array(trips), "x": X3}, host_steps=0)
    np.testing.assert_allclose(y, X3 * (trips + 1))


def test_loop_condition_computed_by_the_body() -> None:
    text = """
    g (float[1] x) => (float[1] y, int64 n) {
      t = Constant <value = bool {1}> ()
      zero = Constant <value = int64 {0}> ()
      y, n = Loop ("", t, x, zero) <body = b (int64 i, bool c, float[1] a, int64 k)
                                           => (bool co, float[1] a2, int64 k2) {
         two = Constant <value = float {2.0}> ()
         a2 = Mul(a, two)
         limit = Constant <value = float {100.0}> ()
         less = Less(a2, limit)
         co = Squeeze(less)
         one = Constant <value = int64 {1}> ()
         k2 = Add(k, one)
      }>
    }"""
    y, n = check(text, {"x": np.array([3.0], np.float32)}, host_steps=0, reference=True)
    assert y.tolist() == [192.0] and int(n) == 6


LOOP_SCAN = """
g ({inputs}) => (float[2] y, float[N, 2] s) {{
  {m_def}
  y, s = Loop (m, "", x) <body = b (int64 i, bool c, float[2] a) => (bool co, float[2] a2, float[2] sc) {{
     co = Identity(c)
     fi = Cast <to = 1> (i)
     a2 = Add(a, fi)
     sc = Identity(a2)
  }}>
}}"""


def test_loop_static_trip_count_with_scan_outputs_is_lax_scan() -> None:
    text = LOOP_SCAN.format(inputs="float[2] x", m_def="m = Constant <value = int64 {4}> ()")
    y, s = check(text, {"x": np.array([1, 2], np.float32)}, host_steps=0)
    assert y.tolist() == [7.0, 8.0] and s.shape == (4, 2)


def test_loop_traced_trip_count_with_scan_outputs_breaks_the_graph() -> None:
    text = LOOP_SCAN.format(inputs="float[2] x, int64 m", m_def="")
    _, s = check(text, {"x": np.array([1, 2], np.float32), "m": np.array(3)}, host_steps=1)
    assert s.shape == (3, 2)


def test_loop_zero_iterations_gives_empty_scan_outputs() -> None:
    text = LOOP_SCAN.format(inputs="float[2] x", m_def="m = Constant <value = int64 {0}> ()")
    y, s = check(text, {"x": np.array([1, 2], np.float32)}, host_steps=0)
    assert y.tolist() == [1.0, 2.0] and s.shape == (0, 2) and s.dtype == np.float32


LOOP_GROWING = """
g (float[1] x{m_input}) => (float[N] y) {{
  {m_def}
  y = Loop (m, "", x) <body = b (int64 i, bool c, float[N] a) => (bool co, float[N] a2) {{
     co = Identity(c)
     a2 = Concat <axis = 0> (a, x)
  }}>
}}"""


def test_loop_with_growing_state_and_static_trip_count_is_unrolled() -> None:
    text = LOOP_GROWING.format(m_input="", m_def="m = Constant <value = int64 {3}> ()")
    (y,) = check(text, {"x": np.array([1.5], np.float32)}, host_steps=0)
    assert y.tolist() == [1.5] * 4


def test_loop_with_growing_state_and_traced_trip_count_breaks_the_graph() -> None:
    text = LOOP_GROWING.format(m_input=", int64 m", m_def="")
    (y,) = check(text, {"x": np.array([1.5], np.float32), "m": np.array(2)}, host_steps=1)
    assert y.tolist() == [1.5] * 3


def test_loop_iteration_number_used_as_a_shape_is_unrolled() -> None:
    # Slice needs its ends static: in a lax loop the iteration number is traced.
    text = """
    g (float[5] x) => (seq(float[N]) y) {
      m = Constant <value = int64 {3}> ()
      empty = SequenceEmpty ()
      y = Loop (m, "", empty) <body = b (int64 i, bool c, seq(float[N]) s) => (bool co, seq(float[N]) s2) {
         co = Identity(c)
         one = Constant <value = int64[1] {1}> ()
         zero = Constant <value = int64[1] {0}> ()
         ax = Constant <value = int64[1] {0}> ()
         i1 = Unsqueeze(i, ax)
         end = Add(i1, one)
         part = Slice(x, zero, end)
         s2 = SequenceInsert(s, part)
      }>
    }"""
    x = np.arange(5, dtype=np.float32)
    (y,) = check(text, {"x": x}, host_steps=0)
    assert_same(y, [x[:1], x[:2], x[:3]])


def test_loop_initial_cond_false_runs_zero_times() -> None:
    text = LOOP_TRACED_M.replace('(m, "", x)', "(m, f, x)").replace(
        "g (int64 m, float[3] x) => (float[3] y) {",
        "g (int64 m, float[3] x) => (float[3] y) {\n  f = Constant <value = bool {0}> ()")
    (y,) = check(text, {"m": np.array(5), "x": X3}, host_steps=0, reference=True)
    np.testing.assert_allclose(y, X3)


def test_loop_opset11_with_outer_scope_reads() -> None:
    (y,) = check(LOOP_TRACED_M, {"m": np.array(2), "x": X3}, host_steps=0, opset=11)
    np.testing.assert_allclose(y, 3 * X3)


def test_loop_without_end_is_an_error() -> None:
    text = """
    g (float[1] x) => (float[1] y) {
      y = Loop ("", "", x) <body = b (int64 i, bool c, float[1] a) => (bool co, float[1] a2) {
         co = Identity(c)
         a2 = Neg(a)
      }>
    }"""
    model = onnx.parser.parse_model(HEADER.format(opset=17) + text)
    with pytest.raises(oxla.LoweringError, match="the loop never ends"):
        oxla.compile(model)({"x": np.ones(1, np.float32)})


SCAN9 = """
g (float[2] s0, float[2, 3] x) => (float[2] s, float[2, 3] ys) {{
  s, ys = Scan (s0, x) <num_scan_inputs = 1, {attrs}
      body = b (float[2] st, float[2] xt) => (float[2] st2, float[2] yt) {{
     st2 = Add(st, xt)
     yt = Identity(st2)
  }}>
}}"""


@pytest.mark.parametrize("attrs", [
    "scan_input_axes = [1],",
    "scan_input_axes = [-1], scan_input_directions = [1],",
    "scan_input_axes = [1], scan_output_axes = [-1], scan_output_directions = [1],",
])
def test_scan9_axes_and_directions(attrs: str) -> None:
    feeds = {"s0": np.zeros(2, np.float32), "x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    text = SCAN9.format(attrs=attrs)
    if "scan_output_axes" not in attrs:
        text = text.replace("float[2, 3] ys", "float[3, 2] ys")
    check(text, feeds, host_steps=0)  # onnx.reference implements only axis 0, forward


def test_scan8_batch_axis_and_sequence_lens() -> None:
    text = """
    g (int64[2] lens, float[2, 2] s0, float[2, 3, 2] x) => (float[2, 2] s, float[2, 3, 2] ys) {
      s, ys = Scan (lens, s0, x) <num_scan_inputs = 1, directions = [1],
          body = b (float[2] st, float[2] xt) => (float[2] st2, float[2] yt) {
         st2 = Add(st, xt)
         yt = Identity(st2)
      }>
    }"""
    x = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    model = onnx.parser.parse_model(HEADER.format(opset=8) + text)
    result = oxla.compile(model)({"lens": np.array([3, 2]), "s0": np.zeros((2, 2), np.float32), "x": x})
    # Batch 1 scans only its first two steps, backward; the step past its length is zero.
    want_ys = np.stack([np.cumsum(x[0, ::-1], axis=0), np.concatenate([np.cumsum(x[1, 1::-1], axis=0),
                                                                        np.zeros((1, 2))])])
    np.testing.assert_allclose(result["ys"], want_ys)
    np.testing.assert_allclose(result["s"], [x[0].sum(0), x[1, :2].sum(0)])


def test_scan_with_growing_state_is_unrolled() -> None:
    text = """
    g (float[1] s0, float[3, 1] x) => (float[N] s, float[3, 1] ys) {
      s, ys = Scan (s0, x) <num_scan_inputs = 1,
          body = b (float[N] st, float[1] xt) => (float[N] st2, float[1] yt) {
         st2 = Concat <axis = 0> (st, xt)
         yt = Identity(xt)
      }>
    }"""
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    # onnxruntime's Scan requires state shapes to stay the same.
    s, _ = check(text, {"s0": np.ones(1, np.float32), "x": x}, host_steps=0, reference=True,
                  ort=False)
    assert s.tolist() == [1.0, 0.0, 1.0, 2.0]


def test_if_inside_a_lax_loop_body() -> None:
    # The iteration number is traced inside lax.scan, so the If becomes a lax.cond in the body.
    text = """
    g (float[2] x) => (float[2] y, float[5, 2] s) {
      m = Constant <value = int64 {5}> ()
      y, s = Loop (m, "", x) <body = b (int64 i, bool c, float[2] a) => (bool co, float[2] a2, float[2] sc) {
         co = Identity(c)
         two = Constant <value = int64 {2}> ()
         zero = Constant <value = int64 {0}> ()
         r = Mod(i, two)
         even = Equal(r, zero)
         a2 = If (even) <then_branch = t () => (float[2] o) { o = Add(a, x) },
                         else_branch = e () => (float[2] o) { o = Neg(a) }>
         sc = Identity(a2)
      }>
    }"""
    check(text, {"x": np.array([1.0, -2.0], np.float32)}, host_steps=0)


def test_data_dependent_scan_outputs_cannot_be_one_pure_function() -> None:
    compiled = oxla.compile(parse(LOOP_SCAN.format(inputs="float[2] x, int64 m", m_def="")))
    feeds = {"x": np.array([1, 2], np.float32), "m": np.array(3)}
    with pytest.raises(oxla.NotStaticError, match=r"M \(the trip count decides the scan outputs"):
        jax.jit(compiled.fn)(compiled.params, feeds)


def test_25_nested_ifs_on_a_runtime_condition_trace_each_branch_once() -> None:
    # each If used to trace its branches twice (a shape probe, then lax.cond): 2^25 traces
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    inner = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "leaf", [], [out])
    for d in range(25):
        other = helper.make_graph([helper.make_node("Sub", ["x", "x"], ["y"])], f"e{d}", [], [out])
        inner = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=other)],
                                  f"t{d}", [], [out])
    graph = helper.make_graph(list(inner.node), "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                                      helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [out])
    sess = oxla.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    x = np.array([1.0, 2.0], np.float32)
    assert sess.run(None, {"c": np.array(True), "x": x})[0].tolist() == [2.0, 4.0]
    assert sess.run(None, {"c": np.array(False), "x": x})[0].tolist() == [0.0, 0.0]
    assert sess.compiled.stats.host_steps == 0


def test_a_million_iterations_over_constants_compile_instead_of_unrolling() -> None:
    model = onnx.parser.parse_model(HEADER.format(opset=17) + """
        g (float[2] x) => (float[2] y) {
            M = Constant<value = int64 {1000000}>()
            c = Constant<value = bool {1}>()
            a0 = Constant<value = float[2] {0.0, 0.0}>()
            acc = Loop(M, c, a0) <body = b (int64 i, bool cin, float[2] a) => (bool cout, float[2] aout) {
                cout = Identity(cin)
                one = Constant<value = float {1.0}>()
                aout = Add(a, one)
            }>
            y = Add(x, acc)
        }""")
    sess = oxla.InferenceSession(model.SerializeToString())
    assert sess.run(None, {"x": np.ones(2, np.float32)})[0].tolist() == [1000001.0] * 2
