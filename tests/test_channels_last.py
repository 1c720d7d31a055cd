"""ChannelsLastPass: which nodes move channels last, and that the rewritten graph computes the same."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla.lowering.context import Options
from oxla.passes import channels_last
from oxla.passes.channels_last import DOMAIN, convs_to_channels_last

RNG = np.random.default_rng(0)


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _model(nodes: list, inits: list, outputs: list[str], opset: int = 17,
           x_shape: tuple = (2, 4, 9, 9)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
        [helper.make_empty_tensor_value_info(o) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _planned(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return oxla.CompiledModel(copy, Options(layout_weights=True)).model


def _check(model: onnx.ModelProto, x: np.ndarray | None = None) -> onnx.ModelProto:
    """oxla's session (pass on) against onnxruntime; returns the planned model."""
    if x is None:
        dims = model.graph.input[0].type.tensor_type.shape.dim
        x = RNG.standard_normal([d.dim_value for d in dims]).astype(np.float32)
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = oxla.InferenceSession(data).run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return _planned(model)


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


@pytest.fixture
def pass_off() -> Iterator[None]:
    channels_last.ENABLED = False
    try:
        yield
    finally:
        channels_last.ENABLED = True


def test_mobile_block_runs_channels_last_with_transposes_at_the_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Conv, BN, Clip, depthwise Conv, HardSwish, residual Add, SE block, pools, Concat, head.
    (The BatchNormalization after the Conv would fold into its weights: BatchNormFoldPass is
    off here, to run it channels last.)"""
    import oxla.plan

    monkeypatch.setattr(oxla.plan, "fold_batch_norms", lambda model: 0)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "t", "mu", "var"], ["bn"]),
        helper.make_node("Clip", ["bn", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "dw"], ["c2"], group=8, pads=[2, 2, 2, 2]),
        helper.make_node("HardSwish", ["c2"], ["h"]),
        helper.make_node("Add", ["h", "r1"], ["res"]),
        helper.make_node("GlobalAveragePool", ["res"], ["gap"]),
        helper.make_node("Conv", ["gap", "se1"], ["se"]),
        helper.make_node("HardSigmoid", ["se"], ["gate"]),
        helper.make_node("Mul", ["res", "gate"], ["scaled"]),
        helper.make_node("Mul", ["scaled", "per_channel"], ["scaled2"]),
        helper.make_node("MaxPool", ["scaled2"], ["mp"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["scaled2"], ["ap"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], ceil_mode=1),
        helper.make_node("Concat", ["mp", "ap"], ["cat"], axis=1),
        helper.make_node("ReduceMean", ["cat"], ["mean"], axes=[2, 3], keepdims=1),
        helper.make_node("Flatten", ["mean"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc"], ["y"], transB=1),
    ]
    inits = [_w("w1", 8, 4, 3, 3), _w("b1", 8), _w("s", 8), _w("t", 8), _w("mu", 8),
             numpy_helper.from_array(np.linspace(0.5, 2, 8).astype(np.float32), "var"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi"),
             _w("dw", 8, 1, 5, 5), _w("se1", 8, 8, 1, 1), _w("per_channel", 8, 1, 1),
             _w("fc", 3, 16)]
    planned = _check(_model(nodes, inits, ["y", "h"], opset=14))
    ops = _ops(planned)
    for op in ("Conv", "BatchNormalization", "GlobalAveragePool", "MaxPool", "AveragePool"):
        assert (DOMAIN, op) in ops, op
    assert ("", "Conv") not in ops
    # the planned model is still a model that onnxruntime runs: its channels-last ops carry ONNX
    # function bodies (onnx.checker on a planned model: tests/test_ort_parity.py)
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    again = ort.InferenceSession(planned.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(again.run(None, {"x": x})[0], oxla.InferenceSession(
        _model(nodes, inits, ["y", "h"], opset=14).SerializeToString()).run(None, {"x": x})[0],
        rtol=1e-4, atol=1e-5)
    # in: x; out: 'h' (a graph output) and 'mean' (read by Flatten)
    transposes = [n for n in planned.graph.node if n.op_type == "Transpose" and n.name.endswith(
        ("_to_nhwc", "_to_nchw"))]
    assert sorted(n.name for n in transposes) == ["h_to_nchw", "mean_to_nchw", "x_to_nhwc"]


def test_the_pass_switched_off_leaves_the_graph(pass_off: None) -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    planned = _planned(_model(nodes, [_w("w", 3, 4, 1, 1)], ["y"]))
    assert ("", "Conv") in _ops(planned) and not any(d == DOMAIN for d, _ in _ops(planned))


def test_layout_sensitive_and_unknown_operands_read_channels_first() -> None:
    """A Reshape, an operand of unknown rank and a Softmax over channels all see NCHW values."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c"], ["shape"]),
        helper.make_node("Reshape", ["c", "shape"], ["same"]),
        helper.make_node("Softmax", ["c"], ["soft"], axis=1),
        helper.make_node("Add", ["same", "soft"], ["sum"]),  # 'same', 'soft' have no known rank
        helper.make_node("Relu", ["sum"], ["y"]),
    ]
    planned = _check(_model(nodes, [_w("w", 5, 4, 3, 3)], ["y"]))
    assert (DOMAIN, "Conv") in _ops(planned)
    assert [n.op_type for n in planned.graph.node if n.name == "c_to_nchw"] == ["Transpose"]


