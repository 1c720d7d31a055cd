"""Graph utilities: reads, free names, producers, liveness, initializers, attributes (no JAX)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from typing import Any

import numpy as np
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    OperatorSetIdProto,
    SparseTensorProto,
    TensorProto,
    ValueInfoProto,
    helper,
    numpy_helper,
    shape_inference,
)

from oxla.errors import InvalidModelError, LoweringError

ONNX_DOMAINS = ("", "ai.onnx")


def canonical_domain(domain: str) -> str:
    """'' and 'ai.onnx' are the same domain."""
    return "" if domain in ONNX_DOMAINS else domain


def model_opsets(opset_import: Iterable[OperatorSetIdProto]) -> dict[str, int]:
    """The opset imports as {canonical domain: version}."""
    return {canonical_domain(o.domain): int(o.version) for o in opset_import}


def subgraphs(node: NodeProto) -> list[GraphProto]:
    """The graphs a node carries as attributes (If branches, Loop/Scan bodies)."""
    out: list[GraphProto] = []
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def graph_free_names(graph: GraphProto) -> set[str]:
    """Names a graph reads from its enclosing scopes (used by nodes, defined nowhere inside)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    free: set[str] = set()
    for node in graph.node:
        free |= {n for n in node_reads(node) if n not in defined}
        defined |= set(node.output)
    free |= {o.name for o in graph.output if o.name not in defined}
    return free


def node_reads(node: NodeProto) -> set[str]:
    """Every name a node reads: its inputs and the free names of its subgraphs."""
    reads = {n for n in node.input if n}
    for g in subgraphs(node):
        reads |= graph_free_names(g)
    return reads


def producers(nodes: Sequence[NodeProto]) -> dict[str, int]:
    """Value name -> index of the node that computes it."""
    return {o: i for i, n in enumerate(nodes) for o in n.output if o}


def last_uses(reads: Sequence[Set[str]], outputs: Iterable[str]) -> dict[str, int]:
    """Value name -> index of the last node that reads it (graph outputs: len(reads))."""
    last: dict[str, int] = {}
    for i, names in enumerate(reads):
        for n in names:
            last[n] = i
    for o in outputs:
        last[o] = len(reads)
    return last


def walk(nodes: Iterable[NodeProto]) -> Iterator[NodeProto]:
    """Every node, then the nodes of its subgraphs, recursively."""
    for node in nodes:
        yield node
        for g in subgraphs(node):
            yield from walk(g.node)


def sparse_to_dense(sparse: SparseTensorProto) -> np.ndarray:
    """A SparseTensorProto as a dense numpy array."""
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def initializer_values(graph: GraphProto) -> dict[str, np.ndarray]:
    """A graph's initializers (dense and sparse) as numpy arrays.

    Raises:
        InvalidModelError: a tensor whose data does not fit its type and shape.
    """
    values = {}
    for t in graph.initializer:
        values[t.name] = tensor_value(t.name, lambda t=t: numpy_helper.to_array(t))
    for sparse in graph.sparse_initializer:
        name = sparse.values.name
        values[name] = tensor_value(name, lambda s=sparse: sparse_to_dense(s))
    return values


def tensor_value(name: str, convert: Any) -> np.ndarray:
    """`convert()` (a tensor's numpy value); data that does not fit is an InvalidModelError."""
    try:
        return np.asarray(convert())
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise InvalidModelError(f"tensor '{name}': its data does not fit its type and shape ({e})") from None


def is_onnx_op(node: NodeProto | None, op: str) -> bool:
    """Whether `node` is the default domain's op `op` (the domain written "" or "ai.onnx")."""
    return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")


# numpy dtypes whose ONNX raw_data is their little-endian bytes as they lie
_RAW = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
        np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int64): TensorProto.INT64,
        np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int16): TensorProto.INT16,
        np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8,
        np.dtype(np.bool_): TensorProto.BOOL}


def set_tensor(tensor: TensorProto, name: str, value: np.ndarray) -> TensorProto:
    """Make `tensor` hold `value` named `name`, its bytes copied once (numpy_helper.from_array,
    then appending or CopyFrom, copied them three times: VGG-19's 411 MB weight 1.26 against
    0.47 s); other dtypes through from_array."""
    value = np.asarray(value)
    kind = _RAW.get(value.dtype)
    if kind is None or sys.byteorder != "little":
        tensor.CopyFrom(numpy_helper.from_array(value, name))
        return tensor
    tensor.Clear()
    tensor.name = name
    tensor.data_type = kind
    tensor.dims.extend(value.shape)
    tensor.raw_data = np.ascontiguousarray(value).tobytes()
    return tensor


def add_initializer(graph: GraphProto, name: str, value: np.ndarray) -> TensorProto:
    """Append `value` as initializer `name` (set_tensor: its bytes copied once)."""
    return set_tensor(graph.initializer.add(), name, value)


def transposed(value: np.ndarray, axes: Sequence[int] | None = None) -> np.ndarray:
    """np.transpose(value, axes) as a C-contiguous copy; a large 2-D one in tiles of 256 x 256
    that stay in cache (numpy's own copy of VGG-19's 4096 x 25088 weight: 1.99 s, tiled 0.25)."""
    if value.ndim != 2 or (axes is not None and tuple(axes) != (1, 0)) or value.size < 1 << 20:
        return np.ascontiguousarray(np.transpose(value, axes))
    n, m = value.shape
    out = np.empty((m, n), value.dtype)
    tile = 256
    for i in range(0, n, tile):
        for j in range(0, m, tile):
            out[j:j + tile, i:i + tile] = value[i:i + tile, j:j + tile].T
    return out


