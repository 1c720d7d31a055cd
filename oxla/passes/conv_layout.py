"""ConvWeightLayoutPass: conv kernels stored once as HWIO, turned back by a Transpose node.

XLA:CPU runs convolutions on HWIO kernels. Given OIHW kernels as parameters, it copies every kernel
on every call (ResNet-50 batch 1: 57 transpose fusions, ~2x the latency). Stored as HWIO, the
graph's Transpose folds into the convolution's dimension numbers and the copies disappear.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, helper, numpy_helper

from oxla.dtypes import is_float
from oxla.lowering.interpreter import node_reads

SUFFIX = "__oxla_hwio"


def conv_weights_to_hwio(model: ModelProto) -> int:
    """Re-lay out float initializers read only as Conv's W input; returns how many."""
    graph = model.graph
    graph_inputs = {i.name for i in graph.input}
    conv_w: dict[str, int] = {}
    other: set[str] = set()
    for node in graph.node:
        reads = node_reads(node)
        is_conv = node.op_type == "Conv" and node.domain in ("", "ai.onnx") and len(node.input) > 1
        for name in reads:
            if is_conv and name == node.input[1] and list(node.input).count(name) == 1:
                conv_w[name] = conv_w.get(name, 0) + 1
            else:
                other.add(name)
    other |= {o.name for o in graph.output}
    moved = []
    for tensor in graph.initializer:
        name = tensor.name
        if name not in conv_w or name in other or name in graph_inputs or len(tensor.dims) < 3:
            continue
        value = numpy_helper.to_array(tensor)
        if not is_float(value.dtype):
            continue
        r = value.ndim
        hwio = np.ascontiguousarray(np.transpose(value, (*range(2, r), 1, 0)))
        tensor.CopyFrom(numpy_helper.from_array(hwio, name + SUFFIX))
        moved.append(helper.make_node("Transpose", [name + SUFFIX], [name], name=name + "_to_oihw",
                                      perm=[r - 1, r - 2, *range(r - 2)]))
    if moved:
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(moved + nodes)
    return len(moved)
