"""LargeConstantToInitializerPass: big float Constant nodes become initializers (parameters).

Some converters store weights in Constant nodes. As static values they would be baked into the
XLA program as constants (slow compiles, see DESIGN.md); as initializers they are parameters.

ConstantOfShape of a constant shape with a float value becomes an initializer too
(`constant_fills_to_initializers`): onnx's light model zoo files (backend/test/data/light) build
every weight and bias so, and XLA filled each one on every call (AlexNet's 235 MB: 4.1x
onnxruntime's time, which folds them at load); as initializers the weight passes (layout, native
kernels: a bias must be an initializer) see them as any model's weights.

An Identity of an initializer is read as the initializer itself (`initializer_aliases`): torch's
exporter writes one initializer for equal tensors and an Identity of it for each other use (all
of torchvision's ResNeXt-50 convolutions' biases, equal zeros at its initial weights), and the
weight passes, which look for initializers, left those layers to XLA: 1.76x onnxruntime's time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from onnx import ModelProto, NodeProto, numpy_helper

from oxla.dtypes import is_float
from oxla.graph import add_initializer, constant_values, graph_free_names, subgraphs, tensor_value
from oxla.host import machine_memory

LARGE = 1024


def listed_initializers_to_constants(model: ModelProto) -> int:
    """Before IR version 4 every initializer had to be listed as a graph input as well, and
    onnxruntime holds them constant there (not the caller's to feed: they are not among its
    session's inputs): the same here, by taking them off the graph's inputs; returns how many.
    onnx's light zoo files are IR 3, their Reshapes' shapes such initializers: read as fed
    values, the layout pass kept ShuffleNet's channel shuffles channels first, between
    transposes."""
    graph = model.graph
    if model.ir_version >= 4:
        return 0
    inits = {t.name for t in graph.initializer}
    listed = [i for i in graph.input if i.name in inits]
    if listed:
        kept = [i for i in graph.input if i.name not in inits]
        del graph.input[:]
        graph.input.extend(kept)
    return len(listed)


def initializer_aliases(model: ModelProto) -> int:
    """Main-graph nodes that read an Identity of an initializer (one that cannot be fed) read the
    initializer instead; the Identity goes unless a graph output or a subgraph still reads it.
    Returns how many inputs were rewired."""
    graph = model.graph
    fed = {i.name for i in graph.input}
    inits = {t.name for t in graph.initializer} - fed
    alias = {n.output[0]: n.input[0] for n in graph.node
             if n.op_type == "Identity" and n.domain in ("", "ai.onnx") and len(n.input) == 1
             and len(n.output) == 1 and n.input[0] in inits}
    if not alias:
        return 0
    rewired = 0
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in alias:
                node.input[i] = alias[name]
                rewired += 1
    kept = {o.name for o in graph.output}
    kept.update(name for n in graph.node for g in subgraphs(n) for name in graph_free_names(g))
    nodes = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in alias
                                            and n.output[0] not in kept)]
    del graph.node[:]
    graph.node.extend(nodes)
    return rewired


def large_constants_to_initializers(model: ModelProto) -> int:
    """Move float Constant tensors with more than LARGE elements to initializers; returns how many."""

    def value_of(node: NodeProto) -> np.ndarray | None:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") \
                or len(node.attribute) != 1 or node.attribute[0].name != "value" \
                or not node.attribute[0].HasField("t"):
            return None
        tensor = node.attribute[0].t
        value = tensor_value(tensor.name, lambda: numpy_helper.to_array(tensor))
        return np.asarray(value) if is_float(value.dtype) and value.size > LARGE else None

    return _to_initializers(model, value_of)


def _to_initializers(model: ModelProto, value_of: Callable[[NodeProto], np.ndarray | None]) -> int:
    """Replace each main-graph node for which `value_of` gives a value by an initializer of it
    named as the node's output; returns how many."""
    graph = model.graph
    keep = []
    moved = 0
    for node in graph.node:
        value = value_of(node) if node.output and node.output[0] else None
        if value is None:
            keep.append(node)
            continue
        add_initializer(graph, node.output[0], value)
        moved += 1
    if moved:
        del graph.node[:]
        graph.node.extend(keep)
    return moved


# ConstantOfShape fills folded at most take this share of the memory limit, all together
FILL_SHARE = 4


def constant_fills_to_initializers(model: ModelProto, memory_limit: int | None = None) -> int:
    """ConstantOfShape nodes of the main graph whose shape is a constant (an initializer that
    cannot be fed, or a Constant node) and whose value is a float become initializers, up to
    1 / FILL_SHARE of the memory limit together (a hostile shape stays a node, which the memory
    checks refuse at run time); returns how many."""
    constant = constant_values(model.graph)
    budget = (memory_limit or machine_memory()) // FILL_SHARE

    def value_of(node: NodeProto) -> np.ndarray | None:
        nonlocal budget
        found = _fill(node, constant)
        if found is None:
            return None
        shape, fill = found
        size = math.prod(shape) * fill.dtype.itemsize
        if size > budget:
            return None
        budget -= size
        return np.full(shape, fill, fill.dtype)

    return _to_initializers(model, value_of)


def _fill(node: NodeProto, constant: Callable[[str], np.ndarray | None]
          ) -> tuple[tuple[int, ...], np.ndarray] | None:
    """(shape, value) of a ConstantOfShape of a constant shape and a float value, or None."""
    if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx") \
            or len(node.input) != 1 or len(node.output) != 1:
        return None
    shape = constant(node.input[0])
    if shape is None or shape.dtype != np.int64 or shape.ndim != 1 or (shape < 0).any():
        return None
    fill: np.ndarray = np.zeros(1, np.float32)  # the default value: float32 0
    for attr in node.attribute:
        if attr.name != "value" or not attr.HasField("t"):
            return None
        fill = numpy_helper.to_array(attr.t).reshape(-1)
    dims = tuple(int(d) for d in shape)
    if fill.size != 1 or not is_float(fill.dtype):
        return None
    return dims, fill.reshape(())
