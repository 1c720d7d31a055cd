"""WeightLayoutPass: weights stored once in the layout XLA:CPU computes with.

- Conv kernels as HWIO, turned back by a Transpose node. Given OIHW kernels as parameters,
  XLA:CPU copies every kernel on every call (ResNet-50 batch 1: 57 transpose fusions, ~2x the
  latency); stored as HWIO, the Transpose folds into the convolution's dimension numbers.
- Gemm's B with transB=1 (what torch.nn.Linear exports) stored as (K, N) with transB=0: a (K, N)
  right operand ran 1.5x faster than contracting a (N, K) one at batch 8 on this CPU.
- A bidirectional RNN/GRU/LSTM's R stored as one initializer per direction, joined again by a
  Concat node. The rule reads R[d] inside each direction's time loop; sliced from one [2, G, H]
  parameter, XLA:CPU copied it before the loop on every call (the suite's bi-GRU: four 768x256
  copies, 0.23 ms a call), while the slice of a Concat folds to the direction's own parameter.
  The bi-GRU at one thread 3.10 -> 2.92 and 3.07 -> 2.86 ms, default threads 3.15 -> 2.79 and
  3.12 -> 2.79 ms (both orders in one process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from oxla.dtypes import is_float
from oxla.graph import (
    attribute_value,
    is_onnx_op,
    node_reads,
    set_tensor,
    tensor_value,
    transposed,
)

SUFFIX = "__oxla_hwio"
KN_SUFFIX = "__oxla_kn"
DIRECTION_SUFFIX = "__oxla_direction"
RECURRENT = ("RNN", "GRU", "LSTM")


def _only_read_as(graph: GraphProto, wanted: Callable[[NodeProto], bool], index: int) -> set[str]:
    """Initializer names read only as input `index` of nodes `wanted` accepts (and not fed)."""
    slot: set[str] = set()
    other: set[str] = {o.name for o in graph.output} | {i.name for i in graph.input}
    for node in graph.node:
        for name in node_reads(node):
            if wanted(node) and len(node.input) > index and name == node.input[index] \
                    and list(node.input).count(name) == 1:
                slot.add(name)
            else:
                other.add(name)
    return slot - other


def conv_weights_to_hwio(model: ModelProto) -> int:
    """Re-lay out float initializers read only as Conv's W input; returns how many."""
    graph = model.graph
    conv_w = _only_read_as(graph, lambda n: is_onnx_op(n, "Conv"), 1)
    moved = []
    for tensor in graph.initializer:
        name = tensor.name
        if name not in conv_w or len(tensor.dims) < 3:
            continue
        value = tensor_value(tensor.name, lambda t=tensor: numpy_helper.to_array(t))
        if not is_float(value.dtype):
            continue
        r = value.ndim
        hwio = transposed(value, (*range(2, r), 1, 0))
        set_tensor(tensor, name + SUFFIX, hwio)
        moved.append(helper.make_node("Transpose", [name + SUFFIX], [name], name=name + "_to_oihw",
                                      perm=[r - 1, r - 2, *range(r - 2)]))
    if moved:
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(moved + nodes)
    return len(moved)


def _attr(node: NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def gemm_weights_to_kn(model: ModelProto) -> int:
    """Transpose float initializers read only as Gemm's B with transB=1; returns how many."""
    graph = model.graph
    weights = _only_read_as(graph, lambda n: is_onnx_op(n, "Gemm") and _attr(n, "transB", 0) == 1, 1)
    renamed = {}
    for tensor in graph.initializer:
        if tensor.name in weights and len(tensor.dims) == 2:
            value = tensor_value(tensor.name, lambda t=tensor: numpy_helper.to_array(t))
            if is_float(value.dtype):
                renamed[tensor.name] = tensor.name + KN_SUFFIX
                set_tensor(tensor, renamed[tensor.name], transposed(value))
    for node in graph.node:
        if is_onnx_op(node, "Gemm") and len(node.input) > 1 and node.input[1] in renamed:
            node.input[1] = renamed[node.input[1]]
            for a in node.attribute:
                if a.name == "transB":
                    a.i = 0
    return len(renamed)


def recurrent_weights_per_direction(model: ModelProto) -> int:
    """Split float initializers read only as a bidirectional RNN/GRU/LSTM's R into one per
    direction, joined by a Concat on axis 0; returns how many."""
    graph = model.graph
    weights = _only_read_as(graph, lambda n: n.op_type in RECURRENT and n.domain in ("", "ai.onnx"), 2)
    split: list[NodeProto] = []
    kept = []
    for tensor in graph.initializer:
        if tensor.name in weights and len(tensor.dims) == 3 and tensor.dims[0] == 2:
            value = tensor_value(tensor.name, lambda t=tensor: numpy_helper.to_array(t))
            if is_float(value.dtype):
                parts = [f"{tensor.name}{DIRECTION_SUFFIX}{d}" for d in range(2)]
                kept += [numpy_helper.from_array(np.ascontiguousarray(value[d:d + 1]), parts[d])
                         for d in range(2)]
                split.append(helper.make_node("Concat", parts, [tensor.name],
                                              name=tensor.name + "_directions", axis=0))
                continue
        kept.append(tensor)
    if split:
        del graph.initializer[:]
        graph.initializer.extend(kept)
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(split + nodes)
    return len(split)


def conv_hwio(node: NodeProto, producers: dict[str, NodeProto],
              inits: dict[str, TensorProto]) -> tuple[np.ndarray, list[str]] | None:
    """The (KH, KW, C, M) kernel of a Conv `node` and the names it came from (a Transpose of
    conv_weights_to_hwio's HWIO initializer, or an OIHW initializer), or None."""
    name = node.input[1]
    if name in inits:
        oihw = tensor_value(name, lambda: numpy_helper.to_array(inits[name]))
        return (np.transpose(oihw, (2, 3, 1, 0)) if oihw.ndim == 4 else oihw), [name]
    producer = producers.get(name)
    if producer is None or producer.op_type != "Transpose" or producer.input[0] not in inits:
        return None
    perm = [int(p) for p in attribute_value(producer.attribute[0])] if producer.attribute else []
    if perm != [3, 2, 0, 1]:
        return None
    source = producer.input[0]
    value = tensor_value(source, lambda: numpy_helper.to_array(inits[source]))
    return value, [name, source]


def plain_conv_attributes(node: NodeProto, kernel: list[int]) -> dict[str, Any] | None:
    """A Conv's attributes when it has group 1, stride 1, dilation 1 and this kernel shape
    (absent attributes at their defaults), else None; pads are left to the caller."""
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    if attrs.get("group", 1) != 1 or any(s != 1 for s in attrs.get("strides", [1, 1])) \
            or any(d != 1 for d in attrs.get("dilations", [1, 1])) \
            or list(attrs.get("kernel_shape", kernel)) != kernel:
        return None
    return attrs