@pytest.mark.parametrize("axes,keepdims,moved", [
    ([2, 3], 0, True),    # (N, C) either way
    ([-1, -2], 1, True),
    ([1], 0, True),       # (N, H, W) either way
    ([2], 0, False),      # NCHW keeps (N, C, W), NHWC would give (N, W, C)
])
def test_reduce_axes_are_renumbered(axes: list[int], keepdims: int, moved: bool) -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("ReduceMean", ["c", "axes"], ["y"], keepdims=keepdims)]
    inits = [_w("w", 3, 4, 1, 1), numpy_helper.from_array(np.asarray(axes, np.int64), "axes")]
    planned = _check(_model(nodes, inits, ["y"], opset=18))
    reduce = next(n for n in planned.graph.node if n.op_type == "ReduceMean")
    assert reduce.input[0].endswith(channels_last.SUFFIX) == moved


def test_maxpool_with_indices_and_subgraph_reads_stay_channels_first() -> None:
    branch = helper.make_graph([helper.make_node("Relu", ["c"], ["out"])], "b", [],
                               [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("MaxPool", ["c"], ["mp", "idx"], kernel_shape=[2, 2]),
        helper.make_node("Cast", ["idx"], ["idx_f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("If", ["cond"], ["branch"], then_branch=branch, else_branch=branch),
    ]
    inits = [_w("w", 3, 4, 1, 1), numpy_helper.from_array(np.asarray(True), "cond")]
    planned = _check(_model(nodes, inits, ["mp", "idx_f", "branch"]))
    assert ("", "MaxPool") in _ops(planned)


def test_model_without_convolutions_is_unchanged() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [], ["y"])
    before = model.SerializeToString()
    assert convs_to_channels_last(model) == 0
    assert model.SerializeToString() == before


def test_weights_from_constant_of_shape_and_dropout_mask() -> None:
    """Light squeezenet's pattern: W made by ConstantOfShape; Dropout's mask read as an output."""
    nodes = [
        helper.make_node("ConstantOfShape", ["w_shape"], ["w"],
                         value=numpy_helper.from_array(np.asarray([0.1], np.float32))),
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Dropout", ["c"], ["y", "mask"], ratio=0.5),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=onnx.TensorProto.FLOAT),
    ]
    inits = [numpy_helper.from_array(np.asarray([3, 4, 1, 1], np.int64), "w_shape")]
    model = _model(nodes, inits, ["y", "mask_f"], opset=9)
    assert (DOMAIN, "Conv") in _ops(_planned(model))
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    on = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    channels_last.ENABLED = False
    try:
        off = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    finally:
        channels_last.ENABLED = True
    for a, b in zip(on, off):  # (onnxruntime 1.32 gives an all-false mask at opset 9)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_lower_rank_operands_computed_in_the_graph() -> None:
    """DenseNet's (light model) BatchNorm as Mul/Add by Unsqueeze'd (C,) vectors, and a (W,) row."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["scale"], ["scale_r"]),  # computed, not an initializer
        helper.make_node("Unsqueeze", ["scale_r"], ["scale_u"], axes=[1, 2]),
        helper.make_node("Mul", ["c", "scale_u"], ["m"]),
        helper.make_node("Neg", ["row"], ["row_n"]),
        helper.make_node("Add", ["m", "row_n"], ["y"]),  # (9,) broadcasts along W
    ]
    inits = [_w("w", 3, 4, 3, 3), _w("scale", 3), _w("row", 9)]
    planned = _check(_model(nodes, inits, ["y"], opset=9))
    assert [n.op_type for n in planned.graph.node if n.domain == DOMAIN].count("ToLast") == 2
    names = [n.name for n in planned.graph.node if n.op_type == "Transpose"]
    assert names == ["w_to_oihw", "x_to_nhwc", "y_to_nchw"]  # the kernel's is WeightLayoutPass's


def test_channel_shuffle_stays_channels_last() -> None:
    """ShuffleNet's Reshape (N, g, C/g, H, W) -> Transpose (0, 2, 1, 3, 4) -> Reshape (N, C, H, W)."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], group=2),
        helper.make_node("Reshape", ["c", "s5"], ["r5"]),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "s4"], ["shuffled"]),
        helper.make_node("Conv", ["shuffled", "w2"], ["y"], group=3),
    ]
    inits = [_w("w", 6, 2, 1, 1), _w("w2", 6, 2, 3, 3),
             numpy_helper.from_array(np.asarray([0, 3, 2, 9, -1], np.int64), "s5"),
             numpy_helper.from_array(np.asarray([2, -1, 9, 9], np.int64), "s4")]
    planned = _check(_model(nodes, inits, ["y"]))
    edges = [n.name for n in planned.graph.node if n.name.endswith(("_to_nhwc", "_to_nchw"))]
    assert edges == ["x_to_nhwc", "y_to_nchw"]


