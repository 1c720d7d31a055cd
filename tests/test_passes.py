"""Graph passes: op classification and large constants becoming parameters."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import oxla
from oxla.passes.classify import classify


def test_large_float_constant_becomes_a_parameter() -> None:
    big = numpy_helper.from_array(np.arange(2048, dtype=np.float32), "w")
    small = numpy_helper.from_array(np.arange(4, dtype=np.float32), "s")
    nodes = [helper.make_node("Constant", [], ["w"], value=big),
             helper.make_node("Constant", [], ["s"], value=small),
             helper.make_node("Add", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2048])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2048])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = oxla.compile(model)
    assert "w" in compiled.params and "s" not in compiled.params
    out = compiled({"x": np.ones(2048, np.float32)})["y"]
    np.testing.assert_array_equal(np.asarray(out), np.arange(2048, dtype=np.float32) + 1)
    assert "w" not in oxla.compile(model, bake_weights=True).params


def _fills(ir_version: int, listed: bool) -> onnx.ModelProto:
    """A Conv whose weight and bias are ConstantOfShape fills of constant shapes (as onnx's light
    model zoo files build them), the shapes initializers listed as graph inputs where `listed`
    (IR 3 required it), and fills that must stay nodes: an int64 one and a 4 TB one."""
    shapes = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
              (([8, 3, 3, 3], "w_shape"), ([8], "b_shape"), ([2], "i_shape"), ([1_000_000, 1_000_000], "huge_shape"))]
    value = numpy_helper.from_array(np.array([0.05], np.float32), "v")
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w"], value=value),
             helper.make_node("ConstantOfShape", ["b_shape"], ["b"], value=numpy_helper.from_array(np.array([0.5], np.float32), "v")),
             helper.make_node("ConstantOfShape", ["i_shape"], ["i"], value=numpy_helper.from_array(np.array([3], np.int64), "v")),
             helper.make_node("ConstantOfShape", ["huge_shape"], ["huge"], value=value),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])]
    if listed:
        inputs += [helper.make_tensor_value_info(t.name, onnx.TensorProto.INT64, list(t.dims)) for t in shapes]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 16, 16]),
                                                   helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [3, 3])],
                              shapes)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9 if ir_version < 4 else 17)],
                             ir_version=ir_version)


def test_constant_fills_of_constant_shapes_become_weights() -> None:
    """ConstantOfShape of a constant shape and a float value folds to an initializer (onnx's light
    zoo AlexNet filled its 235 MB of weights every call: 4.1x onnxruntime's time, 1.03-1.08x
    folded); an integer fill and one over the memory budget stay nodes, nothing allocated; an
    initializer listed as a graph input is a constant before IR 4 only, and then not among the
    session's inputs, as in onnxruntime."""
    import onnxruntime as ort

    from oxla.passes.constants import (
        constant_fills_to_initializers,
        listed_initializers_to_constants,
    )

    for ir_version, listed, folded in ((3, True, 2), (8, False, 2), (8, True, 0)):
        model = _fills(ir_version, listed)
        # IR 3 lists its initializers as inputs: constants all the same, off the graph's inputs
        assert listed_initializers_to_constants(model) == (4 if ir_version < 4 else 0)
        assert len(model.graph.input) == (1 if ir_version < 4 or not listed else 5)
        assert constant_fills_to_initializers(model, memory_limit=1 << 30) == folded, (ir_version, listed)
        ops = [n.op_type for n in model.graph.node]
        assert ops.count("ConstantOfShape") == 4 - folded
        if folded:
            inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
            assert inits["w"].shape == (8, 3, 3, 3) and inits["w"].dtype == np.float32
            np.testing.assert_array_equal(inits["b"], np.full(8, 0.5, np.float32))
    model = _fills(3, True)
    del model.graph.node[3]  # the 4 TB fill: a session refuses it only when it runs
    model.graph.output[1].name = "i"
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = onnxruntime_run(model, {"x": x})
    session = oxla.InferenceSession(model.SerializeToString())
    assert [i.name for i in session.get_inputs()] == [i.name for i in ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]).get_inputs()] == ["x"]
    assert "ConstantOfShape" not in [n.op_type for n in session.compiled.plan.nodes if n.output[0] != "i"]
    for got, w in zip(session.run(None, {"x": x}), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def test_identities_of_initializers_read_the_initializer() -> None:
    """torch writes one initializer for equal tensors and an Identity of it for each other use:
    the readers read the initializer, and the Identities go, except one that is a graph output,
    one a subgraph reads, and one of an initializer the caller may feed."""
    from oxla.passes.constants import initializer_aliases

    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    fed = numpy_helper.from_array(np.ones(4, np.float32), "fed")
    then = helper.make_graph([helper.make_node("Add", ["x", "b_sub"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("Identity", ["b"], [name]) for name in ("b_1", "b_2", "b_out", "b_sub")]
    nodes += [helper.make_node("Identity", ["fed"], ["fed_1"]),
              helper.make_node("Add", ["x", "b_1"], ["a"]), helper.make_node("Add", ["a", "b_2"], ["c"]),
              helper.make_node("Add", ["c", "fed_1"], ["d"]),
              helper.make_node("ReduceSum", ["d"], ["s"], keepdims=0),
              helper.make_node("Greater", ["s", "b_zero"], ["p"]),
              helper.make_node("If", ["p"], ["y"], then_branch=then, else_branch=then)]
    zero = numpy_helper.from_array(np.float32(-1e9), "b_zero")
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4]) for n in ("x", "fed")],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4]) for n in ("y", "b_out")],
        [b, fed, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = np.arange(4, dtype=np.float32)
    want = onnxruntime_run(model, {"x": x, "fed": np.ones(4, np.float32)})
    assert initializer_aliases(model) == 2
    assert [n.input[1] for n in model.graph.node if n.op_type == "Add"] == ["b", "b", "fed_1"]
    assert [n.output[0] for n in model.graph.node if n.op_type == "Identity"] == ["b_out", "b_sub", "fed_1"]
    for got, w in zip(oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x}), want,
                      strict=True):
        np.testing.assert_array_equal(got, w)


