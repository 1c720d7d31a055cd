"""QLinearConvCenteringPass: QLinearConv with constant symmetric 8-bit weights in ops that fold at load.

QLinearConv is y = saturate(round(float32(acc) * M) + y_zp) with acc = conv(x - x_zp, w - w_zp)
+ B in int32 and M = x_scale * w_scale / y_scale rounded in float32 (MlasRequantizeOutput).
Computed as written, the int8 GEMM behind acc needs the row sums of the weights on every call
(x has a zero point). With constant weights and zero weight zero points it becomes

    acc = ConvInteger(int8 x - c, w) + ((c - x_zp) * rowsum(w) + B)     (qdq_conv.centered_conv)
    y   = oxla.quantized::Requantize(acc, M, y_zp)

M and the constant computed once, at load: bit for bit the rule's result (qmath.requantize).
Requantize is saturate(round(float32(acc) * M) + y_zp) in one loop: the float32 product rounded
to an integer by a float64 add (which LLVM cannot contract with the product into an FMA); its
ONNX function body is Cast, Mul and QuantizeLinear by 1. Written as those standard ops, oxla
stores the float32 product (its Mul must, before a possible Add) and divides by the 1: the
requantisations of a QOperator ResNet-50 took ~40% longer.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from oxla.graph import attribute_value, drop_initializers, model_opsets, node_reads
from oxla.passes.qdq_conv import _INT8, _Graph, centered_conv

DOMAIN = "oxla.quantized"


def _scalar(v: np.ndarray | None, dtypes: tuple[np.dtype, ...]) -> bool:
    return v is not None and v.size == 1 and v.dtype in dtypes


def _rewrite(g: _Graph, node: NodeProto) -> tuple[list[NodeProto], list[TensorProto]] | None:
    names = list(node.input) + [""] * (9 - len(node.input))
    x, xs, xz, w_name, ws, wz, ys, yz, b = names
    w = g.const(w_name)
    scales = [g.const(n) for n in (xs, ws, ys)]
    y_zp = g.const(yz)
    f32 = (np.dtype(np.float32),)
    if w is None or y_zp is None or w.dtype not in _INT8 or w.ndim < 3 or not _scalar(y_zp, _INT8) \
            or not (_scalar(scales[0], f32) and _scalar(scales[2], f32)) or scales[1] is None \
            or scales[1].dtype != np.float32 or scales[1].size not in (1, w.shape[0]):
        return None
    m, n = w.shape[0], w.ndim - 2
    bias = g.const(b) if b else None
    if b and (bias is None or bias.dtype != np.int32 or bias.size != m):
        return None
    y = node.output[0]
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    acc = y + "__oxla_acc"
    done = centered_conv(g, (node.name or node.output[0]) + "__oxla_int", (x, xz, w_name, wz), w, attrs, acc,
                         None if bias is None else bias.reshape(-1))
    if done is None:
        return None
    nodes, consts = done
    xs_v, ws_v, ys_v = (np.asarray(v, np.float32).reshape(-1) for v in scales)  # type: ignore[arg-type]
    multiplier = (xs_v * ws_v) / ys_v  # float32 product, then float32 division: output_scale
    consts.append(numpy_helper.from_array(
        np.broadcast_to(multiplier, (m,)).reshape((m,) + (1,) * n).astype(np.float32), y + "__oxla_multiplier"))
    nodes.append(helper.make_node("Requantize", [acc, y + "__oxla_multiplier", yz], [y], domain=DOMAIN))
    return nodes, consts


def qlinear_conv_centered(model: ModelProto) -> int:
    """Rewrite the ai.onnx QLinearConv nodes of the top-level graph that qualify; returns how many."""
    graph = model.graph
    g = _Graph(graph, model_opsets(model.opset_import).get("", 0))
    out: list[NodeProto] = []
    extra: list[TensorProto] = []
    count = 0
    for node in graph.node:
        done = _rewrite(g, node) if node.op_type == "QLinearConv" and node.domain in ("", "ai.onnx") else None
        if done is None:
            out.append(node)
            continue
        out.extend(done[0])
        extra.extend(done[1])
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(out)
        _add_body(model)
        read = set().union(*(node_reads(n) for n in out)) | {o.name for o in graph.output}
        drop_initializers(graph, lambda name: name not in read)  # the old zero points and scales
        graph.initializer.extend(extra)
    return count


def _add_body(model: ModelProto) -> None:
    """Requantize's domain and ONNX function body (Cast, Mul, QuantizeLinear by 1), once: the
    planned model stays one that onnxruntime runs."""
    if DOMAIN not in model_opsets(model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    if (DOMAIN, "Requantize") in {(f.domain, f.name) for f in model.functions}:
        return
    one = helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    nodes = [helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "multiplier"], ["scaled"]), one,
             helper.make_node("QuantizeLinear", ["scaled", "one", "zero_point"], ["y"])]
    opset = max(model_opsets(model.opset_import).get("", 13), 13)
    model.functions.append(helper.make_function(DOMAIN, "Requantize", ["acc", "multiplier", "zero_point"],
                                                ["y"], nodes, [helper.make_opsetid("", opset)]))
    model.ir_version = max(model.ir_version, 8)