@pytest.mark.parametrize("axes", [[1], [-3, 2], None])
def test_slice_split_and_resize_stay_channels_last(axes: list[int] | None) -> None:
    """ShuffleNetV2's channel split (Slice, Split) and DBNet's upsampling (Resize) renumbered."""
    slice_inputs = ["c", "starts", "ends"] + (["axes"] if axes is not None else [])
    n = len(axes) if axes is not None else 2
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Slice", slice_inputs, ["sl"]),
        helper.make_node("Split", ["c"], ["a", "b"], axis=1),
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Resize", ["ab", "", "scales"], ["up"], mode="linear"),
        helper.make_node("Resize", ["c", "", "", "sizes"], ["up2"], mode="nearest"),
    ]
    inits = [_w("w", 6, 4, 3, 3),
             numpy_helper.from_array(np.asarray([1, 2][:n], np.int64), "starts"),
             numpy_helper.from_array(np.asarray([4, 7][:n], np.int64), "ends"),
             numpy_helper.from_array(np.asarray([1, 1, 2, 1.5], np.float32), "scales"),
             numpy_helper.from_array(np.asarray([2, 6, 5, 12], np.int64), "sizes")]
    if axes is not None:
        inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
    planned = _check(_model(nodes, inits, ["sl", "up", "up2"], opset=13))
    edges = sorted(n.name for n in planned.graph.node if n.name.endswith(("_to_nhwc", "_to_nchw")))
    assert edges == ["sl_to_nchw", "up2_to_nchw", "up_to_nchw", "x_to_nhwc"]


@pytest.mark.parametrize("attrs, moved", [
    ({"strides": [2, 2]}, True),
    ({"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]}, True),
    ({"strides": [2, 2], "output_shape": [17, 18]}, True),
    ({"strides": [2, 2], "output_shape": [19, 18]}, True),  # grows: the channels-first rule
    ({"strides": [2, 2], "group": 2}, True),
    ({"strides": [1, 1]}, False),                       # kernel 2x2 at stride 1: not a dot
    ({"strides": [2, 2], "dilations": [2, 1]}, False),
])
def test_conv_transpose_with_kernel_equal_to_stride_runs_channels_last(attrs: dict,
                                                                        moved: bool) -> None:
    # DBNet's head: Conv, Relu, ConvTranspose 2x2/s2, BatchNorm, Relu, ConvTranspose to 1 channel
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("ConvTranspose", ["r1", "wt", "bt"], ["up"], **attrs),
             helper.make_node("BatchNormalization", ["up", "s", "t", "mu", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r2"]),
             helper.make_node("ConvTranspose", ["r2", "wt2"], ["y"], strides=[2, 2])]
    m = 4 * attrs.get("group", 1)
    inits = [_w("w1", 8, 4, 3, 3), _w("wt", 8, 4, 2, 2), _w("bt", m), _w("s", m), _w("t", m),
             _w("mu", m), numpy_helper.from_array(np.linspace(0.5, 2, m).astype(np.float32), "var"),
             _w("wt2", m, 1, 2, 2)]
    planned = _check(_model(nodes, inits, ["y"]))
    assert ((DOMAIN, "ConvTranspose") in _ops(planned)) is True  # the second one always moves
    assert [n.op_type for n in planned.graph.node if n.op_type == "ConvTranspose" and
            n.domain == ""] == ([] if moved else ["ConvTranspose"])
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    again = ort.InferenceSession(planned.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(again.run(None, {"x": x})[0], oxla.InferenceSession(
        _model(nodes, inits, ["y"]).SerializeToString()).run(None, {"x": x})[0],
        rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 3]},
    {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_UPPER"},
], ids=["resnet", "uneven-pads", "ceil", "dilations", "same-upper"])
def test_channels_last_max_pool_is_strided_slices(attrs: dict) -> None:
    """MaxPool between convolutions runs channels last as maxima of strided slices, not XLA's
    reduce_window: equal to onnxruntime on every geometry, negative inputs included."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c1"], ["mp"], **attrs),
             helper.make_node("Conv", ["mp", "w2"], ["y"])]
    model = _model(nodes, [_w("w1", 6, 4, 3, 3), _w("w2", 5, 6, 1, 1)], ["y"], x_shape=(1, 4, 11, 10))
    planned = _check(model)
    assert (DOMAIN, "MaxPool") in _ops(planned)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 2], "dilations": [2, 3]},
    {"kernel_shape": [9, 8], "pads": [2, 2, 2, 2], "count_include_pad": 1},
], ids=["shufflenet", "count-pads", "densenet", "uneven-pads", "ceil", "same-upper", "dilations",
        "large"])
def test_channels_last_average_pool_sums_strided_slices(attrs: dict) -> None:
    """AveragePool between convolutions runs channels last: window sums of strided slices, each
    divided by its count (no reduce_window, which XLA:CPU's YNNPACK fusions got wrong channels
    last inside light densenet121); a window of more than 32 slices (9 + 8 here is not) takes
    the channels-first rule between transposes. Equal to onnxruntime on every geometry."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c1"], ["ap"], **attrs),
             helper.make_node("Conv", ["ap", "w2"], ["y"])]
    model = _model(nodes, [_w("w1", 6, 4, 3, 3), _w("w2", 5, 6, 1, 1)], ["y"], opset=19,
                   x_shape=(1, 4, 11, 10))
    planned = _check(model)
    assert (DOMAIN, "AveragePool") in _ops(planned)