def onnxruntime_run(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_classify_native_expanded_local() -> None:
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18, "local" : 1]>
        g (float[3] x) => (float[3] y) { a = local.Twice(x) y = HardSwish(a) z = Softsign(a) }
        <domain: "local", opset_import: ["" : 18]>
        Twice (x) => (y) { y = Add(x, x) }
    """)
    kinds = {u.op_type: u.kind for u in classify(m)}
    assert kinds["Twice"] == "local-function"
    assert kinds["Add"] == "native"
    assert kinds["HardSwish"] == "native"


LOCAL = """
    <ir_version: 8, opset_import: ["" : 18, "local" : 1]>
    g (float[4] x) => (float[4] y, float[4] z) {
        y = local.Leaky <alpha: float = 0.5> (x)
        z = local.Leaky (x)
    }
    <domain: "local", opset_import: ["" : 18]>
    Leaky <alpha: float = 0.25> (x) => (y) { y = LeakyRelu <alpha: float = @alpha> (x) }
"""


def test_local_function_attribute_reference_and_default() -> None:
    m = onnx.parser.parse_model(LOCAL)
    x = np.array([-4, -1, 0, 2], np.float32)
    y, z = oxla.InferenceSession(m.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(y, np.where(x < 0, 0.5 * x, x))
    np.testing.assert_allclose(z, np.where(x < 0, 0.25 * x, x))


def test_conv_kernels_stored_hwio_give_the_same_result() -> None:
    from oxla.lowering.context import Options
    from oxla.passes import channels_last
    from oxla.passes.weight_layout import SUFFIX

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    shared = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "s")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "s"], ["b"]),
             helper.make_node("Add", ["b", "s"], ["y"])]  # 's' is read elsewhere: left alone
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w, shared])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    plain = oxla.CompiledModel(model)
    laid_out = oxla.CompiledModel(model, Options(layout_weights=True))
    # 's' is also added to a channels-last value: ChannelsLastPass keeps an NHWC copy of it
    assert set(laid_out.params) == {"w" + SUFFIX, "s", "s" + channels_last.SUFFIX}
    assert laid_out.params["w" + SUFFIX].shape == (3, 3, 3, 4)
    np.testing.assert_allclose(np.asarray(laid_out({"x": x})["y"]), np.asarray(plain({"x": x})["y"]),
                               rtol=1e-5, atol=1e-5)


def test_gemm_weights_stored_kn_give_the_same_result() -> None:
    from oxla.lowering.context import Options
    from oxla.passes.weight_layout import KN_SUFFIX

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((5, 7)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((5,)).astype(np.float32), "b")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 7])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 5])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.standard_normal((3, 7)).astype(np.float32)
    laid_out = oxla.CompiledModel(model, Options(layout_weights=True))
    assert laid_out.params["w" + KN_SUFFIX].shape == (7, 5)
    np.testing.assert_allclose(np.asarray(laid_out({"x": x})["y"]),
                               x @ numpy_helper.to_array(w).T + numpy_helper.to_array(b), rtol=1e-5)


def test_bidirectional_recurrent_weights_stored_per_direction() -> None:
    """R of a bidirectional GRU/LSTM/RNN becomes one parameter per direction, joined by a
    Concat; an R read elsewhere stays whole. Outputs equal onnxruntime's."""
    import onnxruntime as ort

    from oxla.lowering.context import Options
    from oxla.passes.weight_layout import DIRECTION_SUFFIX

    rng = np.random.default_rng(2)
    hidden, inp, steps = 6, 5, 4
    nodes, inits, outputs = [], [], []
    for op, gates in (("GRU", 3), ("LSTM", 4), ("RNN", 1)):
        w = rng.standard_normal((2, gates * hidden, inp)).astype(np.float32) * 0.3
        r = rng.standard_normal((2, gates * hidden, hidden)).astype(np.float32) * 0.3
        inits += [numpy_helper.from_array(w, f"{op}_w"), numpy_helper.from_array(r, f"{op}_r")]
        nodes.append(helper.make_node(op, ["x", f"{op}_w", f"{op}_r"], [f"{op}_y"],
                                      hidden_size=hidden, direction="bidirectional"))
        outputs.append(f"{op}_y")
    # the RNN's R also read by a ReduceSum: left whole
    nodes.append(helper.make_node("ReduceSum", ["RNN_r"], ["r_sum"], keepdims=0))
    outputs.append("r_sum")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [steps, 1, inp])],
                              [helper.make_empty_tensor_value_info(o) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((steps, 1, inp)).astype(np.float32)
    laid_out = oxla.CompiledModel(model, Options(layout_weights=True))
    params = set(laid_out.params)
    for op in ("GRU", "LSTM"):
        assert {f"{op}_r{DIRECTION_SUFFIX}0", f"{op}_r{DIRECTION_SUFFIX}1"} <= params
        assert f"{op}_r" not in params
        assert laid_out.params[f"{op}_r{DIRECTION_SUFFIX}1"].shape == (1, (3 if op == "GRU" else 4) * hidden, hidden)
    assert "RNN_r" in params and f"RNN_r{DIRECTION_SUFFIX}0" not in params
    got = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6)


