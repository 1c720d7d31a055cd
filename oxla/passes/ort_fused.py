"""OrtFusedPass: onnxruntime's fused convolutions, products and SiLU back to standard ops.

A model saved by onnxruntime's optimizer (`SessionOptions.optimized_model_filepath`, the
"extended" level its tools write) has each Conv with its activation as one com.microsoft
FusedConv (Y = activation(Conv(X, W, B) + Z)), each Gemm with its activation as a FusedGemm, and
each SiLU (Sigmoid(X) * X) as a QuickGelu of alpha 1. oxla's rules compute them, but its graph
passes look for standard Conv, Gemm and Sigmoid nodes: the layout pass, the native kernels and
the fold of their epilogues saw none, so such a file ran as XLA's NCHW convolutions. The suite's
models at default threads, from onnxruntime's optimized file against the original file:
MobileNetV2 5.0x onnxruntime's time against 0.97x, ResNet-50 2.8x against 1.04x,
EfficientNet-B0 2.4x.

Here each float32 FusedConv becomes Conv, then Add of Z (when given), then its activation; each
float32 FusedGemm Gemm, then its activation, where the activation is a standard op (all but
ScaledTanh and ParametricSoftplus, which stay fused); each QuickGelu Sigmoid(alpha X) * X (Mul
by alpha first where it is not 1). The result is what the converter wrote before onnxruntime
fused it, so every later pass applies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from oxla.graph import attribute_value, inferred_types, model_opsets

MS = "com.microsoft"
SUFFIX = "__oxla_unfused"
CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
GEMM_ATTRIBUTES = ("alpha", "beta", "transA", "transB")
# FusedConv's activations (onnxruntime's MLAS activations) and the activation_params each takes
CONV_ACTIVATIONS = {"Identity": 0, "Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2,
                    "HardSigmoid": 2}
# FusedGemm's activations that are standard ops: their activation_* attributes, as the op's own
# attribute names (ThresholdedRelu is standard from opset 10)
GEMM_ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "Softplus": (), "Softsign": (),
                    "LeakyRelu": ("alpha",), "Elu": ("alpha",), "ThresholdedRelu": ("alpha",),
                    "HardSigmoid": ("alpha", "beta"), "Selu": ("alpha", "gamma")}


def unfuse_ort_ops(model: ModelProto) -> int:
    """Rewrite the main graph's float32 FusedConv, FusedGemm and QuickGelu nodes as standard ops;
    returns how many. A node whose weights (X, for QuickGelu) are not float32, or whose activation
    or its parameters are not as onnxruntime writes them, is left to its rule (which checks
    them)."""
    graph = model.graph
    opset = model_opsets(model.opset_import).get("", 0)
    floats = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    names = _names(model)

    def fused(node: NodeProto) -> list[NodeProto] | None:
        if len(node.input) < 2 or node.input[1] not in floats:
            return None
        if node.op_type == "FusedConv":
            return _conv(node, opset, names, graph.initializer)
        return _gemm(node, opset, names) if node.op_type == "FusedGemm" else None

    count = _each(model, fused)
    if any(n.domain == MS and n.op_type == "QuickGelu" for n in graph.node):
        typed = _float_values(model)
        count += _each(model, lambda node: _quick_gelu(node, names, graph.initializer, typed)
                       if node.op_type == "QuickGelu" else None)
    return count


def _each(model: ModelProto, rewrite: Callable[[NodeProto], list[NodeProto] | None]) -> int:
    """Replace each com.microsoft node of the main graph by the nodes `rewrite` makes of it (None:
    kept); returns how many were replaced."""
    nodes: list[NodeProto] = []
    count = 0
    for node in model.graph.node:
        made = rewrite(node) if node.domain == MS else None
        if made is None:
            nodes.append(node)
        else:
            nodes += made
            count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return count


def _names(model: ModelProto) -> Iterator[str]:
    """Fresh value names, none of them already in the graph."""
    graph = model.graph
    taken = {t.name for t in graph.initializer} | {i.name for i in graph.input} \
        | {o.name for o in graph.output} | {v.name for v in graph.value_info} \
        | {name for n in graph.node for name in (*n.input, *n.output)}
    i = 0
    while True:
        name = f"{SUFFIX}{i}"
        i += 1
        if name not in taken:
            yield name


def _float_values(model: ModelProto) -> set[str]:
    """The values onnx's type inference types float32 (`inferred_types`), each com.microsoft
    QuickGelu read as a Sigmoid: onnx knows no com.microsoft op, and types nothing after one. An
    inference that fails types nothing."""
    nodes = []
    for node in model.graph.node:
        if node.domain == MS and node.op_type == "QuickGelu":
            node = helper.make_node("Sigmoid", list(node.input), list(node.output), name=node.name)
        nodes.append(node)
    try:
        inferred = inferred_types(model, nodes)
    except Exception:  # the pass only loses a rewrite, never the model
        return set()
    return {v.name for v in (*inferred.input, *inferred.value_info, *inferred.output)
            if v.type.tensor_type.elem_type == TensorProto.FLOAT}


def _attrs(node: NodeProto) -> dict[str, Any]:
    return {a.name: attribute_value(a) for a in node.attribute}


def _conv(node: NodeProto, opset: int, names: Iterator[str], inits) -> list[NodeProto] | None:
    attrs = _attrs(node)
    activation = attrs.get("activation", "Identity")
    params = [float(v) for v in attrs.get("activation_params", ())]
    if not isinstance(activation, str) or CONV_ACTIVATIONS.get(activation) != len(params) \
            or set(attrs) - {*CONV_ATTRIBUTES, "activation", "activation_params"} \
            or len(node.input) > 4:
        return None
    y = node.output[0]
    z = node.input[3] if len(node.input) > 3 else ""
    out = [helper.make_node("Conv", list(node.input[:3]), [y], name=node.name,
                            **{k: v for k, v in attrs.items() if k in CONV_ATTRIBUTES})]
    if z:
        out[-1].output[0] = summed = next(names)
        out.append(helper.make_node("Add", [summed, z], [y]))
    if activation == "Identity":
        return out
    out[-1].output[0] = a = next(names)
    if activation == "LeakyRelu":
        out.append(helper.make_node("LeakyRelu", [a], [y], alpha=params[0]))
    elif activation == "HardSigmoid":
        out.append(helper.make_node("HardSigmoid", [a], [y], alpha=params[0], beta=params[1]))
    elif activation == "Clip" and opset < 11:
        out.append(helper.make_node("Clip", [a], [y], min=params[0], max=params[1]))
    elif activation == "Clip":
        bounds = [next(names), next(names)]
        inits.extend(numpy_helper.from_array(np.array(v, np.float32), n) for v, n in zip(params, bounds))
        out.append(helper.make_node("Clip", [a, *bounds], [y]))
    else:
        out.append(helper.make_node(activation, [a], [y]))
    return out


def _gemm(node: NodeProto, opset: int, names: Iterator[str]) -> list[NodeProto] | None:
    attrs = _attrs(node)
    activation = attrs.get("activation")
    needs = GEMM_ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    given = {k[len("activation_"):]: v for k, v in attrs.items() if k.startswith("activation_")}
    if needs is None or set(given) - set(needs) or any(n not in given for n in needs) \
            or set(attrs) - {*GEMM_ATTRIBUTES, "activation", *(f"activation_{n}" for n in needs)} \
            or (activation == "ThresholdedRelu" and opset < 10) or len(node.input) > 3:
        return None
    a = next(names)
    return [helper.make_node("Gemm", list(node.input), [a], name=node.name,
                             **{k: v for k, v in attrs.items() if k in GEMM_ATTRIBUTES}),
            helper.make_node(str(activation), [a], [node.output[0]], **given)]


def _quick_gelu(node: NodeProto, names: Iterator[str], inits, floats: set[str]
                ) -> list[NodeProto] | None:
    """QuickGelu(X) = X * Sigmoid(alpha X) of a float32 X (onnxruntime's SiLU where alpha is 1)."""
    attrs = _attrs(node)
    alpha = attrs.get("alpha", 1.702)
    if set(attrs) - {"alpha"} or not isinstance(alpha, float) or len(node.input) != 1 \
            or len(node.output) != 1 or node.input[0] not in floats:
        return None
    x, out = node.input[0], []
    if alpha != 1.0:
        scale, x = next(names), next(names)
        inits.append(numpy_helper.from_array(np.array(alpha, np.float32), scale))
        out.append(helper.make_node("Mul", [node.input[0], scale], [x]))
    gate = next(names)
    return [*out, helper.make_node("Sigmoid", [x], [gate], name=node.name),
            helper.make_node("Mul", [node.input[0], gate], [node.output[0]])]