def test_channels_last_average_pool_of_a_large_window_reads_channels_first() -> None:
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c1"], ["ap"], kernel_shape=[17, 16]),
             helper.make_node("Conv", ["ap", "w2"], ["y"])]
    model = _model(nodes, [_w("w1", 6, 4, 3, 3), _w("w2", 5, 6, 1, 1)], ["y"],
                   x_shape=(1, 4, 20, 18))
    planned = _check(model)
    assert (DOMAIN, "AveragePool") in _ops(planned)  # the rule itself moves the axes


@pytest.mark.parametrize("x_shape", [(1, 4, 70, 66), (3, 4, 9, 5)])
def test_channels_last_global_average_pool_is_a_dot(x_shape: tuple) -> None:
    """GlobalAveragePool after a convolution runs channels last as a dot with a row of ones,
    per image of the batch: equal to onnxruntime's mean (70x66 pixels: past the size where XLA
    rewrites the reduction into blocks)."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c1"], ["gap"]),
             helper.make_node("Conv", ["gap", "w2"], ["y"])]
    model = _model(nodes, [_w("w1", 6, 4, 3, 3), _w("w2", 5, 6, 1, 1)], ["y", "gap"],
                   x_shape=x_shape)
    planned = _check(model)
    assert (DOMAIN, "GlobalAveragePool") in _ops(planned)


def test_compile_with_layout_weights_runs_the_session_passes() -> None:
    """oxla.compile keeps the file's parameters by default; layout_weights=True runs the passes
    InferenceSession runs (the conv channels last, its kernel renamed HWIO), same results."""
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["c"], ["y"])], [_w("w", 6, 4, 3, 3)], ["y"])
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    plain = oxla.compile(model)
    laid = oxla.compile(model, layout_weights=True)
    assert set(plain.params) == {"w"} and "w" not in laid.params
    assert (DOMAIN, "Conv") in _ops(laid.model) and (DOMAIN, "Conv") not in _ops(plain.model)
    for compiled in (plain, laid):
        np.testing.assert_allclose(np.asarray(compiled({"x": x})["y"]), want, rtol=1e-4, atol=1e-5)
        got = jax.jit(compiled.fn)(compiled.params, {"x": x})["y"]
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_channel_concat_read_by_convolutions_and_pools_joins_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A channels-last Concat that convolutions and pools read is joined as rows of matrices
    (XLA:CPU copies those 3x faster); one an elementwise op reads stays a 4-D join that op fuses.
    Both agree with onnxruntime."""
    from oxla.lowering.ops import layout

    joins: list[bool] = []
    whole = layout._read_whole
    monkeypatch.setattr(layout, "_read_whole", lambda cx: joins.append(whole(cx)) or joins[-1])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
             helper.make_node("MaxPool", ["ab"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Conv", ["ab", "w3"], ["c"]),
             helper.make_node("Concat", ["c", "a"], ["ca"], axis=1),
             helper.make_node("Relu", ["ca"], ["r"]),
             helper.make_node("Conv", ["r", "w4"], ["y"])]
    inits = [_w("w1", 6, 4, 3, 3), _w("w2", 5, 4, 1, 1), _w("w3", 7, 11, 1, 1), _w("w4", 3, 13, 1, 1)]
    _check(_model(nodes, inits, ["y", "p"], x_shape=(2, 4, 9, 9)))
    assert joins == [True, False]