def _conv_bn(group: int = 1, bias: bool = True, stats_as_inputs: bool = False, second_reader: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    c, m = 8, 16
    inits = [numpy_helper.from_array((rng.standard_normal((m, c // group, 3, 3)) / 3).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b"))
    stats = {"scale": rng.uniform(0.5, 2, m), "beta": rng.standard_normal(m), "mean": rng.standard_normal(m),
             "var": rng.uniform(0.1, 3, m)}
    inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in stats.items()]
    nodes = [helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, m, 12, 12])]
    if second_reader:
        outputs.append(helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [1, m, 12, 12]))
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, 12, 12])]
    if stats_as_inputs:
        inputs += [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, [m]) for k in stats]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)


def test_batch_norm_after_a_conv_folds_into_its_weights() -> None:
    """Conv -> BatchNormalization (inference) is one Conv of scaled weights and shifted bias, as
    onnxruntime fuses them (the light zoo's ResNet-50: 53 of them, 1.21x -> 1.01-1.06x
    onnxruntime's time); not when the Conv's output has another reader or the statistics may be
    fed; the results agree with onnxruntime."""
    from oxla.passes.batch_norm_fold import fold_batch_norms

    x = np.random.default_rng(4).standard_normal((1, 8, 12, 12)).astype(np.float32)
    for group, bias in ((1, True), (1, False), (8, True)):
        model = _conv_bn(group, bias)
        want = onnxruntime_run(model, {"x": x})
        folded = onnx.ModelProto()
        folded.CopyFrom(model)
        assert fold_batch_norms(folded) == 1
        assert [n.op_type for n in folded.graph.node] == ["Conv", "Relu"]
        assert {t.name for t in folded.graph.initializer} == {"n__oxla_bn_w", "n__oxla_bn_b"}
        got = onnxruntime_run(folded, {"x": x})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        session = oxla.InferenceSession(model.SerializeToString())
        assert "BatchNormalization" not in [n.op_type for n in session.compiled.plan.nodes]
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)
    for kept in (_conv_bn(second_reader=True), _conv_bn(stats_as_inputs=True)):
        assert fold_batch_norms(kept) == 0
        assert "BatchNormalization" in [n.op_type for n in kept.graph.node]
    training = _conv_bn()
    bn = training.graph.node[1]
    bn.attribute.append(helper.make_attribute("training_mode", 1))
    assert fold_batch_norms(training) == 0


