"""QDQConvToIntegerPass: DequantizeLinear -> Conv with constant int8 weights becomes ConvInteger.

A QDQ model writes each quantized convolution as Conv(DQ(x_q), DQ(w_q), DQ(b_q)): a float
convolution of dequantized values. Its exact value is x_scale * w_scale[m] * conv(x_q - x_zp,
w_q - w_zp) + b; XLA:CPU computes the integer convolution 5-10x faster than the float one
(qmath: int8 GEMMs), so the group becomes

    acc = ConvInteger(x_q, w_q, x_zp, w_zp)          exact, int32
    y   = Cast(acc, float) * (x_scale * w_scale) + b  scale product rounded once, at load

With symmetric weights (zero weight zero points, what onnxruntime's quantizer writes) the
ConvInteger runs on x shifted to int8 and padded with its zero point, and the zero point's
share, (128 - x_zp) * rowsum(w), is a constant added to acc (centered_conv): no per-call sums
of the weights. Where |acc| < 2^29 the scale product is taken in float64 (exact, so its float32
rounding is the float32 product) and fuses with the bias Add and the next QuantizeLinear.

The float convolution rounds each product and partial sum; this form rounds the int32 sum and
the product with the combined scale. Neither is the other bit for bit (nor is onnxruntime's
float convolution, summing in its own order): on the QDQ ResNets all three land on the same
quantized outputs but for a few one-step differences after the next QuantizeLinear.
"""

from __future__ import annotations

import numpy as np
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from oxla.graph import attribute_value, drop_initializers, model_opsets, node_reads, tensor_value
from oxla.passes.dequantize_constants import dequantize

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


def _dq(node: NodeProto | None) -> bool:
    return node is not None and node.op_type == "DequantizeLinear" \
        and node.domain in ("", "ai.onnx", "com.microsoft")


def _attrs(node: NodeProto) -> dict:
    return {a.name: attribute_value(a) for a in node.attribute}


class _Graph:
    """Initializer values (read once), producers and readers of the top-level graph."""

    def __init__(self, graph: GraphProto, opset: int) -> None:
        self.opset = opset
        fed = {i.name for i in graph.input}
        self.tensors = {t.name: t for t in graph.initializer if t.name not in fed}
        self.producer = {o: n for n in graph.node for o in n.output}
        # value -> the nodes reading it (a graph output counts as one more, empty, reader)
        self.readers: dict[str, list[NodeProto]] = {o.name: [NodeProto()] for o in graph.output}
        for node in graph.node:
            for name in node_reads(node):
                self.readers.setdefault(name, []).append(node)
        self._values: dict[str, np.ndarray] = {}

    def const(self, name: str) -> np.ndarray | None:
        if name not in self.tensors:
            return None
        if name not in self._values:
            t = self.tensors[name]
            self._values[name] = tensor_value(name, lambda: numpy_helper.to_array(t))
        return self._values[name]


