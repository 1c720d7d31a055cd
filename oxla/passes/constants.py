"""LargeConstantToInitializerPass: big float Constant nodes become initializers (parameters).

Some converters store weights in Constant nodes. As static values they would be baked into the
XLA program as constants (slow compiles, see DESIGN.md); as initializers they are parameters.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, numpy_helper

from oxla.dtypes import is_float
from oxla.graph import tensor_value

LARGE = 1024


def large_constants_to_initializers(model: ModelProto) -> int:
    """Move float Constant tensors with more than LARGE elements to initializers; returns how many."""
    graph = model.graph
    keep = []
    moved = 0
    for node in graph.node:
        tensor = None
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
            attr = node.attribute[0]
            if attr.name == "value" and attr.HasField("t"):
                tensor = attr.t
        if tensor is not None and node.output[0]:
            value = tensor_value(tensor.name, lambda t=tensor: numpy_helper.to_array(t))
            if is_float(value.dtype) and value.size > LARGE:
                graph.initializer.append(numpy_helper.from_array(np.asarray(value), node.output[0]))
                moved += 1
                continue
        keep.append(node)
    if moved:
        del graph.node[:]
        graph.node.extend(keep)
    return moved