def drop_initializers(graph: GraphProto, dead: Callable[[str], bool]) -> int:
    """Delete the initializers whose names `dead` says, in place; returns how many. (Rebuilding
    the list with the kept ones copies every tensor's data: 3.2 of VGG-19's 14 s of planning.)"""
    dropped = 0
    for i in reversed(range(len(graph.initializer))):
        if dead(graph.initializer[i].name):
            del graph.initializer[i]
            dropped += 1
    return dropped


def constant_values(graph: GraphProto) -> Callable[[str], np.ndarray | None]:
    """name -> value for initializers that cannot be fed and Constant nodes' tensors."""
    fed = {i.name for i in graph.input}
    tensors: dict[str, TensorProto] = {t.name: t for t in graph.initializer if t.name not in fed}
    for node in graph.node:
        if node.op_type == "Constant" and canonical_domain(node.domain) == "" and node.output \
                and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensors[node.output[0]] = node.attribute[0].t
    cache: dict[str, np.ndarray] = {}

    def value(name: str) -> np.ndarray | None:
        if name not in cache and name in tensors:
            t = tensors[name]
            cache[name] = tensor_value(name, lambda: numpy_helper.to_array(t))
        return cache.get(name)

    return value


def attribute_value(attr: AttributeProto) -> Any:
    """An AttributeProto as a Python value: float, int, str, numpy array, graph, or a tuple."""
    t = attr.type
    A = AttributeProto
    if t == A.FLOAT:
        return float(attr.f)
    if t == A.INT:
        return int(attr.i)
    if t == A.STRING:
        return attr.s.decode("utf-8", errors="surrogateescape")
    if t == A.TENSOR:
        return numpy_helper.to_array(attr.t)
    if t == A.GRAPH:
        return attr.g
    if t == A.SPARSE_TENSOR:
        return sparse_to_dense(attr.sparse_tensor)
    if t == A.TYPE_PROTO:
        return attr.tp
    if t == A.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if t == A.INTS:
        return tuple(int(v) for v in attr.ints)
    if t == A.STRINGS:
        return tuple(s.decode("utf-8", errors="surrogateescape") for s in attr.strings)
    if t == A.TENSORS:
        return tuple(numpy_helper.to_array(v) for v in attr.tensors)
    if t == A.GRAPHS:
        return tuple(attr.graphs)
    if t == A.TYPE_PROTOS:
        return tuple(attr.type_protos)
    raise LoweringError(f"attribute '{attr.name}' has unknown type {t}")


# initializer types whose (small) data shape inference is given: shapes, pads, axes, indices
SHAPE_DATA = frozenset({TensorProto.INT64, TensorProto.INT32})
# oxla ops whose output has their first input's shape, which inference through their function
# bodies cannot see
SHAPE_KEEPING = frozenset({("oxla.pad_ahead", "ZeroBorder")})


def inferred_types(model: ModelProto, nodes: Sequence[NodeProto] | None = None) -> GraphProto:
    """ONNX shape inference over the main graph with its initializers' data left out (a model over
    2 GiB cannot be serialized for the inference, and types and shapes are all it gives) except
    small integer ones (up to 64 values: the pads, shapes and axes that Pad, Reshape or Slice
    read as inputs, without which tf2onnx's files lose every size after their first Pad): the
    inferred graph, whose inputs, value_info and outputs carry what it found. Model-local
    functions (oxla's own ops included) are inferred through their bodies. `nodes`: infer these
    in place of the graph's (a rewrite to be tried, without copying the model).

    Raises:
        onnx.shape_inference.InferenceError: the graph's types contradict each other.
    """
    declared = {i.name for i in model.graph.input}
    small = [t for t in model.graph.initializer
             if t.name not in declared and t.data_type in SHAPE_DATA and math.prod(t.dims) <= 64]
    given = {t.name for t in small}
    typed = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
             for t in model.graph.initializer if t.name not in declared and t.name not in given]
    known = list(model.graph.value_info)
    nodes = model.graph.node if nodes is None else nodes
    keeping = [n for n in nodes if (n.domain, n.op_type) in SHAPE_KEEPING]
    while True:
        light = helper.make_model(helper.make_graph(nodes, "types",
                                                    [*model.graph.input, *typed],
                                                    model.graph.output, initializer=small,
                                                    value_info=known),
                                  opset_imports=model.opset_import, functions=model.functions)
        light.ir_version = model.ir_version
        graph = shape_inference.infer_shapes(light).graph
        # an op whose body hides that Y has X's shape (ZeroBorder's pads come from an attribute):
        # Y gets X's type, and the inference runs again, once per such op at most
        types = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
        fixed = [n for n in keeping if n.input[0] in types and not _full(types.get(n.output[0]))
                 and _full(types[n.input[0]])]
        if not fixed:
            return graph
        node = fixed[0]
        keeping.remove(node)
        info = ValueInfoProto()
        info.CopyFrom(types[node.input[0]])
        info.name = node.output[0]
        known = [*(v for v in graph.value_info if v.name != info.name), info]


def _full(value: ValueInfoProto | None) -> bool:
    """Whether a value's type has a shape with every dim a number."""
    if value is None or not value.type.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim)