def _quantized_input(g: _Graph, dq: NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, zero point) of a per-tensor float32 DequantizeLinear of 8-bit integers."""
    if len(dq.input) < 3 or not dq.input[2] or _attrs(dq).get("output_dtype", 0) not in (0, 1):
        return None
    scale, zp = g.const(dq.input[1]), g.const(dq.input[2])
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 \
            or scale.dtype != np.float32 or zp.dtype not in _INT8:
        return None
    return scale, zp


def _weights(g: _Graph, dq: NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """(w_q, per-output-channel float32 scale) of a constant 8-bit weight DequantizeLinear."""
    w = g.const(dq.input[0])
    attrs = _attrs(dq)
    if w is None or w.dtype not in _INT8 or w.ndim < 3 or len(dq.input) < 3 or not dq.input[2] \
            or attrs.get("block_size", 0) or attrs.get("output_dtype", 0) not in (0, 1):
        return None
    scale, zp = g.const(dq.input[1]), g.const(dq.input[2])
    if scale is None or zp is None or scale.dtype != np.float32 or zp.dtype != w.dtype:
        return None
    if scale.size != 1 and (scale.shape != (w.shape[0],) or int(attrs.get("axis", 1)) % w.ndim != 0):
        return None
    if zp.size != 1 and zp.shape != (w.shape[0],):
        return None
    return w, np.broadcast_to(scale.reshape(-1), (w.shape[0],))


def _bias(g: _Graph, name: str, m: int) -> np.ndarray | None:
    """The float32 bias (from an initializer or a constant DequantizeLinear), or None."""
    value = g.const(name)
    dq = g.producer.get(name)
    if value is None and _dq(dq) and dq is not None:
        args = [g.const(i) if i else None for i in dq.input]
        if args[0] is not None and args[1] is not None:
            a = _attrs(dq)
            value = dequantize(args[0], args[1], args[2] if len(args) > 2 else None,
                               axis=int(a.get("axis", 1)), block_size=int(a.get("block_size", 0)),
                               output_dtype=int(a.get("output_dtype", 0)))
    if value is None or value.dtype != np.float32 or value.shape != (m,):
        return None
    return value


def centered_conv(g: _Graph, name: str, inputs: tuple[str, str, str, str], w: np.ndarray, attrs: dict,
                  acc: str, bias: np.ndarray | None = None) -> tuple[list[NodeProto], list[TensorProto]] | None:
    """Nodes computing acc = conv(x - x_zp, w - w_zp) + bias in int32 from inputs (x, x_zp, w,
    w_zp) as ConvInteger on int8 x - c (c = 128 for uint8 x, else 0), x padded with x_zp first,
    plus the constant (c - x_zp) * rowsum(w) + bias: exact, without the per-call weight row sums
    ConvInteger's int8 GEMM needs when X has a zero point (ResNet-50: ~25 MB of weights read and
    summed every call). Only for zero weight zero points (symmetric int8 weights, as
    onnxruntime's quantizer writes them), group 1 and explicit pads; else None."""
    x, xz_name, w_name, wz_name = inputs
    wz, xz = g.const(wz_name), g.const(xz_name)
    if g.opset < 13 or wz is None or xz is None or xz.size != 1 or np.any(wz) \
            or int(attrs.get("group", 1)) != 1 or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID"):
        return None
    n = w.ndim - 2
    pads = [0] * (2 * n) if attrs.get("auto_pad") == "VALID" else list(attrs.get("pads", [0] * (2 * n)))
    shift = 128 if xz.dtype == np.uint8 else 0
    offset = shift - int(xz.reshape(()))  # x - x_zp == (x - shift) + offset
    nodes: list[NodeProto] = []
    consts: list[TensorProto] = []
    if any(pads):  # X padded with its zero point, before the shift (layout's Pad materializes it)
        consts += [numpy_helper.from_array(np.array([0, 0, *pads[:n], 0, 0, *pads[n:]], np.int64),
                                           acc + "__pads"),
                   numpy_helper.from_array(xz.reshape(()), acc + "__fill")]
        nodes.append(helper.make_node("Pad", [x, acc + "__pads", acc + "__fill"], [acc + "__xpad"]))
        x = acc + "__xpad"
    if shift:  # uint8 x - 128 fits int8
        consts.append(numpy_helper.from_array(np.array(shift, np.int16), acc + "__shift"))
        nodes += [helper.make_node("Cast", [x], [acc + "__x16"], to=TensorProto.INT16),
                  helper.make_node("Sub", [acc + "__x16", acc + "__shift"], [acc + "__xc16"]),
                  helper.make_node("Cast", [acc + "__xc16"], [acc + "__x8"], to=TensorProto.INT8)]
        x = acc + "__x8"
    kept = {k: v for k, v in attrs.items() if k not in ("pads", "auto_pad")}
    total = w.reshape(w.shape[0], -1).astype(np.int64).sum(axis=1) * offset
    if bias is not None:
        total = total + bias.astype(np.int64)
    if np.abs(total).max() >= 2**31:
        return None
    if not total.any():
        nodes.append(helper.make_node("ConvInteger", [x, w_name], [acc], name=name, **kept))
        return nodes, consts
    nodes += [helper.make_node("ConvInteger", [x, w_name], [acc + "__conv"], name=name, **kept),
              helper.make_node("Add", [acc + "__conv", acc + "__offset"], [acc])]
    consts.append(numpy_helper.from_array(total.astype(np.int32).reshape((-1,) + (1,) * n), acc + "__offset"))
    return nodes, consts


def float32_product(acc: str, scale: np.ndarray, scale_name: str, out: str
                    ) -> tuple[list[NodeProto], TensorProto]:
    """Nodes computing out = float32(acc) * scale, the float32 product, as float32(float64(
    float32(acc)) * float64(scale)): 24 by 24 bits is exact in float64, so rounding once to float32
    gives the float32 product, and XLA fuses it with what follows (a float32 Mul must be
    materialized, or XLA contracts it with a following Add into an FMA). acc goes through float32
    first: above 2^24 that rounding is part of the float32 arithmetic. Returns (nodes, the scale
    initializer)."""
    nodes = [helper.make_node("Cast", [acc], [acc + "__f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", [acc + "__f"], [acc + "__d"], to=TensorProto.DOUBLE),
             helper.make_node("Mul", [acc + "__d", scale_name], [acc + "__f64"]),
             helper.make_node("Cast", [acc + "__f64"], [out], to=TensorProto.FLOAT)]
    return nodes, numpy_helper.from_array(scale.astype(np.float64), scale_name)


def _rewrite(g: _Graph, conv: NodeProto) -> tuple[list[NodeProto], list[TensorProto]] | None:
    dx, dw = g.producer.get(conv.input[0]), g.producer.get(conv.input[1])
    if not (_dq(dx) and _dq(dw)) or dx is None or dw is None:
        return None
    xq, wq = _quantized_input(g, dx), _weights(g, dw)
    if xq is None or wq is None:
        return None
    (x_scale, _), (w, w_scale) = xq, wq
    m, rank = w.shape[0], w.ndim
    bias = _bias(g, conv.input[2], m) if len(conv.input) > 2 and conv.input[2] else None
    if len(conv.input) > 2 and conv.input[2] and bias is None:
        return None
    y = conv.output[0]
    scale = (x_scale.reshape(()) * w_scale).astype(np.float32)  # one float32 rounding
    consts: list[TensorProto] = []
    attrs = {a.name: attribute_value(a) for a in conv.attribute}
    centered = centered_conv(g, (conv.name or y) + "__oxla_int", (dx.input[0], dx.input[2], dw.input[0], dw.input[2]),
                             w, attrs, y + "__oxla_acc")
    if centered is None:
        nodes = [helper.make_node("ConvInteger", [dx.input[0], dw.input[0], dx.input[2], dw.input[2]],
                                  [y + "__oxla_acc"], name=(conv.name or y) + "__oxla_int", **attrs)]
    else:
        nodes, more = centered
        consts += more
    scaled = y + "__oxla_scaled" if bias is not None else y
    more_nodes, scale_const = float32_product(y + "__oxla_acc", scale.reshape((m,) + (1,) * (rank - 2)),
                                              y + "__oxla_scale", scaled)
    nodes += more_nodes
    consts.append(scale_const)
    if bias is not None:
        consts.append(numpy_helper.from_array(bias.reshape((m,) + (1,) * (rank - 2)), y + "__oxla_bias"))
        nodes.append(helper.make_node("Add", [y + "__oxla_scaled", y + "__oxla_bias"], [y]))
    return nodes, consts


def _int32_bias(g: _Graph, name: str, scale: np.ndarray) -> str | None:
    """The int32 input of a constant bias DequantizeLinear whose scale is `scale` (x_scale *
    w_scale in float32, as onnxruntime's quantizer writes it) and zero point 0, else None."""
    dq = g.producer.get(name)
    if not _dq(dq) or dq is None:
        return None
    b, b_scale = g.const(dq.input[0]), g.const(dq.input[1])
    b_zp = g.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros(1, np.int32)
    if b is None or b_scale is None or b_zp is None or b.dtype != np.int32 or b.ndim != 1 \
            or b_scale.dtype != np.float32 or np.any(b_zp) or _attrs(dq).get("block_size", 0):
        return None
    if b_scale.size not in (1, b.size) or not np.array_equal(np.broadcast_to(b_scale.reshape(-1), scale.shape), scale):
        return None
    return dq.input[0]


def _as_qlinear(g: _Graph, conv: NodeProto, q: NodeProto | None) -> NodeProto | None:
    """DequantizeLinear(x) -> Conv(DequantizeLinear(w), DequantizeLinear(int32 b)) -> its only
    reader QuantizeLinear, all per tensor but w, as the QLinearConv onnxruntime's QDQ fusion runs
    in its place (int32 bias added to the accumulator, one float32 requantisation), or None."""
    if q is None or q.op_type != "QuantizeLinear" or q.domain not in ("", "ai.onnx") or g.opset < 10 \
            or _attrs(q).get("output_dtype", 0):
        return None
    dx, dw = g.producer.get(conv.input[0]), g.producer.get(conv.input[1])
    if dx is None or dw is None:
        return None
    xq, wq, yq = _quantized_input(g, dx), _weights(g, dw), _quantized_input(g, q)
    if xq is None or wq is None or yq is None:
        return None
    inputs = [dx.input[0], dx.input[1], dx.input[2], dw.input[0], dw.input[1], dw.input[2], q.input[1], q.input[2]]
    if len(conv.input) > 2 and conv.input[2]:
        b = _int32_bias(g, conv.input[2], (xq[0].reshape(()) * wq[1]).astype(np.float32))
        if b is None:
            return None
        inputs.append(b)
    return helper.make_node("QLinearConv", inputs, [q.output[0]], name=conv.name, **_attrs(conv))


def qdq_conv_to_integer(model: ModelProto) -> int:
    """Rewrite DequantizeLinear -> Conv groups with constant 8-bit weights: as QLinearConv where a
    QuantizeLinear alone reads the Conv (what onnxruntime runs: its QDQ fusion), else as
    ConvInteger; drop the DequantizeLinear and QuantizeLinear nodes and the initializers nothing
    reads any more. Returns how many."""
    graph = model.graph
    g = _Graph(graph, model_opsets(model.opset_import).get("", 0))
    out: list[NodeProto] = []
    fused: set[str] = set()  # outputs of the QuantizeLinear nodes QLinearConv nodes replace
    count = 0
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and node.output[0] in fused:
            continue
        conv = node.op_type == "Conv" and node.domain in ("", "ai.onnx") and len(node.input) > 1
        only = g.readers.get(node.output[0], []) if conv else []
        qlinear = _as_qlinear(g, node, only[0]) if conv and len(only) == 1 else None
        if qlinear is not None:
            out.append(qlinear)
            fused.add(qlinear.output[0])
            count += 1
            continue
        done = _rewrite(g, node) if conv else None
        if done is None:
            out.append(node)
            continue
        out.extend(done[0])
        graph.initializer.extend(done[1])
        count += 1
    if count:
        _drop_dead(graph, out)
    return count


def quantized_max_pools(model: ModelProto) -> int:
    """Rewrite DequantizeLinear -> MaxPool -> QuantizeLinear, both with the same constant
    per-tensor 8-bit scale and zero point, as MaxPool of the 8-bit values; returns how many.

    Exact: dequantization increases with the value (a positive scale is required), so the max commutes
    with it, and quantizing a dequantized value with its own parameters gives it back (the
    float32 round trip is off by far less than 0.5 before rounding). The 8-bit pool pads with
    the type's minimum, which no window's max can be below, as the float pool's padding is -inf.
    onnxruntime runs its QDQ MaxPool on the 8-bit values too. A QDQ ResNet-50 dequantized
    and pooled 64x112x112 float32 values (0.3 ms at one thread)."""
    graph = model.graph
    g = _Graph(graph, model_opsets(model.opset_import).get("", 0))
    skip: set[int] = set()
    count = 0
    for pool in graph.node:
        if pool.op_type != "MaxPool" or pool.domain not in ("", "ai.onnx") or any(pool.output[1:]):
            continue
        dq, after = g.producer.get(pool.input[0]), g.readers.get(pool.output[0], [])
        q = after[0] if len(after) == 1 else None
        if not _dq(dq) or dq is None or q is None or q.op_type != "QuantizeLinear" \
                or q.domain not in ("", "ai.onnx") or len(g.readers.get(pool.input[0], [])) != 1 \
                or q.input[0] != pool.output[0]:
            continue
        here, there = _quantized_input(g, dq), _quantized_input(g, q)
        if here is None or there is None or _attrs(q).get("output_dtype", 0) or not here[0] > 0 \
                or not all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(here, there)):
            continue  # a scale <= 0 (or NaN) does not keep the order: the max is not the bytes' max
        pool.input[0] = dq.input[0]
        pool.output[0] = q.output[0]
        skip.update({id(dq), id(q)})
        count += 1
    if count:
        kept = [n for n in graph.node if id(n) not in skip]
        del graph.node[:]
        graph.node.extend(kept)
    return count


def qdq_adds_to_qlinear(model: ModelProto) -> int:
    """Rewrite Add(DequantizeLinear(a), DequantizeLinear(b)) -> QuantizeLinear, all per tensor with
    constant 8-bit parameters of one type and the Add read by that QuantizeLinear alone, as
    com.microsoft QLinearAdd: the kernel onnxruntime's QDQ fusion runs in its place (a QDQ
    ResNet-50's residual adds); returns how many. DequantizeLinear nodes nothing else reads go."""
    graph = model.graph
    g = _Graph(graph, model_opsets(model.opset_import).get("", 0))
    fused: dict[str, NodeProto] = {}  # QuantizeLinear output -> the QLinearAdd made for it
    adds: set[str] = set()  # outputs of the Add nodes that go
    for node in graph.node:
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2 \
                or node.input[0] == node.input[1]:
            continue
        only = g.readers.get(node.output[0], [])
        q = only[0] if len(only) == 1 else None
        dqs = [g.producer.get(n) for n in node.input]
        if q is None or q.op_type != "QuantizeLinear" or q.domain not in ("", "ai.onnx") \
                or _attrs(q).get("output_dtype", 0) or not all(_dq(d) for d in dqs):
            continue
        params = [_quantized_input(g, d) for d in (*dqs, q) if d is not None]
        if len(params) != 3 or any(p is None for p in params) \
                or len({p[1].dtype for p in params if p is not None}) != 1:
            continue
        a, b = (d.input for d in dqs if d is not None)
        fused[q.output[0]] = helper.make_node(
            "QLinearAdd", [a[0], a[1], a[2], b[0], b[1], b[2], q.input[1], q.input[2]], [q.output[0]],
            name=(node.name or node.output[0]) + "__oxla_qlinear", domain="com.microsoft")
        adds.add(node.output[0])
    if not fused:
        return 0
    out = [fused.get(n.output[0], n) if n.op_type == "QuantizeLinear" else n
           for n in graph.node if not (n.op_type == "Add" and n.output[0] in adds)]
    if "com.microsoft" not in model_opsets(model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _drop_dead(graph, out)
    return len(fused)


def _drop_dead(graph: GraphProto, nodes: list[NodeProto]) -> None:
    """Keep the nodes whose outputs are still read (only DequantizeLinear ones can die here),
    then the initializers still read."""
    outputs = {o.name for o in graph.output}
    read = outputs.union(*(node_reads(n) for n in nodes))
    dead = [n for n in nodes if _dq(n) and not any(o in read for o in n.output)]
    nodes = [n for n in nodes if not any(n is d for d in dead)]
    candidates = {i for n in dead for i in n.input} - {i.name for i in graph.input} - outputs
    read = set().union(*(node_reads(n) for n in nodes))
    del graph.node[:]
    graph.node.extend(nodes)
    drop_initializers(graph, lambda name: name not in read and name in candidates)