def test_initializers_written_by_the_passes_read_back_as_numpy_helper_writes_them() -> None:
    """graph.set_tensor copies a numeric array's bytes once as raw_data; other dtypes (strings,
    bfloat16) go through numpy_helper.from_array; both read back equal, shape and dtype kept."""
    import ml_dtypes

    from oxla.graph import add_initializer, set_tensor

    graph = onnx.GraphProto()
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((3, 5)).astype(t) for t in (np.float32, np.float64, np.float16)]
    values += [rng.integers(-9, 9, (2, 7)).astype(t) for t in (np.int64, np.int32, np.int16, np.int8, np.uint8)]
    values += [np.array([True, False, True]), np.float32(2.5), np.zeros((0, 4), np.float32),
               np.asfortranarray(rng.standard_normal((4, 6)).astype(np.float32)),
               np.array(["a", "bc"], dtype=object), np.array([1.5, -2], dtype=ml_dtypes.bfloat16)]
    for i, value in enumerate(values):
        tensor = add_initializer(graph, f"t{i}", value)
        assert tensor.name == f"t{i}"
        back = numpy_helper.to_array(tensor)
        assert back.dtype == np.asarray(value).dtype and back.shape == np.shape(value)
        np.testing.assert_array_equal(back, value)
    set_tensor(graph.initializer[0], "again", np.arange(6, dtype=np.int64).reshape(2, 3))
    assert graph.initializer[0].name == "again"
    np.testing.assert_array_equal(numpy_helper.to_array(graph.initializer[0]),
                                  np.arange(6).reshape(2, 3))


def test_large_weights_transpose_in_tiles() -> None:
    from oxla.graph import transposed

    a = np.random.default_rng(1).standard_normal((1100, 1030)).astype(np.float32)  # > 1M, ragged tiles
    out = transposed(a)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, a.T)
    np.testing.assert_array_equal(transposed(a[:3, :4]), a[:3, :4].T)
    b = a[:16, :18].reshape(2, 8, 18)
    np.testing.assert_array_equal(transposed(b, (2, 0, 1)), np.transpose(b, (2, 0, 1)))
